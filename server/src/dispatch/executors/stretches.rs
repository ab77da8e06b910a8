//! How a stream's batch of messages is cut for handling: each maximal stretch of run
//! reports (`Started`, `Result`, `Progress`, `Logs`) about distinct runs may go to the
//! store at once, every other message is handled on its own, and no report overtakes
//! an earlier one about the same run.

use sundial_proto::v1 as pb;
use sundial_proto::v1::executor_message::Msg;

use super::stored_id;

/// The stored run a run report (`Started`, `Result`, `Progress`, `Logs`) names; None
/// for other messages and for a report that names none (handled on its own, and
/// refused).
fn report_key(m: &pb::ExecutorMessage) -> Option<String> {
    let run = match &m.msg {
        Some(Msg::Started(s)) => s.run.as_ref(),
        Some(Msg::Result(r)) => r.run.as_ref(),
        Some(Msg::Progress(p)) => p.run.as_ref(),
        Some(Msg::Logs(l)) => l.run.as_ref(),
        _ => None,
    }?;
    (!run.schedule_id.is_empty()).then(|| stored_id(run))
}

/// A batch cut for handling: a message handled on its own, or run reports about
/// distinct runs, which may go to the store at once.
#[derive(Debug, PartialEq)]
pub(super) enum Stretch {
    One(pb::ExecutorMessage),
    Reports(Vec<pb::ExecutorMessage>),
}

/// Cuts a batch, in order, into stretches: each maximal run of reports naming distinct
/// runs is one stretch (a second report about a run starts the next), every other
/// message one of its own.
pub(super) fn stretches(msgs: Vec<pb::ExecutorMessage>) -> Vec<Stretch> {
    let mut out = Vec::new();
    let mut current: Vec<pb::ExecutorMessage> = Vec::new();
    let mut runs = std::collections::HashSet::new();
    for m in msgs {
        match report_key(&m) {
            Some(key) => {
                if !runs.insert(key.clone()) {
                    out.push(Stretch::Reports(std::mem::take(&mut current)));
                    runs = std::collections::HashSet::from([key]);
                }
                current.push(m);
            }
            None => {
                if !current.is_empty() {
                    out.push(Stretch::Reports(std::mem::take(&mut current)));
                    runs.clear();
                }
                out.push(Stretch::One(m));
            }
        }
    }
    if !current.is_empty() {
        out.push(Stretch::Reports(current));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(id: &str) -> Option<pb::RunRef> {
        Some(pb::RunRef {
            schedule_id: id.into(),
            attempt: 1,
            fencing_token: 1,
            shard_index: 0,
        })
    }

    fn started(id: &str) -> pb::ExecutorMessage {
        pb::ExecutorMessage {
            msg: Some(Msg::Started(pb::Started { run: run(id) })),
        }
    }

    fn result(id: &str) -> pb::ExecutorMessage {
        pb::ExecutorMessage {
            msg: Some(Msg::Result(pb::Result {
                run: run(id),
                ..Default::default()
            })),
        }
    }

    fn logs(id: &str) -> pb::ExecutorMessage {
        pb::ExecutorMessage {
            msg: Some(Msg::Logs(pb::LogLines {
                run: run(id),
                lines: Vec::new(),
            })),
        }
    }

    fn progress(id: &str) -> pb::ExecutorMessage {
        pb::ExecutorMessage {
            msg: Some(Msg::Progress(pb::Progress {
                run: run(id),
                ..Default::default()
            })),
        }
    }

    fn heartbeat() -> pb::ExecutorMessage {
        pb::ExecutorMessage {
            msg: Some(Msg::Heartbeat(pb::Heartbeat::default())),
        }
    }

    #[test]
    fn reports_about_distinct_runs_share_a_stretch_and_never_overtake() {
        use Stretch::{One, Reports};
        let cut = stretches(vec![
            started("a@1"),
            started("b@1"),
            result("a@1"),
            result("c@1"),
            logs("d@1"),
            progress("e@1"),
            logs("c@1"),
            result("d@1"),
            heartbeat(),
            result("b@1"),
            started("x@1"),
            pb::ExecutorMessage {
                msg: Some(Msg::Started(pb::Started { run: None })),
            },
        ]);
        assert_eq!(
            cut,
            vec![
                Reports(vec![started("a@1"), started("b@1")]),
                // The second report about a@1 waits for the first.
                Reports(vec![
                    result("a@1"),
                    result("c@1"),
                    logs("d@1"),
                    progress("e@1")
                ]),
                // c@1's log lines after its result, d@1's result after its log lines.
                Reports(vec![logs("c@1"), result("d@1")]),
                One(heartbeat()),
                Reports(vec![result("b@1"), started("x@1")]),
                // A report naming no run is handled (and refused) on its own.
                One(pb::ExecutorMessage {
                    msg: Some(Msg::Started(pb::Started { run: None })),
                }),
            ]
        );
        assert!(stretches(Vec::new()).is_empty());
    }
}
