//! The redis-rs connection settings a [`RedisTarget`] gives each socket:
//! TCP keepalive and `TCP_USER_TIMEOUT`, a data node's credentials, db and
//! TLS (files as they are now), a Sentinel's own credentials.

use std::time::Duration;

use redis::io::tcp::{TcpSettings, socket2};
use redis::{
    Client, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo, RedisResult,
};

use super::RedisTarget;

/// Keepalive probes start after 10 s without traffic, every 5 s, 3 of them:
/// a peer that vanished is noticed within ~25 s even on an idle connection.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
const KEEPALIVE_RETRIES: u32 = 3;
/// `TCP_USER_TIMEOUT`: data left unacknowledged this long closes the socket
/// (a peer gone while a command is in flight, e.g. a moved pod).
const USER_TIMEOUT: Duration = Duration::from_secs(10);

impl RedisTarget {
    /// TCP keepalive and `TCP_USER_TIMEOUT`, set on every socket.
    pub(in crate::connection) fn tcp_settings() -> TcpSettings {
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
    /// it now (read at every connection open: a rotated Secret is used).
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
    pub(in crate::connection) fn node_info(
        &self,
        host: &str,
        port: u16,
    ) -> RedisResult<ConnectionInfo> {
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

    /// Connection info of one Sentinel: a data node's, with the Sentinel
    /// credentials instead of the data nodes'.
    pub(in crate::connection) fn sentinel_info(
        &self,
        host: &str,
        port: u16,
    ) -> RedisResult<ConnectionInfo> {
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
