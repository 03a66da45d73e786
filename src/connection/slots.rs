//! Reads of many keys on a Cluster grouped by node (the claim on Cluster):
//! one pipeline per node, all at once, instead of one request per key.
//!
//! redis-rs keeps its slot map to itself, so [`SlotView`] holds our own
//! copy from `CLUSTER SLOTS`, taken when the connection opens. It only
//! groups keys: each group's pipeline is still routed by redis-rs (by the
//! slot of its first key), which follows MOVED/ASK and refreshes its own
//! topology. A group whose pipeline fails or answers an error (a slot that
//! moved, a migration in progress) is read again key by key, each key routed
//! by redis-rs, and the view is fetched again.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{RedisResult, Value};

/// Slots of a Cluster (hash slots 0..16383).
const SLOTS: u16 = 16384;
/// Least time between two `CLUSTER SLOTS` fetches after failed groups.
const REFETCH_PAUSE: Duration = Duration::from_secs(1);

/// Which primary served each slot at the last `CLUSTER SLOTS`.
#[derive(Debug, Default, PartialEq, Eq)]
struct SlotOwners {
    /// (first slot, last slot, node number), inclusive; a node number
    /// stands for one primary's `host:port`.
    ranges: Vec<(u16, u16, usize)>,
}

impl SlotOwners {
    /// Parses a `CLUSTER SLOTS` reply; `None` when it is not one.
    fn parse(reply: &Value) -> Option<Self> {
        let Value::Array(ranges) = reply else {
            return None;
        };
        let mut nodes: Vec<(String, u16)> = Vec::new();
        let mut owners = SlotOwners::default();
        for range in ranges {
            let Value::Array(items) = range else {
                return None;
            };
            let [start, end, Value::Array(primary), ..] = items.as_slice() else {
                return None;
            };
            let [host, port, ..] = primary.as_slice() else {
                return None;
            };
            let node: (String, u16) = (
                redis::from_redis_value_ref(host).ok()?,
                redis::from_redis_value_ref(port).ok()?,
            );
            let number = match nodes.iter().position(|n| *n == node) {
                Some(number) => number,
                None => {
                    nodes.push(node);
                    nodes.len() - 1
                }
            };
            owners.ranges.push((
                redis::from_redis_value_ref(start).ok()?,
                redis::from_redis_value_ref(end).ok()?,
                number,
            ));
        }
        Some(owners)
    }

    fn node_of(&self, slot: u16) -> Option<usize> {
        self.ranges
            .iter()
            .find(|(first, last, _)| (*first..=*last).contains(&slot))
            .map(|(_, _, node)| *node)
    }

    /// Positions in `keys` grouped by the node serving them, each group in
    /// key order; `None` when a key's slot has no owner in this view.
    fn groups(&self, keys: &[String]) -> Option<Vec<Vec<usize>>> {
        let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
        for (index, key) in keys.iter().enumerate() {
            let node = self.node_of(key_slot(key.as_bytes()))?;
            match groups.iter_mut().find(|(n, _)| *n == node) {
                Some((_, group)) => group.push(index),
                None => groups.push((node, vec![index])),
            }
        }
        Some(groups.into_iter().map(|(_, group)| group).collect())
    }
}

/// The hash slot of `key` (CRC16/XMODEM of the key or of its non-empty
/// `{hash tag}`, mod 16384), as Redis and redis-rs compute it; redis-rs
/// does not expose the number.
fn key_slot(key: &[u8]) -> u16 {
    let tag = key.iter().position(|b| *b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|b| *b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tag.unwrap_or(key)) % SLOTS
}

/// Our copy of the Cluster's slot owners, shared by clones of one
/// connection. Empty until fetched, and again after a group failed.
#[derive(Default)]
pub(super) struct SlotView {
    state: Mutex<ViewState>,
}

#[derive(Default)]
struct ViewState {
    owners: Option<Arc<SlotOwners>>,
    /// When a fetch last started (fetches after failures are spaced).
    fetched: Option<Instant>,
}

impl SlotView {
    /// Fetches the view now (at connect). A failed fetch (e.g. no
    /// `+cluster|slots`) leaves it empty: reads then go key by key.
    pub(super) async fn fetch(&self, conn: &ClusterConnection) {
        self.state.lock().expect("view lock").fetched = Some(Instant::now());
        let mut conn = conn.clone();
        let mut slots = redis::cmd("CLUSTER");
        slots.arg("SLOTS");
        let reply = conn
            .route_command(
                slots,
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            )
            .await;
        let owners = reply.ok().as_ref().and_then(SlotOwners::parse);
        self.state.lock().expect("view lock").owners = owners.map(Arc::new);
    }

    /// Drops the view and fetches it again in the background, at most once
    /// per [`REFETCH_PAUSE`].
    fn refetch(self: &Arc<Self>, conn: &ClusterConnection) {
        let mut state = self.state.lock().expect("view lock");
        state.owners = None;
        if state.fetched.is_some_and(|at| at.elapsed() < REFETCH_PAUSE) {
            return;
        }
        state.fetched = Some(Instant::now());
        let (view, conn) = (self.clone(), conn.clone());
        tokio::spawn(async move { view.fetch(&conn).await });
    }

    fn owners(&self) -> Option<Arc<SlotOwners>> {
        self.state.lock().expect("view lock").owners.clone()
    }

    /// Positions in `keys` grouped by the primary serving them in this view,
    /// each group in key order; one group per key without a view.
    pub(super) fn groups(&self, keys: &[String]) -> Vec<Vec<usize>> {
        self.owners()
            .and_then(|owners| owners.groups(keys))
            .unwrap_or_else(|| (0..keys.len()).map(|i| vec![i]).collect())
    }
}

/// Sends `MGET key` for each of `keys` (single-key `MGET`: nil for a key of
/// another type too) and returns the replies in key order: one pipeline per
/// node as `view` groups them, all at once; key by key without a view.
/// Any key's error fails the whole read.
pub(super) async fn read_each(
    conn: &ClusterConnection,
    view: &Arc<SlotView>,
    keys: &[String],
) -> RedisResult<Vec<Value>> {
    let groups = match view.owners().and_then(|owners| owners.groups(keys)) {
        Some(groups) => groups,
        None => {
            view.refetch(conn);
            (0..keys.len()).map(|index| vec![index]).collect()
        }
    };
    let replies = join_all(groups.iter().map(|group| read_group(conn, keys, group))).await;
    let mut values = vec![Value::Nil; keys.len()];
    let mut failed = false;
    for (group, reply) in groups.iter().zip(replies) {
        let (group_values, group_failed) = reply?;
        failed |= group_failed;
        for (index, value) in group.iter().zip(group_values) {
            values[*index] = value;
        }
    }
    if failed {
        view.refetch(conn);
    }
    Ok(values)
}

fn mget(key: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("MGET");
    cmd.arg(key);
    cmd
}

/// One node's keys as one pipeline, routed by redis-rs by the first key's
/// slot; on an error, key by key. Returns the replies and whether the
/// pipeline failed (the view is then stale).
async fn read_group(
    conn: &ClusterConnection,
    keys: &[String],
    group: &[usize],
) -> RedisResult<(Vec<Value>, bool)> {
    if let [index] = group {
        return Ok((vec![read_one(conn, &keys[*index]).await?], false));
    }
    let mut pipe = redis::pipe();
    for index in group {
        pipe.add_command(mget(&keys[*index]));
    }
    let sent = conn
        .clone()
        .route_pipeline(pipe, 0, group.len(), primary_of(&keys[group[0]]))
        .await;
    match sent {
        Ok(values) if !values.iter().any(|v| matches!(v, Value::ServerError(_))) => {
            Ok((values, false))
        }
        _ => {
            let each = join_all(group.iter().map(|index| read_one(conn, &keys[*index])));
            let values = each.await.into_iter().collect::<RedisResult<_>>()?;
            Ok((values, true))
        }
    }
}

/// `MGET key` on its own, routed (and redirected) by redis-rs.
async fn read_one(conn: &ClusterConnection, key: &str) -> RedisResult<Value> {
    let routing = RoutingInfo::SingleNode(primary_of(key));
    conn.clone().route_command(mget(key), routing).await
}

/// The primary serving `key`: lease keys are never read on a replica,
/// which may lag.
fn primary_of(key: &str) -> SingleNodeRoutingInfo {
    SingleNodeRoutingInfo::SpecificNode(Route::with_key(key, SlotAddr::Master))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Our slot numbers are redis-rs' (and Redis'), hash tags included.
    #[test]
    fn key_slot_matches_redis_rs() {
        for key in [
            "snowflake:worker:orders:0",
            "snowflake:worker:orders:31",
            "p:a:guard:{p:a:7}",
            "{}x",
            "a{}{b}",
            "{user1000}.following",
            "",
            "foo",
        ] {
            assert_eq!(
                Route::new(key_slot(key.as_bytes()), SlotAddr::Master),
                Route::with_key(key, SlotAddr::Master),
                "{key}"
            );
        }
        // Known values from the Redis Cluster specification.
        assert_eq!(key_slot(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"foo"), 12182);
    }

    fn node(host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::BulkString(host.into()),
            Value::Int(port),
            Value::BulkString(b"id".to_vec()),
        ])
    }

    #[test]
    fn cluster_slots_reply_groups_keys_by_primary() {
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("h", 1),
                node("h", 4),
            ]),
            Value::Array(vec![Value::Int(5461), Value::Int(10922), node("h", 2)]),
            Value::Array(vec![Value::Int(10923), Value::Int(12000), node("h", 3)]),
            Value::Array(vec![Value::Int(12001), Value::Int(16383), node("h", 1)]),
        ]);
        let owners = SlotOwners::parse(&reply).unwrap();
        assert_eq!(owners.ranges.len(), 4);
        assert_eq!(owners.node_of(12001), owners.node_of(0));
        assert_ne!(owners.node_of(5461), owners.node_of(0));
        let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
        let groups = owners.groups(&keys).unwrap();
        let mut all: Vec<usize> = groups.iter().flatten().copied().collect();
        all.sort();
        assert_eq!(all, (0..20).collect::<Vec<_>>(), "every key once");
        let node_at = |i: usize| owners.node_of(key_slot(keys[i].as_bytes())).unwrap();
        let nodes: Vec<usize> = groups.iter().map(|g| node_at(g[0])).collect();
        for (group, n) in groups.iter().zip(&nodes) {
            assert!(group.iter().all(|i| node_at(*i) == *n), "{groups:?}");
            assert!(group.is_sorted(), "key order kept: {groups:?}");
        }
        let distinct: std::collections::BTreeSet<_> = nodes.iter().collect();
        assert_eq!((distinct.len(), nodes.len()), (3, 3), "{groups:?}");
        // Slots not covered: no grouping.
        let partial = SlotOwners::parse(&Value::Array(vec![Value::Array(vec![
            Value::Int(0),
            Value::Int(100),
            node("h", 1),
        ])]))
        .unwrap();
        assert_eq!(partial.groups(&keys), None);
        assert_eq!(SlotOwners::parse(&Value::Nil), None);
    }
}
