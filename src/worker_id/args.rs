//! Flags of worker-ID mode (`worker`, and the app-key group that `status`
//! shares) and their validation into a typed [`WorkerConfig`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::cli::{
    ConfigError, LogArgs, RedisUrlArg, parse_duration, show_duration, validate_key_prefix, whole,
};
use crate::connection::RedisTarget;
use crate::eviction::EvictionArgs;
use crate::http::{ConnectionLimits, HttpArgs};
use crate::worker_id::keys::{LeaseKeys, MintKeys};
use crate::worker_id::mint::MintParams;
use crate::worker_id::mint::args::{MintArgs, MintConfig};
use crate::worker_id::range::WorkerRange;
use crate::worker_id::state::Mode;

pub(crate) use crate::published::DEFAULT_OUTPUT_FILE;

/// Default `--listen` of the sidecar. Port 7391: the sidecar shares the pod's network
/// namespace with the app, so not 8080/8000/3000/5000 (app defaults), not 9100-9999 (Prometheus
/// exporters), 15000-15090 (Istio/Envoy), 4140-4191 (Linkerd), 3500/50001 (Dapr), 8200 (Vault
/// agent), 8300-8600 (Consul), 4317/4318/8888/13133 (OpenTelemetry collector), 9901 (Envoy
/// admin); below the ephemeral (32768+) and NodePort (30000-32767) ranges. Manifests, Dockerfile
/// and docs/ must name the same port (`scripts/validate_k8s.py` reads it from here).
pub(crate) const DEFAULT_LISTEN: &str = "[::]:7391";

use super::limits::{
    CLAIM_TIMEOUT, DEFAULT_KEY_PREFIX, DEFAULT_MAX_WORKER_ID, HANDOVER_DELAY, MAX_CLOCK_SKEW,
    MAX_WORKER_ID, MIN_REPLICAS_ACK, RENEW_INTERVAL, RETRIES, TTL, WORKER_ID_LIMIT,
};

/// What the worker does after it lost its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnLoss {
    /// Unpublish, then claim any free ID again and publish the new one.
    Reclaim,
    /// Unpublish and exit with code 4.
    Exit,
}

/// Which keys: `--app`, `--key-prefix`, `--max-worker-id` or `--worker-ids`,
/// shared by `worker`, `status` and `guard open` (they must name the same keys).
#[derive(Debug, Clone, Args)]
pub struct AppKeysArgs {
    /// Application name: 1-64 chars of [A-Za-z0-9_.-]; part of every lease key.
    #[arg(long, env = APP_ENV)]
    pub app: String,

    /// Prefix of lease keys: the key is <prefix><app>:<id>.
    #[arg(long, env = "SNOWLEASE_KEY_PREFIX", default_value = DEFAULT_KEY_PREFIX)]
    pub key_prefix: String,

    /// Highest worker ID handed out (0-1023); IDs run from 0 to this value (the same as --worker-ids 0-N).
    #[arg(long, env = "SNOWLEASE_MAX_WORKER_ID", default_value_t = MAX_WORKER_ID.default,
        value_parser = whole::<u32>(MAX_WORKER_ID.min.into(), MAX_WORKER_ID.max.into()), allow_negative_numbers = true)]
    pub max_worker_id: u32,

    /// Worker IDs handed out, LOW-HIGH within 0-1023, e.g. 512-1023 for one region's share of the IDs; instead of --max-worker-id.
    #[arg(
        long,
        env = "SNOWLEASE_WORKER_IDS",
        value_name = "LOW-HIGH",
        conflicts_with = "max_worker_id",
        // `-1-3` is a bad range, not an unknown flag `-1`: WorkerRange::parse names the flag
        // and 0-1023.
        allow_hyphen_values = true
    )]
    pub worker_ids: Option<String>,
}

/// The validated [`AppKeysArgs`].
#[derive(Debug, Clone)]
pub(crate) struct AppKeys {
    /// Application name.
    pub app: String,
    /// Key prefix, e.g. `snowflake:worker:`.
    pub key_prefix: String,
    /// The IDs handed out: `--worker-ids`, else `0-(--max-worker-id)`.
    pub worker_ids: WorkerRange,
}

impl AppKeysArgs {
    /// Checks the flags; the first violation names its flag. clap refuses
    /// `--worker-ids` and `--max-worker-id` (or their env twins) given at once.
    pub(crate) fn validate(&self) -> Result<AppKeys, ConfigError> {
        validate_app(&self.app)?;
        validate_key_prefix(&self.key_prefix)?;
        let worker_ids = match &self.worker_ids {
            Some(text) => WorkerRange::parse(text)?,
            None => WorkerRange::up_to(validate_max_worker_id(self.max_worker_id)?),
        };
        Ok(AppKeys {
            app: self.app.clone(),
            key_prefix: self.key_prefix.clone(),
            worker_ids,
        })
    }
}

/// Flags of `snowlease worker`; see docs/flags.md for the long form.
#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    /// Which keys: app, prefix, ID range.
    #[command(flatten)]
    pub keys: AppKeysArgs,

    /// Where Redis is.
    #[command(flatten)]
    pub redis: RedisUrlArg,

    /// Owner identity [default: POD_IP env, else primary local IP, else hostname].
    #[arg(long, env = "SNOWLEASE_IDENTITY")]
    pub identity: Option<String>,

    /// Lease TTL in Redis (PX): 1s-1h, e.g. 120s.
    #[arg(long, env = "SNOWLEASE_TTL", default_value = TTL.default, value_parser = parse_duration)]
    pub ttl: Duration,

    /// Time between renewals: 100ms-ttl/2.
    #[arg(long, env = "SNOWLEASE_RENEW_INTERVAL", default_value = RENEW_INTERVAL.default, value_parser = parse_duration)]
    pub renew_interval: Duration,

    /// Retries of a failed renew round (0-10), with doubling backoff.
    #[arg(long, env = "SNOWLEASE_RETRIES", default_value_t = RETRIES.default,
        value_parser = whole::<u32>(RETRIES.min.into(), RETRIES.max.into()), allow_negative_numbers = true)]
    pub retries: u32,

    /// File the worker ID is published to (decimal ID and a newline).
    #[arg(
        long,
        env = "SNOWLEASE_OUTPUT_FILE",
        default_value = DEFAULT_OUTPUT_FILE
    )]
    pub output_file: PathBuf,

    /// Address of the HTTP server (/id, /livez, /readyz, /metrics); `[::]:PORT` answers on IPv6 and IPv4 (IPv4 only on hosts without IPv6).
    #[arg(long, env = "SNOWLEASE_LISTEN", default_value = DEFAULT_LISTEN)]
    pub listen: SocketAddr,

    /// `--max-connections`, `--http-header-timeout`.
    #[command(flatten)]
    pub http: HttpArgs,

    /// What to do when the lease is lost: reclaim another ID, or exit with code 4.
    #[arg(long, env = "SNOWLEASE_ON_LOSS", value_enum, default_value_t = OnLoss::Reclaim)]
    pub on_loss: OnLoss,

    /// Give up (exit 3) when no ID could be claimed for this long (1s-24h).
    #[arg(long, env = "SNOWLEASE_CLAIM_TIMEOUT", default_value = CLAIM_TIMEOUT.default, value_parser = parse_duration)]
    pub claim_timeout: Duration,

    /// At SIGTERM, keep the released ID blocked this long (100ms-60s): at least twice the clock skew you allow between nodes.
    #[arg(long, env = "SNOWLEASE_HANDOVER_DELAY", default_value = HANDOVER_DELAY.default, value_parser = parse_duration)]
    pub handover_delay: Duration,

    /// Publish a claimed or renewed ID only once this many replicas acknowledged the write (`WAIT`), 0-16; 0: do not wait. Needs `+wait` in the ACL when >= 1.
    #[arg(long, env = "SNOWLEASE_MIN_REPLICAS_ACK", default_value_t = MIN_REPLICAS_ACK.default,
        value_parser = whole::<u32>(MIN_REPLICAS_ACK.min.into(), MIN_REPLICAS_ACK.max.into()), allow_negative_numbers = true)]
    pub min_replicas_ack: u32,

    /// Largest difference between this node's wall clock and Redis' TIME (10ms-60s) at which a newly claimed ID is published.
    #[arg(long, env = "SNOWLEASE_MAX_CLOCK_SKEW", default_value = MAX_CLOCK_SKEW.default, value_parser = parse_duration)]
    pub max_clock_skew: Duration,

    /// `--allow-evicting-redis`.
    #[command(flatten)]
    pub eviction: EvictionArgs,

    /// `--mint` and its flags.
    #[command(flatten)]
    pub mint: MintArgs,

    /// Log format.
    #[command(flatten)]
    pub log: LogArgs,
}

/// Validated settings of the worker mode.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Application name (validated).
    pub app: String,
    /// Where Redis is, with the URL kept out of logs.
    pub redis: RedisTarget,
    /// Explicit identity, if given; else resolved at start.
    pub identity: Option<String>,
    /// Lease timing and ID range.
    pub lease: LeaseSettings,
    /// File the ID is published to; the state file sits beside it.
    pub output_file: PathBuf,
    /// HTTP listen address.
    pub listen: SocketAddr,
    /// Connection cap and header timeout of the HTTP server.
    pub http: ConnectionLimits,
    /// Behaviour after a loss.
    pub on_loss: OnLoss,
    /// How long to keep trying to claim before exit 3.
    pub claim_timeout: Duration,
    /// Hold leases even on a Redis that may evict keys.
    pub allow_evicting_redis: bool,
    /// Expiry of the tombstone left at a SIGTERM release, 100 ms-60 s
    /// (docs/worker.md, "ID handover": a generator that gets the ID next must not
    /// mint in a millisecond the previous holder may have used).
    pub handover_delay: Duration,
    /// Replicas that must acknowledge each claim and renew before the ID
    /// is published or stays published (`WAIT`), 0-16 (docs/worker.md,
    /// "Guarantees": a failover to an acknowledging replica keeps the key).
    pub min_replicas_ack: u32,
    /// Largest |wall clock - Redis TIME| at which a newly claimed ID is
    /// published, 10 ms-60 s (docs/worker.md, "ID handover").
    pub max_clock_skew: Duration,
    /// Mint mode (`--mint`): the sidecar mints the IDs; `None` publishes the worker ID.
    pub mint: Option<MintConfig>,
}

impl WorkerConfig {
    /// Publishing the worker ID, or minting with it (`--mint`).
    pub(crate) fn mode(&self) -> Mode {
        match self.mint {
            Some(_) => Mode::Mint,
            None => Mode::Publish,
        }
    }

    /// The parameters of mint mode; `None` without `--mint`.
    pub(crate) fn mint_params(&self) -> Option<MintParams> {
        let (prefix, app) = (&self.lease.key_prefix, &self.app);
        Some(MintParams {
            config: self.mint.clone()?,
            lease_keys: LeaseKeys::new(prefix, app),
            mint_keys: MintKeys::new(prefix, app),
            call_timeout: self.lease.call_timeout(),
            min_replicas_ack: self.min_replicas_ack,
            max_clock_skew: self.max_clock_skew,
            limits: self.http,
        })
    }
}

/// The lease parameters the worker loop needs, nothing else.
#[derive(Debug, Clone)]
pub struct LeaseSettings {
    /// Key prefix, e.g. `snowflake:worker:`.
    pub key_prefix: String,
    /// The IDs claimed (`--worker-ids`, else `0-(--max-worker-id)`).
    pub worker_ids: WorkerRange,
    /// PX of the lease key.
    pub ttl: Duration,
    /// Time between renewals (<= ttl/2).
    pub renew_interval: Duration,
    /// Retries of a failed renew round.
    pub retries: u32,
}

impl Default for LeaseSettings {
    /// The CLI's defaults (the `limits` table): prefix `snowflake:worker:`,
    /// IDs 0-31, TTL 120 s, renew every 60 s, 3 retries.
    fn default() -> Self {
        Self {
            key_prefix: DEFAULT_KEY_PREFIX.into(),
            worker_ids: WorkerRange::up_to(DEFAULT_MAX_WORKER_ID),
            ttl: TTL.default_value(),
            renew_interval: RENEW_INTERVAL.default_value(),
            retries: RETRIES.default,
        }
    }
}

impl LeaseSettings {
    /// Timeout of one Redis call: a quarter of the renew interval, within
    /// 100 ms-5 s, so a whole round of retries fits before the deadline.
    pub(crate) fn call_timeout(&self) -> Duration {
        (self.renew_interval / 4).clamp(Duration::from_millis(100), Duration::from_secs(5))
    }
}

impl WorkerArgs {
    /// Checks ranges and cross-field rules; the first violation names its flag.
    pub fn validate(&self) -> Result<WorkerConfig, ConfigError> {
        let keys = self.keys.validate()?;
        let redis = self.redis.target()?;
        if let Some(identity) = &self.identity {
            validate_identity(identity)?;
        }
        TTL.check(self.ttl)?;
        if self.renew_interval < RENEW_INTERVAL.min || self.renew_interval > self.ttl / 2 {
            return Err(ConfigError::new(
                RENEW_INTERVAL.flag,
                format!(
                    "{} is outside {}-ttl/2 ({})",
                    show_duration(self.renew_interval),
                    show_duration(RENEW_INTERVAL.min),
                    show_duration(self.ttl / 2)
                ),
            ));
        }
        RETRIES.check(self.retries)?;
        CLAIM_TIMEOUT.check(self.claim_timeout)?;
        HANDOVER_DELAY.check(self.handover_delay)?;
        MIN_REPLICAS_ACK.check(self.min_replicas_ack)?;
        MAX_CLOCK_SKEW.check(self.max_clock_skew)?;
        if self.output_file.file_name().is_none() {
            return Err(ConfigError::new("--output-file", "must name a file"));
        }
        let http = self.http.validate()?;
        let mint = self
            .mint
            .validate(keys.worker_ids, self.ttl, self.max_clock_skew)?;
        Ok(WorkerConfig {
            app: keys.app,
            redis,
            identity: self.identity.clone(),
            lease: LeaseSettings {
                key_prefix: keys.key_prefix,
                worker_ids: keys.worker_ids,
                ttl: self.ttl,
                renew_interval: self.renew_interval,
                retries: self.retries,
            },
            output_file: self.output_file.clone(),
            listen: self.listen,
            http,
            on_loss: self.on_loss,
            claim_timeout: self.claim_timeout,
            allow_evicting_redis: self.eviction.allow_evicting_redis,
            handover_delay: self.handover_delay,
            min_replicas_ack: self.min_replicas_ack,
            max_clock_skew: self.max_clock_skew,
            mint,
        })
    }
}

/// Highest worker ID: 0-1023, the 10 worker bits of a Snowflake ID.
pub(crate) fn validate_max_worker_id(value: u32) -> Result<u16, ConfigError> {
    u16::try_from(value)
        .ok()
        .filter(|id| *id <= WORKER_ID_LIMIT)
        .ok_or_else(|| {
            ConfigError::new(
                MAX_WORKER_ID.flag,
                format!(
                    "{value} is outside {}-{} (10 bits)",
                    MAX_WORKER_ID.min, MAX_WORKER_ID.max
                ),
            )
        })
}

/// The env twin of `--app`.
const APP_ENV: &str = "SNOWLEASE_APP";

/// App names: 1-64 chars of `[A-Za-z0-9_.-]` (the key layout of the existing plugin), so a name can
/// never reach into another app's keys or a hash tag.
///
/// Errors: `--app` with the allowed form; an empty name set through `SNOWLEASE_APP` says so and
/// where the Kustomize Component takes it from (a downward-API field of a missing annotation
/// is an empty string).
pub(crate) fn validate_app(app: &str) -> Result<(), ConfigError> {
    let ok = (1..=64).contains(&app.len())
        && app
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        return Ok(());
    }
    let mut reason = format!("{app:?} must be 1-64 characters of [A-Za-z0-9_.-]");
    // clap takes the flag over the env var, so an empty env var is the source only when it
    // is the value; `--app ""` beside it is told the same, which fits too.
    if app.is_empty() && std::env::var_os(APP_ENV).is_some_and(|v| v.is_empty()) {
        reason = format!(
            "{reason}; it came from the environment variable {APP_ENV}, which is set but empty \
             (in Kubernetes: k8s/components/snowlease sets it from the pod annotation \
             snowlease/app, copied from the workload's; a missing annotation or a label \
             read through the downward API that the pod lacks gives an empty value)"
        );
    }
    Err(ConfigError::new("--app", reason))
}

fn validate_identity(identity: &str) -> Result<(), ConfigError> {
    let ok = (1..=200).contains(&identity.len())
        && identity.chars().all(|c| c.is_ascii_graphic() && c != '#');
    if ok {
        Ok(())
    } else {
        Err(ConfigError::new(
            "--identity",
            "must be 1-200 printable ASCII characters without spaces or '#'",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        worker: WorkerArgs,
    }

    fn args(extra: &[&str]) -> WorkerArgs {
        let mut argv = vec!["snowlease"];
        if !extra.contains(&"--app") {
            argv.extend(["--app", "orders"]);
        }
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv).expect("parses").worker
    }

    #[test]
    fn defaults_validate() {
        let config = args(&[]).validate().expect("defaults are valid");
        assert_eq!(config.lease.worker_ids, WorkerRange::up_to(31));
        assert_eq!(config.lease.ttl, Duration::from_secs(120));
        assert_eq!(config.lease.renew_interval, Duration::from_secs(60));
        // IPv6-only pods: the kubelet probes the pod IP, which may be IPv6.
        assert!(
            config.listen.is_ipv6() && config.listen.ip().is_unspecified(),
            "{}",
            config.listen
        );
    }

    #[test]
    fn renew_interval_above_half_ttl_is_refused() {
        let err = args(&["--ttl", "2s", "--renew-interval", "1001ms"])
            .validate()
            .unwrap_err();
        assert_eq!(err.flag, "--renew-interval");
        args(&["--ttl", "2s", "--renew-interval", "1s"])
            .validate()
            .expect("exactly ttl/2 is allowed");
    }

    #[test]
    fn renew_interval_below_100ms_is_refused() {
        for short in ["1ns", "99ms"] {
            let err = args(&["--ttl", "2s", "--renew-interval", short])
                .validate()
                .unwrap_err();
            assert_eq!(err.flag, "--renew-interval", "{short}");
            assert!(err.reason.contains("100ms"), "{}", err.reason);
        }
        args(&["--ttl", "2s", "--renew-interval", "100ms"])
            .validate()
            .expect("100ms is allowed");
    }

    #[test]
    fn out_of_range_values_name_their_flag() {
        let cases: [(&[&str], &str); 16] = [
            (&["--worker-ids", "512-1024"], "--worker-ids"),
            (&["--worker-ids", "9-3"], "--worker-ids"),
            (&["--worker-ids", "x"], "--worker-ids"),
            (&["--max-connections", "0"], "--max-connections"),
            (&["--max-connections", "65537"], "--max-connections"),
            (&["--http-header-timeout", "99ms"], "--http-header-timeout"),
            (&["--http-header-timeout", "11m"], "--http-header-timeout"),
            (&["--min-replicas-ack", "17"], "--min-replicas-ack"),
            (&["--max-clock-skew", "9ms"], "--max-clock-skew"),
            (&["--max-clock-skew", "61s"], "--max-clock-skew"),
            (&["--handover-delay", "99ms"], "--handover-delay"),
            (&["--ttl", "0s"], "--ttl"),
            (&["--max-worker-id", "1024"], "--max-worker-id"),
            (&["--app", "a:b"], "--app"),
            (&["--app", "a b"], "--app"),
            (&["--redis-url", "http://x"], "--redis-url"),
        ];
        for (extra, flag) in cases {
            let err = args(extra).validate().unwrap_err();
            assert_eq!(err.flag, flag, "{extra:?}");
        }
    }

    /// `--worker-ids` sets the range; `--max-worker-id N` is `0-N`; both at once are refused
    /// by clap, naming both flags.
    #[test]
    fn worker_ids_or_max_worker_id_but_not_both() {
        let config = args(&["--worker-ids", "512-1023"]).validate().unwrap();
        assert_eq!(
            config.lease.worker_ids,
            WorkerRange::new(512, 1023).unwrap()
        );
        let config = args(&["--max-worker-id", "99"]).validate().unwrap();
        assert_eq!(config.lease.worker_ids, WorkerRange::new(0, 99).unwrap());
        let argv = [
            "snowlease",
            "--app",
            "a",
            "--worker-ids",
            "0-9",
            "--max-worker-id",
            "9",
        ];
        let err = Cli::try_parse_from(argv).err().expect("refused");
        assert_eq!(err.kind(), clap::error::ErrorKind::ArgumentConflict);
        let text = err.to_string();
        assert!(
            text.contains("--worker-ids") && text.contains("--max-worker-id"),
            "{text}"
        );
    }
}
