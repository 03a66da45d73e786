//! Redis refusing the sidecar while it holds an ID: a rotated password
//! (`WRONGPASS` at the reconnect) or a revoked command (`NOPERM`) never read the key, so the ID
//! stays published until the validity deadline; the state file outlives the stop, so a
//! restart with the new password on the same volume re-adopts the same ID at once.

use std::time::Instant;

use crate::acl::{WORKER_RULES, acl_user};
use crate::harness::*;

/// The ACL user every test here logs in as (password `pw`, see [`acl_user`]).
const USER: &str = "snowlease";

/// Removes the user's password `pw` for `new` and closes its connections, as a password
/// rotation that is done in the wrong order does: the next reconnect meets `WRONGPASS`.
fn rotate_password(redis: &RedisServer, new: &str) {
    let _: () = redis.query(
        redis::cmd("ACL")
            .arg("SETUSER")
            .arg(USER)
            .arg("resetpass")
            .arg(format!(">{new}")),
    );
    let _: i64 = redis.query(redis::cmd("CLIENT").arg("KILL").arg("USER").arg(USER));
}

/// Takes EVALSHA from the user: the next renew is refused with `NOPERM`.
fn revoke_scripts(redis: &RedisServer) {
    let _: () = redis.query(redis::cmd("ACL").arg("SETUSER").arg(USER).arg("-evalsha"));
}

/// Two sidecars hold the two IDs of the app (TTL 30 s); the password is rotated; both are
/// stopped. Restarted with the new password on the same output files, both publish their old
/// IDs within 5 s, well under the TTL (before the fix the state files were gone and both
/// waited up to 30 s for their own old keys to expire). One of them has a recorded deadline
/// that has passed (as a wall-clock step forward makes it look): the key still holds its
/// owner string, and the owner-checked renew re-adopts it all the same.
#[test]
fn after_a_password_rotation_a_restart_readopts_both_ids() {
    let redis = RedisServer::start();
    let app = "rotated";
    redis.open_claim_guard(app);
    let url = acl_user(&redis, USER, WORKER_RULES);
    let worker = |url: &str, pod: &PodDir| {
        Sidecar::worker_at(url, app)
            .pod(pod)
            .flag("--max-worker-id", "1")
            .flag("--ttl", "30s")
            .flag("--renew-interval", "1s")
    };
    let pods = [PodDir::new(), PodDir::new()];
    let mut first: Vec<Sidecar> = pods.iter().map(|p| worker(&url, p).spawn()).collect();
    let leases: Vec<IdReply> = first.iter().map(|s| s.wait_for_lease(secs(10))).collect();
    assert_ne!(leases[0].worker_id, leases[1].worker_id);

    rotate_password(&redis, "pw2");
    for sidecar in &mut first {
        assert!(
            sidecar.wait_for_log("renew refused by redis", secs(10)),
            "the refusal is logged"
        );
        if sidecar.is_running() {
            sidecar.signal(Signal::SIGTERM);
        }
        sidecar.wait_exit(secs(5)).expect("stopped within 5 s");
        assert!(!sidecar.output_file().exists(), "the ID is not published");
        let state = sidecar
            .read_state()
            .expect("the state file records the lease");
        assert_eq!(state["release_unconfirmed"], true, "{state}");
    }
    for lease in &leases {
        let key = worker_key(app, lease.worker_id);
        assert_eq!(redis.get(&key).as_deref(), Some(lease.owner.as_str()));
    }
    // Sidecar 1's record as a wall clock stepped 60 s forward would read it.
    let mut state = first[1].read_state().unwrap();
    state["valid_until_ms"] = (unix_ms() - 60_000).into();
    std::fs::write(first[1].state_file(), state.to_string()).unwrap();

    let new_url = url.replace(":pw@", ":pw2@");
    let restarted = Instant::now();
    let second: Vec<Sidecar> = pods.iter().map(|p| worker(&new_url, p).spawn()).collect();
    for (sidecar, lease) in second.iter().zip(&leases) {
        let again = poll_some(secs(5), || sidecar.id()).unwrap_or_else(|| {
            panic!(
                "ID {} not re-adopted within 5 s of the restart (TTL 30 s)",
                lease.worker_id
            )
        });
        assert_eq!(again.worker_id, lease.worker_id);
        assert_eq!(
            again.owner, lease.owner,
            "the recorded owner string is kept"
        );
    }
    println!(
        "both old IDs published again {} ms after the restart",
        restarted.elapsed().as_millis()
    );
}

/// Shared body: a holder (TTL 6 s, renewed every second) whose renewals `fault` makes Redis
/// refuse keeps its ID published until the validity deadline /id reported just before the
/// fault (before the fix: gone at the first refusal, about a second later), unpublishes at
/// that deadline, exits 1 naming the refusal, and keeps its state file (the key may be ours).
fn refused_renewals_keep_the_id_until_the_deadline(fault: fn(&RedisServer), refusal: &str) {
    let redis = RedisServer::start();
    let app = "refused";
    redis.open_claim_guard(app);
    let url = acl_user(&redis, USER, WORKER_RULES);
    let mut sidecar = Sidecar::worker_at(&url, app)
        .flag("--ttl", "6s")
        .flag("--renew-interval", "1s")
        .spawn();
    let lease = sidecar.wait_for_lease(secs(10));
    // A renewal confirmed after this only moves the deadline later.
    let sampled = Instant::now();
    let valid_for = ms(sidecar.id().expect("published").lease_expires_in_ms);
    fault(&redis);
    let faulted = Instant::now();

    assert!(
        sidecar.wait_for_log("renew refused by redis", secs(5)),
        "the refusal is logged"
    );
    assert!(sidecar.id().is_some(), "still published after the refusal");
    assert!(
        poll_until(secs(10), || !sidecar.output_file().exists()),
        "unpublished by the deadline"
    );
    let gone = Instant::now();
    assert!(
        gone + ms(100) >= sampled + valid_for,
        "the ID file went {} ms after the fault, before the deadline {} ms after it",
        (gone - faulted).as_millis(),
        (sampled + valid_for)
            .saturating_duration_since(faulted)
            .as_millis()
    );
    assert!(
        gone <= faulted + ms(5_940) + secs(1),
        "the ID file stayed {} ms after the fault, past the deadline",
        (gone - faulted).as_millis()
    );
    let status = sidecar.wait_exit(secs(5)).expect("exit after the deadline");
    let log = sidecar.log_lines().join("\n");
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains(refusal), "{log}");
    crate::acl::assert_no_kind_names(&log);
    let state = sidecar.read_state().expect("state file kept");
    assert_eq!(state["release_unconfirmed"], true, "{state}");
    assert_eq!(state["owner"], lease.owner.as_str());
}

/// `WRONGPASS` at the reconnect after a password rotation: the ID stays until the deadline.
#[test]
fn a_rotated_password_keeps_the_id_until_the_deadline() {
    refused_renewals_keep_the_id_until_the_deadline(
        |redis| rotate_password(redis, "pw2"),
        "Password authentication failed",
    );
}

/// `NOPERM` for the renew script: the ID stays until the deadline.
#[test]
fn a_revoked_script_permission_keeps_the_id_until_the_deadline() {
    refused_renewals_keep_the_id_until_the_deadline(
        revoke_scripts,
        "NOPERM this user has no permissions to run the 'evalsha' command",
    );
}
