//! The credential files of a [`RedisTarget`]: TLS material and the data
//! nodes' password, checked when given and read again at every connection
//! open (so rotated files are used without a restart), never kept.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use redis::{ClientTlsConfig, TlsCertificates};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::RedisTarget;

/// Paths of the files that hold TLS material and the password; read at
/// every connection open, never kept.
#[derive(Clone, Default)]
pub(super) struct CredentialFiles {
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    password: Option<PathBuf>,
}

/// A credential file that cannot be used: the flag that names it and why
/// (the path and the OS error or what the content lacks; never the content).
/// At start a configuration error (exit 2); at a later connection open a
/// failed connect, retried like any other ([`From`] gives an I/O-kind
/// [`redis::RedisError`]: a file in the middle of a rotation).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{flag}: {reason}")]
pub(crate) struct FileRefused {
    /// The flag that names the file, e.g. `--redis-ca-file`.
    pub flag: &'static str,
    /// What is wrong.
    pub reason: String,
}

impl FileRefused {
    fn new(flag: &'static str, reason: impl Into<String>) -> Self {
        Self {
            flag,
            reason: reason.into(),
        }
    }
}

impl From<FileRefused> for redis::RedisError {
    fn from(refused: FileRefused) -> Self {
        std::io::Error::other(refused.to_string()).into()
    }
}

const CA_FLAG: &str = "--redis-ca-file";
const CERT_FLAG: &str = "--redis-cert-file";
const KEY_FLAG: &str = "--redis-key-file";
const PASSWORD_FLAG: &str = "--redis-password-file";

impl RedisTarget {
    /// Trusts only the CA certificates in the PEM file `ca` instead of the
    /// system store, and presents the certificate in `cert` with the key in
    /// `key` (PEM files) when both are given. The files are read now, to
    /// refuse bad ones at start, and again at every connection open
    /// (`RedisTarget::certs`).
    ///
    /// Errors (naming the flag): TLS files for a URL without TLS, a
    /// certificate without its key (or the other way round), a file that
    /// cannot be read or holds no PEM certificate or key.
    pub(crate) fn with_tls_files(
        mut self,
        ca: Option<PathBuf>,
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
    ) -> Result<Self, FileRefused> {
        if ca.is_none() && cert.is_none() && key.is_none() {
            return Ok(self);
        }
        let flag = [(CA_FLAG, &ca), (CERT_FLAG, &cert), (KEY_FLAG, &key)]
            .into_iter()
            .find_map(|(flag, path)| path.as_ref().map(|_| flag))
            .unwrap_or(CA_FLAG);
        if !self.tls {
            return Err(FileRefused::new(flag, "TLS files need a rediss:// URL"));
        }
        if cert.is_some() != key.is_some() {
            return Err(FileRefused::new(
                flag,
                "a client certificate (--redis-cert-file) needs its key (--redis-key-file), and the other way round",
            ));
        }
        let files = &mut Arc::make_mut(&mut self.0).files;
        (files.ca, files.cert, files.key) = (ca, cert, key);
        self.certs()?;
        Ok(self)
    }

    /// Takes the data nodes' password from the file `path` (a mounted
    /// Kubernetes Secret) instead of the URL's. The file is read now, to
    /// refuse a bad one at start, and again at every connection open
    /// (`RedisTarget::node_password`).
    ///
    /// Errors (naming `--redis-password-file`, never the content): the file
    /// cannot be read, is empty, holds more than one line or is not UTF-8.
    pub(crate) fn with_password_file(mut self, path: Option<PathBuf>) -> Result<Self, FileRefused> {
        if path.is_some() {
            Arc::make_mut(&mut self.0).files.password = path;
            self.node_password()?;
        }
        Ok(self)
    }

    /// The TLS material as the files hold it now (`None` without TLS files:
    /// the system trust store, no client certificate). Read at every
    /// connection open, so a rotated CA bundle or certificate is used by the
    /// next connection.
    ///
    /// Errors: as [`RedisTarget::with_tls_files`] for a file that cannot be
    /// read or holds no PEM certificate or key.
    pub(crate) fn certs(&self) -> Result<Option<TlsCertificates>, FileRefused> {
        let files = &self.files;
        if files.ca.is_none() && files.cert.is_none() {
            return Ok(None);
        }
        let root_cert = files
            .ca
            .as_deref()
            .map(|path| {
                let ca = read(CA_FLAG, path)?;
                let certs = CertificateDer::pem_slice_iter(&ca)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| {
                        FileRefused::new(CA_FLAG, format!("{} is not PEM: {e}", path.display()))
                    })?;
                match certs.is_empty() {
                    true => Err(FileRefused::new(
                        CA_FLAG,
                        format!("{} holds no certificate", path.display()),
                    )),
                    false => Ok(ca),
                }
            })
            .transpose()?;
        let client_tls = match (&files.cert, &files.key) {
            (Some(cert), Some(key)) => Some(client_tls(cert, key)?),
            _ => None,
        };
        Ok(Some(TlsCertificates {
            client_tls,
            root_cert,
        }))
    }

    /// The data nodes' password: the password file's one line as it is now
    /// (a trailing newline dropped), else the URL's. Read at every
    /// connection open, so a rotated Secret is used by the next connection.
    ///
    /// Errors: as [`RedisTarget::with_password_file`].
    pub(crate) fn node_password(&self) -> Result<Option<String>, FileRefused> {
        let Some(path) = &self.files.password else {
            return Ok(self.password.clone());
        };
        let bytes = read(PASSWORD_FLAG, path)?;
        let text = String::from_utf8(bytes).map_err(|_| {
            FileRefused::new(PASSWORD_FLAG, format!("{} is not UTF-8", path.display()))
        })?;
        let line = text
            .strip_suffix('\n')
            .map(|t| t.strip_suffix('\r').unwrap_or(t))
            .unwrap_or(&text);
        if line.is_empty() {
            return Err(FileRefused::new(
                PASSWORD_FLAG,
                format!("{} is empty", path.display()),
            ));
        }
        if line.contains(['\n', '\r']) {
            return Err(FileRefused::new(
                PASSWORD_FLAG,
                format!(
                    "{} holds more than one line (expected the password alone)",
                    path.display()
                ),
            ));
        }
        Ok(Some(line.to_owned()))
    }
}

/// Reads a whole credential file; the error names the flag and the path.
fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, FileRefused> {
    std::fs::read(path)
        .map_err(|e| FileRefused::new(flag, format!("cannot read {}: {e}", path.display())))
}

/// The client certificate and its key, each checked to hold PEM of its kind.
fn client_tls(cert: &Path, key: &Path) -> Result<ClientTlsConfig, FileRefused> {
    let client_cert = read(CERT_FLAG, cert)?;
    let client_key = read(KEY_FLAG, key)?;
    PrivateKeyDer::from_pem_slice(&client_key).map_err(|e| {
        FileRefused::new(
            KEY_FLAG,
            format!("{} holds no private key: {e}", key.display()),
        )
    })?;
    if CertificateDer::pem_slice_iter(&client_cert)
        .next()
        .is_none()
    {
        return Err(FileRefused::new(
            CERT_FLAG,
            format!("{} holds no certificate", cert.display()),
        ));
    }
    Ok(ClientTlsConfig {
        client_cert,
        client_key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "s3cr";

    #[test]
    fn tls_files_need_rediss_and_pairs() {
        let dir = tempfile::tempdir().unwrap();
        let not_pem = dir.path().join("not.pem");
        std::fs::write(&not_pem, "not pem").unwrap();
        let refused = |target: RedisTarget, ca: Option<&Path>, cert: Option<&Path>| {
            target
                .with_tls_files(ca.map(Path::to_owned), cert.map(Path::to_owned), None)
                .expect_err("refused")
        };
        let plain = RedisTarget::parse("redis://h").unwrap();
        assert_eq!(refused(plain, Some(&not_pem), None).flag, CA_FLAG);
        let tls = RedisTarget::parse("rediss://h").unwrap();
        let bad = refused(tls.clone(), Some(&not_pem), None);
        assert_eq!(bad.flag, CA_FLAG);
        assert!(bad.reason.contains("holds no certificate"), "{bad}");
        let missing = refused(tls.clone(), Some(&dir.path().join("gone.pem")), None);
        assert!(missing.reason.starts_with("cannot read"), "{missing}");
        assert_eq!(refused(tls.clone(), None, Some(&not_pem)).flag, CERT_FLAG);
        let none = tls.with_tls_files(None, None, None).unwrap();
        assert!(none.certs().unwrap().is_none());
    }

    /// The password file's one line, read again at each call
    /// (a rotated Secret); refused when empty or of several lines, never
    /// with its content in the message.
    #[test]
    fn password_file_is_read_at_each_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("password");
        std::fs::write(&path, "s3cr-one\n").unwrap();
        let target = RedisTarget::parse("redis://user:url-pw@h")
            .unwrap()
            .with_password_file(Some(path.clone()))
            .unwrap();
        assert_eq!(target.node_password().unwrap().as_deref(), Some("s3cr-one"));
        std::fs::write(&path, "s3cr-two").unwrap();
        assert_eq!(target.node_password().unwrap().as_deref(), Some("s3cr-two"));
        for content in ["", "\n", "s3cr-a\ns3cr-b\n"] {
            std::fs::write(&path, content).unwrap();
            let err = target.node_password().unwrap_err();
            assert_eq!(err.flag, PASSWORD_FLAG);
            assert!(!err.to_string().contains(SECRET), "{err}");
        }
        std::fs::remove_file(&path).unwrap();
        assert!(target.node_password().is_err());
        let fresh = RedisTarget::parse("redis://h").unwrap();
        assert!(fresh.with_password_file(Some(path)).is_err());
        let url_only = RedisTarget::parse("redis://user:url-pw@h").unwrap();
        assert_eq!(url_only.node_password().unwrap().as_deref(), Some("url-pw"));
    }
}
