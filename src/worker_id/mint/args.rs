//! The flags of mint mode (`snowlease worker --mint`), validated into a [`MintConfig`]:
//! the ID layout and epoch, the unix socket, and the reservation window (docs/worker.md,
//! "Mint mode").

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::layout::{DEFAULT_EPOCH_MS, DEFAULT_LAYOUT, Epoch, IdLayout, wall_now_ms};
use super::minter::MintWindow;
use crate::cli::{parse_duration, show_duration, whole};
use crate::config_error::ConfigError;
use crate::worker_id::limits::MINT_WINDOW;
use crate::worker_id::range::WorkerRange;

/// The largest `--datacenter-id` any layout takes: 16 datacenter bits. A layout with fewer
/// bits takes less (`IdLayout::with_datacenter_id` says how much).
pub(crate) const DATACENTER_ID_MAX: u64 = 65_535;

/// Flags of mint mode, part of `snowlease worker`.
#[derive(Debug, Clone, Args)]
pub struct MintArgs {
    /// Mint the Snowflake IDs here (`GET /next`) instead of publishing the worker ID to the app.
    #[arg(long, env = "SNOWLEASE_MINT")]
    pub mint: bool,

    /// Serve `GET /next` on this unix socket (mode 0660), e.g. on a volume the pod shares; then only here, not on --listen.
    #[arg(long, env = "SNOWLEASE_MINT_SOCKET", requires = "mint")]
    pub mint_socket: Option<PathBuf>,

    /// With --mint-socket, serve `GET /next` on --listen too (any client that reaches the port mints with this worker ID).
    #[arg(long, env = "SNOWLEASE_NEXT_ON_LISTEN", requires = "mint_socket")]
    pub next_on_listen: bool,

    /// Bits of an ID, TIMESTAMP:WORKER:SEQUENCE or TIMESTAMP:DATACENTER:WORKER:SEQUENCE (e.g. 41:5:5:12), each at least 1 (datacenter 0-16), together at most 63.
    #[arg(long, env = "SNOWLEASE_ID_LAYOUT", default_value = DEFAULT_LAYOUT, requires = "mint")]
    pub id_layout: String,

    /// With --mint: datacenter ID put into every minted ID, 0 to 2^D-1 for the D datacenter bits of --id-layout (only 0 without them); fixed for the app like the layout.
    #[arg(long, env = "SNOWLEASE_DATACENTER_ID", default_value_t = 0, requires = "mint",
        value_parser = whole::<u16>(0, DATACENTER_ID_MAX), allow_negative_numbers = true)]
    pub datacenter_id: u16,

    /// Where timestamps count from: RFC 3339 or Unix ms, not in the future [default: Twitter's].
    #[arg(long, env = "SNOWLEASE_EPOCH", requires = "mint")]
    pub epoch: Option<String>,

    /// Reserve timestamps this far ahead of the clock in Redis (100ms-60s; below --ttl - --max-clock-skew).
    #[arg(long, env = "SNOWLEASE_MINT_WINDOW", default_value = MINT_WINDOW.default, value_parser = parse_duration, requires = "mint")]
    pub mint_window: Duration,
}

/// Validated settings of mint mode.
#[derive(Debug, Clone)]
pub struct MintConfig {
    /// Bits of an ID.
    pub layout: IdLayout,
    /// Where timestamps count from.
    pub epoch: Epoch,
    /// The unix socket to serve `/next` on, if any.
    pub socket: Option<PathBuf>,
    /// `/next` on `--listen` too although a socket serves it (`--next-on-listen`); without a
    /// socket `--listen` always serves it.
    pub next_on_listen: bool,
    /// The reservation window: reserve the clock + `ahead_ms` once less than half of it is
    /// left; `reserve.lua` caps a reservation at Redis' TIME + `ahead_ms`.
    pub window: MintWindow,
}

impl MintConfig {
    /// The window: how far ahead of the minting clock a reservation asks for. The cap
    /// `reserve.lua` applies is this plus `--max-clock-skew` past Redis' TIME
    /// (`reserver::Reserver::reservation_cap`).
    pub fn max_lead(&self) -> Duration {
        Duration::from_millis(self.window.ahead_ms)
    }
}

impl MintArgs {
    /// `None` without `--mint`. Checks the layout against `--max-worker-id` and the next 10
    /// years, and the window against the TTL: after Redis loses its data, the claim guard
    /// holds claims back one TTL, which must outlast every reservation granted before the
    /// loss plus the clock skew a newcomer may have (docs/mint-design.md, "Data loss").
    /// (Since marks carry node stamps a lost mark is raised on its own, `vouch.lua`; the
    /// check stays so that the guard alone still covers a loss, as before.)
    ///
    /// Errors: [`ConfigError`] naming `--id-layout`, `--epoch` or `--mint-window`.
    pub fn validate(
        &self,
        worker_ids: WorkerRange,
        ttl: Duration,
        max_clock_skew: Duration,
    ) -> Result<Option<MintConfig>, ConfigError> {
        if !self.mint {
            // clap's `requires = "mint"` counts `SNOWLEASE_MINT=false` as given.
            let set = [
                ("--epoch", self.epoch.is_some()),
                ("--mint-socket", self.mint_socket.is_some()),
                ("--id-layout", self.id_layout != DEFAULT_LAYOUT),
                (
                    "--mint-window",
                    self.mint_window != MINT_WINDOW.default_value(),
                ),
                ("--datacenter-id", self.datacenter_id != 0),
            ];
            if let Some((flag, _)) = set.into_iter().find(|(_, set)| *set) {
                return Err(ConfigError::new(
                    flag,
                    "only with --mint (SNOWLEASE_MINT is false or unset): without it nothing is minted and the flag would be ignored",
                ));
            }
            return Ok(None);
        }
        let now = wall_now_ms();
        let layout = IdLayout::parse(&self.id_layout)?.with_datacenter_id(self.datacenter_id)?;
        let epoch = match &self.epoch {
            Some(text) => Epoch::parse(text, now)?,
            None => Epoch::parse(&DEFAULT_EPOCH_MS.to_string(), now)?,
        };
        layout.check_workers(worker_ids)?;
        layout.check_lasts(epoch, now)?;
        MINT_WINDOW.check(self.mint_window)?;
        if self.mint_window + max_clock_skew >= ttl {
            return Err(ConfigError::new(
                MINT_WINDOW.flag,
                format!(
                    "{} plus --max-clock-skew {} must stay below --ttl {}: after Redis loses its data, the claim guard's wait of one TTL must outlast every reservation",
                    show_duration(self.mint_window),
                    show_duration(max_clock_skew),
                    show_duration(ttl)
                ),
            ));
        }
        if let Some(socket) = &self.mint_socket {
            check_socket_path(socket)?;
        }
        let ahead_ms = crate::timing::ms(self.mint_window);
        Ok(Some(MintConfig {
            layout,
            epoch,
            socket: self.mint_socket.clone(),
            next_on_listen: self.next_on_listen,
            window: MintWindow {
                ahead_ms,
                low_water_ms: ahead_ms / 2,
            },
        }))
    }
}

/// The longest path a unix socket can be connected at: `sun_path` holds 108 bytes with the
/// closing NUL (unix(7)).
const MAX_SOCKET_PATH: usize = 107;

/// `--mint-socket` fits a socket address, so the app can connect to it.
fn check_socket_path(path: &std::path::Path) -> Result<(), ConfigError> {
    let len = path.as_os_str().len();
    if len == 0 || len > MAX_SOCKET_PATH {
        return Err(ConfigError::new(
            "--mint-socket",
            format!(
                "{} is {len} bytes; a unix socket path is 1-{MAX_SOCKET_PATH} bytes (sun_path, unix(7))",
                path.display()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        mint: MintArgs,
    }

    fn validate(extra: &[&str], max_worker_id: u16) -> Result<Option<MintConfig>, ConfigError> {
        let mut argv = vec!["snowlease", "--mint"];
        argv.extend_from_slice(extra);
        let args = Cli::try_parse_from(argv).expect("parses").mint;
        args.validate(
            WorkerRange::up_to(max_worker_id),
            Duration::from_secs(120),
            Duration::from_millis(500),
        )
    }

    #[test]
    fn defaults_validate_with_twitters_layout() {
        let config = validate(&[], 31).unwrap().unwrap();
        assert_eq!(config.layout, IdLayout::parse("41:10:12").unwrap());
        assert_eq!(config.epoch.unix_ms(), DEFAULT_EPOCH_MS);
        assert_eq!(
            (config.window.ahead_ms, config.window.low_water_ms),
            (2000, 1000)
        );
        assert_eq!(config.socket, None);
    }

    /// `SNOWLEASE_MINT=false` passes clap's `requires`; a mint flag set beside it is refused.
    #[test]
    fn a_mint_flag_with_mint_false_is_refused() {
        let args = Cli::try_parse_from(["snowlease", "--epoch", "0"]).err();
        assert!(args.is_some(), "clap refuses --epoch without --mint");
        let mut args = Cli::try_parse_from(["snowlease"]).unwrap().mint;
        args.epoch = Some("0".into());
        let refused = args
            .validate(
                WorkerRange::up_to(31),
                Duration::from_secs(120),
                Duration::from_millis(500),
            )
            .unwrap_err();
        assert_eq!(refused.flag, "--epoch");
    }

    #[test]
    fn without_mint_there_is_no_config() {
        let args = Cli::try_parse_from(["snowlease"]).unwrap().mint;
        let config = args.validate(
            WorkerRange::up_to(31),
            Duration::from_secs(120),
            Duration::from_millis(500),
        );
        assert!(config.unwrap().is_none());
    }

    /// A socket path fits `sun_path`: up to 107 bytes.
    #[test]
    fn the_socket_path_fits_a_socket_address() {
        let ok = format!("/{}", "s".repeat(106));
        validate(&["--mint-socket", &ok], 31).unwrap();
        let long = format!("/{}", "s".repeat(107));
        let err = validate(&["--mint-socket", &long], 31).unwrap_err();
        assert_eq!(err.flag, "--mint-socket");
        assert!(err.reason.contains("1-107 bytes"), "{}", err.reason);
    }

    #[test]
    fn the_socket_needs_mint() {
        assert!(Cli::try_parse_from(["snowlease", "--mint-socket", "/tmp/s"]).is_err());
    }

    #[test]
    fn bad_values_name_their_flag() {
        let cases: [(&[&str], u16, &str); 5] = [
            (&["--id-layout", "41:4:12"], 31, "--id-layout"),
            (&["--id-layout", "35:10:12"], 31, "--id-layout"),
            (&["--epoch", "soon"], 31, "--epoch"),
            (&["--mint-window", "99ms"], 31, "--mint-window"),
            (&["--mint-window", "120s"], 31, "--mint-window"),
        ];
        for (extra, max_worker_id, flag) in cases {
            let err = validate(extra, max_worker_id).unwrap_err();
            assert_eq!(err.flag, flag, "{extra:?}: {err}");
        }
    }

    /// The window plus the skew must stay below the TTL (the claim guard covers a data loss).
    #[test]
    fn the_window_must_fit_in_the_ttl() {
        let args = Cli::try_parse_from(["snowlease", "--mint", "--mint-window", "1500ms"])
            .unwrap()
            .mint;
        let skew = Duration::from_millis(500);
        let err = args
            .validate(WorkerRange::up_to(31), Duration::from_secs(2), skew)
            .unwrap_err();
        assert_eq!(err.flag, "--mint-window");
        assert!(err.reason.contains("--ttl 2s"), "{}", err.reason);
        args.validate(WorkerRange::up_to(31), Duration::from_millis(2001), skew)
            .expect("just above");
    }
}
