//! Authentication of gRPC admin and status calls: a tower layer in front of every
//! service, which lets through only the paths that need no admin credentials and
//! checks the rest with [`AdminGuard`] (bearer token or app signature, see
//! [`crate::auth`]) before the service sees the request.
//!
//! Open paths: the executor stream (its hello carries the executor token, checked in
//! `executors`), health and reflection (v1 and v1alpha). Everything else, including
//! any service added later, needs credentials: the list is of what is open, not of
//! what is closed. A refusal is `UNAUTHENTICATED` naming the reason, sent before the
//! request body is read (but a signed call's, which the signature covers), so a
//! refused call changes nothing. A read-only token may
//! call only [`READ_RPCS`](crate::auth::READ_RPCS); anything else is
//! `PERMISSION_DENIED`, refused the same way.
//!
//! Every admitted call that may change state is recorded in the audit log
//! ([`crate::api::audit`]) with how it went; the layer reads its request message for
//! that, as it does for a signature. In dev mode such calls are recorded too, their
//! caller `anonymous`.
//!
//! A gRPC signature covers method (`POST`), path, the timestamp and nonce headers and
//! the request message's bytes (see [`crate::auth`]): for a signed call the layer reads
//! the body, the one gRPC frame every admin call sends (at most
//! [`MAX_SIGNED_BODY`](crate::api::rest::MAX_SIGNED_BODY)), checks the signature over
//! its payload and hands the service the same bytes.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use tonic::Status;
use tonic::body::Body;
use tower::{Layer, Service};

use crate::api::audit::{Audit, audited};
use crate::api::rest::MAX_SIGNED_BODY;
use crate::auth::{AdminGuard, Caller, READ_RPCS, read_only_refusal};

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
    audit: Audit,
}

impl AdminAuthLayer {
    pub fn new(guard: AdminGuard, audit: Audit) -> Self {
        Self { guard, audit }
    }
}

impl<S> Layer<S> for AdminAuthLayer {
    type Service = AdminAuth<S>;
    fn layer(&self, inner: S) -> Self::Service {
        AdminAuth {
            inner,
            guard: self.guard.clone(),
            audit: self.audit.clone(),
        }
    }
}

#[derive(Clone)]
pub struct AdminAuth<S> {
    inner: S,
    guard: AdminGuard,
    audit: Audit,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, ResBody> Service<http::Request<Body>> for AdminAuth<S>
where
    S: Service<http::Request<Body>, Response = http::Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    ResBody: Default + Send,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        // The clone that was polled ready serves this request (tower's usual swap).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let path = req.uri().path().to_owned();
        let audited = audited(&path);
        if is_open_path(&path) || (self.guard.is_open() && !audited) {
            return Box::pin(inner.call(req));
        }
        let (guard, audit) = (self.guard.clone(), self.audit.clone());
        Box::pin(async move {
            // A signed call's message is read first (the signature covers it); any
            // other call is admitted, or refused, before its body is read.
            let signed = guard.needs_body(req.headers());
            let (mut req, mut message) = (req, Bytes::new());
            if signed {
                match read_message(req, true).await {
                    Ok(read) => (req, message) = read,
                    Err(status) => return Ok(refused(&path, status)),
                }
            }
            let caller = if guard.is_open() {
                Caller::Open
            } else {
                match guard
                    .admit(req.method().as_str(), &path, req.headers(), &message)
                    .await
                {
                    Ok(caller) if !caller.may_write() && !READ_RPCS.contains(&path.as_str()) => {
                        tracing::info!(%path, ?caller, "grpc call refused: read-only token");
                        return Ok(Status::permission_denied(read_only_refusal(&path)).into_http());
                    }
                    Ok(caller) => caller,
                    Err(e) => return Ok(refused(&path, Status::from(e))),
                }
            };
            if audited && !signed {
                match read_message(req, false).await {
                    Ok(read) => (req, message) = read,
                    Err(status) => return Ok(refused(&path, status)),
                }
            }
            tracing::debug!(%path, ?caller, "grpc call admitted");
            let resp = inner.call(req).await?;
            if audited {
                // A unary call that failed answers its status in the headers (trailers
                // only); one that succeeded answers OK in the trailers.
                let failed =
                    Status::from_header_map(resp.headers()).filter(|s| s.code() != tonic::Code::Ok);
                audit
                    .record(&caller, &path, &message, failed.as_ref(), "grpc")
                    .await;
            }
            Ok(resp)
        })
    }
}

/// A refusal, logged.
fn refused<B: Default>(path: &str, status: Status) -> http::Response<B> {
    tracing::info!(%path, reason = %status.message(), "grpc call refused");
    status.into_http()
}

/// Reads a call's body, its one gRPC frame: the request with the same bytes as its
/// body, and the frame's payload (the request message), which a signature covers and
/// the audit log reads. A signed call whose body is not one uncompressed frame is
/// refused; an unsigned one goes on (the service answers it) with no message read.
async fn read_message(
    req: http::Request<Body>,
    signed: bool,
) -> Result<(http::Request<Body>, Bytes), Status> {
    let (parts, body) = req.into_parts();
    let frame = Limited::new(body, FRAME_HEADER + MAX_SIGNED_BODY)
        .collect()
        .await
        .map_err(|_| {
            let why = format!("the request is unreadable or larger than {MAX_SIGNED_BODY} bytes");
            if signed {
                Status::unauthenticated(format!("X-Sundial-Signature: {why}"))
            } else {
                Status::resource_exhausted(why)
            }
        })?
        .to_bytes();
    let message = match payload(&frame) {
        Ok(message) => message,
        Err(_) if !signed => Bytes::new(),
        Err(why) => {
            return Err(Status::unauthenticated(format!(
                "X-Sundial-Signature: a signed gRPC call carries one uncompressed request \
                 message; {why}"
            )));
        }
    };
    Ok((
        http::Request::from_parts(parts, Body::new(Full::new(frame))),
        message,
    ))
}

/// A gRPC frame's header: a compression flag and the payload's length (big-endian).
const FRAME_HEADER: usize = 5;

/// The payload of `frame` when it is exactly one uncompressed gRPC frame.
fn payload(frame: &Bytes) -> Result<Bytes, &'static str> {
    let Some((&flag, rest)) = frame.split_first() else {
        return Err("this one has no message");
    };
    let Some(len) = rest.first_chunk::<4>().map(|b| u32::from_be_bytes(*b)) else {
        return Err("this one is cut short");
    };
    if flag != 0 {
        return Err("this one is compressed");
    }
    match usize::try_from(len).map(|l| l + FRAME_HEADER) {
        Ok(end) if end == frame.len() => Ok(frame.slice(FRAME_HEADER..)),
        Ok(end) if end < frame.len() => Err("this one carries more than one"),
        _ => Err("this one is cut short"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signed_call_is_one_uncompressed_frame() {
        let frame = |flag: u8, len: u32, payload: &[u8]| {
            let mut f = vec![flag];
            f.extend_from_slice(&len.to_be_bytes());
            f.extend_from_slice(payload);
            Bytes::from(f)
        };
        assert_eq!(
            payload(&frame(0, 7, b"\x0a\x05hello")).as_deref(),
            Ok(&b"\x0a\x05hello"[..])
        );
        assert_eq!(payload(&frame(0, 0, b"")).as_deref(), Ok(&b""[..]));
        assert!(
            payload(&frame(1, 7, b"\x0a\x05hello")).is_err(),
            "compressed"
        );
        assert!(payload(&frame(0, 8, b"\x0a\x05hello")).is_err(), "short");
        assert!(payload(&frame(0, 3, b"\x0a\x05hello")).is_err(), "two");
        assert!(payload(&Bytes::from_static(b"\0\0")).is_err(), "no header");
        assert!(payload(&Bytes::new()).is_err(), "nothing");
    }

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
