//! Authentication of gRPC admin and status calls: a tower layer in front of every
//! service, which lets through only the paths that need no admin credentials and
//! checks the rest with [`AdminGuard`] (bearer token or app signature, see
//! [`crate::auth`]) before the service sees the request.
//!
//! Open paths: the executor stream (its hello carries the executor token, checked in
//! `executors`), health and reflection (v1 and v1alpha). Everything else, including
//! any service added later, needs credentials: the list is of what is open, not of
//! what is closed. A refusal is `UNAUTHENTICATED` naming the reason, sent before the
//! request body is read, so a refused call changes nothing. A read-only token may
//! call only [`READ_RPCS`](crate::auth::READ_RPCS); anything else is
//! `PERMISSION_DENIED`, refused the same way.
//!
//! A gRPC signature covers method (`POST`), path and the timestamp and nonce headers,
//! not the body (a stream): see [`crate::auth`].

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tonic::Status;
use tower::{Layer, Service};

use crate::auth::{AdminGuard, READ_RPCS, read_only_refusal};

/// gRPC paths open to every caller, by prefix.
const OPEN_PATHS: &[&str] = &[
    "/sundial.v1.ExecutorService/",
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1.ServerReflection/",
    "/grpc.reflection.v1alpha.ServerReflection/",
];

fn is_open_path(path: &str) -> bool {
    OPEN_PATHS.iter().any(|p| path.starts_with(p))
}

/// Wraps the gRPC routes in [`AdminAuth`].
#[derive(Clone)]
pub struct AdminAuthLayer {
    guard: AdminGuard,
}

impl AdminAuthLayer {
    pub fn new(guard: AdminGuard) -> Self {
        Self { guard }
    }
}

impl<S> Layer<S> for AdminAuthLayer {
    type Service = AdminAuth<S>;
    fn layer(&self, inner: S) -> Self::Service {
        AdminAuth {
            inner,
            guard: self.guard.clone(),
        }
    }
}

#[derive(Clone)]
pub struct AdminAuth<S> {
    inner: S,
    guard: AdminGuard,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for AdminAuth<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    ReqBody: Send + 'static,
    ResBody: Default,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqBody>) -> Self::Future {
        // The clone that was polled ready serves this request (tower's usual swap).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        if self.guard.is_open() || is_open_path(req.uri().path()) {
            return Box::pin(inner.call(req));
        }
        let guard = self.guard.clone();
        Box::pin(async move {
            let path = req.uri().path();
            match guard
                .admit(req.method().as_str(), path, req.headers(), b"")
                .await
            {
                Ok(caller) if !caller.may_write() && !READ_RPCS.contains(&path) => {
                    tracing::info!(%path, ?caller, "grpc call refused: read-only token");
                    Ok(Status::permission_denied(read_only_refusal(path)).into_http())
                }
                Ok(caller) => {
                    tracing::debug!(%path, ?caller, "grpc call admitted");
                    inner.call(req).await
                }
                Err(e) => {
                    tracing::info!(%path, reason = %e, "grpc call refused");
                    Ok(Status::from(e).into_http())
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_executor_health_and_reflection_are_open() {
        for open in [
            "/sundial.v1.ExecutorService/Connect",
            "/grpc.health.v1.Health/Check",
            "/grpc.health.v1.Health/Watch",
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        ] {
            assert!(is_open_path(open), "{open}");
        }
        for closed in [
            "/sundial.v1.JobService/CreateJob",
            "/sundial.v1.RunService/GetRun",
            "/sundial.v1.NodeService/ListNodes",
            "/sundial.v1.AppService/CreateApp",
            "/sundial.v1.ExecutorServiceX/Connect",
            "/",
        ] {
            assert!(!is_open_path(closed), "{closed}");
        }
    }
}
