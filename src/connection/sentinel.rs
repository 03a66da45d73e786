//! Which node the Sentinels of a `redis+sentinel://` URL name as the primary.
//!
//! The rule (Redis' Sentinel client guidelines,
//! <https://redis.io/docs/latest/develop/reference/sentinel-clients/>): every
//! Sentinel of the URL is asked at once (`SENTINEL GET-MASTER-ADDR-BY-NAME`, each bounded by the
//! call timeout); the primary is the node named by more than half of the Sentinels in the URL
//! (not of those that answered: behind a partition one stale Sentinel that alone answers must not
//! decide, so list the deployment's Sentinels, an odd number); the caller then connects only when
//! that node answers `ROLE` as master. A Sentinel
//! that names another node (stale after a failover, cut off from the others) is outvoted, never
//! believed first, and named in a warning at most once per [`WARN_EVERY`] for the same dissent.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{Readable, RedisTarget, classify};
use crate::timing::bounded;
use futures_util::future::join_all;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, ErrorKind, RedisError, RedisResult};

/// The same dissent (which Sentinel names which node) is warned about at most this often; a
/// new dissent at once.
const WARN_EVERY: Duration = Duration::from_secs(300);

/// A node as `host:port`.
pub(super) type Node = (String, u16);

/// The Sentinels of one URL: a connection to each (opened on first use, dropped on an error)
/// and the last dissent warned about.
pub(super) struct Sentinels {
    /// One slot per Sentinel of the URL, in URL order.
    conns: Vec<Mutex<Option<MultiplexedConnection>>>,
    warned: Mutex<Option<(String, Instant)>>,
}

/// What one Sentinel answered.
enum Answer {
    Names(Node),
    /// It does not know the master (nil reply).
    Unknown,
    Failed(RedisError),
}

impl Sentinels {
    pub(super) fn new(target: &RedisTarget) -> Sentinels {
        Sentinels {
            conns: target.hosts.iter().map(|_| Mutex::new(None)).collect(),
            warned: Mutex::new(None),
        }
    }

    /// The node more than half of the URL's Sentinels name as the primary of the URL's
    /// master (asked all at once, each within `limit`).
    ///
    /// Errors: no Sentinel answers (I/O kind, transient: `no Sentinel answers (hosts)`); no
    /// majority (transient: a failover in progress); every answering Sentinel does not know the
    /// master (`MasterNameNotFoundBySentinel`); a host that is no Sentinel (configuration
    /// error); a refusal of the Sentinel's own (auth, ACL) as Redis said it.
    pub(super) async fn primary(&self, target: &RedisTarget, limit: Duration) -> RedisResult<Node> {
        let asks = target
            .hosts
            .iter()
            .enumerate()
            .map(|(i, (host, port))| async move {
                match bounded(limit, self.ask(target, i, host, *port, limit)).await {
                    Ok(Some(node)) => Answer::Names(node),
                    Ok(None) => Answer::Unknown,
                    Err(err) => {
                        *self.conns[i].lock().expect("sentinel slot") = None;
                        Answer::Failed(err)
                    }
                }
            });
        let answers = join_all(asks).await;
        let node = tally(target, &answers)?;
        self.warn_dissent(target, &answers, &node);
        Ok(node)
    }

    async fn ask(
        &self,
        target: &RedisTarget,
        index: usize,
        host: &str,
        port: u16,
        limit: Duration,
    ) -> RedisResult<Option<Node>> {
        let kept = self.conns[index].lock().expect("sentinel slot").clone();
        let mut conn = match kept {
            Some(conn) => conn,
            None => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(limit))
                    .set_response_timeout(Some(limit));
                let client = Client::open(target.sentinel_info(host, port)?)?;
                let conn = client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                *self.conns[index].lock().expect("sentinel slot") = Some(conn.clone());
                conn
            }
        };
        redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(&target.master)
            .query_async(&mut conn)
            .await
    }

    /// Warns once per dissent (and again after [`WARN_EVERY`]) about Sentinels that name
    /// another node than the majority.
    fn warn_dissent(&self, target: &RedisTarget, answers: &[Answer], primary: &Node) {
        let dissent: Vec<String> = answers
            .iter()
            .zip(&target.hosts)
            .filter_map(|(answer, sentinel)| match answer {
                Answer::Names(node) if node != primary => {
                    Some(format!("{} names {}", show(sentinel), show(node)))
                }
                _ => None,
            })
            .collect();
        let mut warned = self.warned.lock().expect("warned lock");
        if dissent.is_empty() {
            *warned = None;
            return;
        }
        let dissent = dissent.join(", ");
        let due = match &*warned {
            Some((last, at)) => *last != dissent || at.elapsed() >= WARN_EVERY,
            None => true,
        };
        if due {
            tracing::warn!(
                redis = %target,
                primary = %show(primary),
                dissent = %dissent,
                "a Sentinel names another primary than the majority of the Sentinels (stale or cut off from the others?); it is outvoted"
            );
            *warned = Some((dissent, Instant::now()));
        }
    }
}

/// The node more than half of the Sentinels in the URL name (answered or not: a minority
/// that alone answers, e.g. behind a partition, decides nothing); see [`Sentinels::primary`]
/// for the errors.
fn tally(target: &RedisTarget, answers: &[Answer]) -> RedisResult<Node> {
    let answered = answers
        .iter()
        .filter(|a| !matches!(a, Answer::Failed(_)))
        .count();
    let mut counts: Vec<(&Node, usize)> = Vec::new();
    for answer in answers {
        if let Answer::Names(node) = answer {
            match counts.iter_mut().find(|(n, _)| *n == node) {
                Some((_, count)) => *count += 1,
                None => counts.push((node, 1)),
            }
        }
    }
    if let Some((node, _)) = counts.iter().find(|(_, count)| count * 2 > answers.len()) {
        return Ok((*node).clone());
    }
    if answered == 0 {
        return Err(no_answer(target, answers));
    }
    if counts.is_empty() && answers.iter().any(|a| matches!(a, Answer::Unknown)) {
        return Err(RedisError::from((
            ErrorKind::MasterNameNotFoundBySentinel,
            "the Sentinel does not know the master",
        )));
    }
    let named: Vec<String> = counts
        .iter()
        .map(|(node, count)| format!("{} by {count}", show(node)))
        .collect();
    Err(in_failover(&format!(
        "no majority of the Sentinels in the URL names one primary yet ({} of {} answered; named: {})",
        answered,
        answers.len(),
        match named.is_empty() {
            true => "none".to_owned(),
            false => named.join(", "),
        }
    )))
}

/// No Sentinel answered: a refusal a retry cannot fix (a host that is no Sentinel, an auth or
/// ACL error) is returned as such; otherwise all are down or unreachable (transient).
fn no_answer(target: &RedisTarget, answers: &[Answer]) -> RedisError {
    let failures = answers.iter().filter_map(|a| match a {
        Answer::Failed(err) => Some(err),
        _ => None,
    });
    let mut last = None;
    for err in failures {
        if err.code() == Some("ERR") && err.detail().is_some_and(|d| d.contains("unknown command"))
        {
            return (
                ErrorKind::InvalidClientConfig,
                "Address does not point to a sentinel node",
                Readable(err).to_string(),
            )
                .into();
        }
        if classify(err) == super::Failure::Permanent {
            return err.clone();
        }
        last = Some(err);
    }
    no_sentinel_answers(&target.hosts, last.expect("at least one Sentinel"))
}

/// `host:port` (`[v6]:port`).
pub(super) fn show((host, port): &Node) -> String {
    match host.contains(':') {
        true => format!("[{host}]:{port}"),
        false => format!("{host}:{port}"),
    }
}

/// A transient error (I/O kind): a Sentinel failover in progress.
pub(super) fn in_failover(what: &str) -> RedisError {
    std::io::Error::other(format!("{what} (failover in progress?)")).into()
}

/// A transient error (I/O kind): none of the Sentinels in the URL answers
/// (`hosts` as `host:port`, never credentials).
fn no_sentinel_answers(hosts: &[Node], last: &RedisError) -> RedisError {
    let hosts: Vec<String> = hosts.iter().map(show).collect();
    std::io::Error::other(format!(
        "no Sentinel answers ({}): {}",
        hosts.join(", "),
        Readable(last)
    ))
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(host: &str) -> Answer {
        Answer::Names((host.to_owned(), 6379))
    }

    fn down() -> Answer {
        Answer::Failed(std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into())
    }

    /// After a failover: the first Sentinel is stale, the second down, three agree.
    #[test]
    fn a_majority_of_the_listed_sentinels_names_the_primary() {
        let target = RedisTarget::parse("redis+sentinel://s1,s2,s3,s4,s5/mymaster").expect("url");
        let answers = [
            names("old"),
            down(),
            names("new"),
            names("new"),
            names("new"),
        ];
        assert_eq!(tally(&target, &answers).unwrap().0, "new");
        // Two of five is no majority.
        let split = [
            names("old"),
            down(),
            names("old"),
            names("new"),
            names("new"),
        ];
        let err = tally(&target, &split).unwrap_err();
        assert!(err.to_string().contains("no majority"), "{err}");
        // One answering Sentinel decides nothing (a partition; it may be stale).
        let one = [down(), down(), names("new"), down(), down()];
        let err = tally(&target, &one).unwrap_err();
        assert!(err.to_string().contains("no majority"), "{err}");
        // Three of five, two down: a majority of the URL's Sentinels.
        let three = [down(), names("new"), names("new"), down(), names("new")];
        assert_eq!(tally(&target, &three).unwrap().0, "new");
        let none = [down(), down(), down(), down(), down()];
        let err = tally(&target, &none).unwrap_err();
        assert!(err.to_string().contains("no Sentinel answers"), "{err}");
        let unknown = [Answer::Unknown, down(), Answer::Unknown, down(), down()];
        assert_eq!(
            tally(&target, &unknown).unwrap_err().kind(),
            ErrorKind::MasterNameNotFoundBySentinel
        );
    }
}
