//! Authentication over real sockets: gRPC and REST admin/status calls need a bearer
//! token or a fresh app signature (a refused call changes nothing), executors need
//! their group's token (a refused one is not registered), health, reflection and
//! `/healthz` stay open, dev mode (no credentials configured) is open and says so, and
//! no secret ever reaches the logs.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;
use sundial_proto::v1 as pb;
use sundial_proto::v1::executor_message::Msg;
use sundial_proto::v1::server_message::Msg as Out;
use sundial_sdk::app_auth::{AppSigner, signature as sign};
use sundial_tests::{MANUAL_ONLY, RedisServer, Sundial, SundialOptions, wait_for};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

const BEARER: &str = "bearer-Zq9Vw7741-not-for-logs";
const READER: &str = "reader-Hy31Lq08-not-for-logs";
const APP: &str = "billing-app";
/// `whsec_` + base64 of [`APP_KEY`].
const APP_SECRET: &str = "whsec_a2V5LWJ5dGVzLWZvci10aGUtYXV0aC10ZXN0LTQyNDI=";
const APP_SECRET_B64: &str = "a2V5LWJ5dGVzLWZvci10aGUtYXV0aC10ZXN0LTQyNDI=";
const APP_KEY: &[u8] = b"key-bytes-for-the-auth-test-4242";
const EXEC_TOKEN: &str = "exec-tok-billing-5521-not-for-logs";
const OTHER_EXEC_TOKEN: &str = "exec-tok-payments-8812-not-for-logs";

/// A server with a bearer token (from the environment), an app secret and executor
/// tokens for two groups (flags), logging at debug so more of it is checked.
fn secured(opts: SundialOptions) -> SundialOptions {
    opts.env("SUNDIAL_BEARER_TOKENS", BEARER)
        .arg("read-token", READER)
        .env("RUST_LOG", "debug")
        .arg("app-secret", &format!("{APP}={APP_SECRET}"))
        .repeated_arg("executor-token", &format!("billing={EXEC_TOKEN}"))
        .repeated_arg("executor-token", &format!("payments={OTHER_EXEC_TOKEN}"))
}

/// Fails if any secret (or a part of it) appears in what the server printed.
fn assert_no_secrets(server: &Sundial) -> Result<()> {
    let logs = format!("{}\n{}", server.stderr(), server.stdout());
    ensure!(logs.contains("sundial serving"), "the logs were captured");
    let key = String::from_utf8_lossy(APP_KEY).into_owned();
    for secret in [
        BEARER,
        READER,
        APP_SECRET,
        APP_SECRET_B64,
        key.as_str(),
        EXEC_TOKEN,
        OTHER_EXEC_TOKEN,
        "not-for-logs",
    ] {
        ensure!(
            !logs.contains(secret),
            "a secret ({} chars) is in the logs",
            secret.len()
        );
    }
    Ok(())
}

fn unix_now() -> i64 {
    sundial_server::auth::unix_now()
}

/// What a caller presents.
#[derive(Clone, Debug)]
enum Cred {
    None,
    Bearer(&'static str),
    /// An app signature at now + `skew` seconds; `signed_path` is what was signed
    /// (the real path unless the test forges one).
    Sig {
        app: &'static str,
        skew: i64,
        nonce: String,
        signed_path: Option<&'static str>,
    },
}

fn sig(nonce: &str) -> Cred {
    Cred::Sig {
        app: APP,
        skew: 0,
        nonce: nonce.to_owned(),
        signed_path: None,
    }
}

/// The signature headers for `method path` over `body`, as (name, value) pairs.
fn sig_headers(cred: &Cred, method: &str, path: &str, body: &[u8]) -> Vec<(&'static str, String)> {
    match cred {
        Cred::None => Vec::new(),
        Cred::Bearer(t) => vec![("authorization", format!("Bearer {t}"))],
        Cred::Sig {
            app,
            skew,
            nonce,
            signed_path,
        } => {
            let ts = (unix_now() + skew).to_string();
            let signature = sign(
                APP_KEY,
                method,
                signed_path.unwrap_or(path),
                &ts,
                nonce,
                body,
            );
            vec![
                ("x-sundial-app-id", (*app).to_owned()),
                ("x-sundial-timestamp", ts),
                ("x-sundial-nonce", nonce.clone()),
                ("x-sundial-signature", signature),
            ]
        }
    }
}

/// A request message's bytes, which a gRPC signature covers.
fn bytes(msg: &impl prost::Message) -> Vec<u8> {
    msg.encode_to_vec()
}

/// A gRPC request carrying `headers`.
fn grpc_request<T>(msg: T, headers: &[(&'static str, String)]) -> Result<tonic::Request<T>> {
    let mut req = tonic::Request::new(msg);
    for (name, value) in headers {
        req.metadata_mut()
            .insert(*name, MetadataValue::try_from(value.as_str())?);
    }
    Ok(req)
}

/// The REST body creating the job [`spec`] describes.
fn create_body(id: &str) -> String {
    format!(
        r#"{{"spec": {{"id": "{id}", "cron": "{MANUAL_ONLY}", "executor": {{"group": "billing", "handler": "noop"}}}}}}"#
    )
}

/// A gRPC request carrying the read-only token.
fn as_reader<T>(msg: T) -> Result<tonic::Request<T>> {
    grpc_request(msg, &[("authorization", format!("Bearer {READER}"))])
}

/// Adds the good bearer token to every call.
#[derive(Clone)]
struct WithBearer;

impl Interceptor for WithBearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let v = MetadataValue::try_from(format!("Bearer {BEARER}"))
            .map_err(|_| tonic::Status::internal("header"))?;
        req.metadata_mut().insert("authorization", v);
        Ok(req)
    }
}

type Authed = InterceptedService<Channel, WithBearer>;

fn jobs_as_admin(ch: &Channel) -> pb::job_service_client::JobServiceClient<Authed> {
    pb::job_service_client::JobServiceClient::with_interceptor(ch.clone(), WithBearer)
}

async fn run_count(ch: &Channel, job_id: &str) -> Result<usize> {
    let mut c = pb::run_service_client::RunServiceClient::with_interceptor(ch.clone(), WithBearer);
    Ok(c.list_runs(pb::ListRunsRequest {
        job_id: job_id.into(),
        page_size: 1000,
        ..Default::default()
    })
    .await?
    .into_inner()
    .runs
    .len())
}

/// Waits until `job_id` has at least `n` runs (runs appear once a dispatcher took the
/// trigger), then says how many it has.
async fn runs_after(ch: &Channel, job_id: &str, n: usize) -> Result<usize> {
    wait_for(
        &format!("{n} runs of {job_id}"),
        Duration::from_secs(10),
        || async {
            let count = run_count(ch, job_id).await?;
            Ok((count >= n).then_some(count))
        },
    )
    .await
}

async fn job_exists(ch: &Channel, job_id: &str) -> Result<bool> {
    match jobs_as_admin(ch)
        .get_job(pb::GetJobRequest {
            job_id: job_id.into(),
        })
        .await
    {
        Ok(_) => Ok(true),
        Err(s) if s.code() == Code::NotFound => Ok(false),
        Err(s) => Err(s.into()),
    }
}

async fn node_ids(ch: &Channel) -> Result<Vec<String>> {
    let mut c =
        pb::node_service_client::NodeServiceClient::with_interceptor(ch.clone(), WithBearer);
    Ok(c.list_nodes(pb::ListNodesRequest::default())
        .await?
        .into_inner()
        .nodes
        .into_iter()
        .map(|n| n.node_id)
        .collect())
}

fn spec(id: &str) -> pb::JobSpec {
    pb::JobSpec {
        id: id.to_owned(),
        cron: MANUAL_ONLY.to_owned(),
        target: Some(pb::job_spec::Target::Executor(pb::ExecutorTarget {
            group: "billing".into(),
            handler: "noop".into(),
        })),
        ..Default::default()
    }
}

/// The refusals every transport must give: (case, credentials, what the message names).
fn refusals() -> Vec<(&'static str, Cred, &'static str)> {
    vec![
        ("no credentials", Cred::None, "no credentials"),
        (
            "wrong bearer token",
            Cred::Bearer("bearer-wrong"),
            "Authorization",
        ),
        (
            "timestamp 6 min old",
            Cred::Sig {
                app: APP,
                skew: -360,
                nonce: "old-ts".into(),
                signed_path: None,
            },
            "X-Sundial-Timestamp",
        ),
        (
            "timestamp 6 min ahead",
            Cred::Sig {
                app: APP,
                skew: 360,
                nonce: "future-ts".into(),
                signed_path: None,
            },
            "X-Sundial-Timestamp",
        ),
        (
            "signature over another path",
            Cred::Sig {
                app: APP,
                skew: 0,
                nonce: "bad-sig".into(),
                signed_path: Some("/somewhere/else"),
            },
            "X-Sundial-Signature",
        ),
        (
            "unknown app",
            Cred::Sig {
                app: "nobody",
                skew: 0,
                nonce: "unknown-app".into(),
                signed_path: None,
            },
            "X-Sundial-App-Id",
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_calls_need_a_bearer_token_or_a_fresh_signature() -> Result<()> {
    let redis = RedisServer::start()?;
    let mut server = Sundial::start(secured(SundialOptions::redis(&redis)))?;
    let ch = server.channel().await?;
    let mut jobs = pb::job_service_client::JobServiceClient::new(ch.clone());
    const CREATE: &str = "/sundial.v1.JobService/CreateJob";

    for (i, (case, cred, names)) in refusals().into_iter().enumerate() {
        let id = format!("refused-{i}");
        let msg = pb::CreateJobRequest {
            spec: Some(spec(&id)),
        };
        let req = grpc_request(
            msg.clone(),
            &sig_headers(&cred, "POST", CREATE, &bytes(&msg)),
        )?;
        let err = jobs.create_job(req).await.err().context(case)?;
        ensure!(
            err.code() == Code::Unauthenticated && err.message().contains(names),
            "{case}: {err:?}"
        );
        ensure!(!job_exists(&ch, &id).await?, "{case}: the job was created");
    }
    // Every service but executors, health and reflection is guarded.
    let err = pb::node_service_client::NodeServiceClient::new(ch.clone())
        .list_nodes(pb::ListNodesRequest::default())
        .await
        .err()
        .context("ListNodes without credentials")?;
    ensure!(err.code() == Code::Unauthenticated, "{err:?}");
    let err = pb::run_service_client::RunServiceClient::new(ch.clone())
        .get_run(pb::GetRunRequest {
            schedule_id: "x@1".into(),
        })
        .await
        .err()
        .context("GetRun without credentials")?;
    ensure!(err.code() == Code::Unauthenticated, "{err:?}");

    // A good bearer token and a good signature both work.
    jobs_as_admin(&ch)
        .create_job(pb::CreateJobRequest {
            spec: Some(spec("by-bearer")),
        })
        .await?;
    let msg = pb::CreateJobRequest {
        spec: Some(spec("by-signature")),
    };
    let headers = sig_headers(&sig("create-1"), "POST", CREATE, &bytes(&msg));
    jobs.create_job(grpc_request(msg, &headers)?).await?;
    ensure!(job_exists(&ch, "by-bearer").await? && job_exists(&ch, "by-signature").await?);

    // A signature covers the request message: the headers signed for one CreateJob
    // do not carry another (nor does a signature over no message), and nothing is
    // written.
    let swapped = pb::CreateJobRequest {
        spec: Some(spec("swapped")),
    };
    let signed_for = pb::CreateJobRequest {
        spec: Some(spec("signed-for")),
    };
    for (case, body) in [
        ("another request's bytes", bytes(&signed_for)),
        ("no bytes", Vec::new()),
    ] {
        let headers = sig_headers(&sig(&format!("swap-{}", body.len())), "POST", CREATE, &body);
        let err = jobs
            .create_job(grpc_request(swapped.clone(), &headers)?)
            .await
            .err()
            .context(case)?;
        ensure!(
            err.code() == Code::Unauthenticated && err.message().contains("X-Sundial-Signature"),
            "{case}: {err:?}"
        );
    }
    ensure!(!job_exists(&ch, "swapped").await? && !job_exists(&ch, "signed-for").await?);

    // The SDK's signer signs what it sends.
    let signer = AppSigner::from_secret(APP, APP_SECRET)?;
    jobs.create_job(signer.grpc(
        CREATE,
        pb::CreateJobRequest {
            spec: Some(spec("by-the-sdk")),
        },
    ))
    .await?;
    ensure!(job_exists(&ch, "by-the-sdk").await?);

    // The same signed request twice: the first triggers, the replay is refused and
    // triggers nothing.
    let msg = pb::TriggerJobRequest {
        job_id: "by-signature".into(),
        ..Default::default()
    };
    let headers = sig_headers(
        &sig("trigger-1"),
        "POST",
        "/sundial.v1.JobService/TriggerJob",
        &bytes(&msg),
    );
    let trigger = || grpc_request(msg.clone(), &headers);
    jobs.trigger_job(trigger()?).await?;
    let err = jobs.trigger_job(trigger()?).await.err().context("replay")?;
    ensure!(
        err.code() == Code::Unauthenticated && err.message().contains("X-Sundial-Nonce"),
        "{err:?}"
    );
    ensure!(runs_after(&ch, "by-signature", 1).await? == 1);

    // Health and reflection need no credentials.
    let health = tonic_health::pb::health_client::HealthClient::new(ch.clone())
        .check(tonic_health::pb::HealthCheckRequest {
            service: "sundial.v1.JobService".into(),
        })
        .await?
        .into_inner();
    ensure!(
        health.status == tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    let (tx, rx) = mpsc::channel(1);
    tx.send(tonic_reflection::pb::v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            tonic_reflection::pb::v1::server_reflection_request::MessageRequest::ListServices(
                String::new(),
            ),
        ),
    })
    .await?;
    let mut listed =
        tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient::new(ch.clone())
            .server_reflection_info(ReceiverStream::new(rx))
            .await?
            .into_inner();
    ensure!(listed.message().await?.is_some(), "reflection answers");

    server.stop()?;
    assert_no_secrets(&server)
}

/// One REST call with `cred`; the status and the JSON body (Null when not JSON).
async fn rest(
    http: &reqwest::Client,
    base: &str,
    method: &str,
    target: &str,
    body: &[u8],
    cred: &Cred,
    sent_body: Option<&[u8]>,
) -> Result<(u16, Value)> {
    let mut req = match method {
        "GET" => http.get(format!("{base}{target}")),
        "POST" => http.post(format!("{base}{target}")),
        "PUT" => http.put(format!("{base}{target}")),
        "DELETE" => http.delete(format!("{base}{target}")),
        other => bail!("method {other}"),
    };
    for (name, value) in sig_headers(cred, method, target, body) {
        req = req.header(name, value);
    }
    if !body.is_empty() || sent_body.is_some() {
        req = req
            .header("content-type", "application/json")
            .body(sent_body.unwrap_or(body).to_vec());
    }
    let resp = req.send().await?;
    let status = resp.status().as_u16();
    let text = resp.text().await?;
    Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
}

/// A read-only token reads jobs, runs and nodes over REST and gRPC, and every call
/// that would change something is PERMISSION_DENIED (REST 403) and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_token_reads_and_changes_nothing() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut server = Sundial::start(secured(SundialOptions::embedded(dir.path())))?;
    let ch = server.channel().await?;
    let base = format!("http://{}", server.http.context("no http address")?);
    let http = reqwest::Client::new();
    jobs_as_admin(&ch)
        .create_job(pb::CreateJobRequest {
            spec: Some(spec("read-job")),
        })
        .await?;
    let reader = Cred::Bearer(READER);
    for target in [
        "/api/v1/jobs/read-job",
        "/api/v1/jobs?page_size=5",
        "/api/v1/jobs/read-job/runs",
        "/api/v1/jobs/read-job/status",
        "/api/v1/tasks/read-job",
        "/api/v1/nodes",
        "/api/v1/openapi.json",
    ] {
        let (status, v) = rest(&http, &base, "GET", target, b"", &reader, None).await?;
        ensure!(
            status == 200,
            "GET {target} with a read token: {status} {v}"
        );
    }
    let create = create_body("read-made");
    let writes: [(&str, &str, &[u8]); 6] = [
        ("POST", "/api/v1/jobs", create.as_bytes()),
        ("POST", "/api/v1/jobs/read-job/trigger", b""),
        ("POST", "/api/v1/jobs/read-job/pause", b""),
        ("DELETE", "/api/v1/jobs/read-job", b""),
        ("POST", "/api/v1/apps", br#"{"appId": "made-by-reader"}"#),
        ("POST", "/api/v1/nodes/n1/drain", b""),
    ];
    for (method, target, body) in writes {
        let (status, v) = rest(&http, &base, method, target, body, &reader, None).await?;
        ensure!(
            status == 403
                && v["error"]["code"] == "PERMISSION_DENIED"
                && v["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("read-only token")),
            "{method} {target} with a read token: {status} {v}"
        );
    }

    // gRPC: reads pass, writes are PERMISSION_DENIED.
    let mut jobs = pb::job_service_client::JobServiceClient::new(ch.clone());
    let job = jobs
        .get_job(as_reader(pb::GetJobRequest {
            job_id: "read-job".into(),
        })?)
        .await?
        .into_inner();
    ensure!(job.job.is_some());
    let e = jobs
        .pause_job(as_reader(pb::PauseJobRequest {
            job_id: "read-job".into(),
        })?)
        .await
        .expect_err("a reader's pause");
    ensure!(e.code() == Code::PermissionDenied, "{e:?}");
    let e = jobs
        .trigger_job(as_reader(pb::TriggerJobRequest {
            job_id: "read-job".into(),
            ..Default::default()
        })?)
        .await
        .expect_err("a reader's trigger");
    ensure!(e.code() == Code::PermissionDenied, "{e:?}");

    // Nothing changed.
    let job = jobs_as_admin(&ch)
        .get_job(pb::GetJobRequest {
            job_id: "read-job".into(),
        })
        .await?
        .into_inner()
        .job
        .context("job")?;
    ensure!(
        job.version == 1 && job.state() == pb::JobState::Active,
        "{job:?}"
    );
    ensure!(
        !job_exists(&ch, "read-made").await?,
        "a reader created a job"
    );
    ensure!(
        run_count(&ch, "read-job").await? == 0,
        "a reader's trigger ran"
    );
    server.stop()?;
    assert_no_secrets(&server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_calls_need_a_bearer_token_or_a_fresh_signature() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut server = Sundial::start(secured(SundialOptions::embedded(dir.path())))?;
    let ch = server.channel().await?;
    let base = format!("http://{}", server.http.context("no http address")?);
    let http = reqwest::Client::new();
    jobs_as_admin(&ch)
        .create_job(pb::CreateJobRequest {
            spec: Some(spec("rest-job")),
        })
        .await?;
    const TRIGGER: &str = "/api/v1/jobs/rest-job/trigger";
    let body = br#"{"idempotency_key": "k-1"}"#;

    let mut cases = refusals();
    cases.push(("tampered body", sig("tampered"), "X-Sundial-Signature"));
    for (case, cred, names) in cases {
        let sent: Option<&[u8]> =
            (case == "tampered body").then_some(br#"{"idempotency_key": "k-2"}"#);
        let (status, v) = rest(&http, &base, "POST", TRIGGER, body, &cred, sent).await?;
        ensure!(status == 401, "{case}: {status} {v}");
        ensure!(v["error"]["code"] == "UNAUTHENTICATED", "{case}: {v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        ensure!(message.contains(names), "{case}: {message}");
        ensure!(!message.contains("not-for-logs"), "{case}: {message}");
    }
    ensure!(
        run_count(&ch, "rest-job").await? == 0,
        "a refused trigger ran"
    );

    // The operations' routes take the same credentials: each refused without them or
    // with a wrong bearer token, changing nothing; admitted with a bearer token or a
    // signature.
    let create = create_body("rest-made");
    let writes: [(&str, &str, &[u8]); 6] = [
        ("POST", "/api/v1/jobs", create.as_bytes()),
        ("DELETE", "/api/v1/jobs/rest-job", b""),
        ("POST", "/api/v1/jobs/rest-job/pause", b""),
        ("GET", "/api/v1/nodes", b""),
        ("POST", "/api/v1/apps", br#"{"appId": "made-by-rest"}"#),
        ("POST", "/api/v1/apps/billing-app/rotate", b""),
    ];
    for (case, cred) in [
        ("no credentials", Cred::None),
        ("wrong bearer token", Cred::Bearer("bearer-wrong")),
    ] {
        for (method, target, body) in writes {
            let (status, v) = rest(&http, &base, method, target, body, &cred, None).await?;
            ensure!(
                status == 401 && v["error"]["code"] == "UNAUTHENTICATED",
                "{case}: {method} {target} answered {status} {v}"
            );
        }
    }
    let job = jobs_as_admin(&ch)
        .get_job(pb::GetJobRequest {
            job_id: "rest-job".into(),
        })
        .await?
        .into_inner()
        .job
        .context("job")?;
    ensure!(
        job.version == 1 && job.state() == pb::JobState::Active,
        "a refused call changed the job"
    );
    let (status, v) = rest(
        &http,
        &base,
        "POST",
        "/api/v1/jobs",
        create.as_bytes(),
        &Cred::Bearer(BEARER),
        None,
    )
    .await?;
    ensure!(
        status == 201 && v["job"]["spec"]["id"] == "rest-made",
        "bearer create: {status} {v}"
    );
    let (status, v) = rest(
        &http,
        &base,
        "DELETE",
        "/api/v1/jobs/rest-made",
        b"",
        &sig("ops-delete"),
        None,
    )
    .await?;
    ensure!(status == 200, "signed delete: {status} {v}");

    // A query string is signed with the path.
    let cred = Cred::Sig {
        app: APP,
        skew: 0,
        nonce: "query".into(),
        signed_path: Some("/api/v1/jobs/rest-job/runs?page_size=1"),
    };
    let (status, v) = rest(
        &http,
        &base,
        "GET",
        "/api/v1/jobs/rest-job/runs?page_size=2",
        b"",
        &cred,
        None,
    )
    .await?;
    ensure!(
        status == 401
            && v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("X-Sundial-Signature")),
        "{status} {v}"
    );
    let (status, v) = rest(
        &http,
        &base,
        "GET",
        "/api/v1/jobs/rest-job/runs?page_size=1",
        b"",
        &sig("query-ok"),
        None,
    )
    .await?;
    ensure!(status == 200, "{status} {v}");

    // Good bearer and good signature trigger; the signed request replayed is refused.
    let (status, v) = rest(
        &http,
        &base,
        "POST",
        TRIGGER,
        br#"{"idempotency_key": "b-1"}"#,
        &Cred::Bearer(BEARER),
        None,
    )
    .await?;
    ensure!(status == 202, "bearer: {status} {v}");
    let signed = sig("rest-trigger-1");
    let (status, v) = rest(&http, &base, "POST", TRIGGER, body, &signed, None).await?;
    ensure!(status == 202, "signature: {status} {v}");
    // The same headers and body again (its timestamp is recomputed, so sign once and
    // send the same bytes twice by hand).
    let headers = sig_headers(
        &sig("rest-trigger-2"),
        "POST",
        TRIGGER,
        br#"{"idempotency_key": "s-2"}"#,
    );
    let send = || {
        let mut req = http
            .post(format!("{base}{TRIGGER}"))
            .header("content-type", "application/json")
            .body(br#"{"idempotency_key": "s-2"}"#.to_vec());
        for (name, value) in &headers {
            req = req.header(*name, value);
        }
        req.send()
    };
    ensure!(send().await?.status().as_u16() == 202, "first use");
    let replay = send().await?;
    ensure!(
        replay.status().as_u16() == 401,
        "replay: {}",
        replay.status()
    );
    let v: Value = replay.json().await?;
    ensure!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("X-Sundial-Nonce")),
        "{v}"
    );
    // Exactly the three admitted triggers ran (a refused one with key k-1 would also
    // have made the signed k-1 trigger a duplicate, answered 200, not 202).
    ensure!(
        runs_after(&ch, "rest-job", 3).await? == 3,
        "bearer + two signed triggers"
    );

    // /healthz is open; the OpenAPI document is not.
    ensure!(
        http.get(format!("{base}/healthz"))
            .send()
            .await?
            .status()
            .as_u16()
            == 200
    );
    ensure!(
        http.get(format!("{base}/api/v1/openapi.json"))
            .send()
            .await?
            .status()
            .as_u16()
            == 401
    );

    server.stop()?;
    assert_no_secrets(&server)
}

fn hello(node: &str, group: &str, token: &str) -> pb::ExecutorMessage {
    pb::ExecutorMessage {
        msg: Some(Msg::Hello(pb::Hello {
            node_id: node.into(),
            group: group.into(),
            handlers: vec!["noop".into()],
            token: token.into(),
            sdk: "test".into(),
            ..Default::default()
        })),
    }
}

/// Opens an executor stream with `first` and returns its first server message.
async fn connect(
    ch: &Channel,
    first: pb::ExecutorMessage,
) -> Result<(mpsc::Sender<pb::ExecutorMessage>, Out), tonic::Status> {
    let (tx, rx) = mpsc::channel(4);
    tx.send(first)
        .await
        .map_err(|_| tonic::Status::internal("send"))?;
    let mut stream = pb::executor_service_client::ExecutorServiceClient::new(ch.clone())
        .connect(ReceiverStream::new(rx))
        .await?
        .into_inner();
    match tokio::time::timeout(Duration::from_secs(10), stream.message()).await {
        Err(_) => Err(tonic::Status::deadline_exceeded("no message in 10 s")),
        Ok(Err(s)) => Err(s),
        Ok(Ok(None)) => Err(tonic::Status::aborted("stream ended")),
        Ok(Ok(Some(m))) => Ok((tx, m.msg.ok_or_else(|| tonic::Status::internal("empty"))?)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executors_need_their_group_token() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut server = Sundial::start(secured(SundialOptions::embedded(dir.path())))?;
    let ch = server.channel().await?;

    for (case, node, group, token, names) in [
        (
            "wrong token",
            "n-wrong",
            "billing",
            "exec-wrong",
            "not accepted for group \"billing\"",
        ),
        (
            "another group's token",
            "n-other",
            "billing",
            OTHER_EXEC_TOKEN,
            "not accepted",
        ),
        (
            "no token",
            "n-none",
            "billing",
            "",
            "required for group \"billing\"",
        ),
        (
            "group without a token",
            "n-nogroup",
            "reports",
            EXEC_TOKEN,
            "no executor token is configured",
        ),
    ] {
        let err = connect(&ch, hello(node, group, token))
            .await
            .err()
            .context(case)?;
        ensure!(
            err.code() == Code::Unauthenticated
                && err.message().starts_with("hello.token")
                && err.message().contains(names),
            "{case}: {err:?}"
        );
    }
    ensure!(
        node_ids(&ch).await?.is_empty(),
        "a refused executor was registered"
    );

    let (_keep, first) = connect(&ch, hello("n-good", "billing", EXEC_TOKEN)).await?;
    ensure!(matches!(first, Out::Welcome(_)), "{first:?}");
    wait_for("the node listed", Duration::from_secs(10), || {
        let ch = ch.clone();
        async move { Ok((node_ids(&ch).await? == ["n-good"]).then_some(())) }
    })
    .await?;

    server.stop()?;
    assert_no_secrets(&server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_credentials_configured_everything_is_open_and_the_server_says_so() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut server = Sundial::start(SundialOptions::embedded(dir.path()))?;
    let ch = server.channel().await?;
    server
        .jobs()
        .await?
        .create_job(pb::CreateJobRequest {
            spec: Some(spec("open-job")),
        })
        .await?;
    let (_keep, first) = connect(&ch, hello("n-open", "anything", "")).await?;
    ensure!(matches!(first, Out::Welcome(_)), "{first:?}");
    let base = format!("http://{}", server.http.context("no http address")?);
    let status = reqwest::get(format!("{base}/api/v1/tasks/open-job"))
        .await?
        .status();
    ensure!(status.as_u16() == 200, "{status}");
    server.stop()?;
    let logs = server.stderr();
    for warning in ["admin auth OFF (dev mode)", "executor auth OFF (dev mode)"] {
        ensure!(
            logs.matches(warning).count() == 1,
            "{warning:?} once in:\n{logs}"
        );
    }
    Ok(())
}

/// Every admitted call that may change state, over gRPC and REST, is in the audit log
/// with its caller (a token by its name, an app by its id), operation, target and
/// outcome, readable with a read token through ListAuditEvents and
/// `GET /api/v1/audit`, and logged on the `audit` target; reads are not recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_calls_are_audited_with_their_named_caller() -> Result<()> {
    let redis = RedisServer::start()?;
    let mut server = Sundial::start(
        SundialOptions::redis(&redis)
            .env("SUNDIAL_BEARER_TOKENS", &format!("ops={BEARER}"))
            .arg("read-token", &format!("dash={READER}"))
            .arg("app-secret", &format!("{APP}={APP_SECRET}")),
    )?;
    let ch = server.channel().await?;
    let base = format!("http://{}", server.http.context("no http address")?);
    let http = reqwest::Client::new();
    let mut jobs = jobs_as_admin(&ch);
    let ops = Cred::Bearer(BEARER);

    // create (gRPC, token), a read, trigger (gRPC, app), cancel (REST, token),
    // update (gRPC), pause (REST), drain of an unknown node (gRPC: NOT_FOUND), delete.
    jobs.create_job(pb::CreateJobRequest {
        spec: Some(spec("audited")),
    })
    .await?;
    jobs.get_job(pb::GetJobRequest {
        job_id: "audited".into(),
    })
    .await?;
    let signer = AppSigner::from_secret(APP, APP_SECRET)?;
    // Without the bearer interceptor: the signature is the credential.
    let sid = pb::job_service_client::JobServiceClient::new(ch.clone())
        .trigger_job(signer.grpc(
            "/sundial.v1.JobService/TriggerJob",
            pb::TriggerJobRequest {
                job_id: "audited".into(),
                ..Default::default()
            },
        ))
        .await?
        .into_inner()
        .schedule_id;
    // TriggerJob queues the trigger; the run is recorded once the dispatcher takes it.
    wait_for("the triggered run", Duration::from_secs(10), || async {
        let run =
            pb::run_service_client::RunServiceClient::with_interceptor(ch.clone(), WithBearer)
                .get_run(pb::GetRunRequest {
                    schedule_id: sid.clone(),
                })
                .await;
        Ok(run.is_ok().then_some(()))
    })
    .await?;
    let (status, v) = rest(
        &http,
        &base,
        "POST",
        &format!("/api/v1/runs/{sid}/cancel"),
        b"",
        &ops,
        None,
    )
    .await?;
    ensure!(status == 200, "cancel: {status} {v}");
    let mut changed = spec("audited");
    changed.name = "changed".into();
    jobs.update_job(pb::UpdateJobRequest {
        spec: Some(changed),
        expected_version: 1,
    })
    .await?;
    let (status, v) = rest(
        &http,
        &base,
        "POST",
        "/api/v1/jobs/audited/pause",
        b"",
        &ops,
        None,
    )
    .await?;
    ensure!(status == 200, "pause: {status} {v}");
    let err = pb::node_service_client::NodeServiceClient::with_interceptor(ch.clone(), WithBearer)
        .drain_node(pb::DrainNodeRequest {
            node_id: "nowhere".into(),
            ..Default::default()
        })
        .await
        .err()
        .context("draining an unknown node")?;
    ensure!(err.code() == Code::NotFound, "{err:?}");
    jobs.delete_job(pb::DeleteJobRequest {
        job_id: "audited".into(),
    })
    .await?;

    let mut audit = pb::audit_service_client::AuditServiceClient::new(ch.clone());
    let page = audit
        .list_audit_events(grpc_request(
            pb::ListAuditEventsRequest::default(),
            &[("authorization", format!("Bearer {READER}"))],
        )?)
        .await?
        .into_inner();
    let seen: Vec<(String, String, String, String, String)> = page
        .events
        .iter()
        .rev()
        .map(|e| {
            (
                e.caller.clone(),
                e.operation.clone(),
                e.target.clone(),
                e.outcome.clone(),
                e.via.clone(),
            )
        })
        .collect();
    let row = |caller: &str, op: &str, target: &str, outcome: &str, via: &str| {
        (
            caller.to_owned(),
            op.to_owned(),
            target.to_owned(),
            outcome.to_owned(),
            via.to_owned(),
        )
    };
    let want = vec![
        row(
            "bearer:ops",
            "JobService.CreateJob",
            "job audited",
            "OK",
            "grpc",
        ),
        row(
            &format!("app:{APP}"),
            "JobService.TriggerJob",
            "job audited",
            "OK",
            "grpc",
        ),
        row(
            "bearer:ops",
            "RunService.CancelRun",
            &format!("run {sid}"),
            "OK",
            "rest",
        ),
        row(
            "bearer:ops",
            "JobService.UpdateJob",
            "job audited",
            "OK",
            "grpc",
        ),
        row(
            "bearer:ops",
            "JobService.PauseJob",
            "job audited",
            "OK",
            "rest",
        ),
        row(
            "bearer:ops",
            "NodeService.DrainNode",
            "node nowhere",
            "NOT_FOUND",
            "grpc",
        ),
        row(
            "bearer:ops",
            "JobService.DeleteJob",
            "job audited",
            "OK",
            "grpc",
        ),
    ];
    ensure!(seen == want, "audit log:\n{seen:#?}\nwanted:\n{want:#?}");
    ensure!(
        page.events
            .windows(2)
            .all(|w| w[0].seq > w[1].seq && w[0].time_ms >= w[1].time_ms)
    );
    ensure!(page.events.iter().all(|e| !e.instance.is_empty()));

    // The REST twin, paged, for a read token.
    let (status, v) = rest(
        &http,
        &base,
        "GET",
        "/api/v1/audit?page_size=2",
        b"",
        &Cred::Bearer(READER),
        None,
    )
    .await?;
    ensure!(status == 200, "GET /api/v1/audit: {status} {v}");
    ensure!(
        v["events"][0]["operation"] == "JobService.DeleteJob"
            && v["events"][1]["operation"] == "NodeService.DrainNode"
            && v["nextPageToken"].as_str().is_some_and(|t| !t.is_empty()),
        "{v}"
    );

    // And each on the `audit` log target.
    server.stop()?;
    let logs = server.stderr();
    let lines = logs
        .lines()
        .filter(|l| l.contains("audit") && l.contains("admin call"))
        .count();
    ensure!(lines == 7, "{lines} audit lines in:\n{logs}");
    ensure!(logs.contains("caller=bearer:ops") && logs.contains("operation=RunService.CancelRun"));
    assert_no_secrets(&server)
}
