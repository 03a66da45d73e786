//! A private redis-server for the benchmarks: a free loopback port, no
//! persistence, killed on drop. Included by each bench with `#[path]`.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Redis {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Redis {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// A replica of the server on `primary_port` (`--replicaof`); the caller
    /// waits until it is linked.
    #[allow(dead_code)]
    pub fn start_replica_of(primary_port: u16) -> Self {
        Self::start_with(&["--replicaof", "127.0.0.1", &primary_port.to_string()])
    }

    fn start_with(extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(extra)
            .arg("--dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server on PATH");
        let redis = Self {
            child,
            port,
            _dir: dir,
        };
        let client = redis::Client::open(redis.url()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while client.get_connection().is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        redis
    }

    #[allow(dead_code)]
    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
