//! [`Redis`]: the one connection handle of every mode, over a standalone
//! server, a Sentinel-managed primary, or a Cluster.
//!
//! Rules:
//! - every call (connecting included) ends by the call timeout; a call that
//!   timed out, was cancelled, or failed on the connection marks that
//!   connection broken, and the next call opens a new one (resolving the
//!   host name again; for Sentinel: asking the Sentinels for the primary
//!   again); so does a reply that says the node is not a usable primary
//!   (`READONLY`, `MASTERDOWN`, `LOADING`), also inside an `Ok` reply
//!   (a demoted node behind an unchanged URL; the one table:
//!   [`super::classify`]);
//! - a new connection to one server (`redis://`) or to the primary the
//!   Sentinels name is used only when the node answers `ROLE` as master;
//!   which node the Sentinels name: the majority rule of `sentinel.rs`;
//! - a command that never left because the connection was already closed
//!   (e.g. the server's `timeout` closed it while idle) is sent once more at
//!   once on a new connection and is not an error; so is one that met a
//!   close after a silence of [`IDLE_CLOSE_MIN`] (the close and the command
//!   crossed) on one server, where the caller asked
//!   ([`Redis::resend_after_idle`]);
//! - TCP keepalive and `TCP_USER_TIMEOUT` are set on every socket;
//! - each new connection bumps a generation number callers can watch
//!   ([`Redis::reconnects`]), and [`Redis::confirm_primary`] tells whether the
//!   last call ran on the node the Sentinels name now.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::Poll;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, Value};
use tokio::sync::watch;
use tokio::time::{Instant, timeout, timeout_at};

use super::classify::leaves_connection;
use super::open::{Activity, Live, Primary, ServerKind, Shared};
use super::route::Conn;
use super::sentinel::Sentinels;
use super::target::{RedisTarget, Topology};
use crate::timing::{bounded, ms, timed_out};

/// A cheap-to-clone handle on one Redis deployment; clones share the
/// connection. Connects lazily: an unreachable server shows as errors of
/// calls, never at construction.
#[derive(Clone)]
pub struct Redis {
    shared: Arc<Shared>,
    /// Generation of the connection the last call of this clone ran on
    /// (0: none yet).
    ran_on: u64,
}

/// What a script's keys must share on this deployment: the connection
/// knows, callers that lay out keys (the worker's claim guards) ask
/// [`Redis::keyspace`] instead of the topology.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keyspace {
    /// One server (standalone, Sentinel): any keys go in one script call.
    Whole,
    /// Redis Cluster: a script's keys must share one hash slot.
    Slots,
}

impl RedisTarget {
    /// A handle whose calls each end after `timeout` (connecting included).
    ///
    /// Errors only on a client configuration redis-rs refuses; an
    /// unreachable server shows as errors of the first calls instead.
    pub fn connect(&self, timeout: Duration) -> RedisResult<Redis> {
        super::install_crypto_provider();
        let sentinel = match self.topology {
            Topology::Sentinel => Some(Sentinels::new(self)),
            _ => None,
        };
        let shared = Shared {
            target: self.clone(),
            timeout,
            slot: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            generation: watch::Sender::new(0),
            mode: OnceLock::new(),
            sentinel,
            resend_idle: AtomicBool::new(false),
        };
        Ok(Redis {
            shared: Arc::new(shared),
            ran_on: 0,
        })
    }
}

// === what callers ask beyond commands ===

impl Redis {
    /// Lets every clone send a command once more on a new connection when it
    /// met a close after a silence of [`IDLE_CLOSE_MIN`] on one server (not
    /// on a Cluster: redis-rs' cluster client retries such a command itself,
    /// and both together ran one up to 4 times). Only for callers whose
    /// every command answers its own repeat without handing anything out
    /// twice (the worker: claims answer "already ours", renewals check the
    /// owner; `lock`: acquires answer "already ours"): a repeat of a command
    /// that did run, its reply lost, meets what the first one left, so a
    /// pool acquire without a request id or a budget take would answer "no
    /// id due" or "denied" for a lease or charge that was made.
    pub(crate) fn resend_after_idle(&self) {
        self.shared.resend_idle.store(true, Ordering::Relaxed);
    }

    /// Watches the connection generation: it grows by one with every new
    /// connection (first connect, reconnect, new primary, new cluster view).
    pub(crate) fn reconnects(&self) -> watch::Receiver<u64> {
        self.shared.generation.subscribe()
    }

    /// What a script's keys must share here: [`Keyspace::Slots`] on a Redis
    /// Cluster, else [`Keyspace::Whole`] (decided at the first connect,
    /// which this waits for, bounded by the call timeout). Key layouts that
    /// differ by it (the worker's claim guards) ask this.
    ///
    /// Errors: the first connect failed or timed out.
    pub async fn keyspace(&self) -> RedisResult<Keyspace> {
        let of = |mode: Option<&ServerKind>| match mode {
            Some(ServerKind::Cluster) => Keyspace::Slots,
            _ => Keyspace::Whole,
        };
        if let Some(mode) = self.shared.mode.get() {
            return Ok(of(Some(mode)));
        }
        bounded(self.shared.timeout * 5, self.shared.live())
            .await
            .map(|_| of(self.shared.mode.get()))
    }

    /// Sentinel: true when this clone's last call ran on the connection that
    /// is still current, to the node a majority of the answering Sentinels
    /// name as primary now, and that node still answers `ROLE` as master (the
    /// rule of the first connect, see `sentinel.rs`; both asked at once
    /// within the call timeout). A majority that names another node, or a
    /// `ROLE` other than master, marks the connection broken. Standalone and
    /// Cluster: always true.
    pub(crate) async fn confirm_primary(&mut self) -> bool {
        let Some(sentinels) = &self.shared.sentinel else {
            return true;
        };
        let Some(live) = self
            .shared
            .current()
            .filter(|l| l.generation == self.ran_on)
        else {
            return false;
        };
        let Some(Primary { node, mut conn }) = live.primary else {
            return false;
        };
        let limit = self.shared.timeout;
        let asked = timeout(
            limit,
            futures_util::future::join(
                sentinels.primary(&self.shared.target, limit),
                super::open::role_of(&mut conn),
            ),
        )
        .await;
        match asked {
            Ok((Ok(named), Ok(role))) if node == named => {
                if role == "master" {
                    return true;
                }
                self.shared.mark_broken(live.generation);
                false
            }
            Ok((Ok(_), _)) => {
                self.shared.mark_broken(live.generation);
                false
            }
            _ => false,
        }
    }

    /// `WAIT replicas timeout` on the node that holds `key` (on a Cluster
    /// the primary of its slot; `WAIT` names no key, so it is routed by
    /// hand): how many replicas acknowledged every write this connection
    /// made before. `timeout` is Redis' own limit, at least 1 ms (0 would
    /// block forever); keep it below the call timeout. A `WAIT` that ran on
    /// another connection than this clone's last call (a reconnect in
    /// between) proves nothing about that call's write: it counts 0.
    ///
    /// Errors: as any call (e.g. `NOPERM` without `+wait`).
    pub async fn wait_replicas(
        &mut self,
        key: &str,
        replicas: u32,
        timeout: Duration,
    ) -> RedisResult<u32> {
        let wrote_on = self.ran_on;
        let timeout_ms = ms(timeout).max(1);
        let mut wait = redis::cmd("WAIT");
        wait.arg(replicas).arg(timeout_ms);
        let value = self.call_on_key_node(&wait, key).await?;
        let acked: u32 = redis::from_redis_value(value.extract_error()?)?;
        Ok(if self.ran_on == wrote_on { acked } else { 0 })
    }

    /// How many replicas the node that holds `key` has connected now
    /// (`connected_slaves` of `INFO replication`; on a Cluster the primary of
    /// the key's slot), for start-up advice on `--min-replicas-ack`.
    ///
    /// Errors: as any call (`NOPERM` without `+info`); a reply without the
    /// field is a parse error.
    pub(crate) async fn connected_replicas(&mut self, key: &str) -> RedisResult<u32> {
        let text = self.info_on_key_node("replication", key).await?;
        super::info_field(&text, "connected_slaves")
            .and_then(|count| count.trim().parse().ok())
            .ok_or_else(|| {
                RedisError::from((
                    ErrorKind::UnexpectedReturnType,
                    "INFO replication has no connected_slaves",
                ))
            })
    }

    /// A command without keys on every primary (settings such as `CONFIG
    /// GET`): `(node, reply)` per primary, `node` its address on a Cluster
    /// and `None` on one server. A node's error reply stays a value.
    ///
    /// Errors: as any call; on a Cluster a reply that is not one per node.
    pub(crate) async fn on_every_primary(
        &mut self,
        cmd: &Cmd,
    ) -> RedisResult<Vec<(Option<String>, Value)>> {
        let value = self
            .call(|mut conn| async move { conn.on_primaries(cmd).await })
            .await?;
        if self.keyspace().await? == Keyspace::Whole {
            return Ok(vec![(None, value)]);
        }
        let Value::Map(nodes) = value else {
            return Err(RedisError::from((
                ErrorKind::UnexpectedReturnType,
                "a command sent to every primary did not answer node by node",
            )));
        };
        nodes
            .into_iter()
            .map(|(node, reply)| Ok((Some(redis::from_redis_value(node)?), reply)))
            .collect()
    }

    /// The value of each of `keys` as a string, in key order: `None` for a
    /// missing key and for a key of another type (a single-key `MGET` each).
    /// One pipeline on one server; on a Cluster one pipeline per node that
    /// serves some of the keys, all at once (grouped by the slot owners
    /// `CLUSTER SLOTS` named at connect; a group that fails, e.g. during a
    /// slot migration, is read again key by key as redis-rs routes each).
    ///
    /// Errors: as any call; one key's error fails the whole read.
    pub(crate) async fn read_each(&mut self, keys: &[String]) -> RedisResult<Vec<Option<String>>> {
        let values = self
            .call(|mut conn| async move { conn.read_each(keys).await })
            .await?;
        values
            .into_iter()
            .map(|value| {
                let (value,): (Option<String>,) = redis::from_redis_value(value)?;
                Ok(value)
            })
            .collect()
    }
}

// === calls ===

impl Redis {
    /// One command (on a Cluster routed by its key).
    ///
    /// Errors: the call timeout, a failed connect, the command's own error.
    pub(crate) async fn call_one(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        self.call(|mut conn| async move { conn.one(cmd).await })
            .await
    }

    /// A pipeline's `count` replies from `offset` (on a Cluster a pipeline
    /// that is no transaction goes command by command, all at once).
    ///
    /// Errors: as [`Redis::call_one`]; on a Cluster the first command's
    /// error fails the pipeline.
    pub(crate) async fn call_many(
        &mut self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        self.call(|mut conn| async move { conn.many(pipeline, offset, count).await })
            .await
    }

    /// Positions in `keys` grouped by the node that serves them: one group on
    /// one server; on a Cluster by the slot owners `CLUSTER SLOTS` named at
    /// connect (one group per key without them). For a command per node
    /// ([`Redis::call_on_key_node`] with a group's first key).
    ///
    /// Errors: the first connect failed.
    pub(crate) async fn node_groups(&self, keys: &[String]) -> RedisResult<Vec<Vec<usize>>> {
        let live = bounded(self.shared.timeout, self.shared.live()).await?;
        Ok(match &live.conn {
            Conn::Node(_) => vec![(0..keys.len()).collect()],
            Conn::Cluster(_, view) => view.groups(keys),
        })
    }

    /// `INFO <section>` of the node that holds `key` (on a Cluster the
    /// primary of its slot), as text; read its fields with
    /// [`super::info_field`]. `default` names Redis' default sections.
    ///
    /// Errors: as any call (`NOPERM` without `+info`), an error reply.
    pub(crate) async fn info_on_key_node(
        &mut self,
        section: &str,
        key: &str,
    ) -> RedisResult<String> {
        let mut info = redis::cmd("INFO");
        info.arg(section);
        let value = self.call_on_key_node(&info, key).await?;
        Ok(redis::from_redis_value(value.extract_error()?)?)
    }

    /// A command without keys on the node that holds `key` (on a Cluster
    /// the primary of its slot). A node's error reply stays a value.
    ///
    /// Errors: as any call.
    pub(crate) async fn call_on_key_node(&mut self, cmd: &Cmd, key: &str) -> RedisResult<Value> {
        self.call(|mut conn| async move { conn.on_key_node(cmd, key).await })
            .await
    }

    /// One request: wait for a live connection (its own timeout), then the
    /// request `send` makes on it (its own timeout).
    async fn call<T, F, Fut>(&mut self, mut send: F) -> RedisResult<T>
    where
        T: Replies,
        F: FnMut(Conn) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let shared = self.shared.clone();
        let mut resent = false;
        loop {
            // A connection opened for this call is not condemned when the
            // caller gives up meanwhile: connecting may have used its budget.
            let fresh = shared.current().is_none();
            let live = bounded(shared.timeout, shared.live()).await?;
            let deadline = Instant::now() + shared.timeout;
            let mut suspect = Suspect {
                shared: &shared,
                generation: live.generation,
                armed: !fresh,
            };
            let silent = live.activity.touch();
            let one_server = matches!(live.conn, Conn::Node(_));
            let mut request = pin!(send(live.conn));
            let first = std::future::poll_fn(|cx| Poll::Ready(request.as_mut().poll(cx))).await;
            // Failed before the driver took it: it never left (the server had
            // closed the connection and the driver had seen it).
            let (result, never_left) = match first {
                Poll::Ready(result) => (result, true),
                Poll::Pending => {
                    let result = timeout_at(deadline, request).await;
                    (
                        result.unwrap_or_else(|_| Err(timed_out(shared.timeout))),
                        false,
                    )
                }
            };
            let dropped = result.as_ref().is_err_and(|e| e.is_connection_dropped());
            let crossed = silent >= IDLE_CLOSE_MIN
                && shared.resend_idle.load(Ordering::Relaxed)
                && one_server;
            if dropped && !resent && (never_left || crossed) {
                shared.mark_broken(live.generation);
                suspect.armed = false;
                resent = true;
                continue;
            }
            live.activity.touch();
            suspect.armed = false;
            if leaves_connection(result.as_ref().map(Replies::values)) {
                shared.mark_broken(live.generation);
            }
            self.ran_on = live.generation;
            return result;
        }
    }
}

/// The replies of one request, which may carry error replies as values.
trait Replies {
    fn values(&self) -> &[Value];
}

impl Replies for Value {
    fn values(&self) -> &[Value] {
        std::slice::from_ref(self)
    }
}

impl Replies for Vec<Value> {
    fn values(&self) -> &[Value] {
        self
    }
}

/// Marks the connection broken unless disarmed: a call that timed out, was
/// cancelled by its caller, or failed on the connection.
struct Suspect<'a> {
    shared: &'a Shared,
    generation: u64,
    armed: bool,
}

impl Drop for Suspect<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.shared.mark_broken(self.generation);
        }
    }
}

// === the shared connection ===

impl Shared {
    fn current(&self) -> Option<Live> {
        self.slot.lock().expect("slot lock").clone()
    }

    fn mark_broken(&self, generation: u64) {
        let mut slot = self.slot.lock().expect("slot lock");
        if slot.as_ref().is_some_and(|l| l.generation == generation) {
            *slot = None;
        }
    }

    /// The current connection, or a new one. The connect runs in a task of
    /// its own, so a caller that stops waiting does not waste it.
    async fn live(self: &Arc<Self>) -> RedisResult<Live> {
        if let Some(live) = self.current() {
            return Ok(live);
        }
        let this = self.clone();
        tokio::spawn(async move { this.connect().await })
            .await
            .map_err(|e| RedisError::from(std::io::Error::other(e)))?
    }

    /// A new connection ([`Shared::open`]) under a new generation.
    async fn connect(&self) -> RedisResult<Live> {
        let _one = self.connecting.lock().await;
        if let Some(live) = self.current() {
            return Ok(live);
        }
        // Several round trips (TCP, TLS, AUTH/SELECT, INFO, Sentinel lookup).
        let limit = (self.timeout * 4).max(CONNECT_MIN);
        let opened = bounded(limit, self.open()).await;
        let ran_before = *self.generation.borrow() > 0;
        let (conn, primary) = opened.map_err(|e| super::explain(&self.target, e, ran_before))?;
        let mut generation = 0;
        self.generation.send_modify(|g| {
            *g += 1;
            generation = *g;
        });
        let live = Live {
            conn,
            generation,
            primary,
            activity: Arc::new(Activity::new()),
        };
        *self.slot.lock().expect("slot lock") = Some(live.clone());
        Ok(live)
    }
}

/// The shortest silence after which a server or the network may close a
/// connection for idleness: Redis' `timeout` is whole seconds (at least 1,
/// 0 = never) and closes a client only when its last request is older
/// than that (redis.conf; `clientsCronHandleTimeout`), NATs and load
/// balancers wait minutes. A request sent after such a silence whose
/// connection then drops before any reply may have crossed that close (the
/// server's FIN on its way while the request left): the close came before
/// the server read it, so it did not run, and it is sent again once on a
/// new connection, for the callers that asked ([`Redis::resend_after_idle`]:
/// the worker and `lock`, whose commands answer their own repeat, so a
/// drop that was something else, a crash right after the request ran,
/// hands nothing out twice either).
const IDLE_CLOSE_MIN: Duration = Duration::from_secs(1);

/// Least time a connect may take in the background (several round trips).
const CONNECT_MIN: Duration = Duration::from_secs(2);

impl ConnectionLike for Redis {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(self.call_one(cmd))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(self.call_many(pipeline, offset, count))
    }

    fn get_db(&self) -> i64 {
        self.shared.target.db
    }
}

impl Redis {
    /// Runs `call` on each group of `keys` that one script may touch, all
    /// groups at once, each on a clone of this handle: on one server one
    /// call with every key; on a Cluster one call per hash slot (a script's
    /// keys must share one). Returns the results, one per group, in no set
    /// order, for the caller to merge.
    ///
    /// Errors: the first connect failed; the first error of any call (the
    /// others still ran).
    pub(crate) async fn per_slot<T, F, Fut>(&self, keys: &[String], call: F) -> RedisResult<Vec<T>>
    where
        F: Fn(Redis, Vec<String>) -> Fut,
        Fut: Future<Output = RedisResult<T>> + Send + 'static,
        T: Send + 'static,
    {
        if self.keyspace().await? == Keyspace::Whole {
            return Ok(vec![call(self.clone(), keys.to_vec()).await?]);
        }
        let mut calls = tokio::task::JoinSet::new();
        for group in super::route::by_slot(keys) {
            calls.spawn(call(self.clone(), group));
        }
        let (mut results, mut failed) = (Vec::new(), None);
        while let Some(joined) = calls.join_next().await {
            match joined.map_err(|e| RedisError::from(std::io::Error::other(e)))? {
                Ok(result) => results.push(result),
                Err(err) => {
                    failed.get_or_insert(err);
                }
            }
        }
        failed.map_or(Ok(results), Err)
    }
}
