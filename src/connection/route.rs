//! Where a call goes: one node (standalone, the primary the Sentinels
//! name), or a Cluster, where redis-rs routes each command by its key and
//! this module splits what redis-rs would send to one node (a pipeline over
//! several slots, a read of many keys, a keyless command for a key's node,
//! a script over keys of several slots: [`Redis::per_slot`]).

use std::collections::HashMap;

use std::sync::Arc;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr,
};
use redis::{Cmd, Pipeline, RedisError, RedisResult, Value};

use super::slots::{self, SlotView};

/// `keys` grouped by hash slot, each group in key order.
pub(super) fn by_slot(keys: &[String]) -> Vec<Vec<String>> {
    let mut slots: HashMap<Slot, Vec<String>> = HashMap::new();
    for key in keys {
        slots
            .entry(Slot::for_key(key))
            .or_default()
            .push(key.clone());
    }
    slots.into_values().collect()
}

/// One live connection.
#[derive(Clone)]
pub(super) enum Conn {
    Node(MultiplexedConnection),
    /// With our copy of the slot owners, which groups reads by node.
    Cluster(ClusterConnection, Arc<SlotView>),
}

impl Conn {
    /// One command, routed by its key on a Cluster.
    pub(super) async fn one(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Conn::Node(c) => c.req_packed_command(cmd).await,
            Conn::Cluster(c, _) => c.req_packed_command(cmd).await,
        }
    }

    /// A command without keys that must run on the primary of `key`'s slot
    /// (Cluster); elsewhere the same as [`Conn::one`].
    pub(super) async fn on_key_node(&mut self, cmd: &Cmd, key: &str) -> RedisResult<Value> {
        match self {
            Conn::Node(c) => c.req_packed_command(cmd).await,
            Conn::Cluster(c, _) => {
                let route = Route::with_key(key, SlotAddr::Master);
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                c.route_command(cmd.clone(), routing).await
            }
        }
    }

    /// A command without keys on every primary: one reply on one node; on a
    /// Cluster a map of each primary's address to its reply (an error reply
    /// as a value), as redis-rs gathers a command it cannot combine.
    pub(super) async fn on_primaries(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Conn::Node(c) => c.req_packed_command(cmd).await,
            Conn::Cluster(c, _) => {
                let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                c.route_command(cmd.clone(), routing).await
            }
        }
    }

    /// A pipeline: `count` replies from `offset`. On a Cluster a pipeline
    /// that is no transaction goes command by command ([`scatter`]).
    pub(super) async fn many(
        &mut self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        match self {
            Conn::Node(c) => c.req_packed_commands(pipeline, offset, count).await,
            Conn::Cluster(c, _) if !pipeline.is_transaction() => scatter(c, pipeline).await,
            Conn::Cluster(c, _) => c.req_packed_commands(pipeline, offset, count).await,
        }
    }

    /// A single-key `MGET` of each of `keys`, one reply each in key order:
    /// one pipeline on one node; on a Cluster one pipeline per node
    /// ([`slots::read_each`]).
    pub(super) async fn read_each(&mut self, keys: &[String]) -> RedisResult<Vec<Value>> {
        match self {
            Conn::Node(c) => {
                let mut pipe = redis::pipe();
                for key in keys {
                    pipe.cmd("MGET").arg(key);
                }
                c.req_packed_commands(&pipe, 0, keys.len()).await
            }
            Conn::Cluster(c, view) => slots::read_each(c, view, keys).await,
        }
    }
}

/// A pipeline on a Cluster: redis-rs sends a pipeline to one node and fails
/// on keys of several slots (an app's worker keys spread over all), so each
/// command goes on its own, all at once, and the replies keep their order.
/// The first error fails the whole pipeline.
async fn scatter(conn: &ClusterConnection, pipeline: &Pipeline) -> RedisResult<Vec<Value>> {
    let mut tasks = tokio::task::JoinSet::new();
    for (index, cmd) in pipeline.cmd_iter().enumerate() {
        let (mut conn, cmd) = (conn.clone(), cmd.clone());
        tasks.spawn(async move { (index, conn.req_packed_command(&cmd).await) });
    }
    let mut values = vec![Value::Nil; tasks.len()];
    while let Some(joined) = tasks.join_next().await {
        let (index, reply) = joined.map_err(|e| RedisError::from(std::io::Error::other(e)))?;
        values[index] = reply?;
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A script's keys must share a slot: keys with one hash tag form one
    /// group (in key order), keys of other slots their own.
    #[test]
    fn keys_are_grouped_by_slot() {
        let keys: Vec<String> = ["a:{x}:1", "b", "a:{x}:2", "c", "{x}"]
            .map(String::from)
            .to_vec();
        let mut groups = by_slot(&keys);
        groups.sort();
        let tagged = vec!["a:{x}:1".to_owned(), "a:{x}:2".into(), "{x}".into()];
        assert!(groups.contains(&tagged), "{groups:?}");
        assert_eq!(groups.iter().map(Vec::len).sum::<usize>(), keys.len());
        for group in &groups {
            let slot = Slot::for_key(&group[0]);
            assert!(group.iter().all(|k| Slot::for_key(k) == slot), "{group:?}");
        }
    }
}
