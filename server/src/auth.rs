//! Who may call the server: the verification of bearer tokens and app signatures for
//! admin and status callers, and of executor tokens per group for executors.
//!
//! This module owns the rules, not the transports: the gRPC layer
//! ([`crate::api::grpc_auth`]) and the REST middleware ([`crate::api::rest`]) hand it
//! the method, path, headers and body of a request, and `executors` hands it a hello's
//! group and token. The only I/O is the replay check, behind [`NonceChecker`] (the
//! store's `check_nonce`).
//!
//! **Admin and status callers** present either
//! - `Authorization: Bearer <token>`, one of the `--bearer-token`s, or
//! - an app signature: `X-Sundial-App-Id`, `X-Sundial-Timestamp` (unix seconds),
//!   `X-Sundial-Nonce` (1 to 128 visible ASCII characters) and `X-Sundial-Signature`,
//!   the lowercase hex HMAC-SHA256, keyed with the app's secret, of the canonical
//!   string
//!
//!   ```text
//!   METHOD "\n" PATH "\n" TIMESTAMP "\n" NONCE "\n" BODY
//!   ```
//!
//!   where METHOD is the HTTP method (`GET`, `POST`), PATH the request target exactly
//!   as sent (path and, if any, `?query`), TIMESTAMP and NONCE the header values, and
//!   BODY the raw body bytes. The key is the app secret in the Standard Webhooks form
//!   `whsec_<base64>`: the HMAC key is the base64-decoded part. **gRPC**: METHOD is
//!   `POST`, PATH the gRPC path (`/sundial.v1.JobService/GetJob`) and BODY the request
//!   message's bytes as sent (the one gRPC frame's payload, uncompressed), so a
//!   signature made for one request cannot carry another; every admin call sends one
//!   request message. Clients sign with `sundial_sdk::app_auth`.
//!
//!   A timestamp more than [`SIGNATURE_WINDOW`] (5 minutes) away from the server's
//!   clock, in either direction, is refused; a nonce is remembered per app for twice
//!   that window, so a replayed request is refused. The nonce is only spent once the
//!   signature is good, so a forger cannot burn an app's nonces.
//!
//! With no bearer token and no app secret configured, admin authentication is off
//! (dev mode), and with no executor token configured, any executor may connect; the
//! server warns about each at startup.
//!
//! Every comparison with a secret takes constant time. Secrets live in [`Secret`],
//! whose `Debug` is redacted and which has no `Display`; error messages never carry a
//! presented or configured credential.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use hmac::{Hmac, KeyInit, Mac};
use http::HeaderMap;
use sha2::Sha256;
use subtle::ConstantTimeEq;
use tonic::Status;

use crate::model::valid_job_id;
use crate::store::{self, AppStore};

/// How far a signature's timestamp may be from the server's clock, either way.
pub const SIGNATURE_WINDOW: Duration = Duration::from_secs(300);

pub use sundial_sdk::app_auth::{HEADER_APP_ID, HEADER_NONCE, HEADER_SIGNATURE, HEADER_TIMESTAMP};

/// The group name of an executor token that any group may present.
pub const ANY_GROUP: &str = "*";

/// The longest nonce accepted.
const MAX_NONCE_LEN: usize = 128;

type HmacSha256 = Hmac<Sha256>;

/// A credential: a token, or an HMAC key. Its `Debug` is redacted and it has no
/// `Display`, so it cannot end up in a log line or an error message by accident.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl Secret {
    pub fn new(bytes: impl Into<Vec<u8>>) -> Self {
        Self(bytes.into())
    }

    /// The secret's bytes: for comparisons and HMAC keys only.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }

    /// Constant-time equality with `presented` (the length may leak, the content not).
    pub(crate) fn matches(&self, presented: &[u8]) -> bool {
        bool::from(self.0.as_slice().ct_eq(presented))
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Parsing never fails, so a malformed secret is reported by `config::validate`
/// without being echoed (clap prints the value of an argument it cannot parse).
impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Self(s.as_bytes().to_vec()))
    }
}

impl<'de> serde::Deserialize<'de> for Secret {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(|s| Self(s.into_bytes()))
    }
}

/// A bearer or read token and the name the audit log gives its caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedToken {
    pub name: String,
    pub token: Secret,
}

impl NamedToken {
    pub fn new(name: impl Into<String>, token: impl Into<Vec<u8>>) -> Self {
        Self {
            name: name.into(),
            token: Secret::new(token),
        }
    }
}

/// The validated credentials of one instance.
#[derive(Debug, Clone, Default)]
pub struct AuthOptions {
    /// Tokens accepted as `Authorization: Bearer <token>`.
    pub bearer_tokens: Vec<NamedToken>,
    /// Tokens accepted the same way for reading only ([`Caller::Reader`]).
    pub read_tokens: Vec<NamedToken>,
    /// App id → the HMAC keys of its secrets (more than one while a secret rotates).
    pub app_secrets: BTreeMap<String, Vec<Secret>>,
    /// Executor group (or [`ANY_GROUP`]) → the tokens its executors may present.
    pub executor_tokens: BTreeMap<String, Vec<Secret>>,
    /// A file of more executor tokens (`GROUP=TOKEN` lines), read again on
    /// [`Authenticator::reload_executor_tokens`]. With one, executor tokens are always
    /// required, even while the file is empty.
    pub executor_tokens_file: Option<PathBuf>,
    /// The tokens that file held when the configuration was read.
    pub file_executor_tokens: ExecutorTokens,
}

/// Executor group (or [`ANY_GROUP`]) → the tokens its executors may present.
pub type ExecutorTokens = BTreeMap<String, Vec<Secret>>;

/// Parses one `GROUP=TOKEN` entry (`*` for groups without their own). The error says
/// why, never the token.
pub fn parse_executor_token(entry: &[u8]) -> Result<(String, Secret), String> {
    let at = entry
        .iter()
        .position(|&b| b == b'=')
        .ok_or("expected GROUP=TOKEN")?;
    let group = std::str::from_utf8(&entry[..at])
        .map_err(|_| "expected GROUP=TOKEN")?
        .trim();
    if group != ANY_GROUP && !valid_job_id(group) {
        return Err("the group must be * or match [A-Za-z0-9._-]{1,128}, not . or ..".to_owned());
    }
    let token = &entry[at + 1..];
    if token.is_empty() || token.iter().any(|b| !b.is_ascii_graphic()) {
        return Err(format!(
            "group {group:?}: the token must be non-empty visible ASCII"
        ));
    }
    Ok((group.to_owned(), Secret::new(token)))
}

/// Reads an executor tokens file: one `GROUP=TOKEN` a line, blank lines and lines
/// starting with `#` skipped. The error names the line, never a token.
pub fn read_executor_tokens_file(path: &Path) -> Result<ExecutorTokens, String> {
    let text = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut tokens = ExecutorTokens::new();
    for (n, line) in text.split(|&b| b == b'\n').enumerate() {
        let line = line.trim_ascii();
        if line.is_empty() || line.starts_with(b"#") {
            continue;
        }
        let (group, token) = parse_executor_token(line)
            .map_err(|why| format!("{} line {}: {why}", path.display(), n + 1))?;
        tokens.entry(group).or_default().push(token);
    }
    Ok(tokens)
}

/// The flags' tokens and the file's, per group.
fn merge_tokens(a: &ExecutorTokens, b: &ExecutorTokens) -> ExecutorTokens {
    let mut out = a.clone();
    for (group, tokens) in b {
        out.entry(group.clone())
            .or_default()
            .extend(tokens.iter().cloned());
    }
    out
}

/// Why a caller was refused. Every variant but [`Error::NonceStore`] is
/// `UNAUTHENTICATED` (REST: 401); the message names the header or field and the reason.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "no credentials: send `Authorization: Bearer <token>` or the X-Sundial-App-Id, \
         X-Sundial-Timestamp, X-Sundial-Nonce and X-Sundial-Signature headers"
    )]
    Missing,
    #[error("Authorization: {0}")]
    Bearer(&'static str),
    #[error("{header}: {reason}")]
    Header {
        header: &'static str,
        reason: &'static str,
    },
    #[error(
        "X-Sundial-Timestamp: {skew_secs} s away from the server's clock, \
         outside the {window_secs} s window"
    )]
    Expired { skew_secs: u64, window_secs: u64 },
    #[error("X-Sundial-Signature: does not match the request")]
    BadSignature,
    #[error("X-Sundial-Nonce: already used (replayed request)")]
    Replayed,
    #[error("hello.token: {0}")]
    ExecutorToken(String),
    /// The replay check could not be made; the request is refused, not let through.
    #[error("replay check: {0}")]
    NonceStore(#[from] store::Error),
}

impl From<Error> for Status {
    fn from(e: Error) -> Self {
        match e {
            Error::NonceStore(s) => Status::from(s),
            e => Status::unauthenticated(e.to_string()),
        }
    }
}

/// Who a request was admitted as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// Admin authentication is off (dev mode).
    Open,
    /// An admin token, by its name.
    Bearer {
        name: String,
    },
    App {
        app_id: String,
    },
    /// A read-only token, by its name: only the calls of [`READ_RPCS`] (REST: `GET`).
    Reader {
        name: String,
    },
}

impl Caller {
    /// Whether this caller may make a call that changes state.
    pub fn may_write(&self) -> bool {
        !matches!(self, Self::Reader { .. })
    }
}

/// The gRPC methods a read-only token may call: the ones that change nothing. A list
/// of what is allowed, so a method added later is closed to readers until listed.
pub const READ_RPCS: &[&str] = &[
    "/sundial.v1.JobService/GetJob",
    "/sundial.v1.JobService/ListJobs",
    "/sundial.v1.JobService/PreviewFireTimes",
    "/sundial.v1.RunService/GetRun",
    "/sundial.v1.RunService/ListRuns",
    "/sundial.v1.RunService/GetJobStatus",
    "/sundial.v1.RunService/GetRunLogs",
    "/sundial.v1.RunService/ListRunLogs",
    "/sundial.v1.NodeService/ListNodes",
    "/sundial.v1.AppService/GetApp",
    "/sundial.v1.AuditService/ListAuditEvents",
];

/// Why an admitted caller may not make this call: a read-only token on a write. The
/// transports answer it PERMISSION_DENIED (REST: 403).
pub fn read_only_refusal(what: &str) -> String {
    format!("a read-only token may not call {what}: it changes state and needs an admin token")
}

/// A request whose signature is good; its nonce is not checked yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedRequest {
    pub app_id: String,
    pub nonce: String,
}

/// Remembers nonces: true the first time `(app_id, nonce)` is seen within `ttl`; and
/// knows the signing keys of apps created through `AppService`.
#[async_trait::async_trait]
pub trait NonceChecker: Send + Sync {
    async fn first_use(
        &self,
        app_id: &str,
        nonce: &str,
        ttl: Duration,
    ) -> Result<bool, store::Error>;

    /// The keys (decoded `whsec_` secrets) an app stored by `AppService` signs with
    /// now; empty for an unknown app.
    async fn app_keys(&self, _app_id: &str) -> Result<Vec<Vec<u8>>, store::Error> {
        Ok(Vec::new())
    }
}

/// The store remembers nonces for every instance (`check_nonce`).
pub struct StoreNonces(pub Arc<dyn AppStore>);

#[async_trait::async_trait]
impl NonceChecker for StoreNonces {
    async fn first_use(
        &self,
        app_id: &str,
        nonce: &str,
        ttl: Duration,
    ) -> Result<bool, store::Error> {
        self.0.check_nonce(app_id, nonce, ttl).await
    }

    async fn app_keys(&self, app_id: &str) -> Result<Vec<Vec<u8>>, store::Error> {
        let Some(app) = self.0.get_app(app_id).await? else {
            return Ok(Vec::new());
        };
        let now = crate::model::now_ms();
        Ok(app
            .active_secrets(now)
            .filter_map(|s| s.parse::<sundial_sdk::webhook::Secret>().ok())
            .map(|s| s.as_bytes().to_vec())
            .collect())
    }
}

fn mac(
    key: &[u8],
    method: &str,
    path: &str,
    timestamp: &str,
    nonce: &str,
    body: &[u8],
) -> HmacSha256 {
    // HMAC takes keys of any length; `new_from_slice` cannot fail for it.
    let mut mac = <HmacSha256 as KeyInit>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
    mac.update(&sundial_sdk::app_auth::canonical_string(
        method, path, timestamp, nonce, body,
    ));
    mac
}

/// The HMAC key of an app secret written `whsec_<base64>` (at least 16 bytes), or
/// `None` when it is not in that form.
pub fn decode_app_secret(secret: &[u8]) -> Option<Secret> {
    use base64::Engine as _;
    let b64 = secret.strip_prefix(b"whsec_")?;
    let key = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    (key.len() >= 16).then(|| Secret::new(key))
}

/// The verification rules over one instance's configured credentials.
#[derive(Debug)]
pub struct Authenticator {
    opts: AuthOptions,
    window: Duration,
    /// The executor tokens in force: the configured ones and the tokens file's, swapped
    /// whole when the file is read again.
    executor_tokens: RwLock<Arc<ExecutorTokens>>,
}

impl Authenticator {
    pub fn new(opts: AuthOptions) -> Self {
        let executor_tokens = merge_tokens(&opts.executor_tokens, &opts.file_executor_tokens);
        Self {
            opts,
            window: SIGNATURE_WINDOW,
            executor_tokens: RwLock::new(Arc::new(executor_tokens)),
        }
    }

    /// Reads the executor tokens file again (when one is configured) and puts its tokens
    /// in force beside the configured ones, for hellos from now on (streams already
    /// open stay). A file that cannot be read or parsed changes nothing. Returns the
    /// number of tokens now in force.
    pub fn reload_executor_tokens(&self) -> Result<usize, String> {
        let Some(path) = &self.opts.executor_tokens_file else {
            return Err("no executor tokens file is configured".to_owned());
        };
        let file = read_executor_tokens_file(path)?;
        let merged = merge_tokens(&self.opts.executor_tokens, &file);
        let count = merged.values().map(Vec::len).sum();
        *self
            .executor_tokens
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(merged);
        Ok(count)
    }

    /// Whether an executor tokens file is configured (read again on SIGHUP).
    pub fn executor_tokens_file_configured(&self) -> bool {
        self.opts.executor_tokens_file.is_some()
    }

    fn executor_tokens(&self) -> Arc<ExecutorTokens> {
        self.executor_tokens
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// False in dev mode: no bearer token, read token or app secret configured.
    pub fn admin_required(&self) -> bool {
        !self.opts.bearer_tokens.is_empty()
            || !self.opts.read_tokens.is_empty()
            || !self.opts.app_secrets.is_empty()
    }

    /// False in dev mode: no executor token and no tokens file configured.
    pub fn executor_tokens_required(&self) -> bool {
        !self.opts.executor_tokens.is_empty() || self.opts.executor_tokens_file.is_some()
    }

    /// The configured app ids (not secret; for the startup log).
    pub fn app_ids(&self) -> impl Iterator<Item = &str> {
        self.opts.app_secrets.keys().map(String::as_str)
    }

    pub fn bearer_token_count(&self) -> usize {
        self.opts.bearer_tokens.len()
    }

    pub fn read_token_count(&self) -> usize {
        self.opts.read_tokens.len()
    }

    /// The executor groups that have a token now (`*` = any group).
    pub fn executor_groups(&self) -> Vec<String> {
        self.executor_tokens().keys().cloned().collect()
    }

    /// How long a nonce is remembered: twice the window, so a request can never be
    /// both inside the window and forgotten.
    pub fn nonce_ttl(&self) -> Duration {
        self.window * 2
    }

    /// Whether checking this request needs its body (an app signature covers it; a
    /// bearer token does not).
    pub fn needs_body(&self, headers: &HeaderMap) -> bool {
        self.admin_required()
            && !headers.contains_key(http::header::AUTHORIZATION)
            && headers.contains_key(HEADER_APP_ID)
    }

    /// Checks an `Authorization` header value: `Bearer <token>` with a configured
    /// admin token ([`Caller::Bearer`]) or read token ([`Caller::Reader`]). Every
    /// configured token is compared, in constant time.
    pub fn check_bearer(&self, authorization: &str) -> Result<Caller, Error> {
        let (scheme, token) = authorization
            .trim()
            .split_once(' ')
            .ok_or(Error::Bearer("expected `Bearer <token>`"))?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(Error::Bearer("expected `Bearer <token>`"));
        }
        let token = token.trim().as_bytes();
        if token.is_empty() {
            return Err(Error::Bearer("empty bearer token"));
        }
        // Every token is compared, whichever matches.
        let find = |tokens: &[NamedToken]| {
            tokens.iter().fold(None, |found, t| {
                if t.token.matches(token) {
                    Some(t.name.clone())
                } else {
                    found
                }
            })
        };
        let (admin, reader) = (find(&self.opts.bearer_tokens), find(&self.opts.read_tokens));
        match (admin, reader) {
            (Some(name), _) => Ok(Caller::Bearer { name }),
            (None, Some(name)) => Ok(Caller::Reader { name }),
            (None, None) => Err(Error::Bearer("bearer token not accepted")),
        }
    }

    /// Checks an app signature (see the module doc) at `now` (unix seconds). The
    /// nonce is not checked here: [`authenticate`](Self::authenticate) does, once the
    /// signature is good.
    pub fn check_app_signature(
        &self,
        method: &str,
        path: &str,
        headers: &HeaderMap,
        body: &[u8],
        now: i64,
    ) -> Result<SignedRequest, Error> {
        let app_id = header(headers, HEADER_APP_ID, "X-Sundial-App-Id")?;
        let keys: Vec<&[u8]> = self
            .opts
            .app_secrets
            .get(app_id)
            .map(|keys| keys.iter().map(Secret::expose).collect())
            .unwrap_or_default();
        self.check_signature_with(&keys, method, path, headers, body, now)
    }

    /// As [`check_app_signature`](Self::check_app_signature), with the app's keys given
    /// (none: the app is unknown).
    fn check_signature_with(
        &self,
        keys: &[&[u8]],
        method: &str,
        path: &str,
        headers: &HeaderMap,
        body: &[u8],
        now: i64,
    ) -> Result<SignedRequest, Error> {
        let app_id = header(headers, HEADER_APP_ID, "X-Sundial-App-Id")?;
        if !valid_job_id(app_id) {
            return Err(Error::Header {
                header: "X-Sundial-App-Id",
                reason: "must match [A-Za-z0-9._-]{1,128}, not . or ..",
            });
        }
        if keys.is_empty() {
            return Err(Error::Header {
                header: "X-Sundial-App-Id",
                reason: "unknown app",
            });
        }
        let timestamp = header(headers, HEADER_TIMESTAMP, "X-Sundial-Timestamp")?;
        let nonce = header(headers, HEADER_NONCE, "X-Sundial-Nonce")?;
        let signature = header(headers, HEADER_SIGNATURE, "X-Sundial-Signature")?;
        if timestamp.is_empty()
            || timestamp.len() > 18
            || !timestamp.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(Error::Header {
                header: "X-Sundial-Timestamp",
                reason: "must be unix seconds (decimal digits)",
            });
        }
        let ts: i64 = timestamp.parse().map_err(|_| Error::Header {
            header: "X-Sundial-Timestamp",
            reason: "must be unix seconds (decimal digits)",
        })?;
        let skew = now.abs_diff(ts);
        if skew > self.window.as_secs() {
            return Err(Error::Expired {
                skew_secs: skew,
                window_secs: self.window.as_secs(),
            });
        }
        if nonce.is_empty()
            || nonce.len() > MAX_NONCE_LEN
            || !nonce.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(Error::Header {
                header: "X-Sundial-Nonce",
                reason: "must be 1 to 128 visible ASCII characters",
            });
        }
        let presented = hex::decode(signature).map_err(|_| Error::Header {
            header: "X-Sundial-Signature",
            reason: "must be hex",
        })?;
        // Every key is tried (there is more than one while a secret rotates).
        let good = keys.iter().fold(false, |good, key| {
            good | mac(key, method, path, timestamp, nonce, body)
                .verify_slice(&presented)
                .is_ok()
        });
        if !good {
            return Err(Error::BadSignature);
        }
        Ok(SignedRequest {
            app_id: app_id.to_owned(),
            nonce: nonce.to_owned(),
        })
    }

    /// Admits an admin or status request at `now` (unix seconds): a bearer token if
    /// `Authorization` is present, else an app signature whose nonce is then spent.
    pub async fn authenticate(
        &self,
        method: &str,
        path: &str,
        headers: &HeaderMap,
        body: &[u8],
        now: i64,
        nonces: &dyn NonceChecker,
    ) -> Result<Caller, Error> {
        if !self.admin_required() {
            return Ok(Caller::Open);
        }
        if let Some(v) = headers.get(http::header::AUTHORIZATION) {
            let v = v.to_str().map_err(|_| Error::Bearer("not visible ASCII"))?;
            return self.check_bearer(v);
        }
        if !headers.contains_key(HEADER_APP_ID) {
            return Err(Error::Missing);
        }
        // Apps given by flag first; then apps created through `AppService`.
        let app_id = header(headers, HEADER_APP_ID, "X-Sundial-App-Id")?;
        let signed = if self.opts.app_secrets.contains_key(app_id) || !valid_job_id(app_id) {
            self.check_app_signature(method, path, headers, body, now)?
        } else {
            let stored = nonces.app_keys(app_id).await?;
            let keys: Vec<&[u8]> = stored.iter().map(Vec::as_slice).collect();
            self.check_signature_with(&keys, method, path, headers, body, now)?
        };
        if !nonces
            .first_use(&signed.app_id, &signed.nonce, self.nonce_ttl())
            .await?
        {
            return Err(Error::Replayed);
        }
        Ok(Caller::App {
            app_id: signed.app_id,
        })
    }

    /// Checks a hello's executor token: the group's own tokens if it has any, else the
    /// `*` tokens. With no executor token configured at all, every executor passes.
    pub fn check_executor(&self, group: &str, token: &str) -> Result<(), Error> {
        if !self.executor_tokens_required() {
            return Ok(());
        }
        // The group is named only when it is a well-formed name (it is caller input).
        let named = if valid_job_id(group) {
            format!("group {group:?}")
        } else {
            "this group".to_owned()
        };
        let in_force = self.executor_tokens();
        let Some(tokens) = in_force.get(group).or_else(|| in_force.get(ANY_GROUP)) else {
            return Err(Error::ExecutorToken(format!(
                "no executor token is configured for {named}"
            )));
        };
        if token.is_empty() {
            return Err(Error::ExecutorToken(format!("required for {named}")));
        }
        let found = tokens
            .iter()
            .fold(false, |found, t| found | t.matches(token.as_bytes()));
        if found {
            Ok(())
        } else {
            Err(Error::ExecutorToken(format!("not accepted for {named}")))
        }
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &str, shown: &'static str) -> Result<&'a str, Error> {
    headers
        .get(name)
        .ok_or(Error::Header {
            header: shown,
            reason: "required with X-Sundial-App-Id",
        })?
        .to_str()
        .map(str::trim)
        .map_err(|_| Error::Header {
            header: shown,
            reason: "not visible ASCII",
        })
}

/// The clock signatures are judged by: this host's, in unix seconds.
pub fn unix_now() -> i64 {
    crate::model::now_ms().div_euclid(1000)
}

/// An [`Authenticator`] with the nonce memory it spends: what the gRPC layer and the
/// REST middleware hold.
#[derive(Clone)]
pub struct AdminGuard {
    auth: Arc<Authenticator>,
    nonces: Arc<dyn NonceChecker>,
}

impl AdminGuard {
    pub fn new(auth: Arc<Authenticator>, nonces: Arc<dyn NonceChecker>) -> Self {
        Self { auth, nonces }
    }

    /// Admin authentication is off (dev mode).
    pub fn is_open(&self) -> bool {
        !self.auth.admin_required()
    }

    pub fn needs_body(&self, headers: &HeaderMap) -> bool {
        self.auth.needs_body(headers)
    }

    /// Admits a request now.
    pub async fn admit(
        &self,
        method: &str,
        path: &str,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<Caller, Error> {
        self.auth
            .authenticate(
                method,
                path,
                headers,
                body,
                unix_now(),
                self.nonces.as_ref(),
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use std::sync::Mutex;
    use sundial_sdk::app_auth::signature as sign;

    use http::HeaderValue;

    use super::*;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";
    const NOW: i64 = 1_700_000_000;

    /// Nonces in memory, as the store keeps them (ttl ignored: tests are quick).
    #[derive(Default)]
    struct FakeNonces(Mutex<HashSet<(String, String)>>);

    #[async_trait::async_trait]
    impl NonceChecker for FakeNonces {
        async fn first_use(
            &self,
            app: &str,
            nonce: &str,
            _: Duration,
        ) -> Result<bool, store::Error> {
            let mut seen = self
                .0
                .lock()
                .map_err(|_| store::Error::Unavailable("poisoned".into()))?;
            Ok(seen.insert((app.to_owned(), nonce.to_owned())))
        }
    }

    fn auth() -> Authenticator {
        let mut opts = AuthOptions {
            bearer_tokens: vec![
                NamedToken::new("ci", "tok-1"),
                NamedToken::new("ops", "tok-2"),
            ],
            ..AuthOptions::default()
        };
        opts.app_secrets
            .insert("billing".into(), vec![Secret::new(KEY)]);
        opts.executor_tokens
            .insert("payments".into(), vec![Secret::new("exec-pay")]);
        opts.executor_tokens
            .insert(ANY_GROUP.into(), vec![Secret::new("exec-any")]);
        Authenticator::new(opts)
    }

    fn signed(method: &str, path: &str, ts: i64, nonce: &str, body: &[u8]) -> HeaderMap {
        let ts = ts.to_string();
        let mut h = HeaderMap::new();
        let mut put = |k: &'static str, v: &str| {
            h.insert(k, HeaderValue::from_str(v).expect("ascii"));
        };
        put(HEADER_APP_ID, "billing");
        put(HEADER_TIMESTAMP, &ts);
        put(HEADER_NONCE, nonce);
        put(HEADER_SIGNATURE, &sign(KEY, method, path, &ts, nonce, body));
        h
    }

    #[test]
    fn read_tokens_admit_a_reader_only() {
        let mut opts = AuthOptions {
            bearer_tokens: vec![NamedToken::new("ops", "tok-1")],
            read_tokens: vec![
                NamedToken::new("dash", "look-1"),
                NamedToken::new("wall", "look-3"),
            ],
            ..AuthOptions::default()
        };
        let a = Authenticator::new(opts.clone());
        let bearer = |name: &str| Caller::Bearer { name: name.into() };
        let reader = |name: &str| Caller::Reader { name: name.into() };
        assert_eq!(a.check_bearer("Bearer tok-1").ok(), Some(bearer("ops")));
        assert_eq!(a.check_bearer("Bearer look-1").ok(), Some(reader("dash")));
        assert_eq!(a.check_bearer("Bearer look-3").ok(), Some(reader("wall")));
        assert!(a.check_bearer("Bearer look-2").is_err());
        assert!(!reader("dash").may_write() && bearer("ops").may_write());
        // Read tokens alone turn authentication on.
        opts.bearer_tokens.clear();
        assert!(Authenticator::new(opts).admin_required());
    }

    #[test]
    fn bearer_tokens_are_checked() {
        let a = auth();
        assert!(a.check_bearer("Bearer tok-1").is_ok());
        assert!(
            a.check_bearer("bearer tok-2").is_ok(),
            "scheme is case-insensitive"
        );
        for bad in [
            "Bearer tok-3",
            "Bearer tok-1x",
            "Bearer tok",
            "Bearer ",
            "Basic tok-1",
            "tok-1",
            "",
        ] {
            let e = a.check_bearer(bad).expect_err(bad);
            assert!(matches!(e, Error::Bearer(_)), "{bad}: {e}");
            assert!(!e.to_string().contains("tok-"), "never echoes a token: {e}");
        }
    }

    #[test]
    fn the_signature_matches_an_independent_hmac() {
        // Computed with `openssl dgst -sha256 -hmac` over the canonical string.
        let body = br#"{"payload":"x"}"#;
        assert_eq!(
            sign(
                KEY,
                "POST",
                "/api/v1/jobs/kat/trigger",
                "1700000000",
                "nonce-1",
                body
            ),
            "c1c67d89b8d2b3da9baf9ab0d53981b5e8cf32573603d08c7051bdb6f1061aa2"
        );
        assert_eq!(
            decode_app_secret(b"whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="),
            Some(Secret::new(KEY))
        );
        assert_eq!(
            decode_app_secret(b"MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="),
            None
        );
        assert_eq!(decode_app_secret(b"whsec_!!"), None);
        assert_eq!(decode_app_secret(b"whsec_c2hvcnQ="), None, "too short");
    }

    #[test]
    fn good_signatures_pass_and_bad_ones_name_the_reason() {
        let a = auth();
        let path = "/api/v1/jobs/j/trigger?x=1";
        let body = b"{}";
        let h = signed("POST", path, NOW, "n-1", body);
        assert_eq!(
            a.check_app_signature("POST", path, &h, body, NOW)
                .expect("good"),
            SignedRequest {
                app_id: "billing".into(),
                nonce: "n-1".into()
            }
        );
        // gRPC: POST, the gRPC path, empty body.
        let g = signed("POST", "/sundial.v1.JobService/GetJob", NOW, "n-2", b"");
        assert!(
            a.check_app_signature("POST", "/sundial.v1.JobService/GetJob", &g, b"", NOW)
                .is_ok()
        );

        let bad = |e: Result<SignedRequest, Error>| e.expect_err("refused").to_string();
        assert!(
            bad(a.check_app_signature("POST", path, &h, b"{\"a\":1}", NOW))
                .starts_with("X-Sundial-Signature"),
            "tampered body"
        );
        assert!(
            bad(a.check_app_signature("GET", path, &h, body, NOW))
                .starts_with("X-Sundial-Signature"),
            "other method"
        );
        assert!(
            bad(a.check_app_signature("POST", "/api/v1/jobs/j/trigger?x=2", &h, body, NOW))
                .starts_with("X-Sundial-Signature"),
            "other query"
        );
        assert!(
            bad(a.check_app_signature("POST", "/sundial.v1.JobService/DeleteJob", &g, b"", NOW))
                .starts_with("X-Sundial-Signature"),
            "other gRPC method"
        );

        let mut wrong_key = signed("POST", path, NOW, "n-1", body);
        wrong_key.insert(
            HEADER_SIGNATURE,
            HeaderValue::from_str(&sign(
                b"another key of 16+ bytes",
                "POST",
                path,
                &NOW.to_string(),
                "n-1",
                body,
            ))
            .expect("ascii"),
        );
        assert!(matches!(
            a.check_app_signature("POST", path, &wrong_key, body, NOW),
            Err(Error::BadSignature)
        ));

        let mut not_hex = h.clone();
        not_hex.insert(HEADER_SIGNATURE, HeaderValue::from_static("zz"));
        assert_eq!(
            bad(a.check_app_signature("POST", path, &not_hex, body, NOW)),
            "X-Sundial-Signature: must be hex"
        );

        let mut unknown = h.clone();
        unknown.insert(HEADER_APP_ID, HeaderValue::from_static("nobody"));
        assert_eq!(
            bad(a.check_app_signature("POST", path, &unknown, body, NOW)),
            "X-Sundial-App-Id: unknown app"
        );

        for (name, shown) in [
            (HEADER_TIMESTAMP, "X-Sundial-Timestamp"),
            (HEADER_NONCE, "X-Sundial-Nonce"),
            (HEADER_SIGNATURE, "X-Sundial-Signature"),
        ] {
            let mut missing = h.clone();
            missing.remove(name);
            assert!(
                bad(a.check_app_signature("POST", path, &missing, body, NOW)).starts_with(shown)
            );
        }
        let mut ts = h.clone();
        ts.insert(HEADER_TIMESTAMP, HeaderValue::from_static("-5"));
        assert!(
            bad(a.check_app_signature("POST", path, &ts, body, NOW))
                .starts_with("X-Sundial-Timestamp")
        );
    }

    #[test]
    fn timestamps_outside_five_minutes_either_way_are_refused() {
        let a = auth();
        for (offset, ok) in [
            (-360, false),
            (360, false),
            (-300, true),
            (300, true),
            (0, true),
        ] {
            let h = signed("GET", "/p", NOW + offset, "n", b"");
            let r = a.check_app_signature("GET", "/p", &h, b"", NOW);
            assert_eq!(r.is_ok(), ok, "offset {offset}: {r:?}");
            if !ok {
                assert!(matches!(
                    r,
                    Err(Error::Expired {
                        skew_secs: 360,
                        window_secs: 300
                    })
                ));
            }
        }
    }

    #[tokio::test]
    async fn a_replayed_nonce_is_refused_and_only_good_signatures_spend_one() {
        let a = auth();
        let nonces = FakeNonces::default();
        let h = signed("POST", "/p", NOW, "once", b"x");
        let first = a.authenticate("POST", "/p", &h, b"x", NOW, &nonces).await;
        assert_eq!(
            first.expect("first use"),
            Caller::App {
                app_id: "billing".into()
            }
        );
        let again = a.authenticate("POST", "/p", &h, b"x", NOW, &nonces).await;
        assert!(matches!(again, Err(Error::Replayed)), "{again:?}");

        // A forged request does not spend the nonce it names.
        let forged = signed("POST", "/p", NOW, "fresh", b"x");
        assert!(
            a.authenticate("POST", "/p", &forged, b"tampered", NOW, &nonces)
                .await
                .is_err()
        );
        assert!(
            a.authenticate("POST", "/p", &forged, b"x", NOW, &nonces)
                .await
                .is_ok()
        );
    }

    #[tokio::test]
    async fn authenticate_picks_the_scheme_and_dev_mode_lets_all_in() {
        let a = auth();
        let nonces = FakeNonces::default();
        let mut h = HeaderMap::new();
        let r = a.authenticate("GET", "/p", &h, b"", NOW, &nonces).await;
        assert!(matches!(r, Err(Error::Missing)));
        h.insert(
            http::header::AUTHORIZATION,
            HeaderValue::from_static("Bearer tok-2"),
        );
        assert_eq!(
            a.authenticate("GET", "/p", &h, b"", NOW, &nonces)
                .await
                .expect("bearer"),
            Caller::Bearer { name: "ops".into() }
        );
        h.insert(
            http::header::AUTHORIZATION,
            HeaderValue::from_static("Bearer nope"),
        );
        assert!(
            a.authenticate("GET", "/p", &h, b"", NOW, &nonces)
                .await
                .is_err()
        );

        let open = Authenticator::new(AuthOptions::default());
        assert!(!open.admin_required() && !open.executor_tokens_required());
        assert_eq!(
            open.authenticate("GET", "/p", &HeaderMap::new(), b"", NOW, &nonces)
                .await
                .expect("open"),
            Caller::Open
        );
        assert!(open.check_executor("any", "").is_ok());

        let status = Status::from(Error::Replayed);
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        assert!(status.message().contains("X-Sundial-Nonce"));
    }

    /// The tokens file is read again on reload: a rotation adds the new token, then
    /// removes the old one; a bad file keeps the tokens in force and its error names the
    /// line, never a token; an emptied file admits no executor (never dev mode).
    #[test]
    fn the_executor_tokens_file_rotates_on_reload() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("tokens");
        let write = |text: &str| std::fs::write(&path, text).expect("write");
        write("# group gb\n\ngb=old-tok\n");
        let auth = Authenticator::new(AuthOptions {
            file_executor_tokens: read_executor_tokens_file(&path).expect("read"),
            executor_tokens_file: Some(path.clone()),
            ..AuthOptions::default()
        });
        assert!(auth.executor_tokens_required());
        assert!(auth.check_executor("gb", "old-tok").is_ok());
        assert!(auth.check_executor("gb", "new-tok").is_err());

        write("gb=old-tok\ngb=new-tok\n");
        assert_eq!(auth.reload_executor_tokens(), Ok(2));
        assert!(auth.check_executor("gb", "old-tok").is_ok());
        assert!(auth.check_executor("gb", "new-tok").is_ok());

        write("gb=new-tok\n");
        assert_eq!(auth.reload_executor_tokens(), Ok(1));
        assert!(auth.check_executor("gb", "old-tok").is_err());
        assert!(auth.check_executor("gb", "new-tok").is_ok());

        write("gb=new-tok\ngb=secret with spaces\n");
        let err = auth.reload_executor_tokens().expect_err("a bad line");
        assert!(err.contains("line 2") && !err.contains("secret"), "{err}");
        assert!(
            auth.check_executor("gb", "new-tok").is_ok(),
            "the bad file changed nothing"
        );

        write("");
        assert_eq!(auth.reload_executor_tokens(), Ok(0));
        assert!(auth.executor_tokens_required());
        assert!(auth.check_executor("gb", "new-tok").is_err());
    }

    #[test]
    fn executor_tokens_per_group_and_wildcard() {
        let a = auth();
        assert!(a.check_executor("payments", "exec-pay").is_ok());
        // A group with its own token does not take the wildcard's.
        let e = a
            .check_executor("payments", "exec-any")
            .expect_err("wildcard for own-token group");
        assert_eq!(
            e.to_string(),
            "hello.token: not accepted for group \"payments\""
        );
        assert!(a.check_executor("reports", "exec-any").is_ok(), "wildcard");
        assert!(a.check_executor("reports", "exec-pay").is_err());
        assert_eq!(
            a.check_executor("reports", "")
                .expect_err("empty")
                .to_string(),
            "hello.token: required for group \"reports\""
        );
        assert_eq!(
            Status::from(a.check_executor("reports", "x").expect_err("x")).code(),
            tonic::Code::Unauthenticated
        );

        let mut only = AuthOptions::default();
        only.executor_tokens
            .insert("payments".into(), vec![Secret::new("exec-pay")]);
        let only = Authenticator::new(only);
        assert!(!only.admin_required() && only.executor_tokens_required());
        let e = only
            .check_executor("reports", "exec-pay")
            .expect_err("no token for group");
        assert!(
            e.to_string().starts_with("hello.token: no executor token"),
            "{e}"
        );
    }

    #[test]
    fn secrets_do_not_show_in_debug() {
        let shown = format!("{:?}", auth());
        for s in ["tok-1", "exec-pay", "exec-any", "0123456789abcdef"] {
            assert!(!shown.contains(s), "{s} in {shown}");
        }
        assert!(shown.contains("billing"), "app ids are not secret");
    }
}
