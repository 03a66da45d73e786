//! [`Redis`]: the one connection handle of every mode, over a standalone
//! server, a Sentinel-managed primary, or a Cluster.
//!
//! Rules (issues 8.3, 8.4, 9.1, 10 "Connecting"):
//! - every call (connecting included) ends by the call timeout; a call that
//!   timed out, was cancelled, or failed on the connection marks that
//!   connection broken, and the next call opens a new one (for Sentinel: asks
//!   the Sentinels for the primary again);
//! - a command that never left because the connection was already closed
//!   (e.g. the server's `timeout` closed it while idle) is sent at once on a
//!   new connection and is not an error;
//! - TCP keepalive and `TCP_USER_TIMEOUT` are set on every socket;
//! - each new connection bumps a generation number callers can watch
//!   ([`Redis::reconnects`]), and [`Redis::confirm_primary`] tells whether the
//!   last call ran on the node the Sentinels name now.

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::Poll;
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::io::tcp::{TcpSettings, socket2};
use redis::{
    AsyncConnectionConfig, Client, Cmd, ConnectionAddr, ConnectionInfo, ErrorKind,
    IntoConnectionInfo, Pipeline, RedisConnectionInfo, RedisError, RedisFuture, RedisResult,
    TlsMode, Value,
};
use tokio::sync::watch;
use tokio::time::{Instant, timeout, timeout_at};

use super::slots::{self, SlotView};
use super::target::{RedisTarget, Topology};

mod sentinel;

use sentinel::{Node, Sentinels};

/// Keepalive probes start after 10 s without traffic, every 5 s, 3 of them:
/// a peer that vanished is noticed within ~25 s even on an idle connection.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
const KEEPALIVE_RETRIES: u32 = 3;
/// `TCP_USER_TIMEOUT`: data left unacknowledged this long closes the socket
/// (a peer gone while a command is in flight, e.g. a moved pod).
const USER_TIMEOUT: Duration = Duration::from_secs(10);

/// Least time a connect may take in the background (several round trips).
const CONNECT_MIN: Duration = Duration::from_secs(2);

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

struct Shared {
    target: RedisTarget,
    timeout: Duration,
    /// The current connection; `None` once marked broken.
    slot: Mutex<Option<Live>>,
    /// One connect at a time, so a burst of calls opens one connection.
    connecting: tokio::sync::Mutex<()>,
    generation: watch::Sender<u64>,
    /// Decided at the first connect (`INFO cluster` for `redis://`).
    mode: OnceLock<Mode>,
    sentinel: Option<Sentinels>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Node,
    Cluster,
    Sentinel,
}

#[derive(Clone)]
struct Live {
    conn: Conn,
    generation: u64,
    /// Sentinel: the primary's address as the Sentinels named it.
    node: Option<(String, u16)>,
}

#[derive(Clone)]
enum Conn {
    Node(MultiplexedConnection),
    /// With our copy of the slot owners, which groups reads by node.
    Cluster(ClusterConnection, Arc<SlotView>),
}

#[derive(Clone, Copy)]
enum Req<'a> {
    One(&'a Cmd),
    Many(&'a Pipeline, usize, usize),
    /// A command without keys that must run on the primary of `key`'s
    /// slot (Cluster); elsewhere the same as `One`.
    OnKeyNode(&'a Cmd, &'a str),
    /// A single-key `MGET` of each key (see [`Redis::read_each`]).
    ReadEach(&'a [String]),
}

enum Reply {
    One(Value),
    Many(Vec<Value>),
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
        };
        Ok(Redis {
            shared: Arc::new(shared),
            ran_on: 0,
        })
    }

    fn tcp_settings() -> TcpSettings {
        let keepalive = socket2::TcpKeepalive::new()
            .with_time(KEEPALIVE_IDLE)
            .with_interval(KEEPALIVE_INTERVAL)
            .with_retries(KEEPALIVE_RETRIES);
        TcpSettings::default()
            .set_nodelay(true)
            .set_keepalive(keepalive)
            .set_user_timeout(USER_TIMEOUT)
    }

    /// Credentials and db of a data node; the password as its file holds
    /// it now (read at every connection open, issue 20.4).
    fn node_settings(&self) -> RedisResult<RedisConnectionInfo> {
        let mut info = RedisConnectionInfo::default().set_db(self.db);
        if let Some(user) = &self.username {
            info = info.set_username(user);
        }
        if let Some(password) = self.node_password()? {
            info = info.set_password(password);
        }
        Ok(info)
    }

    fn addr(&self, host: &str, port: u16) -> ConnectionAddr {
        match self.tls {
            true => ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure: false,
                tls_params: None,
            },
            false => ConnectionAddr::Tcp(host.to_owned(), port),
        }
    }

    /// Connection info of one data node (credentials, db, TCP settings,
    /// TLS), with the TLS and password files as they are now.
    fn node_info(&self, host: &str, port: u16) -> RedisResult<ConnectionInfo> {
        let info = self
            .addr(host, port)
            .into_connection_info()?
            .set_tcp_settings(Self::tcp_settings())
            .set_redis_settings(self.node_settings()?);
        match (self.certs()?, self.tls) {
            (Some(certs), true) => Ok(Client::build_with_tls(info, certs)?
                .get_connection_info()
                .clone()),
            _ => Ok(info),
        }
    }

    fn sentinel_info(&self, host: &str, port: u16) -> RedisResult<ConnectionInfo> {
        let mut settings = RedisConnectionInfo::default();
        if let Some(user) = &self.sentinel_username {
            settings = settings.set_username(user);
        }
        if let Some(password) = &self.sentinel_password {
            settings = settings.set_password(password);
        }
        let info = self.node_info(host, port)?.set_redis_settings(settings);
        Ok(info)
    }
}

impl Redis {
    /// The URL this handle connects to, redacted.
    pub fn target(&self) -> &RedisTarget {
        &self.shared.target
    }

    /// Watches the connection generation: it grows by one with every new
    /// connection (first connect, reconnect, new primary, new cluster view).
    pub fn reconnects(&self) -> watch::Receiver<u64> {
        self.shared.generation.subscribe()
    }

    /// Generation of the connection this clone's last call ran on (0: none).
    pub fn ran_on(&self) -> u64 {
        self.ran_on
    }

    /// Whether this handle talks to a Redis Cluster (decided at the first
    /// connect, which this waits for, bounded by the call timeout). Key
    /// layouts that differ by topology (the worker's claim guards) ask this.
    ///
    /// Errors: the first connect failed or timed out.
    pub async fn is_cluster(&self) -> RedisResult<bool> {
        if let Some(mode) = self.shared.mode.get() {
            return Ok(*mode == Mode::Cluster);
        }
        match timeout(self.shared.timeout * 5, self.shared.live()).await {
            Ok(live) => live.map(|_| self.shared.mode.get() == Some(&Mode::Cluster)),
            Err(_) => Err(timed_out(self.shared.timeout * 5)),
        }
    }

    /// Sentinel: true when this clone's last call ran on the connection that
    /// is still current, to the node a majority of the answering Sentinels
    /// name as primary now, and that node still answers `ROLE` as master (the
    /// rule of the first connect, see `handle/sentinel.rs`; both asked at once
    /// within the call timeout). A majority that names another node, or a
    /// `ROLE` other than master, marks the connection broken. Standalone and
    /// Cluster: always true.
    pub async fn confirm_primary(&mut self) -> bool {
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
        let Conn::Node(conn) = &live.conn else {
            unreachable!("Sentinel connections are to one node")
        };
        let mut conn = conn.clone();
        let limit = self.shared.timeout;
        let asked = timeout(
            limit,
            futures_util::future::join(
                sentinels.primary(&self.shared.target, limit),
                role_of(&mut conn),
            ),
        )
        .await;
        match asked {
            Ok((Ok(named), Ok(role))) if live.node.as_ref() == Some(&named) => {
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
        let timeout_ms = u64::try_from(timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let mut wait = redis::cmd("WAIT");
        wait.arg(replicas).arg(timeout_ms);
        let Reply::One(value) = self.call(Req::OnKeyNode(&wait, key)).await? else {
            unreachable!("one command, one reply")
        };
        let acked: u32 = redis::from_redis_value(value.extract_error()?)?;
        Ok(if self.ran_on == wrote_on { acked } else { 0 })
    }

    /// How many replicas the node that holds `key` has connected now
    /// (`connected_slaves` of `INFO replication`; on a Cluster the primary of
    /// the key's slot), for start-up advice on `--min-replicas-ack`.
    ///
    /// Errors: as any call (`NOPERM` without `+info`); a reply without the
    /// field is a parse error.
    pub async fn connected_replicas(&mut self, key: &str) -> RedisResult<u32> {
        let mut info = redis::cmd("INFO");
        info.arg("replication");
        let Reply::One(value) = self.call(Req::OnKeyNode(&info, key)).await? else {
            unreachable!("one command, one reply")
        };
        let text: String = redis::from_redis_value(value.extract_error()?)?;
        text.lines()
            .find_map(|line| line.strip_prefix("connected_slaves:"))
            .and_then(|count| count.trim().parse().ok())
            .ok_or_else(|| {
                RedisError::from((
                    ErrorKind::UnexpectedReturnType,
                    "INFO replication has no connected_slaves",
                ))
            })
    }

    /// The value of each of `keys` as a string, in key order: `None` for a
    /// missing key and for a key of another type (a single-key `MGET` each).
    /// One pipeline on one server; on a Cluster one pipeline per node that
    /// serves some of the keys, all at once (grouped by the slot owners
    /// `CLUSTER SLOTS` named at connect; a group that fails, e.g. during a
    /// slot migration, is read again key by key as redis-rs routes each).
    ///
    /// Errors: as any call; one key's error fails the whole read.
    pub async fn read_each(&mut self, keys: &[String]) -> RedisResult<Vec<Option<String>>> {
        let Reply::Many(values) = self.call(Req::ReadEach(keys)).await? else {
            unreachable!("one reply per key")
        };
        values
            .into_iter()
            .map(|value| {
                let (value,): (Option<String>,) = redis::from_redis_value(value)?;
                Ok(value)
            })
            .collect()
    }

    /// One request: wait for a live connection (its own timeout), then the
    /// command (its own timeout).
    async fn call(&mut self, req: Req<'_>) -> RedisResult<Reply> {
        let shared = self.shared.clone();
        let mut resent = false;
        loop {
            // A connection opened for this call is not condemned when the
            // caller gives up meanwhile: connecting may have used its budget.
            let fresh = shared.current().is_none();
            let live = match timeout(shared.timeout, shared.live()).await {
                Ok(live) => live?,
                Err(_) => return Err(timed_out(shared.timeout)),
            };
            let deadline = Instant::now() + shared.timeout;
            let mut suspect = Suspect {
                shared: &shared,
                generation: live.generation,
                armed: !fresh,
            };
            let mut conn = live.conn;
            let mut request = pin!(conn.send(req));
            let first = std::future::poll_fn(|cx| Poll::Ready(request.as_mut().poll(cx))).await;
            let result = match first {
                // Failed before the driver took it: it never left (issue 9.1).
                Poll::Ready(Err(err)) if !resent && err.is_connection_dropped() => {
                    shared.mark_broken(live.generation);
                    suspect.armed = false;
                    resent = true;
                    continue;
                }
                Poll::Ready(result) => result,
                Poll::Pending => timeout_at(deadline, request)
                    .await
                    .unwrap_or_else(|_| Err(timed_out(shared.timeout))),
            };
            suspect.armed = false;
            if condemns(&result) {
                shared.mark_broken(live.generation);
            }
            self.ran_on = live.generation;
            return result;
        }
    }
}

/// What the worker keeper asks of its connection beyond commands: reconnect
/// news (renew at once after one) and the Sentinel primary check.
pub trait Reconnects: ConnectionLike {
    /// See [`Redis::reconnects`].
    fn reconnects(&self) -> watch::Receiver<u64>;
    /// See [`Redis::confirm_primary`].
    fn confirm_primary(&mut self) -> impl Future<Output = bool> + Send;
    /// See [`Redis::is_cluster`].
    fn is_cluster(&self) -> impl Future<Output = RedisResult<bool>> + Send;
    /// See [`Redis::wait_replicas`].
    fn wait_replicas(
        &mut self,
        key: &str,
        replicas: u32,
        timeout: Duration,
    ) -> impl Future<Output = RedisResult<u32>> + Send;
    /// See [`Redis::read_each`].
    fn read_each(
        &mut self,
        keys: &[String],
    ) -> impl Future<Output = RedisResult<Vec<Option<String>>>> + Send;
    /// See [`Redis::connected_replicas`].
    fn connected_replicas(&mut self, key: &str) -> impl Future<Output = RedisResult<u32>> + Send;
}

impl Reconnects for Redis {
    fn reconnects(&self) -> watch::Receiver<u64> {
        Redis::reconnects(self)
    }

    fn confirm_primary(&mut self) -> impl Future<Output = bool> + Send {
        Redis::confirm_primary(self)
    }

    fn is_cluster(&self) -> impl Future<Output = RedisResult<bool>> + Send {
        Redis::is_cluster(self)
    }

    fn wait_replicas(
        &mut self,
        key: &str,
        replicas: u32,
        timeout: Duration,
    ) -> impl Future<Output = RedisResult<u32>> + Send {
        Redis::wait_replicas(self, key, replicas, timeout)
    }

    fn read_each(
        &mut self,
        keys: &[String],
    ) -> impl Future<Output = RedisResult<Vec<Option<String>>>> + Send {
        Redis::read_each(self, keys)
    }

    fn connected_replicas(&mut self, key: &str) -> impl Future<Output = RedisResult<u32>> + Send {
        Redis::connected_replicas(self, key)
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

/// A transient error (I/O kind): a Sentinel failover in progress.
fn in_failover(what: &str) -> RedisError {
    std::io::Error::other(format!("{what} (failover in progress?)")).into()
}

/// A transient error (I/O kind): none of the Sentinels in the URL answers
/// (`hosts` as `host:port`, never credentials).
fn no_sentinel_answers(hosts: &[(String, u16)], last: &RedisError) -> RedisError {
    let hosts: Vec<String> = hosts
        .iter()
        .map(|(h, p)| match h.contains(':') {
            true => format!("[{h}]:{p}"),
            false => format!("{h}:{p}"),
        })
        .collect();
    std::io::Error::other(format!(
        "no Sentinel answers ({}): {}",
        hosts.join(", "),
        super::Readable(last)
    ))
    .into()
}

fn timed_out(limit: Duration) -> RedisError {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("redis call timed out after {} ms", limit.as_millis()),
    )
    .into()
}

/// Whether a call's outcome condemns its connection (the next call opens a
/// new one, resolving the host name again, or asking the Sentinels): an
/// error, or a server error inside an `Ok` reply (redis-rs returns those as
/// [`Value::ServerError`], also inside pipeline and `EXEC` replies), that
/// [`super::needs_new_connection`] names.
fn condemns(result: &RedisResult<Reply>) -> bool {
    match result {
        Err(err) => {
            super::needs_new_connection(err)
                || err.clone().into_server_errors().is_some_and(|items| {
                    items
                        .iter()
                        .any(|(_, e)| super::needs_new_connection(&e.clone().into()))
                })
        }
        Ok(Reply::One(value)) => value_condemns(value),
        Ok(Reply::Many(values)) => values.iter().any(value_condemns),
    }
}

fn value_condemns(value: &Value) -> bool {
    match value {
        Value::ServerError(err) => super::needs_new_connection(&err.clone().into()),
        Value::Array(items) | Value::Set(items) => items.iter().any(value_condemns),
        _ => false,
    }
}

/// The first element of `ROLE`'s reply: "master", "slave" or "sentinel".
///
/// Errors: as any command (e.g. `NOPERM` without `+role`).
async fn role_of(conn: &mut MultiplexedConnection) -> RedisResult<String> {
    let reply: Vec<Value> = redis::cmd("ROLE").query_async(conn).await?;
    let first = reply.into_iter().next().unwrap_or(Value::Nil);
    Ok(redis::from_redis_value(first)?)
}

/// Ok when the node at `node` answers `ROLE` as master. A replica is a
/// transient error (a failover in progress: the next connect resolves the
/// name, or asks the Sentinels, again). `required`: whether a user without
/// `+role` (`NOPERM`) is an error (Sentinel, whose ACL rules list `+role`) or
/// skips the check (a plain `redis://` URL, whose rules never needed it).
async fn check_primary(
    conn: &mut MultiplexedConnection,
    (host, port): &Node,
    required: bool,
) -> RedisResult<()> {
    match role_of(conn).await {
        Ok(role) if role == "master" => Ok(()),
        Ok(role) => Err(in_failover(&format!(
            "{} answers ROLE as {role}, not as the primary; try again later",
            show_node(host, *port)
        ))),
        Err(err) if !required && super::is_permission_error(&err) => Ok(()),
        Err(err) => Err(err),
    }
}

/// `host:port` (`[v6]:port`).
fn show_node(host: &str, port: u16) -> String {
    match host.contains(':') {
        true => format!("[{host}]:{port}"),
        false => format!("{host}:{port}"),
    }
}

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

    async fn connect(&self) -> RedisResult<Live> {
        let _one = self.connecting.lock().await;
        if let Some(live) = self.current() {
            return Ok(live);
        }
        // Several round trips (TCP, TLS, AUTH/SELECT, INFO, Sentinel lookup).
        let limit = (self.timeout * 4).max(CONNECT_MIN);
        let opened = timeout(limit, self.open())
            .await
            .unwrap_or_else(|_| Err(timed_out(limit)));
        let ran_before = *self.generation.borrow() > 0;
        let (conn, node) = opened.map_err(|e| super::explain(&self.target, e, ran_before))?;
        let mut generation = 0;
        self.generation.send_modify(|g| {
            *g += 1;
            generation = *g;
        });
        let live = Live {
            conn,
            generation,
            node,
        };
        *self.slot.lock().expect("slot lock") = Some(live.clone());
        Ok(live)
    }

    fn config(&self) -> AsyncConnectionConfig {
        // Calls are bounded by `Redis::call`; no second timer per request.
        AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(None)
    }

    async fn open(&self) -> RedisResult<(Conn, Option<(String, u16)>)> {
        match self.mode.get().copied() {
            Some(Mode::Node) => {
                let (mut conn, node) = self.open_node().await?;
                check_primary(&mut conn, &node, false).await?;
                Ok((Conn::Node(conn), None))
            }
            Some(Mode::Cluster) => Ok((self.open_cluster().await?, None)),
            Some(Mode::Sentinel) => self.open_sentinel().await,
            None => match self.target.topology {
                Topology::Sentinel => {
                    let opened = self.open_sentinel().await?;
                    let _ = self.mode.set(Mode::Sentinel);
                    Ok(opened)
                }
                Topology::Cluster => {
                    self.check_cluster(true).await?;
                    let conn = self.open_cluster().await?;
                    let _ = self.mode.set(Mode::Cluster);
                    Ok((conn, None))
                }
                Topology::Detect => self.detect().await,
            },
        }
    }

    /// `redis://`: one `INFO cluster` on the first node that answers decides
    /// between one server and a Cluster. One server must answer `ROLE` as
    /// master (a managed Redis fails over by moving its DNS name: until the
    /// name moves, it may lead to the demoted node).
    async fn detect(&self) -> RedisResult<(Conn, Option<(String, u16)>)> {
        let (mut conn, cluster, node) = self.check_cluster(false).await?;
        let topology = if cluster { "cluster" } else { "one server" };
        tracing::info!(
            target: crate::logging::START_TARGET,
            topology,
            "redis:// URL: topology detected with INFO cluster"
        );
        if cluster {
            let conn = self.open_cluster().await?;
            let _ = self.mode.set(Mode::Cluster);
            return Ok((conn, None));
        }
        check_primary(&mut conn, &node, false).await?;
        let _ = self.mode.set(Mode::Node);
        Ok((Conn::Node(conn), None))
    }

    /// Connects to the first node that answers and reads `cluster_enabled`.
    /// Errors (configuration): a Cluster was required (`want_cluster`) or
    /// several hosts were given, and the node is not a Cluster node.
    async fn check_cluster(
        &self,
        want_cluster: bool,
    ) -> RedisResult<(MultiplexedConnection, bool, Node)> {
        let (mut conn, (host, port)) = self.open_node().await?;
        let info: RedisResult<String> = redis::cmd("INFO")
            .arg("cluster")
            .query_async(&mut conn)
            .await;
        let cluster = match info {
            Ok(info) => info.lines().any(|l| l.trim() == "cluster_enabled:1"),
            // No +info for this user: trust the URL's form.
            Err(err) if super::is_permission_error(&err) => want_cluster,
            Err(err) => return Err(err),
        };
        if !cluster && (want_cluster || self.target.hosts.len() > 1) {
            return Err((
                ErrorKind::InvalidClientConfig,
                "not a Cluster node (cluster_enabled:0): use redis://host:port with one host for one server, or redis+sentinel:// for Sentinel",
                format!("{host}:{port}"),
            )
                .into());
        }
        Ok((conn, cluster, (host, port)))
    }

    async fn open_node(&self) -> RedisResult<(MultiplexedConnection, (String, u16))> {
        let mut last = None;
        for (host, port) in &self.target.hosts {
            match self.open_one(host, *port).await {
                Ok(conn) => return Ok((conn, (host.clone(), *port))),
                Err(err) => last = Some(err),
            }
        }
        Err(last.expect("at least one host"))
    }

    /// A connection to one data node. A connection the server closed at
    /// once is asked why (see [`super::refusal::why_closed`]): Redis at
    /// `maxclients` says so before it closes, which redis-rs's own reading
    /// loses ("Connection reset by peer", "broken pipe").
    async fn open_one(&self, host: &str, port: u16) -> RedisResult<MultiplexedConnection> {
        let client = Client::open(self.target.node_info(host, port)?)?;
        match client
            .get_multiplexed_async_connection_with_config(&self.config())
            .await
        {
            Ok(conn) => Ok(conn),
            Err(err) if err.is_connection_dropped() && !self.target.tls => {
                let probe = super::refusal::why_closed(host, port, self.timeout);
                Err(match probe.await {
                    Some(said) => super::refusal::refused(host, port, &said),
                    None => err,
                })
            }
            Err(err) => Err(err),
        }
    }

    async fn open_cluster(&self) -> RedisResult<Conn> {
        let target = &self.target;
        let nodes = target
            .hosts
            .iter()
            .map(|(h, p)| target.node_info(h, *p))
            .collect::<RedisResult<Vec<_>>>()?;
        let mut builder = ClusterClientBuilder::new(nodes)
            .connection_timeout(self.timeout)
            .response_timeout(self.timeout)
            .retries(2)
            .tcp_settings(RedisTarget::tcp_settings());
        if let Some(user) = &target.username {
            builder = builder.username(user);
        }
        if let Some(password) = target.node_password()? {
            builder = builder.password(password);
        }
        if target.tls {
            builder = builder.tls(TlsMode::Secure);
            if let Some(certs) = target.certs()? {
                builder = builder.certs(certs);
            }
        }
        let conn = builder.build()?.get_async_connection().await?;
        let view = Arc::new(SlotView::default());
        // Bounded: without a view reads only go key by key.
        let _ = timeout(self.timeout, view.fetch(&conn)).await;
        Ok(Conn::Cluster(conn, view))
    }

    /// The node a majority of the answering Sentinels name, if it answers
    /// `ROLE` as master (see `handle/sentinel.rs`).
    async fn open_sentinel(&self) -> RedisResult<(Conn, Option<Node>)> {
        let sentinels = self.sentinel.as_ref().expect("sentinel topology");
        let node = sentinels.primary(&self.target, self.timeout).await?;
        let mut conn = self.open_one(&node.0, node.1).await?;
        check_primary(&mut conn, &node, true).await?;
        Ok((Conn::Node(conn), Some(node)))
    }
}

type Sending<'a> = Pin<Box<dyn Future<Output = RedisResult<Reply>> + Send + 'a>>;

impl Conn {
    fn send<'a>(&'a mut self, req: Req<'a>) -> Sending<'a> {
        match (self, req) {
            (Conn::Node(c), Req::One(cmd) | Req::OnKeyNode(cmd, _)) => {
                Box::pin(async move { c.req_packed_command(cmd).await.map(Reply::One) })
            }
            (Conn::Node(c), Req::ReadEach(keys)) => Box::pin(async move {
                let mut pipe = redis::pipe();
                for key in keys {
                    pipe.cmd("MGET").arg(key);
                }
                c.req_packed_commands(&pipe, 0, keys.len())
                    .await
                    .map(Reply::Many)
            }),
            (Conn::Cluster(c, view), Req::ReadEach(keys)) => {
                Box::pin(async move { slots::read_each(c, view, keys).await.map(Reply::Many) })
            }
            (Conn::Cluster(c, _), Req::OnKeyNode(cmd, key)) => {
                let route = Route::with_key(key, SlotAddr::Master);
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                Box::pin(async move { c.route_command(cmd.clone(), routing).await.map(Reply::One) })
            }
            (Conn::Cluster(c, _), Req::One(cmd)) => {
                Box::pin(async move { c.req_packed_command(cmd).await.map(Reply::One) })
            }
            (Conn::Node(c), Req::Many(p, offset, count)) => Box::pin(async move {
                c.req_packed_commands(p, offset, count)
                    .await
                    .map(Reply::Many)
            }),
            (Conn::Cluster(c, _), Req::Many(p, ..)) if !p.is_transaction() => {
                Box::pin(scatter(c.clone(), p))
            }
            (Conn::Cluster(c, _), Req::Many(p, offset, count)) => Box::pin(async move {
                c.req_packed_commands(p, offset, count)
                    .await
                    .map(Reply::Many)
            }),
        }
    }
}

/// A pipeline on a Cluster: redis-rs sends a pipeline to one node and fails
/// on keys of several slots (an app's worker keys spread over all), so each
/// command goes on its own, all at once, and the replies keep their order.
/// The first error fails the whole pipeline.
async fn scatter(conn: ClusterConnection, pipeline: &Pipeline) -> RedisResult<Reply> {
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
    Ok(Reply::Many(values))
}

impl ConnectionLike for Redis {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            match self.call(Req::One(cmd)).await? {
                Reply::One(value) => Ok(value),
                Reply::Many(_) => unreachable!("one command, one reply"),
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            match self.call(Req::Many(pipeline, offset, count)).await? {
                Reply::Many(values) => Ok(values),
                Reply::One(_) => unreachable!("a pipeline, many replies"),
            }
        })
    }

    fn get_db(&self) -> i64 {
        self.shared.target.db
    }
}
