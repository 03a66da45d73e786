//! Flag pieces shared by every command: the Redis URL and log format flag
//! groups, the duration and range parsers, and [`ConfigError`], the one
//! error type of stage-two validation (exit 2, see [`crate::exit`]).
//!
//! Stage one is clap: syntax, env twins, defaults. Stage two is each
//! command's `validate()`: ranges and cross-field rules, checked before any
//! socket is bound or Redis is touched, so bad input exits 2 with nothing
//! half-written.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

pub use crate::config_error::ConfigError;
use crate::connection::RedisTarget;
use crate::eviction::EvictionArgs;
pub use crate::logging::LogFormat;

pub(crate) mod limit;
pub(crate) use limit::{CountLimit, DurationLimit, REDIS_TIMEOUT};

/// Parses `500ms`, `2s`, `1m`, `1h` (humantime syntax) into a [`Duration`].
///
/// Errors: a message with examples in the docs' form (`10s`, `500ms`) when
/// `text` is not a duration; a bare number is told to take a unit, a
/// negative one (from the environment: on the command line clap stops it
/// first, and [`explain`] adds the tip) that durations are not negative.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|_| {
        let number = text.trim();
        if number.starts_with('-') {
            "a duration is not negative; write a number and a unit, e.g. 10s, 500ms, 2m, 1h"
                .to_owned()
        } else if !number.is_empty() && number.chars().all(|c| c.is_ascii_digit()) {
            format!("a duration needs a unit, e.g. {number}s or {number}ms (units: ms, s, m, h)")
        } else {
            "not a duration; write a number and a unit, e.g. 10s, 500ms, 2m, 1h".to_owned()
        }
    })
}

/// A duration in the docs' form: one number and the largest unit that
/// divides it exactly (`25h`, `90m`, `1500ms`, `0s`); days only beyond one
/// (`24h`, `30d`). A value typed with one unit is shown as typed.
pub(crate) fn show_duration(d: Duration) -> String {
    const UNITS: [(u128, &str); 7] = [
        (86_400_000_000_000, "d"),
        (3_600_000_000_000, "h"),
        (60_000_000_000, "m"),
        (1_000_000_000, "s"),
        (1_000_000, "ms"),
        (1_000, "us"),
        (1, "ns"),
    ];
    let ns = d.as_nanos();
    if ns == 0 {
        return "0s".to_owned();
    }
    UNITS
        .iter()
        .filter(|(unit, name)| ns.is_multiple_of(*unit) && !(*name == "d" && ns == *unit))
        .map(|(unit, name)| format!("{}{name}", ns / unit))
        .next()
        .unwrap_or_else(|| format!("{ns}ns"))
}

/// Key prefixes of `worker`, `status` and `lock`: 1-128 printable ASCII characters without spaces or braces
/// (braces would form a Redis Cluster hash tag).
pub(crate) fn validate_key_prefix(prefix: &str) -> Result<(), ConfigError> {
    let ok = (1..=128).contains(&prefix.len())
        && prefix
            .chars()
            .all(|c| c.is_ascii_graphic() && c != '{' && c != '}');
    if ok {
        Ok(())
    } else {
        Err(ConfigError::new(
            "--key-prefix",
            "must be 1-128 printable ASCII characters without spaces or braces",
        ))
    }
}

/// The clap value parser of a whole-number flag whose range is `min..=max`:
/// text that is no whole number, or a number the flag's type cannot hold
/// (negative, or too large), is refused with the range (`-1 is outside
/// 0-1023`), where clap's own parser named its type's range (`0..=4294967295`)
/// or none. A number the type holds is left to stage two, which checks the
/// range with the flag's own message. Give the flag `allow_negative_numbers`
/// too, so that `--flag -1` reaches the parser instead of reading as a flag.
pub(crate) fn whole<T>(min: u64, max: u64) -> impl Fn(&str) -> Result<T, String> + Clone
where
    T: TryFrom<u64>,
{
    move |text: &str| {
        let text = text.trim();
        let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("not a whole number; allowed: {min}-{max}"));
        }
        text.parse::<u64>()
            .ok()
            .and_then(|n| T::try_from(n).ok())
            .ok_or_else(|| format!("{text} is outside {min}-{max}"))
    }
}

/// Checks `min <= value <= max`; the error names `flag` and the range, in
/// the docs' form (`25h is outside 1s-24h`).
pub fn check_range(
    flag: &'static str,
    value: Duration,
    min: Duration,
    max: Duration,
) -> Result<(), ConfigError> {
    if value < min || value > max {
        return Err(ConfigError::new(
            flag,
            format!(
                "{} is outside {}-{}",
                show_duration(value),
                show_duration(min),
                show_duration(max)
            ),
        ));
    }
    Ok(())
}

/// `--log-format`, shared by every long-running command.
#[derive(Debug, Clone, Copy, Args)]
pub struct LogArgs {
    /// Log format on stderr (the filter comes from SNOWLEASE_LOG, default `info`).
    #[arg(long, env = "SNOWLEASE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// `--redis-url` and its TLS / Sentinel companions, shared by every command
/// that talks to Redis (docs/operations.md, "Redis topologies").
#[derive(Debug, Clone, Default, Args)]
pub struct RedisUrlArg {
    /// Redis URL: `redis://[user:password@]host:port[,host:port...][/db]` (one server, or a
    /// Cluster detected by `INFO cluster`), `redis+sentinel://[user:password@]sentinel[:26379][,...]/<master>[/db]`,
    /// `redis+cluster://host:port[,...]`; `rediss...` for TLS. Percent-encode `@ # / ? :` in passwords.
    // hide_env_values: --help must not print a password from the env.
    #[arg(
        long,
        env = "REDIS_URL",
        hide_env_values = true,
        default_value = "redis://127.0.0.1:6379"
    )]
    pub redis_url: String,
    /// PEM file of the CA(s) that sign the Redis server's certificate (`rediss://`); without
    /// it the system trust store is used (SSL_CERT_FILE honoured). Read again at every
    /// connection open (a rotated CA bundle is followed without a restart).
    #[arg(long, env = "REDIS_CA_FILE")]
    pub redis_ca_file: Option<PathBuf>,
    /// PEM client certificate for servers that require one (with --redis-key-file). Read
    /// again at every connection open.
    #[arg(long, env = "REDIS_CERT_FILE")]
    pub redis_cert_file: Option<PathBuf>,
    /// PEM private key of --redis-cert-file. Read again at every connection open.
    #[arg(long, env = "REDIS_KEY_FILE")]
    pub redis_key_file: Option<PathBuf>,
    /// File holding the data nodes' password alone on one line (trailing newline dropped),
    /// e.g. a mounted Kubernetes Secret; overrides the URL's password. Read again at every
    /// connection open (a rotated password is followed without a restart).
    #[arg(long, env = "REDIS_PASSWORD_FILE")]
    pub redis_password_file: Option<PathBuf>,
    /// Sentinel user name (`redis+sentinel://`), when the URL's `?sentinel_username=` is not set.
    #[arg(long, env = "REDIS_SENTINEL_USERNAME")]
    pub redis_sentinel_username: Option<String>,
    /// Sentinel password (`redis+sentinel://`), when the URL's `?sentinel_password=` is not set.
    #[arg(long, env = "REDIS_SENTINEL_PASSWORD", hide_env_values = true)]
    pub redis_sentinel_password: Option<String>,
}

/// Where Redis is, and how this process logs: the flags every one-shot
/// command that talks to Redis shares (`pool`, `budget`).
#[derive(Args)]
pub(crate) struct RedisArgs {
    /// Where Redis is.
    #[command(flatten)]
    pub redis: RedisUrlArg,

    /// Timeout of one Redis call (10ms-60s).
    #[arg(long, env = "SNOWLEASE_REDIS_TIMEOUT", default_value = REDIS_TIMEOUT.default, value_parser = parse_duration)]
    pub redis_timeout: Duration,

    /// `--allow-evicting-redis`.
    #[command(flatten)]
    pub eviction: EvictionArgs,

    /// Log format.
    #[command(flatten)]
    pub log: LogArgs,
}

impl RedisUrlArg {
    /// Parses the URL and reads the TLS and password files once, to refuse
    /// bad ones before anything starts (they are read again at every
    /// connection open); the error names the flag and never shows the URL
    /// or the password.
    pub(crate) fn target(&self) -> Result<RedisTarget, ConfigError> {
        RedisTarget::parse(&self.redis_url)
            .map_err(|reason| ConfigError::new("--redis-url", reason))?
            .with_sentinel_auth(
                self.redis_sentinel_username.clone(),
                self.redis_sentinel_password.clone(),
            )
            .with_tls_files(
                self.redis_ca_file.clone(),
                self.redis_cert_file.clone(),
                self.redis_key_file.clone(),
            )
            .and_then(|target| target.with_password_file(self.redis_password_file.clone()))
            .map_err(|refused| ConfigError::new(refused.flag, refused.reason))
    }
}

/// Writes `text` and a newline to stdout. A closed stdout (`cmd | true`) is
/// an error (exit 1), never a panic as `println!` would make it.
///
/// Errors: the write error, named as stdout's.
pub fn stdout_line(text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}")
        .and_then(|()| out.flush())
        .map_err(|err| anyhow::anyhow!("cannot write the result to stdout: {err}"))
}

/// Rewrites a clap parse error before it is printed (the one place that
/// renders them, called by `main`): a value from an environment variable
/// names the variable, not only the flag clap reports; the usage line is
/// the command's own (clap lists the flags given as if required); `--listen`
/// gets an example; a command without `--` before it gets a hint.
/// `root` is the built top command, `argv` the arguments without `argv[0]`.
pub fn explain(mut err: clap::Error, root: &clap::Command, argv: &[String]) -> clap::Error {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let leaf = leaf_command(root, argv);
    let given = |arg: &clap::Arg| {
        let long = arg.get_long().map(|l| format!("--{l}"));
        let short = arg.get_short().map(|c| format!("-{c}"));
        argv.iter().take_while(|a| *a != "--").any(|a| {
            let flag = a.split('=').next().unwrap_or(a);
            Some(flag) == long.as_deref() || Some(flag) == short.as_deref()
        })
    };
    let mut tips: Vec<String> = Vec::new();
    if let Some(ContextValue::String(shown)) = err.get(ContextKind::InvalidArg).cloned() {
        let long = shown.split(' ').next().unwrap_or("").to_owned();
        let arg = leaf
            .get_arguments()
            .find(|a| a.get_long().is_some_and(|l| format!("--{l}") == long));
        if let Some(env) = arg.filter(|a| !given(a)).and_then(clap::Arg::get_env) {
            let env = env.to_string_lossy();
            let named = format!("{env}, the environment variable of {long}");
            err.insert(ContextKind::InvalidArg, ContextValue::String(named));
        }
        if long == "--listen" {
            tips.push(
                "write host:port, e.g. 0.0.0.0:7391 (every interface) or 127.0.0.1:7391".into(),
            );
        }
    }
    if let Some(tip) = negative_duration(&err, leaf, argv) {
        tips.push(tip);
    }
    if let (ErrorKind::UnknownArgument, "exec" | "lock", Some(ContextValue::String(word))) = (
        err.kind(),
        leaf.get_name(),
        err.get(ContextKind::InvalidArg),
    ) && !word.starts_with('-')
    {
        let name = leaf.get_name();
        tips.push(format!(
            "put `--` before the command and its arguments: snowlease {name} [OPTIONS] -- {word} ..."
        ));
    }
    if !tips.is_empty() {
        let tips = tips
            .into_iter()
            .map(clap::builder::StyledStr::from)
            .collect();
        err.insert(ContextKind::Suggested, ContextValue::StyledStrs(tips));
    }
    if err.get(ContextKind::Usage).is_some() {
        let usage = leaf.clone().render_usage();
        err.insert(ContextKind::Usage, ContextValue::StyledStr(usage));
    }
    err
}

/// A tip for a negative duration: clap reads `--ttl -1s` as the flag without
/// a value followed by the unknown flag `-1` (a duration flag does not take
/// values starting with `-`, so that `--ttl --` and `--ttl --other` still
/// say that the value is missing).
fn negative_duration(err: &clap::Error, leaf: &clap::Command, argv: &[String]) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let (ErrorKind::UnknownArgument, Some(ContextValue::String(word))) =
        (err.kind(), err.get(ContextKind::InvalidArg))
    else {
        return None;
    };
    let digits = word.strip_prefix('-')?;
    if !digits.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    let at = argv.iter().position(|a| a.starts_with(word.as_str()))?;
    let flag = argv.get(at.checked_sub(1)?)?;
    let arg = leaf
        .get_arguments()
        .find(|a| a.get_long().is_some_and(|l| format!("--{l}") == *flag))?;
    (arg.get_value_parser().type_id() == std::any::TypeId::of::<Duration>()).then(|| {
        format!(
            "{flag} takes a duration, which is not negative: a number and a unit, e.g. 10s, 500ms"
        )
    })
}

/// The subcommand `argv` names (`root` when none), walking names up to `--`.
fn leaf_command<'a>(root: &'a clap::Command, argv: &[String]) -> &'a clap::Command {
    let mut leaf = root;
    for arg in argv.iter().take_while(|a| *a != "--") {
        if let Some(sub) = leaf.find_subcommand(arg) {
            leaf = sub;
        }
    }
    leaf
}

/// The flags of the command line's leaf subcommand whose value came from the environment
/// (clap's `ValueSource::EnvVariable`), with their variables: what a validation error names
/// instead of the flag. Taken right after parsing so that clap's command tree and matches
/// (tens of KiB of heap) are freed before the runtime starts, not kept for the whole run.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct EnvSources(Vec<(String, String)>);

impl EnvSources {
    /// Reads them from the parsed `matches` of `root`.
    pub fn of(root: &clap::Command, matches: &clap::ArgMatches) -> EnvSources {
        let (mut command, mut matches) = (root, matches);
        while let Some((name, sub)) = matches.subcommand() {
            match command.find_subcommand(name) {
                Some(found) => (command, matches) = (found, sub),
                None => return EnvSources::default(),
            }
        }
        let from_env =
            |id: &str| matches.value_source(id) == Some(clap::parser::ValueSource::EnvVariable);
        EnvSources(
            command
                .get_arguments()
                .filter(|a| from_env(a.get_id().as_str()))
                .filter_map(|a| {
                    let env = a.get_env()?.to_string_lossy().into_owned();
                    Some((format!("--{}", a.get_long()?), env))
                })
                .collect(),
        )
    }

    /// The environment variable `flag` (e.g. `--ttl`) was read from, if it was.
    pub fn env_of(&self, flag: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(f, _)| f == flag)
            .map(|(_, env)| env.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Numbers the type holds pass (range left to stage two); anything else
    /// names the range.
    #[test]
    fn whole_numbers_pass_and_the_rest_names_the_range() {
        let parse = whole::<u16>(0, 1023);
        assert_eq!(parse("7"), Ok(7));
        assert_eq!(parse("+7"), Ok(7));
        assert_eq!(parse("2000"), Ok(2000));
        assert_eq!(parse("65536"), Err("65536 is outside 0-1023".to_owned()));
        assert_eq!(parse("-0"), Err("-0 is outside 0-1023".to_owned()));
        for bad in ["", "-", "1.5", "1e3", "0x10", "seven"] {
            assert_eq!(
                parse(bad),
                Err("not a whole number; allowed: 0-1023".to_owned())
            );
        }
    }

    #[test]
    fn durations_accept_ms_s_m() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert!(parse_duration("soon").is_err());
    }

    /// A bare number is told to take a unit, with the docs' spelling
    /// (`10s`), not humantime's (`10sec`).
    #[test]
    fn a_bare_number_is_told_the_docs_units() {
        let err = parse_duration("10").unwrap_err();
        assert!(err.contains("10s") && err.contains("10ms"), "{err}");
        assert!(
            !err.contains("sec") && !err.contains("for example"),
            "{err}"
        );
        let err = parse_duration("soon").unwrap_err();
        assert!(err.contains("10s, 500ms"), "{err}");
    }

    #[test]
    fn durations_are_shown_as_the_docs_write_them() {
        for (d, shown) in [
            (Duration::ZERO, "0s"),
            (Duration::from_millis(500), "500ms"),
            (Duration::from_millis(1500), "1500ms"),
            (Duration::from_micros(1500), "1500us"),
            (Duration::from_secs(10), "10s"),
            (Duration::from_secs(90 * 60), "90m"),
            (Duration::from_secs(3600), "1h"),
            (Duration::from_secs(86_400), "24h"),
            (Duration::from_secs(25 * 3600), "25h"),
            (Duration::from_secs(30 * 86_400), "30d"),
        ] {
            assert_eq!(show_duration(d), shown);
        }
    }

    /// `--claim-timeout 25h`: the value as typed and the range as the docs
    /// write it (humantime said "1day 1h is outside 1s-1day").
    #[test]
    fn out_of_range_values_are_shown_as_typed() {
        let err = check_range(
            "--claim-timeout",
            parse_duration("25h").unwrap(),
            Duration::from_secs(1),
            Duration::from_secs(86_400),
        )
        .unwrap_err();
        assert_eq!(err.reason, "25h is outside 1s-24h");
    }

    #[test]
    fn ranges_name_the_flag_and_both_bounds() {
        let err = check_range(
            "--ttl",
            Duration::ZERO,
            Duration::from_secs(1),
            Duration::from_secs(60),
        )
        .unwrap_err();
        assert_eq!(err.flag, "--ttl");
        assert!(err.reason.contains("1s-1m"), "{}", err.reason);
        check_range(
            "--ttl",
            Duration::from_secs(60),
            Duration::from_secs(1),
            Duration::from_secs(60),
        )
        .expect("bounds are inclusive");
    }
}
