//! Node stamps: values that name the Redis node (and its life) that wrote
//! them, so a script sees that Redis rolled back (`node.lua`,
//! docs/rollback-design.md).

use redis::Script;

use crate::connection::{Redis, info_field};

/// `node.lua`: `node_stamp()`, `unstamp()`, `stamped()`, `stamped_here()`,
/// `node_gate()`, `lift_fence()`; for scripts built from several parts.
pub(crate) const PRELUDE: &str = include_str!("node.lua");

/// A script with `node.lua` put in front of `body`.
pub(crate) fn script(body: &str) -> Script {
    Script::new(&format!("{PRELUDE}{body}"))
}

/// The integer part of a stored "<integer>.<stamp>" or of a plain
/// integer (a value written before stamps); `None` for anything else.
pub(crate) fn integer_part(value: &str) -> Option<u64> {
    let value = value.trim();
    let int = match value.split_once('.') {
        Some((int, stamp)) if !stamp.is_empty() && stamp.bytes().all(|b| b.is_ascii_digit()) => int,
        Some(_) => return None,
        None => value,
    };
    int.parse().ok()
}

/// The stamp part of a stored "<integer>.<stamp>"; `None` for a plain
/// integer (written before stamps) or anything else.
pub(crate) fn stamp_part(value: &str) -> Option<&str> {
    let (_, stamp) = value.trim().split_once('.')?;
    (!stamp.is_empty() && stamp.bytes().all(|b| b.is_ascii_digit())).then_some(stamp)
}

/// The stamps of the primaries now (one server: one; Cluster: each
/// primary's), as `node.lua` computes them there; `None` when a primary's
/// `INFO` is refused or unreadable (then no stamp is judged).
pub(crate) async fn primary_stamps(conn: &mut Redis) -> Option<Vec<String>> {
    let section = |name: &str| {
        let mut cmd = redis::cmd("INFO");
        cmd.arg(name);
        cmd
    };
    let servers = conn.on_every_primary(&section("server")).await.ok()?;
    let replications = conn.on_every_primary(&section("replication")).await.ok()?;
    let mut stamps = Vec::new();
    for (node, server) in servers {
        let replication = replications.iter().find(|(n, _)| *n == node)?;
        let server: String = redis::from_redis_value(server).ok()?;
        let replication: String = redis::from_redis_value(replication.1.clone()).ok()?;
        stamps.push(stamp_from_info(&server, &replication)?);
    }
    Some(stamps)
}

/// The stamp `node.lua`'s `node_stamp()` computes on the node whose `INFO
/// server` and `INFO replication` texts are given: 15 decimal digits of the
/// first 12 hex digits of SHA1(`run_id:master_replid`). `None` when either
/// field is missing. (A test on a real server keeps the two equal.)
pub(crate) fn stamp_from_info(server: &str, replication: &str) -> Option<String> {
    let run_id = info_field(server, "run_id")?;
    let replid = info_field(replication, "master_replid")?;
    let digest = sha1_smol::Sha1::from(format!("{run_id}:{replid}"))
        .digest()
        .to_string();
    let head = u64::from_str_radix(&digest[..12], 16).ok()?;
    Some(format!("{head:015}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stamp of a value, and a node's stamp from its INFO texts.
    #[test]
    fn stamps_are_read_and_computed() {
        assert_eq!(
            stamp_part("1796412036000.123456789012345"),
            Some("123456789012345")
        );
        for none in ["42", "42.", "42.x", ""] {
            assert_eq!(stamp_part(none), None, "{none:?}");
        }
        let server = "# Server\r\nrun_id:abc\r\n";
        let replication = "# Replication\r\nmaster_replid:def\r\nmaster_replid2:000\r\n";
        // SHA1("abc:def") = 0ce84d8d01f2..., and 0x0ce84d8d01f2 = 14191873032690.
        assert_eq!(
            stamp_from_info(server, replication).as_deref(),
            Some("014191873032690")
        );
        assert_eq!(stamp_from_info(server, "# Replication\r\n"), None);
    }

    /// Stamped and plain integers read alike; anything else is unreadable.
    #[test]
    fn integer_part_reads_stamped_and_plain_values() {
        assert_eq!(
            integer_part("1796412036000.123456789012345"),
            Some(1796412036000)
        );
        assert_eq!(integer_part("42"), Some(42));
        assert_eq!(integer_part(" 42\n"), Some(42));
        for bad in ["", "x", "42.", "42.x", "42.1.2", "-1", ".5"] {
            assert_eq!(integer_part(bad), None, "{bad:?}");
        }
    }
}
