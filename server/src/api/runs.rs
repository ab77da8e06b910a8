//! `RunService`: what happened to every planned execution.

use std::sync::Arc;

use sundial_proto::v1 as pb;
use sundial_proto::v1::run_service_server::RunService;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::{convert, status};
use crate::jobs::Jobs;
use crate::model::split_schedule_id;
use crate::runs::{self, RunFilter};
use crate::store::Store;

pub struct RunApi {
    store: Arc<dyn Store>,
    jobs: Jobs,
}

impl RunApi {
    pub fn new(jobs: Jobs) -> Self {
        Self {
            store: jobs.store().clone(),
            jobs,
        }
    }
}

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
        let cursor = (!req.page_token.is_empty()).then_some(req.page_token);
        let page = runs::list_runs(self.store.as_ref(), &job_id, &filter, size, cursor).await?;
        Ok(Response::new(pb::ListRunsResponse {
            runs: page.items.into_iter().map(convert::run_to_pb).collect(),
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
        let st = runs::job_status(&self.jobs, &job_id, n)
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
        _req: Request<pb::CancelRunRequest>,
    ) -> Result<Response<pb::CancelRunResponse>, Status> {
        Err(Status::unimplemented(
            "CancelRun needs executor dispatch and leases, which are not built yet (executors issue)",
        ))
    }

    type GetRunLogsStream = ReceiverStream<Result<pb::LogLine, Status>>;

    async fn get_run_logs(
        &self,
        _req: Request<pb::GetRunLogsRequest>,
    ) -> Result<Response<Self::GetRunLogsStream>, Status> {
        Err(Status::unimplemented(
            "GetRunLogs needs executors streaming log lines, which are not built yet (executors issue)",
        ))
    }
}
