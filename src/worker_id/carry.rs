//! `snowlease mint carry-over`: a supported change of the ID format (`--id-layout`,
//! `--epoch`). The format is fixed per app (`format.lua`), so a new format mints under a new
//! `--app`; its IDs must not equal any the old app minted (an epoch 3 s later repeats the old
//! app's last 3 s). Run once the old app's pods are gone and before the new app's first
//! sidecar: it reads the old app's format and high-water marks, records the new app's format,
//! and raises every worker ID's mark of the new app to the first Unix ms whose IDs in the new
//! format are above every ID the old app can have minted.

use std::sync::LazyLock;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use redis::Script;

use super::keys::MintKeys;
use super::mint::layout::{
    DEFAULT_EPOCH_MS, DEFAULT_LAYOUT, Epoch, IdLayout, IdParts, wall_now_ms,
};
use super::mint::script::record_format;
use crate::cli::{ConfigError, RedisUrlArg, stdout_line};
use crate::cli::{parse_duration, whole};
use crate::connection::RedisTarget;
use crate::persistence::durable::{Durability, Reach, make_durable};
use crate::timing::{COMMAND_CALL_TIMEOUT, bounded};
use crate::worker_id::args::{AppKeysArgs, validate_app};
use crate::worker_id::keys::LeaseKeys;
use crate::worker_id::limits::{DURABLE_WAIT, MAX_CLOCK_SKEW, MINT_WINDOW};
use crate::worker_id::mint::args::DATACENTER_ID_MAX;
use crate::worker_id::range::WorkerRange;

static CARRY: LazyLock<Script> =
    LazyLock::new(|| crate::lease::node::script(include_str!("carry.lua")));
static READ: LazyLock<Script> =
    LazyLock::new(|| crate::lease::node::script(include_str!("carry_read.lua")));

/// The highest worker ID any app can have (10 bits): the old app's marks are read for all.
const ALL_IDS: u16 = 1023;

/// `snowlease mint ...`.
#[derive(Debug, Clone, Args)]
pub struct MintCommandArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: MintCommand,
}

/// Subcommands of `snowlease mint`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum MintCommand {
    /// Carry an app's minted IDs over to a new app with another ID format (--id-layout, --epoch): run once the old app's pods are gone, before the new app's first sidecar; its IDs then stay above every ID the old app minted (exit 5, nothing written, while the old app holds IDs).
    #[command(after_help = crate::exit::HELP)]
    CarryOver(CarryArgs),
}

/// Flags of `snowlease mint carry-over`.
#[derive(Debug, Clone, Args)]
pub struct CarryArgs {
    /// The app that minted in the old format (its pods stopped): 1-64 chars of [A-Za-z0-9_.-].
    #[arg(long)]
    pub from_app: String,

    /// The new app: its name, key prefix (shared with the old app) and worker IDs.
    #[command(flatten)]
    pub keys: AppKeysArgs,

    /// The new app's ID layout, as its sidecars are given it.
    #[arg(long, env = "SNOWLEASE_ID_LAYOUT", default_value = DEFAULT_LAYOUT)]
    pub id_layout: String,

    /// The new app's epoch, as its sidecars are given it [default: Twitter's].
    #[arg(long, env = "SNOWLEASE_EPOCH")]
    pub epoch: Option<String>,

    /// The new app's datacenter ID, as its sidecars are given it (0 to 2^D-1 for D datacenter bits of --id-layout).
    #[arg(long, env = "SNOWLEASE_DATACENTER_ID", default_value_t = 0,
        value_parser = whole::<u16>(0, DATACENTER_ID_MAX), allow_negative_numbers = true)]
    pub datacenter_id: u16,

    /// The old app's --mint-window (100ms-60s): a mark of the old app this Redis node did not
    /// write in its current life (a restart or failover since) counts as Redis TIME + this +
    /// twice --max-clock-skew, as its sidecars would raise it.
    #[arg(long, env = "SNOWLEASE_MINT_WINDOW", default_value = MINT_WINDOW.default, value_parser = parse_duration)]
    pub mint_window: Duration,

    /// The old app's --max-clock-skew (10ms-60s; see --mint-window).
    #[arg(long, env = "SNOWLEASE_MAX_CLOCK_SKEW", default_value = MAX_CLOCK_SKEW.default, value_parser = parse_duration)]
    pub max_clock_skew: Duration,

    /// How long to wait for the raised floors to reach every replica and a snapshot (1s-1h); exit 3 after it (written, not yet durable: run again).
    #[arg(long, env = "SNOWLEASE_DURABLE_WAIT", default_value = DURABLE_WAIT.default, value_parser = parse_duration)]
    pub durable_wait: Duration,

    /// Where Redis is.
    #[command(flatten)]
    pub redis: RedisUrlArg,
}

/// A validated `mint carry-over`.
#[derive(Debug, Clone)]
pub struct CarryConfig {
    from: LeaseKeys,
    from_mint: MintKeys,
    from_app: String,
    to: LeaseKeys,
    to_mint: MintKeys,
    app: String,
    worker_ids: WorkerRange,
    layout: IdLayout,
    epoch: Epoch,
    redis: RedisTarget,
    /// --mint-window + 2 x --max-clock-skew of the old app.
    rollback_lead: Duration,
    /// --durable-wait.
    durable_wait: Duration,
}

impl CarryArgs {
    /// Checks every flag; the first violation names its flag.
    pub fn validate(&self) -> Result<CarryConfig, ConfigError> {
        let keys = self.keys.validate()?;
        validate_app(&self.from_app).map_err(|e| ConfigError::new("--from-app", e.reason))?;
        if self.from_app == keys.app {
            return Err(ConfigError::new(
                "--from-app",
                "must differ from --app: a new format mints under a new app name",
            ));
        }
        let now = wall_now_ms();
        let layout = IdLayout::parse(&self.id_layout)?.with_datacenter_id(self.datacenter_id)?;
        let epoch = Epoch::parse(
            self.epoch
                .as_deref()
                .unwrap_or(&DEFAULT_EPOCH_MS.to_string()),
            now,
        )?;
        layout.check_workers(keys.worker_ids)?;
        layout.check_lasts(epoch, now)?;
        MINT_WINDOW.check(self.mint_window)?;
        MAX_CLOCK_SKEW.check(self.max_clock_skew)?;
        DURABLE_WAIT.check(self.durable_wait)?;
        let prefix = &keys.key_prefix;
        Ok(CarryConfig {
            from: LeaseKeys::new(prefix, &self.from_app),
            from_mint: MintKeys::new(prefix, &self.from_app),
            from_app: self.from_app.clone(),
            to: LeaseKeys::new(prefix, &keys.app),
            to_mint: MintKeys::new(prefix, &keys.app),
            app: keys.app,
            worker_ids: keys.worker_ids,
            layout,
            epoch,
            redis: self.redis.target()?,
            rollback_lead: self.mint_window + 2 * self.max_clock_skew,
            durable_wait: self.durable_wait,
        })
    }
}

/// Why `carry-over` wrote nothing (exit 5).
#[derive(Debug, thiserror::Error)]
pub(crate) enum CarryRefused {
    /// The old app still holds worker IDs: its pods may still mint.
    #[error(
        "app {from_app} still holds {held} worker ID(s) (or their tombstones): its pods may \
         still mint, and IDs minted after this command would not be carried over; stop them, \
         wait until `snowlease status --app {from_app}` lists no key, and run this again"
    )]
    OldAppRuns {
        /// The old app.
        from_app: String,
        /// Lease keys of the old app that exist.
        held: usize,
    },
    /// The new app already records another format.
    #[error("app {app} already mints in the format {recorded}, not {ours}")]
    OtherFormat {
        /// The new app.
        app: String,
        /// Its recorded format.
        recorded: String,
        /// The one given here.
        ours: String,
    },
}

/// The first Unix ms above which every ID of `layout` from `epoch` is greater than every ID
/// of `old` from `old_epoch` with a timestamp up to `old_mark` (any worker, any sequence).
pub(crate) fn floor_after(
    old: IdLayout,
    old_epoch: Epoch,
    old_mark: u64,
    layout: IdLayout,
    epoch: Epoch,
) -> u64 {
    if old_mark < old_epoch.unix_ms() {
        return 0;
    }
    let largest_old = old
        .compose(
            old_epoch,
            IdParts {
                unix_ms: old_mark.min(old.overflows_at(old_epoch) - 1),
                datacenter_id: 0,
                worker_id: 0,
                sequence: 0,
            },
        )
        .expect("a timestamp within the layout")
        | old.low_bits();
    // An ID of `layout` at Unix ms t is at least (t - epoch) << low bits: above the largest
    // old ID once t - epoch > largest_old >> low bits.
    epoch.unix_ms() + (largest_old >> layout.low_bits().count_ones())
}

/// Runs `mint carry-over` and prints one JSON line.
///
/// Then waits until the writes are durable (`persistence::durable`: on every replica, in each
/// primary's snapshot or AOF), up to `--durable-wait`.
///
/// Errors: `CarryRefused` (exit 5, nothing written); a format record of the old app that
/// cannot be read; a Redis error; `NotDurable` (exit 3: written, not yet durable; running it
/// again is safe: it raises the same floors).
pub async fn carry_over(config: &CarryConfig) -> anyhow::Result<()> {
    let mut conn = config.redis.connect(COMMAND_CALL_TIMEOUT)?;
    let context = || format!("redis {}", config.redis);
    let ids: Vec<u16> = (0..=ALL_IDS).collect();
    let mut pipe = redis::pipe();
    for id in &ids {
        pipe.cmd("GET").arg(config.from.id(*id));
    }
    for id in &ids {
        pipe.cmd("GET")
            .arg(config.from_mint.mark(&config.from.id(*id)));
    }
    pipe.cmd("GET").arg(config.from_mint.format());
    let replies: Vec<Option<String>> = bounded(COMMAND_CALL_TIMEOUT, pipe.query_async(&mut conn))
        .await
        .with_context(context)?;
    let (leases, rest) = replies.split_at(ids.len());
    let (marks, format) = rest.split_at(ids.len());
    let held = leases.iter().filter(|v| v.is_some()).count();
    if held > 0 {
        return Err(CarryRefused::OldAppRuns {
            from_app: config.from_app.clone(),
            held,
        }
        .into());
    }
    // Each existing mark as this node can vouch for it: one it did not write in its
    // current life may be below reservations a rollback lost, so it counts as Redis TIME +
    // the old app's rollback lead (vouch.lua's rule).
    let mut old_mark = 0;
    for (id, mark) in ids.iter().zip(marks) {
        if mark.is_none() {
            continue;
        }
        let invocation = READ.key(config.from_mint.mark(&config.from.id(*id)));
        let call = invocation.invoke_async::<(u64, u8, u64)>(&mut conn);
        let (mark, here, now) = bounded(COMMAND_CALL_TIMEOUT, call)
            .await
            .with_context(context)?;
        let lead = crate::timing::ms(config.rollback_lead);
        old_mark = old_mark.max(if here == 1 {
            mark
        } else {
            mark.max(now + lead)
        });
    }
    let ours = config.layout.format(config.epoch);
    let floor = match &format[0] {
        None => 0,
        Some(record) => {
            let (old, old_epoch) = parse_format(record).with_context(|| {
                format!(
                    "the format record {} of app {}",
                    config.from_mint.format(),
                    config.from_app
                )
            })?;
            floor_after(old, old_epoch, old_mark, config.layout, config.epoch)
        }
    };
    let recorded = bounded(
        COMMAND_CALL_TIMEOUT,
        record_format(&mut conn, &config.to_mint, &ours),
    )
    .await
    .with_context(context)?;
    if recorded != ours {
        return Err(CarryRefused::OtherFormat {
            app: config.app.clone(),
            recorded,
            ours,
        }
        .into());
    }
    for id in config.worker_ids.ids() {
        let mark = config.to_mint.mark(&config.to.id(id));
        let mut invocation = CARRY.key(mark);
        invocation.arg(floor);
        let call = invocation.invoke_async::<u64>(&mut conn);
        bounded(COMMAND_CALL_TIMEOUT, call)
            .await
            .with_context(context)?;
    }
    // The raised floors must outlast a rollback before the new app may start: a restart
    // from an earlier snapshot or a failover to a lagging replica would lose them, and the
    // new app's marks would then be raised only to Redis TIME + its window (vouch.lua),
    // below the floor when the new epoch is later.
    let durability = make_durable(&mut conn, &Reach::EveryPrimary, config.durable_wait)
        .await
        .context("the carry-over is written but not yet durable; the step is safe to run again")
        .with_context(context)?;
    let (durable, unchecked) = match &durability {
        Durability::Held(how) => (Some(how.as_str()), None),
        Durability::Unchecked(why) => {
            eprintln!(
                "warning: the carry-over is written but its durability is unchecked: {why}: take a snapshot (BGSAVE) or wait for your provider's before the new app starts"
            );
            (None, Some(why.as_str()))
        }
    };
    let line = serde_json::json!({
        "from_app": config.from_app,
        "app": config.app,
        "format": ours,
        "old_mark_unix_ms": old_mark,
        "floor_unix_ms": floor,
        "wait_ms": floor.saturating_sub(wall_now_ms()),
        "worker_ids": config.worker_ids.len(),
        "durable": durable,
        "durability_unchecked": unchecked,
    });
    stdout_line(&line.to_string())
}

/// `"<t>:<w>:<s>@<epoch ms>"` ([`IdLayout::format`]).
fn parse_format(record: &str) -> anyhow::Result<(IdLayout, Epoch)> {
    IdLayout::parse_format(record, wall_now_ms()).map_err(anyhow::Error::msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Epoch {
        Epoch::parse(&ms.to_string(), u64::MAX).unwrap()
    }

    /// An epoch 3 s later: the new app's IDs at t equal the old app's at t - 3 s, so its
    /// floor is the old mark + 3 s; every new ID above it is above every old one.
    #[test]
    fn a_later_epoch_moves_the_floor_by_the_difference() {
        let layout = IdLayout::parse(DEFAULT_LAYOUT).unwrap();
        let (old_epoch, new_epoch, mark) = (at(1_000_000), at(1_003_000), 5_000_000);
        let floor = floor_after(layout, old_epoch, mark, layout, new_epoch);
        assert_eq!(floor, mark + 3_000);
        let parts = |unix_ms| IdParts {
            unix_ms,
            datacenter_id: 0,
            worker_id: 0,
            sequence: 0,
        };
        let largest_old = layout.compose(old_epoch, parts(mark)).unwrap() | layout.low_bits();
        assert!(layout.compose(new_epoch, parts(floor + 1)).unwrap() > largest_old);
        assert!(layout.compose(new_epoch, parts(floor)).unwrap() <= largest_old);
    }

    /// An earlier epoch or fewer low bits need no wait; other layouts shift by their bits.
    #[test]
    fn other_layouts_are_compared_as_numbers() {
        let (old, new) = (
            IdLayout::parse("41:10:12").unwrap(),
            IdLayout::parse("41:5:12").unwrap(),
        );
        let epoch = at(1_000_000);
        let floor = floor_after(old, epoch, 1_000_100, new, epoch);
        // 100 ms of the old layout span 100 << 22 ids; the new one has 17 low bits.
        assert_eq!(floor, 1_000_000 + (((101u64 << 22) - 1) >> 17));
        assert_eq!(floor_after(old, at(2_000_000), 1_000_100, new, epoch), 0);
    }
}
