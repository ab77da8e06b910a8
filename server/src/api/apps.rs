//! `AppService`: apps and their signing secrets. Secrets are write-only: one is
//! returned once, when it is created (by `CreateApp` or `RotateAppSecret`), and never
//! again; no request or secret is logged.

use std::sync::Arc;
use std::time::Duration;

use sundial_proto::v1 as pb;
use sundial_proto::v1::app_service_server::AppService;
use sundial_sdk::webhook::Secret;
use tonic::{Request, Response, Status};

use crate::model::{AppRecord, AppSecret, now_ms, valid_job_id};
use crate::store::AppStore;

/// How long the old secret keeps signing after a rotation when the caller does not say.
pub const DEFAULT_OVERLAP: Duration = Duration::from_secs(24 * 3600);

/// The longest overlap a rotation may ask for.
const MAX_OVERLAP: Duration = Duration::from_secs(30 * 24 * 3600);

pub struct AppApi {
    store: Arc<dyn AppStore>,
}

impl AppApi {
    pub fn new(store: Arc<dyn AppStore>) -> Self {
        Self { store }
    }
}

fn invalid(field: &str, reason: &str) -> Status {
    Status::invalid_argument(format!("{field}: {reason}"))
}

fn app_id(raw: &str) -> Result<&str, Status> {
    if valid_job_id(raw) {
        Ok(raw)
    } else {
        Err(invalid(
            "app_id",
            "required, must match [A-Za-z0-9._-]{1,128}, not . or ..",
        ))
    }
}

/// The given secret (parsed, never echoed in the error), or a fresh one.
fn secret(field: &str, raw: &str) -> Result<Secret, Status> {
    if raw.is_empty() {
        return Ok(Secret::generate());
    }
    raw.parse::<Secret>().map_err(|e| {
        invalid(
            field,
            &format!("must be \"whsec_\" followed by base64 of 24 to 64 bytes ({e})"),
        )
    })
}

fn view(app: &AppRecord) -> pb::App {
    let active = app.active_secrets(now_ms()).count();
    pb::App {
        app_id: app.app_id.clone(),
        name: app.name.clone(),
        active_secrets: i32::try_from(active).unwrap_or(i32::MAX),
        created_at_ms: app.created_at,
    }
}

#[tonic::async_trait]
impl AppService for AppApi {
    async fn create_app(
        &self,
        req: Request<pb::CreateAppRequest>,
    ) -> Result<Response<pb::CreateAppResponse>, Status> {
        let req = req.into_inner();
        let id = app_id(&req.app_id)?;
        if req.name.len() > 256 {
            return Err(invalid("name", "at most 256 bytes"));
        }
        let secret = secret("secret", &req.secret)?;
        let app = self
            .store
            .create_app(AppRecord {
                app_id: id.to_owned(),
                name: req.name,
                secrets: vec![AppSecret {
                    secret: secret.to_string(),
                    not_after: 0,
                }],
                created_at: 0,
            })
            .await?;
        tracing::info!(app_id = %app.app_id, "app created");
        Ok(Response::new(pb::CreateAppResponse {
            app: Some(view(&app)),
            secret: secret.to_string(),
        }))
    }

    async fn get_app(
        &self,
        req: Request<pb::GetAppRequest>,
    ) -> Result<Response<pb::GetAppResponse>, Status> {
        let req = req.into_inner();
        let id = app_id(&req.app_id)?;
        let app = self
            .store
            .get_app(id)
            .await?
            .ok_or_else(|| Status::not_found(format!("app {id:?} not found")))?;
        Ok(Response::new(pb::GetAppResponse {
            app: Some(view(&app)),
        }))
    }

    async fn rotate_app_secret(
        &self,
        req: Request<pb::RotateAppSecretRequest>,
    ) -> Result<Response<pb::RotateAppSecretResponse>, Status> {
        let req = req.into_inner();
        let id = app_id(&req.app_id)?;
        let overlap = match req.overlap_ms {
            0 => DEFAULT_OVERLAP,
            ms if ms < 0 => return Err(invalid("overlap_ms", "must be >= 0 (0 = 24 h)")),
            ms => Duration::from_millis(ms.unsigned_abs()),
        };
        if overlap > MAX_OVERLAP {
            return Err(invalid("overlap_ms", "at most 30 days"));
        }
        let secret = secret("new_secret", &req.new_secret)?;
        let app = self
            .store
            .rotate_app_secret(id, &secret.to_string(), overlap)
            .await?;
        tracing::info!(app_id = %app.app_id, overlap_ms = overlap.as_millis() as u64, "app secret rotated");
        Ok(Response::new(pb::RotateAppSecretResponse {
            app: Some(view(&app)),
            secret: secret.to_string(),
        }))
    }
}
