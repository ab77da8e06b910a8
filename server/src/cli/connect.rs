//! The client's connection to a server: one channel (TLS when the address is
//! `https://`, trusting `--ca-file` or the web's roots), the bearer token on every call
//! (`--token-file`, else `SUNDIAL_TOKEN`), and a typed client per service.

use std::time::Duration;

use sundial_proto::v1::app_service_client::AppServiceClient;
use sundial_proto::v1::job_service_client::JobServiceClient;
use sundial_proto::v1::node_service_client::NodeServiceClient;
use sundial_proto::v1::run_service_client::RunServiceClient;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use super::{ClientArgs, Exit, Failure, Result};

/// The server the client talks to when neither `--server` nor `SUNDIAL_SERVER` says
/// (the `serve` default `--listen`).
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:50051";

/// Puts `authorization: Bearer <token>` on every call, when there is a token.
#[derive(Clone)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            req.metadata_mut().insert("authorization", value.clone());
        }
        Ok(req)
    }
}

pub type Svc = InterceptedService<Channel, Bearer>;

/// A connected server.
pub struct Server {
    channel: Channel,
    bearer: Bearer,
}

impl Server {
    pub async fn connect(args: &ClientArgs) -> Result<Self> {
        let bearer = Bearer(token(args)?);
        let address = address(&args.server);
        let mut endpoint = Endpoint::from_shared(address.clone())
            .map_err(|e| {
                Failure::usage(format!(
                    "--server: {:?} is not a URL such as {DEFAULT_SERVER} ({e})",
                    args.server
                ))
            })?
            .connect_timeout(Duration::from_secs(5));
        let tls = address.starts_with("https://");
        match (&args.ca_file, tls) {
            (Some(_), false) => {
                return Err(Failure::usage(
                    "--ca-file: the server address is not https://, so there is no TLS to check",
                ));
            }
            (ca, true) => {
                let mut config = ClientTlsConfig::new().with_webpki_roots();
                if let Some(path) = ca {
                    let pem = std::fs::read(path).map_err(|e| {
                        Failure::usage(format!("--ca-file: cannot read {}: {e}", path.display()))
                    })?;
                    config = config.ca_certificate(Certificate::from_pem(pem));
                }
                endpoint = endpoint
                    .tls_config(config)
                    .map_err(|e| Failure::usage(format!("--ca-file: {}", chain(&e))))?;
            }
            (None, false) => {}
        }
        let channel = endpoint.connect().await.map_err(|e| Failure {
            exit: Exit::Unavailable,
            message: format!("cannot reach the server at {address}: {}", chain(&e)),
        })?;
        Ok(Self { channel, bearer })
    }

    pub fn jobs(&self) -> JobServiceClient<Svc> {
        JobServiceClient::with_interceptor(self.channel.clone(), self.bearer.clone())
    }

    pub fn runs(&self) -> RunServiceClient<Svc> {
        RunServiceClient::with_interceptor(self.channel.clone(), self.bearer.clone())
    }

    pub fn nodes(&self) -> NodeServiceClient<Svc> {
        NodeServiceClient::with_interceptor(self.channel.clone(), self.bearer.clone())
    }

    pub fn apps(&self) -> AppServiceClient<Svc> {
        AppServiceClient::with_interceptor(self.channel.clone(), self.bearer.clone())
    }
}

/// The server's URL: `host:port` alone means plaintext `http://host:port`.
fn address(raw: &str) -> String {
    if raw.contains("://") {
        raw.to_owned()
    } else {
        format!("http://{raw}")
    }
}

/// The bearer token's header value: from `--token-file`, else `SUNDIAL_TOKEN`.
fn token(args: &ClientArgs) -> Result<Option<MetadataValue<Ascii>>> {
    let (raw, from) = match &args.token_file {
        Some(path) => (
            std::fs::read_to_string(path).map_err(|e| {
                Failure::usage(format!("--token-file: cannot read {}: {e}", path.display()))
            })?,
            format!("--token-file {}", path.display()),
        ),
        None => match std::env::var("SUNDIAL_TOKEN") {
            Ok(token) => (token, "SUNDIAL_TOKEN".to_owned()),
            Err(_) => return Ok(None),
        },
    };
    let token = raw.trim();
    if token.is_empty() {
        return Err(Failure::usage(format!("{from}: the token is empty")));
    }
    format!("Bearer {token}")
        .parse()
        .map(Some)
        .map_err(|_| Failure::usage(format!("{from}: the token is not printable ASCII")))
}

/// An error with its causes, as one line.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// The answer of one call, or a failure saying `what` was refused and why.
pub async fn ask<T>(
    what: impl std::fmt::Display,
    call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T> {
    call.await
        .map(tonic::Response::into_inner)
        .map_err(|status| Failure::rpc(what, &status))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_host_and_port_is_plaintext() {
        assert_eq!(address("127.0.0.1:50051"), "http://127.0.0.1:50051");
        assert_eq!(address("https://sundial:443"), "https://sundial:443");
    }
}
