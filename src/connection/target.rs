//! [`RedisTarget`]: a Redis URL parsed into topology, nodes, credentials and
//! TLS material, with a redacted form for logs.
//!
//! URL forms (docs/operations.md, "Redis topologies"):
//! - `redis://[user:password@]host[:6379][,host2[:port]...][/db]` (`rediss://` for TLS):
//!   one server, or a Cluster when the node says `cluster_enabled:1`;
//! - `redis+cluster://...` (`rediss+cluster://`): a Cluster, checked at start;
//! - `redis+sentinel://[user:password@]host[:26379][,host2...]/<master>[/db]`
//!   (`rediss+sentinel://`): the primary the Sentinels name; the credentials are for
//!   the data nodes, Sentinel credentials come from `?sentinel_username=&sentinel_password=`
//!   or `--redis-sentinel-username` / `--redis-sentinel-password`.
//!
//! The TLS files and the password file are read again at every connection
//! open ([`RedisTarget::certs`], [`RedisTarget::node_password`]): cert-manager
//! rotates a CA bundle and certificates, Kubernetes updates a mounted Secret,
//! and a long-running sidecar follows without a restart.

mod files;
mod settings;

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use percent_encoding::percent_decode_str;

use files::CredentialFiles;

/// Said with every URL error: the usual cause is an unencoded `@`, `#`, `/` or `:`
/// in a password.
const ENCODE_HINT: &str = "percent-encode special characters in the user name and password (@ as %40, # as %23, / as %2F, ? as %3F, : as %3A)";

/// How to reach Redis, as the URL's scheme says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Topology {
    /// `redis://`: one server, or a Cluster detected at start (`INFO cluster`).
    Detect,
    /// `redis+cluster://`: a Cluster.
    Cluster,
    /// `redis+sentinel://`: the primary the Sentinels name.
    Sentinel,
}

/// A parsed Redis URL. Its `Display` and `Debug` show only scheme, hosts,
/// ports, master name and db: never any part of the user name or password.
/// Cheap to clone.
#[derive(Clone)]
pub struct RedisTarget(Arc<Parts>);

/// The parts of a [`RedisTarget`] (read through `Deref` inside the crate).
#[derive(Clone)]
pub struct Parts {
    pub(crate) topology: Topology,
    pub(crate) tls: bool,
    /// Data nodes (Detect, Cluster) or Sentinels (Sentinel); at least one.
    pub(crate) hosts: Vec<(String, u16)>,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) db: i64,
    /// Sentinel: the master name.
    pub(crate) master: String,
    pub(crate) sentinel_username: Option<String>,
    pub(crate) sentinel_password: Option<String>,
    /// `--redis-ca-file`, `--redis-cert-file`, `--redis-key-file`, `--redis-password-file`.
    files: CredentialFiles,
    redacted: String,
}

impl RedisTarget {
    /// Parses a URL of one of the forms in the module doc.
    ///
    /// Errors: a message that never repeats the URL (it may hold a password):
    /// unknown scheme, a fragment (`#`), more than one `@`, a host or port that
    /// is not one, a db that is not a number (Cluster: not 0), a Sentinel URL
    /// without a master name, an unknown query option.
    pub fn parse(url: &str) -> Result<Self, String> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| "not a URL; expected redis://host:port[/db]".to_owned())?;
        let (topology, tls, default_port) = match scheme {
            "redis" => (Topology::Detect, false, 6379),
            "rediss" => (Topology::Detect, true, 6379),
            "redis+cluster" => (Topology::Cluster, false, 6379),
            "rediss+cluster" => (Topology::Cluster, true, 6379),
            "redis+sentinel" => (Topology::Sentinel, false, 26379),
            "rediss+sentinel" => (Topology::Sentinel, true, 26379),
            _ => {
                return Err("scheme must be redis://, rediss:// (TLS), redis+sentinel://, rediss+sentinel://, redis+cluster:// or rediss+cluster://".into());
            }
        };
        if rest.contains('#') {
            return Err(format!("the URL has a '#' (fragment); {ENCODE_HINT}"));
        }
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        if path.contains('@') || authority.matches('@').count() > 1 {
            return Err(format!("the URL has more than one '@'; {ENCODE_HINT}"));
        }
        let (userinfo, hostlist) = match authority.rsplit_once('@') {
            Some((user, hosts)) => (Some(user), hosts),
            None => (None, authority),
        };
        let (username, password) = userinfo
            .map(split_userinfo)
            .transpose()?
            .unwrap_or_default();
        // A '?' in the password cuts the URL before its '@': the user name
        // and password then read as a host, and only then is the hint due.
        let cut_userinfo = userinfo.is_none() && query.contains('@');
        let hosts = hostlist
            .split(',')
            .map(|h| parse_host(h, default_port))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|reason| match cut_userinfo {
                true => format!("the URL has an '@' after a '?'; {ENCODE_HINT}"),
                false => reason,
            })?;
        let mut target = Parts {
            topology,
            tls,
            hosts,
            username,
            password,
            db: 0,
            master: String::new(),
            sentinel_username: None,
            sentinel_password: None,
            files: CredentialFiles::default(),
            redacted: String::new(),
        };
        target.parse_path(path)?;
        target.parse_query(query)?;
        target.redacted = target.redact(scheme);
        Ok(Self(Arc::new(target)))
    }

    /// Sets the Sentinel credentials where the URL's query gave none
    /// (`--redis-sentinel-username`, `--redis-sentinel-password`).
    pub(crate) fn with_sentinel_auth(
        mut self,
        user: Option<String>,
        password: Option<String>,
    ) -> Self {
        let parts = Arc::make_mut(&mut self.0);
        parts.sentinel_username = parts.sentinel_username.take().or(user);
        parts.sentinel_password = parts.sentinel_password.take().or(password);
        self
    }
}

impl Parts {
    fn parse_path(&mut self, path: &str) -> Result<(), String> {
        let mut parts = path.trim_start_matches('/').split('/');
        let first = parts.next().unwrap_or("");
        let db = if self.topology == Topology::Sentinel {
            if first.is_empty() || !first.chars().all(name_char) {
                return Err("a Sentinel URL needs the master name: redis+sentinel://host:26379/<master>[/db]".into());
            }
            self.master = first.to_owned();
            parts.next().unwrap_or("")
        } else {
            first
        };
        if parts.next().is_some() {
            return Err("the URL's path has too many parts (expected /<db>)".into());
        }
        if !db.is_empty() {
            self.db = match db.parse::<u16>() {
                Ok(n) => n.into(),
                // Only digits are echoed: the path may hold a mistyped secret.
                Err(_) if db.chars().all(|c| c.is_ascii_digit()) => {
                    return Err(format!(
                        "the db {db} in the URL's path (/<db>) is outside 0-65535"
                    ));
                }
                Err(_) => {
                    return Err("the db in the URL's path (/<db>) must be a number 0-65535".into());
                }
            };
        }
        if self.db != 0 && self.topology == Topology::Cluster {
            return Err("a Cluster has only db 0".into());
        }
        Ok(())
    }

    fn parse_query(&mut self, query: &str) -> Result<(), String> {
        for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
            let slot = match key.as_ref() {
                "sentinel_username" => &mut self.sentinel_username,
                "sentinel_password" => &mut self.sentinel_password,
                _ => {
                    return Err(
                        "unknown query option in the URL (known: sentinel_username, sentinel_password)"
                            .into(),
                    );
                }
            };
            if self.topology != Topology::Sentinel {
                return Err(
                    "sentinel_username/sentinel_password need a redis+sentinel:// URL".into(),
                );
            }
            *slot = Some(value.into_owned());
        }
        Ok(())
    }

    fn redact(&self, scheme: &str) -> String {
        let hosts: Vec<String> = self
            .hosts
            .iter()
            .map(|(h, p)| match h.contains(':') {
                true => format!("[{h}]:{p}"),
                false => format!("{h}:{p}"),
            })
            .collect();
        let master = match self.topology {
            Topology::Sentinel => format!("/{}", self.master),
            _ => String::new(),
        };
        format!("{scheme}://{}{master}/{}", hosts.join(","), self.db)
    }
}

impl Deref for RedisTarget {
    type Target = Parts;

    fn deref(&self) -> &Parts {
        &self.0
    }
}

/// Master names and db numbers: letters, digits, `.`, `_`, `-`.
fn name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

type Credentials = (Option<String>, Option<String>);

fn split_userinfo(userinfo: &str) -> Result<Credentials, String> {
    let decode = |s: &str| {
        percent_decode_str(s)
            .decode_utf8()
            .map(|s| s.into_owned())
            .map_err(|_| {
                format!("the user name or password is not UTF-8 once decoded; {ENCODE_HINT}")
            })
    };
    let (user, password) = match userinfo.split_once(':') {
        Some((user, password)) => (user, Some(password)),
        // `redis://secret@host`: a password typed without its colon.
        None => ("", Some(userinfo)),
    };
    let user = Some(decode(user)?).filter(|u| !u.is_empty());
    let password = password.map(decode).transpose()?.filter(|p| !p.is_empty());
    Ok((user, password))
}

fn parse_host(item: &str, default_port: u16) -> Result<(String, u16), String> {
    let bad = || "each host must be host[:port] or [ipv6][:port]".to_owned();
    let (host, port, v6) = if let Some(v6) = item.strip_prefix('[') {
        let (host, after) = v6.split_once(']').ok_or_else(bad)?;
        let port = match after {
            "" => None,
            _ => Some(after.strip_prefix(':').ok_or_else(bad)?),
        };
        (host, port, true)
    } else {
        match item.split_once(':') {
            Some((host, port)) => (host, Some(port), false),
            None => (item, None, false),
        }
    };
    let host_ok = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') || (v6 && c == ':'));
    if !host_ok {
        return Err(bad());
    }
    let port = match port {
        None => default_port,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| "the port in the URL must be a number 1-65535".to_owned())?,
    };
    Ok((host.to_owned(), port))
}

impl fmt::Display for RedisTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted)
    }
}

impl fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RedisTarget({})", self.redacted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "s3cr";

    #[test]
    fn shown_form_has_no_userinfo() {
        for (url, shown) in [
            (
                "redis://user:s3cret@redis.example:6380/2",
                "redis://redis.example:6380/2",
            ),
            (
                "redis://s3cret@redis.example:6380",
                "redis://redis.example:6380/0",
            ),
            ("rediss://:s3cr%40t@h", "rediss://h:6379/0"),
            ("redis://h1:1,h2", "redis://h1:1,h2:6379/0"),
            ("redis://[::1]:7000/3", "redis://[::1]:7000/3"),
            (
                "redis+sentinel://u:s3cret@s1,s2:5000/mymaster/4?sentinel_password=s3cret",
                "redis+sentinel://s1:26379,s2:5000/mymaster/4",
            ),
            (
                "rediss+cluster://:s3cret@c1:7000",
                "rediss+cluster://c1:7000/0",
            ),
        ] {
            let target = RedisTarget::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(target.to_string(), shown);
            assert!(!format!("{target:?}").contains(SECRET));
        }
    }

    #[test]
    fn credentials_are_percent_decoded() {
        let t = RedisTarget::parse("redis://us%3Aer:p%40ss%23w@h:1/0").unwrap();
        assert_eq!(t.username.as_deref(), Some("us:er"));
        assert_eq!(t.password.as_deref(), Some("p@ss#w"));
        let t = RedisTarget::parse("redis://justpassword@h").unwrap();
        assert_eq!(
            (t.username.as_deref(), t.password.as_deref()),
            (None, Some("justpassword"))
        );
        let t =
            RedisTarget::parse("redis+sentinel://s/m?sentinel_username=a&sentinel_password=b%26c")
                .unwrap();
        assert_eq!(t.sentinel_username.as_deref(), Some("a"));
        assert_eq!(t.sentinel_password.as_deref(), Some("b&c"));
        assert_eq!((t.master.as_str(), t.hosts[0].1), ("m", 26379));
    }

    /// URLs that do not parse cleanly are refused, suggest
    /// percent-encoding and never echo any part of the URL.
    #[test]
    fn unclean_urls_are_refused_without_echo() {
        for url in [
            "redis://:s3cr@t#frag@redis.example:6379",
            "redis://:s3cr@t@redis.example:6379",
            "redis://:s3cr/t@redis.example:6379",
            "redis://u:s3cr?t@redis.example:6379",
            "redis://u:s3cr@h:1/0#s3cr",
        ] {
            let err = RedisTarget::parse(url)
                .err()
                .unwrap_or_else(|| panic!("{url} accepted"));
            assert!(!err.contains(SECRET) && !err.contains("example"), "{err}");
            assert!(err.contains("percent-encode"), "{url}: {err}");
        }
        // A bad db or port after the '@' is no password's fault: the
        // message names the part and its range, without the encoding hint
        // (it gave it for every URL error) and still without echo.
        for (url, says) in [
            (
                "redis://u:s3cr@redis.example:6379/s3cr",
                "the db in the URL's path (/<db>) must be a number 0-65535",
            ),
            (
                "redis://redis.example:s3cr",
                "the port in the URL must be a number 1-65535",
            ),
            (
                "redis://u:s3cr@h:1/70000",
                "the db 70000 in the URL's path (/<db>) is outside 0-65535",
            ),
            (
                "redis://h:70000",
                "the port in the URL must be a number 1-65535",
            ),
            (
                "redis://u:s3cr@h:1/0/s3cr",
                "the URL's path has too many parts (expected /<db>)",
            ),
        ] {
            let err = RedisTarget::parse(url)
                .err()
                .unwrap_or_else(|| panic!("{url} accepted"));
            assert_eq!(err, says, "{url}");
        }
    }

    #[test]
    fn bad_urls_are_refused() {
        for url in [
            "http://h:1",
            "redis://",
            "not a url",
            "redis://:pw@/0",
            "redis://h:0",
            "redis://h:70000",
            "redis+sentinel://s1:26379",
            "redis+sentinel://s1/m/x",
            "redis+cluster://h/1",
            "redis://h?sentinel_password=x",
            "redis://h?timeout=1",
            "redis://h/0/1",
        ] {
            let err = RedisTarget::parse(url).err().unwrap_or_default();
            assert!(!err.is_empty(), "{url} accepted");
            assert!(!err.contains("pw"), "{err}");
        }
        assert!(RedisTarget::parse("rediss://h:6379").is_ok());
    }
}
