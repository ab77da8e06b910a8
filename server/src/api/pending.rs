//! Services in the contract whose behaviour belongs to later work. Each answers
//! `UNIMPLEMENTED` with a message naming what is missing, so no caller mistakes them
//! for working ones.

use std::pin::Pin;

use futures::Stream;
use sundial_proto::v1 as pb;
use sundial_proto::v1::app_service_server::AppService;
use sundial_proto::v1::executor_service_server::ExecutorService;
use sundial_proto::v1::node_service_server::NodeService;
use tonic::{Request, Response, Status, Streaming};

#[derive(Default)]
pub struct ExecutorApi;

#[derive(Default)]
pub struct NodeApi;

#[derive(Default)]
pub struct AppApi;

#[tonic::async_trait]
impl ExecutorService for ExecutorApi {
    type ConnectStream = Pin<Box<dyn Stream<Item = Result<pb::ServerMessage, Status>> + Send>>;

    async fn connect(
        &self,
        _req: Request<Streaming<pb::ExecutorMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        Err(Status::unimplemented(
            "ExecutorService.Connect: the executor stream is not built yet (executors issue); runs stay TRIGGERED",
        ))
    }
}

#[tonic::async_trait]
impl NodeService for NodeApi {
    async fn list_nodes(
        &self,
        _req: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::ListNodesResponse>, Status> {
        Err(Status::unimplemented(
            "ListNodes: the node registry is not built yet (executors and routing issues)",
        ))
    }
}

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
