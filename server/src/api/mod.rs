//! The API surfaces. gRPC: `JobService`, `RunService` and `AppService` (apps and their
//! write-only secrets); `ExecutorService` and `NodeService` live in
//! `crate::dispatch::executors`. Handlers validate through [`convert`] and forward to
//! the core; errors become a `tonic::Status` in exactly one place, [`status`]. REST:
//! [`rest`], every admin operation over JSON on the HTTP port, calling the same
//! implementations; [`console`], the web console at `/`, a client of that REST API.
//! Both check admin credentials before a handler runs: [`grpc_auth`]
//! for gRPC, [`rest::require_admin`] for REST, over the rules in [`crate::auth`]. A
//! gRPC request that does not decode answers `INVALID_ARGUMENT` ([`grpc_errors`]).

mod apps;
pub mod audit;
pub mod budget;
pub mod console;
pub mod convert;
pub mod destinations;
pub mod grpc_auth;
pub mod grpc_errors;
mod jobs;
pub mod queries;
pub mod rest;
mod runs;
pub mod scrape;

use tonic::{Code, Status};

pub use apps::AppApi;
pub use audit::{Audit, AuditApi};
pub use jobs::JobApi;
pub use runs::RunApi;

use crate::schedule::jobs::Error;
use crate::store;

/// The mapping of core errors to gRPC status codes.
pub fn status(e: Error) -> Status {
    match e {
        Error::Invalid { field, reason } => Status::invalid_argument(format!("{field}: {reason}")),
        Error::Store(s) => {
            let code = match &s {
                store::Error::JobExists(_) | store::Error::AppExists(_) => Code::AlreadyExists,
                store::Error::JobNotFound(_) | store::Error::AppNotFound(_) => Code::NotFound,
                store::Error::VersionConflict { .. } => Code::Aborted,
                store::Error::BadCursor(_) => Code::InvalidArgument,
                store::Error::LeaseHeld { .. } | store::Error::StaleToken { .. } => {
                    Code::FailedPrecondition
                }
                store::Error::Unavailable(_) => Code::Unavailable,
                store::Error::SchemaTooNew { .. } | store::Error::Corrupt(_) => Code::Internal,
            };
            if code == Code::Internal {
                tracing::error!(error = %s, "store error");
            }
            Status::new(code, s.to_string())
        }
    }
}

impl From<store::Error> for Status {
    fn from(e: store::Error) -> Self {
        status(Error::Store(e))
    }
}
