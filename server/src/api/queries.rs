//! Run queries shared by the gRPC and REST surfaces: a job's runs filtered and paged,
//! and a job's status (its latest run and next fire times). Both surfaces validate
//! their own request shapes and then ask here, so they cannot drift apart.

use std::sync::Arc;

use sundial_proto::v1 as pb;

use super::budget::{Budget, MAX_LIST_BYTES};
use super::convert;
use crate::model::{JobRecord, Millis, RunRecord, RunState};
use crate::schedule::jobs::{self, Jobs, Plan};
use crate::store::{Page, RunQuery, RunStore};

/// Bounds how many store pages one listing scans while filtering by state.
const MAX_SCAN_PAGES: usize = 50;

/// Which runs of a job to list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunFilter {
    pub state: Option<RunState>,
    /// scheduled_at ≥ from
    pub from: Option<Millis>,
    /// scheduled_at < to
    pub to: Option<Millis>,
}

/// Up to `page_size` runs of `job_id` that pass `filter`, newest first, as they are
/// answered, and the cursor to continue from. A page may be short while more follow
/// (the scan per call is bounded, and so are the answer's bytes: see
/// [`super::budget`]); only a missing cursor means the end.
pub async fn list_runs(
    store: &dyn RunStore,
    job_id: &str,
    filter: &RunFilter,
    page_size: usize,
    mut cursor: Option<String>,
) -> crate::store::Result<Page<pb::Run>> {
    let mut items = Vec::new();
    let mut room = Budget::new(MAX_LIST_BYTES);
    'pages: for _ in 0..MAX_SCAN_PAGES {
        let page = store
            .list_runs(
                job_id,
                RunQuery {
                    from: filter.from,
                    to: filter.to,
                    limit: page_size - items.len(),
                    cursor: cursor.clone(),
                },
            )
            .await?;
        let wanted = page
            .items
            .into_iter()
            .filter(|r| filter.state.is_none_or(|s| r.state == s));
        for run in wanted {
            let after = store.run_cursor_after(&run);
            let run = convert::run_to_pb(run);
            if !room.take(&run) {
                break 'pages;
            }
            items.push(run);
            // Past this run, should the next one not fit.
            cursor = Some(after);
        }
        cursor = page.next_cursor;
        if cursor.is_none() || items.len() >= page_size {
            break;
        }
    }
    Ok(Page {
        items,
        next_cursor: cursor,
    })
}

/// What a caller wants to know about a job at a glance.
#[derive(Debug, Clone)]
pub struct JobStatus {
    pub job: JobRecord,
    pub latest_run: Option<RunRecord>,
    /// The armed fire and the ones after it; empty while paused or finished.
    pub next_fires: Vec<Millis>,
}

/// What a job's status is read from: the job operations and the run records. Cheap to
/// clone.
#[derive(Clone)]
pub struct StatusSource {
    pub jobs: Jobs,
    pub runs: Arc<dyn RunStore>,
}

pub async fn job_status(
    jobs: &Jobs,
    runs: &dyn RunStore,
    job_id: &str,
    next_fires: usize,
) -> jobs::Result<JobStatus> {
    let job = jobs.get(job_id).await?;
    let latest_run = runs
        .list_runs(
            job_id,
            RunQuery {
                limit: 1,
                ..RunQuery::default()
            },
        )
        .await?
        .items
        .into_iter()
        .next();
    let next_fires = match (&job.next_fire, Plan::new(job.spec.clone())) {
        (Some(arm), Ok(plan)) if next_fires > 0 => {
            let mut fires = vec![arm.planned];
            fires.extend(plan.upcoming(arm.planned, next_fires - 1));
            fires
        }
        _ => Vec::new(),
    };
    Ok(JobStatus {
        job,
        latest_run,
        next_fires,
    })
}
