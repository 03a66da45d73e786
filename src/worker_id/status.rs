//! `snowlease status`: which worker IDs of an app are held, by which owner
//! string, for how much longer; keys of the wrong type marked; the free
//! count; a warning when Redis may evict lease keys, and one when keys of
//! the app exist above `--max-worker-id`; a note when Redis' persistence can
//! bring it back older (snapshots, AOF without `appendfsync always`).
//! Read-only: TYPE, PTTL and GET, in two pipelined round trips, a pipeline
//! of TYPE above the range, then `INFO memory` and `CONFIG GET` (of every
//! primary).

use anyhow::Context;
use clap::Args;
use redis::{RedisResult, Value};
use serde::Serialize;

mod findings;
mod render;

use self::findings::{
    EvictionReport, PersistenceReport, RangesReport, outside_range, outside_range_warning,
};
use self::render::render;
use super::args::AppKeysArgs;
use super::keys::LeaseKeys;
use super::keys::MintKeys;
use crate::cli::{ConfigError, RedisUrlArg};
use crate::connection::{Keyspace, Redis, RedisTarget};
use crate::lease::{TOMBSTONE_PREFIX, node};
use crate::timing::{COMMAND_CALL_TIMEOUT, bounded};
use crate::worker_id::range::WorkerRange;

/// Flags of `snowlease status`.
#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// The keys to read: the same three flags the sidecars were given.
    #[command(flatten)]
    pub keys: AppKeysArgs,

    /// Where Redis is.
    #[command(flatten)]
    pub redis: RedisUrlArg,

    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Validated settings of `status`.
#[derive(Debug, Clone)]
pub struct StatusConfig {
    /// Application name.
    pub app: String,
    /// Where Redis is.
    pub redis: RedisTarget,
    /// Key prefix.
    pub key_prefix: String,
    /// The IDs read (`--worker-ids`, else `0-(--max-worker-id)`).
    pub worker_ids: WorkerRange,
    /// JSON output.
    pub json: bool,
}

impl StatusArgs {
    /// Checks every flag; the first violation names its flag.
    pub fn validate(&self) -> Result<StatusConfig, ConfigError> {
        let keys = self.keys.validate()?;
        let redis = self.redis.target()?;
        Ok(StatusConfig {
            app: keys.app,
            redis,
            key_prefix: keys.key_prefix,
            worker_ids: keys.worker_ids,
            json: self.json,
        })
    }
}

/// The leases of one app as Redis holds them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Report {
    /// Application name.
    pub app: String,
    /// Key prefix; keys are `<prefix><app>:<id>`.
    pub key_prefix: String,
    /// The IDs read, `LOW-HIGH`.
    pub worker_ids: String,
    /// Number of IDs of that range.
    pub ids: u32,
    /// IDs whose key holds an owner string.
    pub held: u32,
    /// IDs whose key is a release tombstone (`released:<owner>`, for
    /// `--handover-delay`): not claimable until it expires.
    pub released: u32,
    /// IDs whose key has another type (skipped by sidecars, never deleted).
    pub wrong_type: u32,
    /// IDs without a key: claimable now.
    pub free: u32,
    /// Every ID that is not free, lowest first.
    pub leases: Vec<Entry>,
    /// The app's claim guard (`<prefix><app>:guard`) on one server; on
    /// Cluster a summary of the per-ID guards (`<prefix><app>:guard:{<key>}`).
    pub claim_guard: ClaimGuard,
    /// Whether the guards' node stamps were judged: false where `INFO` is
    /// refused, so a guard written before a restart or failover shows as
    /// open or closed by its time alone.
    pub claim_guard_stamps_checked: bool,
}

/// The claim guard as `status` sees it (docs/worker.md, "Claim guard").
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub(crate) enum ClaimGuard {
    /// No guard: the next claim sets it and waits one TTL.
    Missing,
    /// New claims are allowed.
    Open,
    /// New claims wait this long (Redis time).
    Closed {
        /// ms until claims are allowed.
        opens_in_ms: u64,
    },
    /// The guard key holds something that is not a number (the next
    /// claim resets it).
    Unreadable,
    /// The guard key has another type: claims fail until it is removed.
    WrongType,
    /// Written on another Redis node or in an earlier life of this one (a
    /// restart, a failover; or before node stamps): it may be older than
    /// lease keys a rollback lost, so the next claim that reaches a free ID
    /// closes it for one TTL (`claim.lua`, docs/rollback-design.md).
    WrittenElsewhere,
    /// Cluster: one guard per ID, in the ID key's slot, summarised.
    PerId(GuardSummary),
}

/// The per-ID claim guards of an app on Cluster, counted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct GuardSummary {
    /// Guards that let claims in now.
    pub open: u32,
    /// Guards that hold claims back.
    pub closed: u32,
    /// ms until the soonest closed guard opens (Redis time); `None` when
    /// none is closed.
    pub soonest_opens_in_ms: Option<u64>,
    /// IDs without a guard: a claim of such an ID sets it and waits one
    /// TTL (first use, or the shard lost its data).
    pub missing: u32,
    /// Guards holding something that is not a number, or of another type.
    pub unreadable: u32,
    /// Guards written on another node or in an earlier life of their
    /// node: the next claim of such an ID closes its guard for one TTL.
    pub written_elsewhere: u32,
}

/// One ID that is not free.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Entry {
    /// The worker ID.
    pub worker_id: u16,
    /// The key's Redis type: `string` for a lease, anything else is wrong.
    #[serde(rename = "type")]
    pub key_type: String,
    /// Owner string (`<identity>#<nonce>`) of a string key.
    pub owner: Option<String>,
    /// Remaining TTL (PTTL) in ms; `None` when the key never expires.
    pub ttl_ms: Option<u64>,
    /// Mint mode: the ID's high-water mark (Unix ms, docs/worker.md "Mint mode"); `None`
    /// when the ID never minted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mark_unix_ms: Option<u64>,
    /// The mark minus Redis' `TIME` (ms; positive: reserved ahead of now).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mark_lead_ms: Option<i64>,
}

impl Entry {
    /// True for a lease key (string), false for a key of the wrong type.
    pub(crate) fn is_lease(&self) -> bool {
        self.key_type == "string"
    }

    /// True for a release tombstone: the holder stopped, the handover
    /// delay still runs.
    pub(crate) fn is_tombstone(&self) -> bool {
        self.is_lease()
            && self
                .owner
                .as_deref()
                .is_some_and(|o| o.starts_with(TOMBSTONE_PREFIX))
    }
}

/// Reads every lease key of `app`: one pipeline of TYPE + PTTL for all
/// keys and GET of the claim guard (Cluster: of every per-ID guard), then
/// one of GET for the string keys and their mint marks. A key that expires
/// between the two counts as free.
///
/// Errors: the first Redis error (NOPERM, connection, timeout).
pub(crate) async fn read(
    conn: &mut Redis,
    app: &str,
    key_prefix: &str,
    range: WorkerRange,
) -> RedisResult<Report> {
    let keyspace = conn.keyspace().await?;
    let names = LeaseKeys::new(key_prefix, app);
    let keys = names.ids(range);
    let guards = match keyspace {
        Keyspace::Slots => names.guards(range, keyspace),
        Keyspace::Whole => vec![names.guard()],
    };
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for key in &keys {
        pipe.cmd("TYPE").arg(key).cmd("PTTL").arg(key);
    }
    for guard in &guards {
        pipe.cmd("GET").arg(guard);
    }
    pipe.cmd("TIME");
    let mut replies: Vec<RedisResult<Value>> = pipe.query_async(conn).await?;
    let stamps = node::stamps_of_key_nodes(conn, &guards).await;
    let Some(time) = replies.pop() else {
        return Err(short_reply());
    };
    let now_ms = redis_ms(time?)?;
    let Some(first_guard) = replies.len().checked_sub(guards.len()) else {
        return Err(short_reply());
    };
    let mut found = replies
        .drain(first_guard..)
        .enumerate()
        .map(|(at, guard)| {
            let stamp = stamps.as_ref().map(|s| s[at].as_str());
            claim_guard(guard, now_ms, stamp)
        })
        .collect::<RedisResult<Vec<_>>>()?;
    let claim_guard = match keyspace {
        Keyspace::Slots => ClaimGuard::PerId(summarise(&found)),
        Keyspace::Whole => found.pop().ok_or_else(short_reply)?,
    };
    let mut entries = Vec::new();
    for ((worker_id, key), pair) in range.ids().zip(&keys).zip(replies.chunks(2)) {
        let [key_type, pttl] = pair else {
            return Err(short_reply());
        };
        let key_type: String = redis::from_redis_value(key_type.clone()?)?;
        let pttl: i64 = redis::from_redis_value(pttl.clone()?)?;
        if key_type == "none" || pttl == -2 {
            continue;
        }
        entries.push((
            key.as_str(),
            Entry {
                worker_id,
                key_type,
                owner: None,
                ttl_ms: u64::try_from(pttl).ok(),
                mark_unix_ms: None,
                mark_lead_ms: None,
            },
        ));
    }

    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    let strings: Vec<usize> = (0..entries.len())
        .filter(|i| entries[*i].1.is_lease())
        .collect();
    let marks = MintKeys::new(key_prefix, app);
    for i in &strings {
        pipe.cmd("GET").arg(entries[*i].0);
        pipe.cmd("GET").arg(marks.mark(entries[*i].0));
    }
    if !strings.is_empty() {
        let values: Vec<RedisResult<Option<String>>> = pipe.query_async(conn).await?;
        if values.len() != 2 * strings.len() {
            return Err(short_reply());
        }
        for (i, pair) in strings.into_iter().zip(values.chunks(2)) {
            let [value, mark] = pair else {
                return Err(short_reply());
            };
            let entry = &mut entries[i].1;
            entry.mark_unix_ms = mark
                .as_ref()
                .ok()
                .and_then(|m| node::integer_part(m.as_deref()?));
            entry.mark_lead_ms = entry.mark_unix_ms.map(|m| m as i64 - now_ms as i64);
            match value.clone() {
                Ok(owner) => entry.owner = owner,
                // Replaced by another type between the two round trips.
                Err(err) if err.code() == Some("WRONGTYPE") => {
                    entry.key_type = "changed".into();
                }
                Err(err) => return Err(err),
            }
        }
    }
    // A string key that expired between the two round trips is free.
    let leases: Vec<Entry> = entries
        .into_iter()
        .map(|(_, e)| e)
        .filter(|e| !e.is_lease() || e.owner.is_some())
        .collect();
    let released = leases.iter().filter(|e| e.is_tombstone()).count() as u32;
    let held = leases.iter().filter(|e| e.is_lease()).count() as u32 - released;
    let wrong_type = leases.len() as u32 - held - released;
    let ids = range.len();
    Ok(Report {
        app: app.to_owned(),
        key_prefix: key_prefix.to_owned(),
        worker_ids: range.to_string(),
        ids,
        held,
        released,
        wrong_type,
        free: ids - held - released - wrong_type,
        leases,
        claim_guard,
        claim_guard_stamps_checked: stamps.is_some(),
    })
}

/// Redis' `TIME` reply in ms.
fn redis_ms(time: Value) -> RedisResult<u64> {
    let (secs, micros): (u64, u64) = redis::from_redis_value(time)?;
    Ok(secs * 1000 + micros / 1000)
}

/// Counts per-ID guards by state.
fn summarise(guards: &[ClaimGuard]) -> GuardSummary {
    let mut summary = GuardSummary::default();
    for guard in guards {
        match guard {
            ClaimGuard::Open => summary.open += 1,
            ClaimGuard::Closed { opens_in_ms } => {
                summary.closed += 1;
                let soonest = summary.soonest_opens_in_ms.get_or_insert(*opens_in_ms);
                *soonest = (*soonest).min(*opens_in_ms);
            }
            ClaimGuard::Missing => summary.missing += 1,
            ClaimGuard::WrittenElsewhere => summary.written_elsewhere += 1,
            _ => summary.unreadable += 1,
        }
    }
    summary
}

/// Reads one guard's value against Redis' time `now_ms` and the stamp of
/// the node that serves it now (`None`: not known, e.g. `INFO` refused;
/// then its stamp is not judged). A guard with another stamp was written
/// before a restart or failover, or on another node (a slot moved since),
/// as `claim.lua` judges it.
fn claim_guard(
    guard: RedisResult<Value>,
    now_ms: u64,
    stamp: Option<&str>,
) -> RedisResult<ClaimGuard> {
    let value: Option<String> = match guard {
        Ok(value) => redis::from_redis_value(value)?,
        Err(err) if err.code() == Some("WRONGTYPE") => return Ok(ClaimGuard::WrongType),
        Err(err) => return Err(err),
    };
    if let (Some(value), Some(stamp)) = (&value, stamp) {
        let here = node::stamp_part(value) == Some(stamp);
        if node::integer_part(value).is_some() && !here {
            return Ok(ClaimGuard::WrittenElsewhere);
        }
    }
    Ok(match value.map(|v| node::integer_part(&v)) {
        None => ClaimGuard::Missing,
        Some(None) => ClaimGuard::Unreadable,
        Some(Some(open_at)) if open_at > now_ms => ClaimGuard::Closed {
            opens_in_ms: open_at - now_ms,
        },
        Some(Some(_)) => ClaimGuard::Open,
    })
}

fn short_reply() -> redis::RedisError {
    redis::RedisError::from(std::io::Error::other("pipeline reply shorter than sent"))
}

/// Runs `status`: reads the report and prints it to stdout.
///
/// Errors: Redis unreachable or refusing (e.g. NOPERM), with the URL
/// (password redacted).
pub async fn run(config: &StatusConfig) -> anyhow::Result<()> {
    let mut conn = config.redis.connect(COMMAND_CALL_TIMEOUT)?;
    // The first connect, under its own bound (not the read's).
    let leases = format!("the leases of {} from {}", config.app, config.redis);
    conn.keyspace()
        .await
        .with_context(|| format!("cannot read {leases}"))?;
    let report = bounded_read(
        read(
            &mut conn,
            &config.app,
            &config.key_prefix,
            config.worker_ids,
        ),
        &leases,
    )
    .await?;
    let names = LeaseKeys::new(&config.key_prefix, &config.app);
    let (below, above) = bounded_read(
        outside_range(&mut conn, &names, config.worker_ids),
        &format!(
            "the keys of {} outside --worker-ids {}",
            config.app, config.worker_ids
        ),
    )
    .await?;
    // Only a report: a record that cannot be read (another type, put there by hand) is a
    // warning, never a reason to hide the leases.
    let (ranges, ranges_warning) = match bounded_read(
        RangesReport::read(&mut conn, &names),
        &format!("the ranges record {}", names.ranges()),
    )
    .await
    {
        Ok(ranges) => (ranges, String::new()),
        Err(err) => (
            RangesReport::default(),
            format!("warning: {err:#}; worker ID ranges are not reported\n"),
        ),
    };
    let eviction = EvictionReport::check(&mut conn).await;
    let persistence = PersistenceReport::read(&mut conn).await;
    let text = if config.json {
        // stdout stays one JSON document; the warning goes to stderr.
        if !ranges_warning.is_empty() {
            eprint!("{ranges_warning}");
        }
        let mut json = serde_json::to_value(&report)?;
        json["ranges"] = serde_json::to_value(&ranges.ranges)?;
        json["range_overlaps"] = serde_json::to_value(&ranges.overlaps)?;
        json["above_range"] = serde_json::to_value(&above)?;
        json["below_range"] = serde_json::to_value(&below)?;
        json["eviction"] = serde_json::to_value(&eviction)?;
        json["persistence"] = serde_json::to_value(&persistence)?;
        json["redis"] = config.redis.to_string().into();
        serde_json::to_string_pretty(&json)? + "\n"
    } else {
        eviction.warning().unwrap_or_default()
            + &ranges_warning
            + &ranges.warnings()
            + &outside_range_warning(&below, &above, config.worker_ids)
            + &persistence
                .as_ref()
                .and_then(PersistenceReport::note)
                .unwrap_or_default()
            + &render(&report, &config.redis.to_string())
            + &ranges.listing()
    };
    crate::cli::stdout_line(text.trim_end_matches('\n'))?;
    Ok(())
}

/// `read` under two call timeouts; the error says "cannot read `what`".
async fn bounded_read<T>(
    read: impl std::future::Future<Output = RedisResult<T>>,
    what: &str,
) -> anyhow::Result<T> {
    bounded(COMMAND_CALL_TIMEOUT * 2, read)
        .await
        .with_context(|| format!("cannot read {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_flags_are_named() {
        let args = |prefix: &str, max| StatusArgs {
            keys: AppKeysArgs {
                app: "orders".into(),
                key_prefix: prefix.into(),
                max_worker_id: max,
                worker_ids: None,
            },
            redis: RedisUrlArg {
                redis_url: "redis://127.0.0.1:1".into(),
                ..Default::default()
            },
            json: false,
        };
        assert_eq!(
            args("a{b}", 31).validate().unwrap_err().flag,
            "--key-prefix"
        );
        assert_eq!(
            args("p:", 1024).validate().unwrap_err().flag,
            "--max-worker-id"
        );
        assert!(args("p:", 1023).validate().is_ok());
    }
}
