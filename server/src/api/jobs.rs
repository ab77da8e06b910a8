//! `JobService`: validated job CRUD, pause/resume and manual triggers.

use sundial_proto::v1 as pb;
use sundial_proto::v1::job_service_server::JobService;
use tonic::{Request, Response, Status};

use super::budget::{Budget, MAX_LIST_BYTES};
use super::destinations::Destinations;
use super::{convert, status};
use crate::model::MAX_PAYLOAD_BYTES;
use std::collections::HashMap;

use crate::schedule::jobs::{self, ApplyOutcome, Jobs, MAX_APPLY};

/// Bounds how many store pages one ListJobs call scans while filtering.
const MAX_SCAN_PAGES: usize = 50;

pub struct JobApi {
    jobs: Jobs,
    /// What a spec names outside itself (callback URL, HTTP target, app), checked
    /// before it is saved.
    destinations: Destinations,
}

impl JobApi {
    pub fn new(jobs: Jobs, destinations: Destinations) -> Self {
        Self { jobs, destinations }
    }
}

#[tonic::async_trait]
impl JobService for JobApi {
    async fn create_job(
        &self,
        req: Request<pb::CreateJobRequest>,
    ) -> Result<Response<pb::CreateJobResponse>, Status> {
        let (spec, paused) = convert::job_spec(req.into_inner().spec).map_err(status)?;
        self.destinations.check(&spec).await.map_err(status)?;
        let job = self.jobs.create(spec, paused).await.map_err(status)?;
        tracing::info!(job_id = %job.spec.id, "job created");
        Ok(Response::new(pb::CreateJobResponse {
            job: Some(convert::job_to_pb(job)),
        }))
    }

    async fn update_job(
        &self,
        req: Request<pb::UpdateJobRequest>,
    ) -> Result<Response<pb::UpdateJobResponse>, Status> {
        let req = req.into_inner();
        if req.expected_version == 0 {
            return Err(Status::invalid_argument(
                "expected_version: required (the version you read)",
            ));
        }
        let (spec, _paused) = convert::job_spec(req.spec).map_err(status)?;
        self.destinations.check(&spec).await.map_err(status)?;
        let job = self
            .jobs
            .update(spec, req.expected_version)
            .await
            .map_err(status)?;
        tracing::info!(job_id = %job.spec.id, version = job.version, "job updated");
        Ok(Response::new(pb::UpdateJobResponse {
            job: Some(convert::job_to_pb(job)),
        }))
    }

    async fn apply_jobs(
        &self,
        req: Request<pb::ApplyJobsRequest>,
    ) -> Result<Response<pb::ApplyJobsResponse>, Status> {
        let pb::ApplyJobsRequest { specs, dry_run } = req.into_inner();
        if specs.is_empty() {
            return Err(Status::invalid_argument(
                "specs: required (1 to 1000 job specs)",
            ));
        }
        if specs.len() > MAX_APPLY {
            return Err(Status::invalid_argument(format!(
                "specs: at most {MAX_APPLY} per call, got {}",
                specs.len()
            )));
        }
        let mut results: Vec<pb::ApplyJobResult> = specs
            .iter()
            .map(|s| pb::ApplyJobResult {
                job_id: s.id.clone(),
                ..Default::default()
            })
            .collect();
        // Valid specs go on to `Jobs::apply`, remembered by their index here.
        let mut valid = Vec::new();
        let mut first_at: HashMap<String, usize> = HashMap::new();
        for (i, s) in specs.into_iter().enumerate() {
            match convert::job_spec(Some(s)) {
                Err(e) => invalid_item(&mut results[i], i, &e),
                Ok((spec, _)) if first_at.contains_key(&spec.id) => {
                    let first = first_at[&spec.id];
                    results[i].outcome = pb::ApplyOutcome::Invalid as i32;
                    results[i].error =
                        format!("specs[{i}].id: {:?} is also specs[{first}]", spec.id);
                }
                Ok((spec, paused)) => {
                    first_at.insert(spec.id.clone(), i);
                    match self.destinations.check(&spec).await {
                        Ok(()) => valid.push((i, spec, paused)),
                        Err(e @ jobs::Error::Invalid { .. }) => {
                            invalid_item(&mut results[i], i, &e);
                        }
                        Err(e) => return Err(status(e)),
                    }
                }
            }
        }
        let (slots, valid): (Vec<usize>, Vec<_>) = valid
            .into_iter()
            .map(|(i, spec, paused)| (i, (spec, paused)))
            .unzip();
        let outcomes = self.jobs.apply(valid, dry_run).await.map_err(status)?;
        for (i, outcome) in slots.into_iter().zip(outcomes) {
            let r = &mut results[i];
            match outcome {
                Err(e) => invalid_item(r, i, &e),
                Ok(ApplyOutcome::Created(job)) => {
                    r.outcome = pb::ApplyOutcome::Created as i32;
                    r.job = Some(convert::job_to_pb(job));
                }
                Ok(ApplyOutcome::Updated(job)) => {
                    r.outcome = pb::ApplyOutcome::Updated as i32;
                    r.job = Some(convert::job_to_pb(job));
                }
                Ok(ApplyOutcome::Unchanged(job)) => {
                    r.outcome = pb::ApplyOutcome::Unchanged as i32;
                    r.job = Some(convert::job_to_pb(job));
                }
                Ok(ApplyOutcome::Conflict(why)) => {
                    r.outcome = pb::ApplyOutcome::Conflict as i32;
                    r.error = why;
                }
            }
        }
        let count = |o: pb::ApplyOutcome| results.iter().filter(|r| r.outcome() == o).count();
        tracing::info!(
            created = count(pb::ApplyOutcome::Created),
            updated = count(pb::ApplyOutcome::Updated),
            unchanged = count(pb::ApplyOutcome::Unchanged),
            invalid = count(pb::ApplyOutcome::Invalid),
            conflict = count(pb::ApplyOutcome::Conflict),
            dry_run,
            "jobs applied"
        );
        Ok(Response::new(pb::ApplyJobsResponse { results }))
    }

    async fn get_job(
        &self,
        req: Request<pb::GetJobRequest>,
    ) -> Result<Response<pb::GetJobResponse>, Status> {
        let id = convert::job_id("job_id", &req.into_inner().job_id).map_err(status)?;
        let job = self.jobs.get(&id).await.map_err(status)?;
        Ok(Response::new(pb::GetJobResponse {
            job: Some(convert::job_to_pb(job)),
        }))
    }

    async fn list_jobs(
        &self,
        req: Request<pb::ListJobsRequest>,
    ) -> Result<Response<pb::ListJobsResponse>, Status> {
        let req = req.into_inner();
        let size = convert::page_size("page_size", req.page_size).map_err(status)?;
        let state = convert::job_state_filter(req.state).map_err(status)?;
        if req.id_prefix.chars().count() > 128 {
            return Err(Status::invalid_argument(
                "id_prefix: longer than a job id (128 characters)",
            ));
        }
        let mut cursor = (!req.page_token.is_empty()).then_some(req.page_token);
        let mut jobs = Vec::new();
        let mut room = Budget::new(MAX_LIST_BYTES);
        'pages: for _ in 0..MAX_SCAN_PAGES {
            let page = self
                .jobs
                .list(cursor.as_deref(), &req.id_prefix, size - jobs.len())
                .await
                .map_err(status)?;
            let wanted = page.items.into_iter().filter(|j| {
                state.is_none_or(|s| convert::job_state(j) == s)
                    && req
                        .label_selector
                        .iter()
                        .all(|(k, v)| j.spec.labels.get(k) == Some(v))
            });
            for job in wanted {
                let id = job.spec.id.clone();
                let job = convert::job_to_pb(job);
                if !room.take(&job) {
                    break 'pages;
                }
                jobs.push(job);
                // Past this job, should the next one not fit.
                cursor = Some(self.jobs.cursor_after(&id));
            }
            cursor = page.next_cursor;
            if cursor.is_none() || jobs.len() >= size {
                break;
            }
        }
        Ok(Response::new(pb::ListJobsResponse {
            jobs,
            next_page_token: cursor.unwrap_or_default(),
        }))
    }

    async fn delete_job(
        &self,
        req: Request<pb::DeleteJobRequest>,
    ) -> Result<Response<pb::DeleteJobResponse>, Status> {
        let id = convert::job_id("job_id", &req.into_inner().job_id).map_err(status)?;
        self.jobs.delete(&id).await.map_err(status)?;
        tracing::info!(job_id = %id, "job deleted");
        Ok(Response::new(pb::DeleteJobResponse {}))
    }

    async fn pause_job(
        &self,
        req: Request<pb::PauseJobRequest>,
    ) -> Result<Response<pb::PauseJobResponse>, Status> {
        let id = convert::job_id("job_id", &req.into_inner().job_id).map_err(status)?;
        let job = self.jobs.pause(&id).await.map_err(status)?;
        tracing::info!(job_id = %id, version = job.version, "job paused");
        Ok(Response::new(pb::PauseJobResponse {
            job: Some(convert::job_to_pb(job)),
        }))
    }

    async fn resume_job(
        &self,
        req: Request<pb::ResumeJobRequest>,
    ) -> Result<Response<pb::ResumeJobResponse>, Status> {
        let id = convert::job_id("job_id", &req.into_inner().job_id).map_err(status)?;
        let job = self.jobs.resume(&id).await.map_err(status)?;
        tracing::info!(job_id = %id, version = job.version, "job resumed");
        Ok(Response::new(pb::ResumeJobResponse {
            job: Some(convert::job_to_pb(job)),
        }))
    }

    async fn preview_fire_times(
        &self,
        req: Request<pb::PreviewFireTimesRequest>,
    ) -> Result<Response<pb::PreviewFireTimesResponse>, Status> {
        let answer = self.preview(req.into_inner()).await.map_err(status)?;
        Ok(Response::new(answer))
    }

    async fn trigger_job(
        &self,
        req: Request<pb::TriggerJobRequest>,
    ) -> Result<Response<pb::TriggerJobResponse>, Status> {
        let req = req.into_inner();
        let id = convert::job_id("job_id", &req.job_id).map_err(status)?;
        if req.payload.len() > MAX_PAYLOAD_BYTES {
            return Err(Status::invalid_argument(format!(
                "payload: {} bytes is more than 64 KiB",
                req.payload.len()
            )));
        }
        if req.route_key.len() > 256 {
            return Err(Status::invalid_argument("route_key: longer than 256 bytes"));
        }
        let payload = (req.override_payload || !req.payload.is_empty()).then_some(req.payload);
        let route_key = (!req.route_key.is_empty()).then_some(req.route_key);
        let key = (!req.idempotency_key.is_empty()).then_some(req.idempotency_key.as_str());
        let enq = self
            .jobs
            .trigger(&id, key, payload, route_key)
            .await
            .map_err(status)?;
        tracing::info!(job_id = %id, schedule_id = %enq.schedule_id, duplicate = enq.duplicate, "manual trigger");
        Ok(Response::new(pb::TriggerJobResponse {
            schedule_id: enq.schedule_id,
            duplicate: enq.duplicate,
        }))
    }
}

impl JobApi {
    async fn preview(
        &self,
        req: pb::PreviewFireTimesRequest,
    ) -> Result<pb::PreviewFireTimesResponse, jobs::Error> {
        let preview = convert::preview(req)?;
        let fire_times_ms = self.jobs.preview(preview).await?;
        Ok(pb::PreviewFireTimesResponse { fire_times_ms })
    }
}

/// Marks item `i` INVALID with its error, the field named as `specs[i].<field>`.
fn invalid_item(r: &mut pb::ApplyJobResult, i: usize, e: &jobs::Error) {
    r.outcome = pb::ApplyOutcome::Invalid as i32;
    r.error = match e {
        jobs::Error::Invalid { field, reason } => {
            // The single-spec names ("spec.cron", or a bare "cron" from the cron parser).
            let rest = match field.strip_prefix("spec") {
                Some(rest) => rest.trim_start_matches('.'),
                None => field,
            };
            if rest.is_empty() {
                format!("specs[{i}]: {reason}")
            } else {
                format!("specs[{i}].{rest}: {reason}")
            }
        }
        other => format!("specs[{i}]: {other}"),
    };
}
