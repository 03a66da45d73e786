//! Exit codes of every command, in one table (docs/operations.md, "Exit codes"): a code
//! means the same in every command. [`crate::failure::code_of`] is the one
//! place that maps an error to its code; `main` calls it. This module
//! imports nothing, so every command may name a code without a circle.
//!
//! | code | meaning |
//! | --- | --- |
//! | 0 | done; for `exec` and `lock` the command's own code passes through |
//! | 1 | anything else (Redis refused, I/O error, TLS certificate error, a topology that does not match the URL, ...) |
//! | 2 | bad input: a flag, env var or argument outside its range; nothing was written |
//! | 3 | unavailable in time: no worker ID claimed (`worker`) or published (`exec`, `id`), no pool id due (`pool acquire`) |
//! | 4 | not held: lease lost with `--on-loss exit` (`worker`), not owner or expired (`pool release`/`extend`) |
//! | 5 | refused as unsafe: `guard open` found lease keys of the app without a guard, or a closed guard (without `--force`); nothing written; `exec`, `id`: the sidecar runs in mint mode and offers no worker ID |
//! | 6 | denied by a rate budget within `--wait` (`budget take`, `pool acquire --budget`); the JSON on stdout gives `retry_after_ms` |
//! | 69 | `lock`: not acquired within `--wait`; the command never started (EX_UNAVAILABLE; not 3, which a command's own code could be) |
//! | 75 | `exec`: the ID was lost while the command ran; `lock`: the lock was lost or not renewed in time while the command ran; the command was stopped (EX_TEMPFAIL) |
//! | 126, 127 | `exec`, `lock`: the command cannot be executed, or was not found (shell convention) |
//! | 128+N | a signal N ended the wait or the command |
//! | 130 | `worker`, `pool serve`: a second stop signal during the stop aborted it without cleanup ([`crate::shutdown`]) |

/// The table for `--help` of the long-running commands, with the log
/// filter variable.
pub const HELP: &str = "\
Logging: SNOWLEASE_LOG sets the filter (a level and/or target=level pairs, e.g. snowlease=debug,warn; default info).

Exit codes (the same meaning in every command):
  0   done; clean stop on SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2
  1   anything else (Redis refused, cannot listen, output file in use, ...)
  2   bad input; the message names the flag and its range; nothing written
  3   unavailable in time: no ID claimed (worker) or published (exec, id), no pool id due;
      mint carry-over: written but not yet on every replica and in a snapshot (run it again);
      pool init, guard open: the first record not seen durable in 60 s (pool init: do not run it
      again, the next acquire opens the pool; guard open: its guard is taken back, run it again; or it changed meanwhile: not opened)
  4   not held: lease lost with --on-loss exit, pool lease not ours or expired
  5   refused as unsafe, nothing written: guard open found lease keys without a guard, or a closed guard;
      exec, id: the sidecar mints (mint mode) and offers no worker ID; mint carry-over: the old app holds IDs
  6   denied by a rate budget within --wait (budget take, pool acquire --budget); stdout says retry_after_ms
  69  lock: not acquired within --wait; the command never started
  75  exec, lock: the ID or lock was lost while the command ran; the command was stopped
  126 exec, lock: the command cannot be executed; 127: not found; 128+N: signal N
  130 a second stop signal during the stop: aborted without cleanup";

/// Anything not listed below.
pub(crate) const FAILURE: u8 = 1;
/// Bad input; nothing was written.
pub(crate) const BAD_INPUT: u8 = 2;
/// What was asked for could not be had in time.
pub(crate) const UNAVAILABLE: u8 = 3;
/// The lease is not (or no longer) ours.
pub(crate) const NOT_HELD: u8 = 4;
/// Refused because it could break the safety property; nothing written.
pub(crate) const REFUSED: u8 = 5;
/// A rate budget denied the take within `--wait` (nothing charged).
pub(crate) const BUDGET_DENIED: u8 = 6;
/// `lock`: not acquired within `--wait` (EX_UNAVAILABLE, sysexits.h). Not
/// [`UNAVAILABLE`]: `lock` passes its command's code through, and 3 is a
/// code a command may well use itself; 69 rarely is.
pub(crate) const NOT_ACQUIRED: u8 = 69;
/// `exec`: the ID was lost while the command ran; `lock`: the lock was lost
/// or not renewed in time while the command ran (EX_TEMPFAIL, sysexits.h).
pub(crate) const LEASE_LOST: u8 = 75;
/// `exec`: the command exists but cannot be executed (shell convention).
pub(crate) const CANNOT_EXECUTE: u8 = 126;
/// `exec`: the command was not found (shell convention).
pub(crate) const NOT_FOUND: u8 = 127;
/// Signal N ended the wait or the command: `SIGNALLED + N`.
pub(crate) const SIGNALLED: u8 = 128;
/// `worker`, `pool serve`: a second stop signal during the stop aborted it
/// without cleanup (128 + SIGINT, the shell's code for Ctrl-C).
pub(crate) const ABORTED: u8 = 130;

/// Every code with a name, for the test that the table, `--help` and
/// docs/operations.md agree.
#[cfg(test)]
pub(crate) const ALL: [u8; 13] = [
    0,
    FAILURE,
    BAD_INPUT,
    UNAVAILABLE,
    NOT_HELD,
    REFUSED,
    BUDGET_DENIED,
    NOT_ACQUIRED,
    LEASE_LOST,
    CANNOT_EXECUTE,
    NOT_FOUND,
    SIGNALLED,
    ABORTED,
];

#[cfg(test)]
mod tests {
    use super::*;

    /// The codes a table names: the first cell of each row (`| 126, 127 |`,
    /// `| 128 + N |`), or in `--help` the first word of a line and any
    /// `; 127:` after it.
    fn named_codes(table: &str) -> Vec<u8> {
        let mut codes = Vec::new();
        for line in table.lines() {
            let line = line.trim_start_matches("//!").trim();
            let cells: Vec<&str> = match line.strip_prefix("| ") {
                Some(row) => row.split(" |").next().unwrap_or("").split(", ").collect(),
                None => line
                    .split_whitespace()
                    .take(1)
                    .chain(
                        line.split("; ")
                            .skip(1)
                            .filter_map(|p| Some(p.split_once(": ")?.0)),
                    )
                    .collect(),
            };
            let code = |cell: &str| cell.split('+').next()?.trim().parse::<u8>().ok();
            codes.extend(cells.into_iter().filter_map(code));
        }
        codes
    }

    /// `--help`, this module's table and docs/operations.md list every code
    /// of [`ALL`], and name none that is not there.
    #[test]
    fn help_and_docs_list_every_code() {
        let doc = include_str!("../docs/operations.md");
        let section = &doc[doc
            .find("## Exit codes")
            .expect("docs/operations.md has the table")..];
        let section = &section[..section[3..].find("\n## ").map_or(section.len(), |i| i + 3)];
        let module: String = include_str!("exit.rs")
            .lines()
            .filter(|line| line.starts_with("//! |"))
            .map(|line| format!("{line}\n"))
            .collect();
        let help = &HELP[HELP.find("Exit codes").expect("--help has the table")..];
        for (name, table) in [("--help", help), ("exit.rs", &module), ("docs", section)] {
            let named = named_codes(table);
            for code in ALL {
                assert!(named.contains(&code), "{name} lacks {code}: {named:?}");
            }
            for code in named {
                assert!(ALL.contains(&code), "{name} names {code}, not in ALL");
            }
        }
    }
}
