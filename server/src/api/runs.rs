//! `RunService`: what happened to every planned execution.

use std::sync::Arc;
use std::time::Duration;

use sundial_proto::v1 as pb;
use sundial_proto::v1::run_service_server::RunService;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::budget::{Budget, MAX_LIST_BYTES};
use super::{convert, status};
use crate::api::queries::{self, RunFilter};
use crate::dispatch::Router;
use crate::model::split_schedule_id;
use crate::schedule::jobs::Jobs;
use crate::store::{Applied, RunStore};

pub struct RunApi {
    store: Arc<dyn RunStore>,
    jobs: Jobs,
    router: Arc<Router>,
    /// Ends log follows on shutdown.
    shutdown: CancellationToken,
}

impl RunApi {
    pub fn new(
        jobs: Jobs,
        store: Arc<dyn RunStore>,
        router: Arc<Router>,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            store,
            jobs,
            router,
            shutdown,
        }
    }
}

/// Log lines fetched per store read while streaming a run's log.
const LOG_PAGE: usize = 500;
/// How often a follow looks for new lines.
const FOLLOW_POLL: Duration = Duration::from_millis(200);
/// Longest reason a caller may give for a cancel.
const MAX_REASON_BYTES: usize = 256;

fn schedule_id(raw: &str) -> Result<&str, Status> {
    if raw.is_empty() {
        return Err(Status::invalid_argument("schedule_id: required"));
    }
    split_schedule_id(raw).map(|_| raw).ok_or_else(|| {
        Status::invalid_argument(format!(
            "schedule_id: {raw:?} is not <job_id>@<schedule_no>"
        ))
    })
}

#[tonic::async_trait]
impl RunService for RunApi {
    async fn get_run(
        &self,
        req: Request<pb::GetRunRequest>,
    ) -> Result<Response<pb::GetRunResponse>, Status> {
        let req = req.into_inner();
        let sid = schedule_id(&req.schedule_id)?;
        let run = self
            .store
            .get_run(sid)
            .await?
            .ok_or_else(|| Status::not_found(format!("run {sid:?} not found")))?;
        Ok(Response::new(pb::GetRunResponse {
            run: Some(convert::run_to_pb(run)),
        }))
    }

    async fn list_runs(
        &self,
        req: Request<pb::ListRunsRequest>,
    ) -> Result<Response<pb::ListRunsResponse>, Status> {
        let req = req.into_inner();
        let job_id = convert::job_id("job_id", &req.job_id).map_err(status)?;
        let size = convert::page_size("page_size", req.page_size).map_err(status)?;
        let state = convert::run_state_filter(req.state).map_err(status)?;
        if req.from_ms < 0 || req.to_ms < 0 {
            return Err(Status::invalid_argument("from_ms/to_ms: must be ≥ 0"));
        }
        if req.to_ms != 0 && req.to_ms <= req.from_ms {
            return Err(Status::invalid_argument("to_ms: must be after from_ms"));
        }
        let filter = RunFilter {
            state,
            from: (req.from_ms > 0).then_some(req.from_ms),
            to: (req.to_ms > 0).then_some(req.to_ms),
        };
        let cursor = convert::run_page_token("page_token", &req.page_token).map_err(status)?;
        let page = queries::list_runs(self.store.as_ref(), &job_id, &filter, size, cursor).await?;
        Ok(Response::new(pb::ListRunsResponse {
            runs: page.items,
            next_page_token: page.next_cursor.unwrap_or_default(),
        }))
    }

    async fn get_job_status(
        &self,
        req: Request<pb::GetJobStatusRequest>,
    ) -> Result<Response<pb::GetJobStatusResponse>, Status> {
        let req = req.into_inner();
        let job_id = convert::job_id("job_id", &req.job_id).map_err(status)?;
        let n = match req.next_fires {
            0 => 5,
            n if !(1..=100).contains(&n) => {
                return Err(Status::invalid_argument(
                    "next_fires: must be between 0 and 100",
                ));
            }
            n => n as usize,
        };
        let st = queries::job_status(&self.jobs, self.store.as_ref(), &job_id, n)
            .await
            .map_err(status)?;
        Ok(Response::new(pb::GetJobStatusResponse {
            job_id,
            version: st.job.version,
            paused: st.job.paused,
            latest_run: st.latest_run.map(convert::run_to_pb),
            next_fire_times_ms: st.next_fires,
        }))
    }

    async fn cancel_run(
        &self,
        req: Request<pb::CancelRunRequest>,
    ) -> Result<Response<pb::CancelRunResponse>, Status> {
        let req = req.into_inner();
        let sid = schedule_id(&req.schedule_id)?;
        if req.reason.len() > MAX_REASON_BYTES {
            return Err(Status::invalid_argument(format!(
                "reason: longer than {MAX_REASON_BYTES} bytes"
            )));
        }
        let reason = if req.reason.is_empty() {
            "cancelled by request".to_owned()
        } else {
            req.reason
        };
        let t = self.store.cancel_run(sid, &reason).await?;
        let Some(run) = t.run.clone() else {
            return Err(Status::not_found(format!("run {sid:?} not found")));
        };
        match &t.applied {
            Applied::Yes => {
                tracing::info!(schedule_id = %sid, %reason, "run cancelled");
                self.router.follow_up(t).await;
            }
            Applied::Already | Applied::No(_) => {
                return Err(Status::failed_precondition(format!(
                    "run {sid:?} is already {}",
                    run.state
                )));
            }
        }
        Ok(Response::new(pb::CancelRunResponse {
            run: Some(convert::run_to_pb(run)),
        }))
    }

    type GetRunLogsStream = ReceiverStream<Result<pb::LogLine, Status>>;

    async fn get_run_logs(
        &self,
        req: Request<pb::GetRunLogsRequest>,
    ) -> Result<Response<Self::GetRunLogsStream>, Status> {
        let req = req.into_inner();
        let sid = schedule_id(&req.schedule_id)?.to_owned();
        if self.store.get_run(&sid).await?.is_none() {
            return Err(Status::not_found(format!("run {sid:?} not found")));
        }
        let (tx, rx) = mpsc::channel(64);
        let store = self.store.clone();
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            let mut after = 0;
            loop {
                // Read the run's state before the lines, so the lines read after a
                // final state include everything the executor sent.
                let final_now = match store.get_run(&sid).await {
                    Ok(r) => r.is_none_or(|r| r.state.is_final()),
                    Err(e) => {
                        let _ = tx.send(Err(Status::from(e))).await;
                        return;
                    }
                };
                loop {
                    let lines = match store.read_logs(&sid, after, LOG_PAGE).await {
                        Ok(l) => l,
                        Err(e) => {
                            let _ = tx.send(Err(Status::from(e))).await;
                            return;
                        }
                    };
                    let n = lines.len();
                    for l in lines {
                        after = l.seq;
                        if tx.send(Ok(log_line(l))).await.is_err() {
                            return;
                        }
                    }
                    if n < LOG_PAGE {
                        break;
                    }
                }
                if !req.follow || final_now {
                    return;
                }
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tx.closed() => return,
                    () = tokio::time::sleep(FOLLOW_POLL) => {}
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn list_run_logs(
        &self,
        req: Request<pb::ListRunLogsRequest>,
    ) -> Result<Response<pb::ListRunLogsResponse>, Status> {
        let req = req.into_inner();
        let sid = schedule_id(&req.schedule_id)?;
        let size = convert::page_size("page_size", req.page_size).map_err(status)?;
        let after = convert::seq_page_token("page_token", &req.page_token)
            .map_err(status)?
            .unwrap_or(0);
        if self.store.get_run(sid).await?.is_none() {
            return Err(Status::not_found(format!("run {sid:?} not found")));
        }
        // One line more than asked tells whether another page follows.
        let mut read = self.store.read_logs(sid, after, size + 1).await?;
        let mut more = read.len() > size;
        read.truncate(size);
        let mut lines = Vec::with_capacity(read.len());
        let mut room = Budget::new(MAX_LIST_BYTES);
        let mut last = 0;
        for l in read {
            let seq = l.seq;
            let line = log_line(l);
            if !room.take(&line) {
                more = true;
                break;
            }
            lines.push(line);
            last = seq;
        }
        let next_page_token = if more {
            last.to_string()
        } else {
            String::new()
        };
        Ok(Response::new(pb::ListRunLogsResponse {
            lines,
            next_page_token,
        }))
    }
}

fn log_line(l: crate::store::LogLine) -> pb::LogLine {
    pb::LogLine {
        time_ms: l.time_ms,
        level: l.level,
        message: l.message,
        attempt: l.attempt,
        shard_index: 0,
        seq: l.seq,
    }
}
