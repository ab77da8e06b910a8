//! What the instance says about its credentials at start (how many and for whom, never
//! which), and the loop that reads the executor tokens file again at each SIGHUP.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::auth::Authenticator;

/// Reads the executor tokens file again at each SIGHUP, until `stop`: a rotation adds
/// the new token to the file, moves the executors, then removes the old one. A file
/// that cannot be read keeps the tokens in force. Never logs a token.
pub async fn reload_executor_tokens_on_sighup(
    auth: Arc<Authenticator>,
    mut hup: tokio::signal::unix::Signal,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            got = hup.recv() => if got.is_none() { return },
        }
        match auth.reload_executor_tokens() {
            Ok(tokens) => {
                info!(tokens, groups = ?auth.executor_groups(), "SIGHUP: executor tokens file read again")
            }
            Err(e) => {
                error!(error = %e, "SIGHUP: executor tokens file not read again; the tokens in force stay")
            }
        }
    }
}

/// Says once, at startup, which credentials are required: how many and for whom,
/// never which.
pub fn log_auth_mode(auth: &Authenticator) {
    if auth.admin_required() {
        let apps: Vec<&str> = auth.app_ids().collect();
        info!(
            bearer_tokens = auth.bearer_token_count(),
            read_tokens = auth.read_token_count(),
            apps = ?apps,
            "admin auth on: gRPC (but executors, health, reflection) and REST (but /healthz, /metrics) need a bearer token or an app signature; a read token may only read"
        );
    } else {
        warn!(
            "admin auth OFF (dev mode): no --bearer-token or --app-secret, so every gRPC admin/status call and REST request is accepted; keep both ports on loopback"
        );
    }
    if auth.executor_tokens_required() {
        let groups = auth.executor_groups();
        info!(groups = ?groups, "executor auth on: a hello needs its group's executor token");
    } else {
        warn!("executor auth OFF (dev mode): no --executor-token, so any executor may connect");
    }
}
