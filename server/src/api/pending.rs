//! Services in the contract whose behaviour belongs to later work. Each answers
//! `UNIMPLEMENTED` with a message naming what is missing, so no caller mistakes them
//! for working ones.

use sundial_proto::v1 as pb;
use sundial_proto::v1::app_service_server::AppService;
use tonic::{Request, Response, Status};

#[derive(Default)]
pub struct AppApi;

#[tonic::async_trait]
impl AppService for AppApi {
    async fn create_app(
        &self,
        _req: Request<pb::CreateAppRequest>,
    ) -> Result<Response<pb::CreateAppResponse>, Status> {
        Err(Status::unimplemented(
            "CreateApp: apps and webhook secrets are not built yet (webhooks issue)",
        ))
    }

    async fn get_app(
        &self,
        _req: Request<pb::GetAppRequest>,
    ) -> Result<Response<pb::GetAppResponse>, Status> {
        Err(Status::unimplemented(
            "GetApp: apps and webhook secrets are not built yet (webhooks issue)",
        ))
    }

    async fn rotate_app_secret(
        &self,
        _req: Request<pb::RotateAppSecretRequest>,
    ) -> Result<Response<pb::RotateAppSecretResponse>, Status> {
        Err(Status::unimplemented(
            "RotateAppSecret: apps and webhook secrets are not built yet (webhooks issue)",
        ))
    }
}
