//! Who holds a lease: the identity (POD_IP, local IP or hostname) plus a
//! per-process nonce, so that two processes never share an owner string.

use std::fmt;

/// Where the identity came from, for the start-up log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IdentitySource {
    /// `--identity` / `SNOWLEASE_IDENTITY`.
    Flag,
    /// The `POD_IP` env var (Kubernetes downward API `status.podIP`).
    PodIp,
    /// The primary non-loopback local IP address.
    LocalIp,
    /// The host name.
    Hostname,
}

/// Resolves the identity once, first that exists: the flag, `POD_IP`, the
/// primary non-loopback local IP, the hostname (docs/worker.md, "Keys").
pub(crate) fn resolve_identity(flag: Option<&str>) -> (String, IdentitySource) {
    if let Some(identity) = flag.filter(|s| !s.is_empty()) {
        return (identity.to_owned(), IdentitySource::Flag);
    }
    if let Some(pod_ip) = std::env::var("POD_IP")
        .ok()
        .filter(|s| !s.trim().is_empty())
    {
        return (pod_ip.trim().to_owned(), IdentitySource::PodIp);
    }
    if let Ok(ip) = local_ip_address::local_ip()
        && !ip.is_loopback()
    {
        return (ip.to_string(), IdentitySource::LocalIp);
    }
    let host = hostname::get()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".to_owned());
    (host, IdentitySource::Hostname)
}

/// The identity part of an owner string (before the last `#`; all of it
/// when there is no `#`, as with keys written by other tools).
pub(crate) fn identity_of(owner: &str) -> &str {
    owner
        .rsplit_once('#')
        .map_or(owner, |(identity, _)| identity)
}

/// The value stored in a lease key: `<identity>#<nonce>`, nonce 64 random
/// bits in hex. Identity alone is not unique (a dead pod's IP is reused,
/// `hostNetwork` pods share one), hence the nonce.
#[derive(Clone, PartialEq, Eq)]
pub struct Owner(String);

impl Owner {
    /// A fresh owner string for this process.
    pub fn generate(identity: &str) -> Self {
        Self(format!("{identity}#{:016x}", rand::random::<u64>()))
    }

    /// An owner string recorded earlier (state file re-adoption).
    pub(crate) fn from_recorded(value: String) -> Self {
        Self(value)
    }

    /// The full string as stored in Redis.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The nonce part (after the last `#`), for names of this process only.
    pub(crate) fn nonce(&self) -> &str {
        self.0.rsplit_once('#').map_or("", |(_, nonce)| nonce)
    }

    /// The owner with the nonce shortened to 4 hex digits, for logs.
    pub(crate) fn redacted(&self) -> String {
        match self.0.rsplit_once('#') {
            Some((identity, nonce)) => {
                format!("{identity}#{}…", nonce.get(..4).unwrap_or(nonce))
            }
            None => self.0.clone(),
        }
    }
}

impl fmt::Debug for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Owner({})", self.redacted())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_strings_differ_per_process_and_logs_hide_the_nonce() {
        let a = Owner::generate("10.0.0.7");
        let b = Owner::generate("10.0.0.7");
        assert_ne!(a, b);
        let (_, nonce) = a.as_str().split_once('#').unwrap();
        assert_eq!(nonce.len(), 16);
        assert!(!format!("{a:?}").contains(nonce));
        assert!(a.redacted().starts_with("10.0.0.7#"));
    }

    #[test]
    fn flag_wins() {
        let (id, source) = resolve_identity(Some("pod-a"));
        assert_eq!((id.as_str(), source), ("pod-a", IdentitySource::Flag));
    }
}
