//! A private `/etc/hosts` for the processes under test: a DNS name that moves between loopback
//! addresses, as a managed Redis service fails over by moving its name.
//!
//! The process runs in a mount namespace of its own (`unshare --mount`) with a test's file
//! bind-mounted over `/etc/hosts`; the rest of the machine never sees it. Moving a name rewrites
//! that file in place (same inode: a bind mount follows the inode, a rename would not be seen).
//! glibc reads `/etc/hosts` at every lookup (no cache without nscd), so the next connect resolves
//! the new address. Needs root (mount namespaces); the tests run as root.
//!
//! ```ignore
//! let port = free_port_on(&["127.0.0.2", "127.0.0.3"]);
//! let a = RedisServer::start_with(RedisOptions { ip: Some("127.0.0.2".into()), port: Some(port), ..Default::default() });
//! let hosts = HostsFile::new(&[("redis.test", "127.0.0.2")]);
//! let worker = Sidecar::worker_at(&format!("redis://redis.test:{port}"), "orders").wrap(&hosts.wrapper()).spawn();
//! hosts.set("redis.test", "127.0.0.3"); // the name moves; the sidecar resolves it again
//! ```

use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use tempfile::TempDir;

use super::{BIN, Run, run_command};

/// A hosts file for processes started through [`HostsFile::wrapper`] or [`HostsFile::run`]:
/// `localhost` plus the names given, each on one address.
pub struct HostsFile {
    _dir: TempDir,
    path: PathBuf,
    /// Name -> address, in the order first given.
    entries: Mutex<Vec<(String, String)>>,
}

impl HostsFile {
    /// A file mapping each `(name, address)`; `localhost` always maps to 127.0.0.1.
    pub fn new(entries: &[(&str, &str)]) -> HostsFile {
        let dir = tempfile::Builder::new()
            .prefix("snowlease-hosts-")
            .tempdir()
            .expect("tempdir");
        let path = dir.path().join("hosts");
        let hosts = HostsFile {
            _dir: dir,
            path,
            entries: Mutex::new(
                entries
                    .iter()
                    .map(|(n, a)| (n.to_string(), a.to_string()))
                    .collect(),
            ),
        };
        fs::write(&hosts.path, hosts.render()).expect("write hosts file");
        hosts
    }

    /// The file's path (bind-mounted over `/etc/hosts` by the wrapper).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Moves `name` to `address` (adds it when new), rewriting the file in place: the new text
    /// is written over the old from offset 0, then the file is cut to its length, so a lookup
    /// meanwhile never reads an empty file (addresses of equal length, e.g. 127.0.0.2 and
    /// 127.0.0.3, leave no partial line either).
    pub fn set(&self, name: &str, address: &str) {
        {
            let mut entries = self.entries.lock().unwrap();
            match entries.iter_mut().find(|(n, _)| n == name) {
                Some(entry) => entry.1 = address.to_owned(),
                None => entries.push((name.to_owned(), address.to_owned())),
            }
        }
        let text = self.render();
        let file = OpenOptions::new()
            .write(true)
            .open(&self.path)
            .expect("open hosts file");
        file.write_all_at(text.as_bytes(), 0)
            .expect("write hosts file");
        file.set_len(text.len() as u64).expect("cut hosts file");
    }

    /// A wrapper for [`SidecarBuilder::wrap`](super::SidecarBuilder::wrap): the process runs in a
    /// private mount namespace with this file over `/etc/hosts`. `--kill-child`: SIGKILL of the
    /// wrapper ends the process too (the harness also kills a wrapper's children on drop).
    pub fn wrapper(&self) -> Vec<String> {
        let path = self.path.to_string_lossy().into_owned();
        [
            "unshare",
            "--mount",
            "--fork",
            "--kill-child",
            "sh",
            "-c",
            r#"mount --bind "$0" /etc/hosts && exec "$@""#,
            &path,
        ]
        .map(String::from)
        .to_vec()
    }

    /// Runs `snowlease args...` to completion under [`HostsFile::wrapper`] (PATH plus `env`,
    /// killed after `timeout`), like [`run_snowlease`](super::run_snowlease).
    pub fn run(&self, args: &[&str], env: &[(&str, &str)], timeout: Duration) -> Run {
        let wrapper = self.wrapper();
        let mut cmd = Command::new(&wrapper[0]);
        cmd.args(&wrapper[1..])
            .arg(BIN)
            .args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(env.iter().copied());
        run_command(cmd, timeout)
    }

    fn render(&self) -> String {
        let mut text = String::from("127.0.0.1 localhost\n");
        for (name, address) in self.entries.lock().unwrap().iter() {
            text.push_str(&format!("{address} {name}\n"));
        }
        text
    }
}
