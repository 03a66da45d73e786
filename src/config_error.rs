//! The error of stage-two validation: a value outside its allowed range,
//! naming its flag (exit 2). Apart from `cli` so that `logging`, which
//! refuses a bad `SNOWLEASE_LOG` with it, needs nothing else of the CLI.

/// A configuration value outside its allowed range; names the flag.
#[derive(Debug, thiserror::Error)]
#[error("invalid value for {flag}: {reason}")]
pub struct ConfigError {
    /// The flag, as typed on the command line (e.g. `--ttl`).
    pub flag: &'static str,
    /// What is wrong and which values are allowed.
    pub reason: String,
}

impl ConfigError {
    pub(crate) fn new(flag: &'static str, reason: impl Into<String>) -> Self {
        Self {
            flag,
            reason: reason.into(),
        }
    }
}
