//! The managed-Redis setup of the fault run: what a hosted Redis service does to its
//! clients. A primary and a replica on two loopback addresses share one TLS port behind one
//! host name ([`NAME`]), which the sidecars resolve through a private `/etc/hosts` ([`HostsFile`]: a
//! file bind-mounted over it under `unshare --mount`, rewritten in place to move the name). The
//! sidecars speak TLS with a CA bundle file the run rotates and log in as an ACL user whose
//! password the run rotates through `--redis-password-file`.
//!
//! Every switch of the primary is lossless, as a managed service's planned failover is: writes
//! on the old primary are paused (`CLIENT PAUSE WRITE`, which also stops expiry) until the
//! replica has all of them, then the replica is promoted and the old primary demoted
//! (`REPLICAOF`). So every overlap counts, as on standalone Redis.
//!
//! The harness reaches the nodes over their plain ports (user `default`), which also carry the
//! replication; only the sidecars use TLS.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::Duration;

use tempfile::TempDir;

use crate::it_dir::harness::*;

/// The host name of the service, as the sidecars' URL names it.
pub const NAME: &str = "managed-redis.chaos";
/// The ACL user of the sidecars.
const USER: &str = "chaos-app";
/// CAs the rotation cycles through (each signs one server certificate for [`NAME`]).
const CAS: usize = 3;
/// Loopback addresses of the two nodes.
const HOSTS: [&str; 2] = ["127.0.0.2", "127.0.0.3"];
/// How long a paused primary waits for its replica to catch up before the harness gives up.
const SYNC_TIMEOUT: Duration = Duration::from_secs(60);

/// The two nodes, the files the sidecars read, and which node is what.
pub struct Managed {
    dir: TempDir,
    hosts: HostsFile,
    nodes: [RedisServer; 2],
    /// Index of the node that takes writes.
    primary: usize,
    /// Index of the node [`NAME`] resolves to.
    named: usize,
    tls_port: u16,
    /// CA whose certificate the nodes present.
    ca: usize,
    /// Generation of the sidecars' password.
    password: u32,
    /// Whether the sidecars read the password from `--redis-password-file` (else the URL).
    password_file: bool,
}

impl Managed {
    /// Certificates, the two nodes (the second a replica of the first), the ACL user on both,
    /// the CA bundle, password and hosts files.
    pub fn start(password_file: bool) -> Managed {
        let dir = tempfile::Builder::new()
            .prefix("snowlease-managed-")
            .tempdir()
            .expect("tempdir");
        make_certs(dir.path());
        let tls_port = free_port_on(&HOSTS);
        let tls = |ca: usize| -> Vec<String> {
            let file = |name: String| dir.path().join(name).to_string_lossy().into_owned();
            vec![
                "--tls-port".into(),
                tls_port.to_string(),
                "--tls-cert-file".into(),
                file(format!("server{ca}.pem")),
                "--tls-key-file".into(),
                file(format!("server{ca}.key")),
                "--tls-auth-clients".into(),
                "no".into(),
            ]
        };
        let first = RedisServer::start_with(RedisOptions {
            args: tls(0),
            name: format!("managed node 0 ({})", HOSTS[0]),
            ip: Some(HOSTS[0].into()),
            ..RedisOptions::default()
        });
        let mut replica_args = tls(0);
        replica_args.extend([
            "--replicaof".into(),
            first.ip().into(),
            first.port().to_string(),
        ]);
        let second = RedisServer::start_with(RedisOptions {
            args: replica_args,
            name: format!("managed node 1 ({})", HOSTS[1]),
            ip: Some(HOSTS[1].into()),
            ..RedisOptions::default()
        });
        let managed = Managed {
            dir,
            hosts: HostsFile::new(&[(NAME, HOSTS[0])]),
            nodes: [first, second],
            primary: 0,
            named: 0,
            tls_port,
            ca: 0,
            password: 0,
            password_file,
        };
        for node in &managed.nodes {
            let _: () = node.query(
                redis::cmd("ACL")
                    .arg("SETUSER")
                    .arg(USER)
                    .arg("on")
                    .arg(format!(">{}", managed.password_of(0)))
                    .arg("~*")
                    .arg("&*")
                    .arg("+@all"),
            );
        }
        write_atomically(&managed.password_path(), &managed.password_of(0));
        managed.write_bundle(&[0]);
        managed.wait_in_sync();
        managed
    }

    /// The node that takes writes now.
    pub fn primary(&self) -> &RedisServer {
        &self.nodes[self.primary]
    }

    /// The sidecars' URL: `rediss://user:[password]@NAME:port` (the password only when
    /// `--redis-password-file` is not used; the colon keeps `user@` from reading as a
    /// password).
    pub fn url(&self) -> String {
        let password = match self.password_file {
            true => String::new(),
            false => self.password_of(self.password),
        };
        format!("rediss://{USER}:{password}@{NAME}:{}", self.tls_port)
    }

    /// Flags every sidecar gets: the CA bundle and, if used, the password file.
    pub fn sidecar_flags(&self) -> Vec<(String, String)> {
        let path = |p: PathBuf| p.to_string_lossy().into_owned();
        let mut flags = vec![("--redis-ca-file".to_owned(), path(self.bundle_path()))];
        if self.password_file {
            flags.push((
                "--redis-password-file".to_owned(),
                path(self.password_path()),
            ));
        }
        flags
    }

    /// The wrapper that runs a sidecar with this setup's `/etc/hosts`.
    pub fn wrapper(&self) -> Vec<String> {
        self.hosts.wrapper()
    }

    /// A failover by DNS: the replica is promoted, the old primary demoted, and `dns_lag`
    /// later the name moves to the new primary.
    pub fn fail_over(&mut self, dns_lag: Duration) {
        self.switch_primary();
        thread::sleep(dns_lag);
        self.point_name(self.primary);
        self.wait_in_sync();
    }

    /// `REPLICAOF` on the node the name points at, without a DNS change: it serves as a
    /// replica for `hold`, then is promoted back.
    pub fn replica_of(&mut self, hold: Duration) {
        assert_eq!(self.primary, self.named, "the name points at the primary");
        self.switch_primary();
        self.wait_in_sync();
        thread::sleep(hold);
        self.switch_primary();
        self.wait_in_sync();
    }

    /// cert-manager's order: the CA bundle gains the next CA, the nodes switch to a
    /// certificate from it and every client connection is killed (the sidecars reconnect and
    /// must verify the new certificate); `overlap` later the old CA leaves the bundle.
    pub fn rotate_ca(&mut self, overlap: Duration) {
        let next = (self.ca + 1) % CAS;
        self.write_bundle(&[self.ca, next]);
        let file = |name: String| self.dir.path().join(name).to_string_lossy().into_owned();
        for node in &self.nodes {
            let _: () = node.query(
                redis::cmd("CONFIG")
                    .arg("SET")
                    .arg("tls-cert-file")
                    .arg(file(format!("server{next}.pem")))
                    .arg("tls-key-file")
                    .arg(file(format!("server{next}.key"))),
            );
        }
        self.kill_clients(&["TYPE", "normal"]);
        self.ca = next;
        thread::sleep(overlap);
        self.write_bundle(&[next]);
    }

    /// Password rotation: the user gains the new password on every node, the password file
    /// gets it, the old one is removed and the user's connections are killed (they reconnect
    /// with the file's password).
    pub fn rotate_password(&mut self) {
        assert!(
            self.password_file,
            "password rotation needs --redis-password-file"
        );
        let (old, new) = (
            self.password_of(self.password),
            self.password_of(self.password + 1),
        );
        self.acl_setuser(&format!(">{new}"));
        write_atomically(&self.password_path(), &new);
        self.acl_setuser(&format!("<{old}"));
        self.kill_clients(&["USER", USER]);
        self.password += 1;
    }

    fn acl_setuser(&self, rule: &str) {
        for node in &self.nodes {
            let _: () = node.query(redis::cmd("ACL").arg("SETUSER").arg(USER).arg(rule));
        }
    }

    fn kill_clients(&self, filter: &[&str]) {
        for node in &self.nodes {
            let _: i64 = node.query(redis::cmd("CLIENT").arg("KILL").arg(filter));
        }
    }

    /// The lossless switch: writes (and expiry) paused on the primary until the replica has
    /// its whole stream, then the replica promoted and the old primary made its replica.
    fn switch_primary(&mut self) {
        let (from, to) = (self.primary, 1 - self.primary);
        let (old, new) = (&self.nodes[from], &self.nodes[to]);
        let _: () = old.query(redis::cmd("CLIENT").arg("PAUSE").arg(30_000).arg("WRITE"));
        let target = repl_offset(old);
        assert!(
            poll_until(SYNC_TIMEOUT, || repl_offset(new) >= target),
            "{} did not reach offset {target} of {} within {SYNC_TIMEOUT:?}",
            new.name(),
            old.name()
        );
        let _: () = new.query(redis::cmd("REPLICAOF").arg("NO").arg("ONE"));
        let _: () = old.query(redis::cmd("REPLICAOF").arg(new.ip()).arg(new.port()));
        let _: () = old.query(redis::cmd("CLIENT").arg("UNPAUSE"));
        self.primary = to;
    }

    /// Waits until the replica's link to the primary is up (a switch needs a replica that
    /// follows the stream).
    fn wait_in_sync(&self) {
        let replica = &self.nodes[1 - self.primary];
        assert!(
            replica.wait_info("replication", "master_link_status", "up", SYNC_TIMEOUT),
            "{} did not link to the primary within {SYNC_TIMEOUT:?}",
            replica.name()
        );
    }

    /// Moves the name to `node` (the hosts file rewritten in place).
    fn point_name(&mut self, node: usize) {
        self.hosts.set(NAME, HOSTS[node]);
        self.named = node;
    }

    /// The CA bundle file, replaced atomically as a mounted Secret is.
    fn write_bundle(&self, cas: &[usize]) {
        let text: String = cas
            .iter()
            .map(|ca| fs::read_to_string(self.dir.path().join(format!("ca{ca}.pem"))).expect("CA"))
            .collect();
        write_atomically(&self.bundle_path(), &text);
    }

    fn password_of(&self, generation: u32) -> String {
        format!("chaos-password-{generation}")
    }

    fn bundle_path(&self) -> PathBuf {
        self.dir.path().join("ca-bundle.pem")
    }

    fn password_path(&self) -> PathBuf {
        self.dir.path().join("password")
    }
}

/// The replication offset a node has processed (`master_repl_offset` of `INFO replication`,
/// on a primary and on a replica alike).
fn repl_offset(node: &RedisServer) -> u64 {
    node.info_field("replication", "master_repl_offset")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{}: no master_repl_offset", node.name()))
}

fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, text).expect("write");
    fs::rename(&tmp, path).expect("rename");
}

/// [`CAS`] CAs with openssl, each with a server certificate for [`NAME`] (EC P-256).
fn make_certs(dir: &Path) {
    let key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    let script = format!(
        "printf 'subjectAltName=DNS:{NAME}\\n' > server.ext
         for i in $(seq 0 {last}); do
           openssl req -x509 {key} -keyout ca$i.key -out ca$i.pem -days 2 -subj /CN=chaos-ca-$i 2>/dev/null
           openssl req {key} -keyout server$i.key -out server$i.csr -subj /CN={NAME} 2>/dev/null
           openssl x509 -req -in server$i.csr -CA ca$i.pem -CAkey ca$i.key -CAcreateserial \
             -out server$i.pem -days 2 -extfile server.ext 2>/dev/null
         done",
        last = CAS - 1
    );
    let out = Command::new("sh")
        .arg("-ec")
        .arg(script)
        .current_dir(dir)
        .output()
        .expect("sh");
    assert!(
        out.status.success(),
        "openssl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
