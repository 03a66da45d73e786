//! Opening a connection: the topology the URL names (or `INFO cluster`
//! detects for `redis://`), the primary check of one server and of the
//! node the Sentinels name, and a Cluster with our copy of its slot owners.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::cluster::ClusterClientBuilder;
use redis::{AsyncConnectionConfig, Client, ErrorKind, RedisResult, TlsMode, Value};
use tokio::sync::watch;
use tokio::time::Instant;

use super::route::Conn;
use super::sentinel::{Node, Sentinels, in_failover, show};
use super::slots::SlotView;
use super::target::{RedisTarget, Topology};
use crate::timing::{ms, within};

/// What every clone of a [`super::Redis`] shares: the target, the current
/// connection and how it was opened.
pub(super) struct Shared {
    pub(super) target: RedisTarget,
    pub(super) timeout: Duration,
    /// The current connection; `None` once marked broken.
    pub(super) slot: Mutex<Option<Live>>,
    /// One connect at a time, so a burst of calls opens one connection.
    pub(super) connecting: tokio::sync::Mutex<()>,
    pub(super) generation: watch::Sender<u64>,
    /// Decided at the first connect (`INFO cluster` for `redis://`).
    pub(super) mode: OnceLock<ServerKind>,
    pub(super) sentinel: Option<Sentinels>,
    /// Whether a command that met a close after a silence is sent again
    /// ([`super::Redis::resend_after_idle`]); off unless asked for.
    pub(super) resend_idle: AtomicBool,
}

/// What the Redis turned out to be at the first connect; the URL's scheme
/// (`target::Topology`) may leave it to detect (`redis://`: one server or a Cluster).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ServerKind {
    Node,
    Cluster,
    Sentinel,
}

#[derive(Clone)]
pub(super) struct Live {
    pub(super) conn: Conn,
    pub(super) generation: u64,
    /// Sentinel: the primary as the Sentinels named it.
    pub(super) primary: Option<Primary>,
    /// When a request was last sent or answered on this connection.
    pub(super) activity: Arc<Activity>,
}

/// When a connection last carried a request or a reply (ms since it
/// opened, tokio's clock): a request sent after a long enough silence may
/// cross a close for idleness (see `handle.rs`, `IDLE_CLOSE_MIN`).
pub(super) struct Activity {
    opened: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    pub(super) fn new() -> Activity {
        Activity {
            opened: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    /// Records activity now; returns how long the connection was silent
    /// before it.
    pub(super) fn touch(&self) -> Duration {
        let now = ms(self.opened.elapsed());
        let last = self.last_ms.fetch_max(now, Ordering::Relaxed);
        Duration::from_millis(now.saturating_sub(last))
    }
}

/// Sentinel: the primary as the Sentinels named it, and the connection to
/// it (for [`super::Redis::confirm_primary`]'s `ROLE`).
#[derive(Clone)]
pub(super) struct Primary {
    pub(super) node: Node,
    pub(super) conn: MultiplexedConnection,
}

impl Shared {
    fn config(&self) -> AsyncConnectionConfig {
        // Calls are bounded by `Redis::call`; no second timer per request.
        AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(None)
    }

    /// A connection of the mode the first connect decided (deciding it at
    /// the first connect).
    pub(super) async fn open(&self) -> RedisResult<(Conn, Option<Primary>)> {
        match self.mode.get().copied() {
            Some(ServerKind::Node) => {
                let (mut conn, node) = self.open_node().await?;
                check_primary(&mut conn, &node, false).await?;
                Ok((Conn::Node(conn), None))
            }
            Some(ServerKind::Cluster) => Ok((self.open_cluster().await?, None)),
            Some(ServerKind::Sentinel) => self.open_sentinel().await,
            None => match self.target.topology {
                Topology::Sentinel => {
                    let opened = self.open_sentinel().await?;
                    let _ = self.mode.set(ServerKind::Sentinel);
                    Ok(opened)
                }
                Topology::Cluster => {
                    self.check_cluster(true).await?;
                    let conn = self.open_cluster().await?;
                    let _ = self.mode.set(ServerKind::Cluster);
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
    async fn detect(&self) -> RedisResult<(Conn, Option<Primary>)> {
        let (mut conn, cluster, node) = self.check_cluster(false).await?;
        let topology = if cluster { "cluster" } else { "one server" };
        tracing::info!(
            target: crate::logging::START_TARGET,
            topology,
            "redis:// URL: topology detected with INFO cluster"
        );
        if cluster {
            let conn = self.open_cluster().await?;
            let _ = self.mode.set(ServerKind::Cluster);
            return Ok((conn, None));
        }
        check_primary(&mut conn, &node, false).await?;
        let _ = self.mode.set(ServerKind::Node);
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
            Ok(info) => super::info_field(&info, "cluster_enabled") == Some("1"),
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

    async fn open_node(&self) -> RedisResult<(MultiplexedConnection, Node)> {
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
        // redis-rs retries `TRYAGAIN`, `CLUSTERDOWN` and the like on its own,
        // waiting at least 1.28 s before each retry by default: longer than a
        // short call timeout, so such an error never reached us and the call
        // timed out instead (a claim stuck on a migrating slot it could skip).
        // Its two retries now fit in a quarter of the call: 1/16 to 1/8 each.
        let wait_ms = ms(self.timeout);
        let mut builder = ClusterClientBuilder::new(nodes)
            .connection_timeout(self.timeout)
            .response_timeout(self.timeout)
            .retries(2)
            .min_retry_wait((wait_ms / 16).max(1))
            .max_retry_wait((wait_ms / 8).max(2))
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
        let _ = within(self.timeout, view.fetch(&conn)).await;
        Ok(Conn::Cluster(conn, view))
    }

    /// The node a majority of the answering Sentinels name, if it answers
    /// `ROLE` as master (see `sentinel.rs`).
    async fn open_sentinel(&self) -> RedisResult<(Conn, Option<Primary>)> {
        let sentinels = self.sentinel.as_ref().expect("sentinel topology");
        let node = sentinels.primary(&self.target, self.timeout).await?;
        let mut conn = self.open_one(&node.0, node.1).await?;
        check_primary(&mut conn, &node, true).await?;
        let primary = Primary {
            node,
            conn: conn.clone(),
        };
        Ok((Conn::Node(conn), Some(primary)))
    }
}

/// The first element of `ROLE`'s reply: "master", "slave" or "sentinel".
///
/// Errors: as any command (e.g. `NOPERM` without `+role`).
pub(super) async fn role_of(conn: &mut MultiplexedConnection) -> RedisResult<String> {
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
    node: &Node,
    required: bool,
) -> RedisResult<()> {
    match role_of(conn).await {
        Ok(role) if role == "master" => Ok(()),
        Ok(role) => Err(in_failover(&format!(
            "{} answers ROLE as {role}, not as the primary; try again later",
            show(node)
        ))),
        Err(err) if !required && super::is_permission_error(&err) => Ok(()),
        Err(err) => Err(err),
    }
}
