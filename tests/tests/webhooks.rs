//! Webhooks end to end: real Redis, real `sundial` processes, and a real HTTP receiver
//! in this process that records every delivery it gets (headers and exact body bytes)
//! and answers from a script. Runs finish through HTTP targets (the server calls a
//! target on this process too), so no executor is needed; one finishes over a raw
//! executor stream, whose result claims its webhook in the step that applies it.
//!
//! Loopback is outside the webhook egress policy, so every server here allow-lists it
//! (`--webhook-allow 127.0.0.1/32`) and retries on a millisecond schedule.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use serde_json::Value;
use sundial_proto::v1 as pb;
use sundial_proto::v1::executor_message::Msg;
use sundial_sdk::webhook::{MemoryNonceCache, Secret, Verifier};
use sundial_tests::raw::Exec;
use sundial_tests::{RedisServer, Sundial, SundialOptions, wait_for};
use tokio_util::sync::CancellationToken;

/// One request the receiver got.
#[derive(Debug, Clone)]
struct Hit {
    id: String,
    body: Vec<u8>,
    headers: HeaderMap,
    answered: u16,
    /// When it came, and how many were being answered then (itself included).
    at: std::time::Instant,
    in_flight: usize,
}

#[derive(Default)]
struct Script {
    /// The next answers, in order: (delay before answering, status).
    replies: VecDeque<(Duration, u16)>,
    /// The answer once `replies` is used up.
    then: u16,
    /// How long that answer takes.
    then_delay: Duration,
    hits: Vec<Hit>,
    /// The ids of the requests being answered now (one entry per request).
    in_flight: Vec<String>,
    /// The most requests answered at once.
    most_in_flight: usize,
    /// Requests that came while another copy of the same webhook was in flight.
    overlaps: usize,
}

type Shared = Arc<Mutex<Script>>;

fn lock(s: &Shared) -> std::sync::MutexGuard<'_, Script> {
    s.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A webhook receiver on a fixed local port that can be stopped (connections refused)
/// and started again on the same port.
struct Receiver {
    addr: SocketAddr,
    script: Shared,
    running: Option<(CancellationToken, tokio::task::JoinHandle<()>)>,
}

async fn hook(State(script): State<Shared>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let id = headers
        .get("webhook-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let (delay, status) = {
        let mut s = lock(&script);
        let (delay, status) = s.replies.pop_front().unwrap_or((s.then_delay, s.then));
        if s.in_flight.contains(&id) {
            s.overlaps += 1;
        }
        s.in_flight.push(id.clone());
        s.most_in_flight = s.most_in_flight.max(s.in_flight.len());
        let in_flight = s.in_flight.len();
        s.hits.push(Hit {
            id: id.clone(),
            body: body.to_vec(),
            headers,
            answered: status,
            at: std::time::Instant::now(),
            in_flight,
        });
        (delay, status)
    };
    tokio::time::sleep(delay).await;
    let mut s = lock(&script);
    if let Some(i) = s.in_flight.iter().position(|x| *x == id) {
        s.in_flight.swap_remove(i);
    }
    StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

impl Receiver {
    /// Answers `replies` in order, then `then` to everything.
    async fn start(replies: &[(Duration, u16)], then: u16) -> Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let script = Arc::new(Mutex::new(Script {
            replies: replies.iter().copied().collect(),
            then,
            ..Script::default()
        }));
        let mut r = Receiver {
            addr,
            script,
            running: None,
        };
        r.serve(listener);
        Ok(r)
    }

    fn serve(&mut self, listener: tokio::net::TcpListener) {
        let app = Router::new()
            .route("/hook", post(hook))
            .with_state(self.script.clone());
        let stop = CancellationToken::new();
        let until = stop.clone().cancelled_owned();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(until)
                .await;
        });
        self.running = Some((stop, task));
    }

    fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    /// Stops listening: deliveries are refused at connect.
    async fn stop(&mut self) -> Result<()> {
        if let Some((stop, task)) = self.running.take() {
            stop.cancel();
            tokio::time::timeout(Duration::from_secs(10), task).await??;
        }
        Ok(())
    }

    /// Listens again on the same port.
    async fn restart(&mut self) -> Result<()> {
        let listener = tokio::net::TcpListener::bind(self.addr).await?;
        self.serve(listener);
        Ok(())
    }

    fn hits(&self) -> Vec<Hit> {
        lock(&self.script).hits.clone()
    }

    fn hits_for(&self, id: &str) -> Vec<Hit> {
        self.hits().into_iter().filter(|h| h.id == id).collect()
    }
}

/// An HTTP target that always answers 200 "ok": the runs it ends succeed.
async fn target() -> Result<String> {
    let app = Router::new().route("/target", post(|| async { "ok" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(format!("http://{addr}/target"))
}

fn options(redis: &RedisServer, secrets: &[Secret]) -> SundialOptions {
    settings(SundialOptions::redis(redis), secrets)
}

/// This file's settings on either store.
fn settings(store: SundialOptions, secrets: &[Secret]) -> SundialOptions {
    let secrets: Vec<String> = secrets.iter().map(Secret::to_string).collect();
    store
        .arg("heartbeat-interval", "300ms")
        .arg("sweep-every", "50ms")
        .arg("http-target-allow", "127.0.0.1/32")
        .arg("webhook-allow", "127.0.0.1/32")
        .arg("webhook-retry-schedule", "50ms,100ms,200ms")
        .arg("webhook-secret", &secrets.join(","))
}

async fn create_job(server: &Sundial, id: &str, target: &str, callback: &str) -> Result<()> {
    server
        .jobs()
        .await?
        .create_job(pb::CreateJobRequest {
            spec: Some(pb::JobSpec {
                callback_url: callback.into(),
                ..sundial_tests::manual_http_job(id, target)
            }),
        })
        .await?;
    Ok(())
}

/// Waits until the run's callback is DONE or FAILED; returns the run.
async fn callback_settled(server: &Sundial, sid: &str, timeout: Duration) -> Result<pb::Run> {
    wait_for(&format!("{sid}'s webhook to settle"), timeout, || async {
        let r = server.run(sid).await?;
        let settled = [
            pb::CallbackState::Done as i32,
            pb::CallbackState::Failed as i32,
        ];
        Ok(settled.contains(&r.callback_state).then_some(r))
    })
    .await
}

/// The run as the REST API shows it, with the callback fields at their default value
/// (left out of the canonical JSON) filled in, so they compare as numbers and strings.
async fn rest_run(server: &Sundial, sid: &str) -> Result<Value> {
    let base = server.http.context("no http address")?;
    let v: Value = reqwest::get(format!("http://{base}/api/v1/runs/{sid}"))
        .await?
        .error_for_status()?
        .json()
        .await?;
    let mut run = v["run"].clone();
    for (field, default) in [
        ("callbackAttempts", Value::from(0)),
        ("callbackStatus", Value::from(0)),
        ("callbackError", Value::from("")),
    ] {
        if run.get(field).is_none() {
            run[field] = default;
        }
    }
    Ok(run)
}

fn verifier(secret: &Secret) -> Verifier {
    Verifier::new(secret.clone()).nonce_cache(MemoryNonceCache::new(1000))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_receiver_gets_the_same_signed_body_until_it_accepts() -> Result<()> {
    let redis = RedisServer::start()?;
    let receiver = Receiver::start(&[(Duration::ZERO, 500); 3], 200).await?;
    let target = target().await?;
    // Two secrets, as while rotating: every delivery carries a signature for each.
    let (old, new) = (Secret::generate(), Secret::generate());
    let server = Sundial::start(options(&redis, &[old.clone(), new.clone()]))?;
    create_job(&server, "hooked", &target, &receiver.url()).await?;
    let sid = server.trigger("hooked").await?;

    let run = callback_settled(&server, &sid, Duration::from_secs(20)).await?;
    ensure!(
        run.callback_state == pb::CallbackState::Done as i32,
        "{run:?}"
    );
    ensure!(run.state == pb::RunState::Succeeded as i32, "{run:?}");
    ensure!(
        (run.callback_attempts, run.callback_status) == (4, 200),
        "the delivery record over gRPC: {run:?}"
    );
    let hits = receiver.hits_for(&sid);
    ensure!(hits.len() == 4, "four attempts, got {}", hits.len());
    ensure!(
        hits.iter().map(|h| h.answered).collect::<Vec<_>>() == [500, 500, 500, 200],
        "{hits:?}"
    );
    ensure!(receiver.hits().len() == 4, "nothing else was delivered");
    // The same id and byte-identical body every time; a new timestamp/nonce each time.
    ensure!(hits.iter().all(|h| h.body == hits[0].body));
    // Classic: each attempt's nonce is new, so a replay cache accepts every one.
    // Standard: checked without a cache, whose key (id.timestamp, whole seconds) cannot
    // tell apart retries sent within one second.
    let (old_classic, new_classic) = (verifier(&old), verifier(&new));
    let mut nonces = std::collections::BTreeSet::new();
    for h in &hits {
        old_classic
            .verify_classic(&h.headers, &h.body)
            .context("classic, old secret")?;
        new_classic
            .verify_classic(&h.headers, &h.body)
            .context("classic, new secret")?;
        for secret in [&old, &new] {
            let v = Verifier::new(secret.clone())
                .verify_standard(&h.headers, &h.body)
                .context("standard")?;
            ensure!(v.id.as_deref() == Some(sid.as_str()), "{v:?}");
        }
        let nonce = h
            .headers
            .get("x-sundial-nonce")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        ensure!(nonces.insert(nonce.to_owned()), "nonce {nonce} repeated");
        ensure!(
            h.headers.get("x-sundial-app-id").map(|v| v.as_bytes()) == Some(b"sundial".as_slice())
        );
    }
    // The body: the run's final result.
    let body: Value = serde_json::from_slice(&hits[0].body)?;
    ensure!(body["schedule_id"] == sid.as_str() && body["job_id"] == "hooked");
    ensure!(
        body["status"] == "SUCCEEDED" && body["attempt"] == 1,
        "{body}"
    );
    ensure!(
        body["fencing_token"].as_str() == Some(run.fencing_token.to_string().as_str()),
        "{body}"
    );
    ensure!(
        body["output"] == "b2s=",
        "output is base64 of \"ok\": {body}"
    );
    ensure!(
        body["finished_at_ms"] == run.finished_at_ms
            && body["started_at_ms"] == run.started_at_ms
            && body["duration_ms"] == run.finished_at_ms - run.started_at_ms,
        "{body}"
    );
    // The delivery record, over REST.
    let rest = rest_run(&server, &sid).await?;
    ensure!(
        rest["callbackState"] == "CALLBACK_STATE_DONE"
            && rest["callbackAttempts"] == 4
            && rest["callbackStatus"] == 200
            && rest["callbackError"] == "",
        "{rest}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_down_for_the_whole_schedule_fails_the_callback_and_trips_the_breaker()
-> Result<()> {
    let redis = RedisServer::start()?;
    let mut receiver = Receiver::start(&[], 200).await?;
    receiver.stop().await?;
    let target = target().await?;
    let server = Sundial::start(
        options(&redis, &[Secret::generate()])
            .arg("webhook-breaker-failures", "3")
            .arg("webhook-breaker-cooldown", "1s"),
    )?;
    create_job(&server, "down", &target, &receiver.url()).await?;
    let first = server.trigger("down").await?;

    // Three refused attempts open the breaker; the fourth waits for the cool-down, is
    // the probe, is refused too: retries spent.
    let run = callback_settled(&server, &first, Duration::from_secs(20)).await?;
    ensure!(
        run.callback_state == pb::CallbackState::Failed as i32,
        "{run:?}"
    );
    // The result is still there.
    ensure!(
        run.state == pb::RunState::Succeeded as i32 && run.output == b"ok",
        "{run:?}"
    );
    let rest = rest_run(&server, &first).await?;
    ensure!(
        rest["callbackState"] == "CALLBACK_STATE_FAILED"
            && rest["callbackAttempts"] == 4
            && rest["callbackStatus"] == 0
            && rest["callbackError"]
                .as_str()
                .is_some_and(|e| e.contains("retries spent")),
        "{rest}"
    );
    let log = server.stderr();
    ensure!(
        log.lines()
            .any(|l| l.contains("callback_failed") && l.contains("ERROR") && l.contains(&first)),
        "no alert line for {first} in:\n{log}"
    );
    ensure!(
        log.contains("webhook circuit breaker opened"),
        "the breaker never opened:\n{log}"
    );
    ensure!(
        log.contains("this delivery is the probe"),
        "no half-open probe:\n{log}"
    );

    // The receiver comes back; the breaker is open (the probe failed), so the next
    // run's webhook waits for the cool-down without spending an attempt, then is the
    // probe that closes it.
    receiver.restart().await?;
    let second = server.trigger("down").await?;
    let run = callback_settled(&server, &second, Duration::from_secs(20)).await?;
    ensure!(
        run.callback_state == pb::CallbackState::Done as i32,
        "{run:?}"
    );
    let rest = rest_run(&server, &second).await?;
    ensure!(
        rest["callbackAttempts"] == 1,
        "deferral spent an attempt: {rest}"
    );
    ensure!(receiver.hits_for(&second).len() == 1);
    ensure!(
        receiver.hits_for(&first).is_empty(),
        "the failed one is not retried"
    );
    let log = server.stderr();
    ensure!(
        log.contains("webhook circuit breaker closed"),
        "the breaker never closed:\n{log}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_receiver_and_two_workers_record_one_outcome_per_claim() -> Result<()> {
    let redis = RedisServer::start()?;
    // The first request is answered (500) only after the claim's lease ran out; the
    // delivery is claimed again meanwhile and that attempt is answered 200.
    let receiver = Receiver::start(&[(Duration::from_millis(2500), 500)], 200).await?;
    let target = target().await?;
    let secret = Secret::generate();
    let opts = |name: &str| {
        options(&redis, std::slice::from_ref(&secret))
            .arg("instance-id", name)
            .arg("webhook-claim-lease", "300ms")
            .arg("webhook-timeout", "5s")
    };
    let a = Sundial::start(opts("a"))?;
    let b = Sundial::start(opts("b"))?;
    create_job(&a, "slow", &target, &receiver.url()).await?;
    let sid = a.trigger("slow").await?;

    let run = callback_settled(&b, &sid, Duration::from_secs(20)).await?;
    ensure!(
        run.callback_state == pb::CallbackState::Done as i32,
        "{run:?}"
    );
    // Let the slow request end and its worker try to record the 500.
    let log_of = || format!("{}{}", a.stderr(), b.stderr());
    wait_for(
        "the stale outcome to be refused",
        Duration::from_secs(10),
        || async { Ok(log_of().contains("webhook outcome refused").then_some(())) },
    )
    .await?;
    let hits = receiver.hits_for(&sid);
    ensure!(
        hits.iter().map(|h| h.answered).collect::<Vec<_>>() == [500, 200],
        "{hits:?}"
    );
    ensure!(hits.iter().all(|h| h.body == hits[0].body));
    // One outcome recorded: the later claim's 200; the stale 500 changed nothing.
    let rest = rest_run(&a, &sid).await?;
    ensure!(
        rest["callbackState"] == "CALLBACK_STATE_DONE"
            && rest["callbackAttempts"] == 1
            && rest["callbackStatus"] == 200
            && rest["callbackError"] == "",
        "{rest}"
    );
    let log = log_of();
    ensure!(
        log.matches("webhook delivered").count() == 1,
        "one delivered outcome:\n{log}"
    );
    ensure!(!log.contains("callback_failed"), "{log}");
    Ok(())
}

/// Waits for an instance armed with `run.after_finish@1` to die at that point.
async fn died_after_finish(crashing: &mut Sundial) -> Result<()> {
    let status = crashing.wait_exit(Duration::from_secs(20)).await?;
    ensure!(!status.success(), "crash point exit was {status}");
    ensure!(
        crashing
            .stderr()
            .contains("SUNDIAL_FAULT: crashing at run.after_finish"),
        "the instance died, but not at its crash point"
    );
    Ok(())
}

/// Waits for `sid` to be SUCCEEDED with its webhook DONE on `server`, every delivery of
/// it answered 200 and signed with `secret`.
async fn delivered(
    server: &Sundial,
    sid: &str,
    receiver: &Receiver,
    secret: &Secret,
) -> Result<()> {
    let run = callback_settled(server, sid, Duration::from_secs(20)).await?;
    ensure!(
        run.callback_state == pb::CallbackState::Done as i32
            && run.state == pb::RunState::Succeeded as i32,
        "{run:?}"
    );
    let hits = receiver.hits_for(sid);
    ensure!(
        !hits.is_empty() && hits.iter().all(|h| h.answered == 200),
        "{hits:?}"
    );
    verifier(secret).verify(&hits[0].headers, &hits[0].body)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_finished_right_before_a_crash_is_delivered_after_the_restart() -> Result<()> {
    let redis = RedisServer::start()?;
    let receiver = Receiver::start(&[], 200).await?;
    let target = target().await?;
    let secret = Secret::generate();
    // The instance dies right after the result committed (the run final, its webhook
    // in the outbox), before anything else: no ack, no follow-up, no delivery.
    let mut crashing =
        Sundial::start(options(&redis, std::slice::from_ref(&secret)).fault("run.after_finish@1"))?;
    create_job(&crashing, "crash", &target, &receiver.url()).await?;
    let sid = crashing.trigger("crash").await?;
    died_after_finish(&mut crashing).await?;

    let restarted = Sundial::start(options(&redis, std::slice::from_ref(&secret)))?;
    delivered(&restarted, &sid, &receiver, &secret).await
}

/// A result from an executor stream claims its webhook for its own instance in the
/// step that applies it. That instance dies right after the step, before it could
/// deliver the webhook or record anything: the claim runs out with its lease (1 s
/// here) and the restarted instance's sweep delivers it, signed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_its_result_claimed_on_an_instance_that_dies_is_delivered_after_the_lease()
-> Result<()> {
    let redis = RedisServer::start()?;
    let receiver = Receiver::start(&[], 200).await?;
    let secret = Secret::generate();
    let opts = || options(&redis, std::slice::from_ref(&secret)).arg("webhook-claim-lease", "1s");
    let mut crashing = Sundial::start(opts().fault("run.after_finish@1"))?;
    crashing
        .jobs()
        .await?
        .create_job(pb::CreateJobRequest {
            spec: Some(pb::JobSpec {
                callback_url: receiver.url(),
                ..sundial_tests::manual_job("claimed", "work")
            }),
        })
        .await?;
    let mut e = Exec::connect(crashing.channel().await?, "n1", &["work"]).await?;
    let sid = crashing.trigger("claimed").await?;
    let run = e.dispatch().await?.run.context("run ref")?;
    e.send(Msg::Started(pb::Started {
        run: Some(run.clone()),
    }))
    .await?;
    wait_for("the run to start", Duration::from_secs(15), || async {
        let r = crashing.run(&sid).await?;
        Ok((r.state == pb::RunState::Running as i32).then_some(()))
    })
    .await?;
    e.send(Msg::Result(pb::Result {
        run: Some(run),
        status: pb::ResultStatus::Succeeded as i32,
        ..Default::default()
    }))
    .await?;
    died_after_finish(&mut crashing).await?;

    let restarted = Sundial::start(opts())?;
    delivered(&restarted, &sid, &receiver, &secret).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gone_stops_the_retries_at_once() -> Result<()> {
    let redis = RedisServer::start()?;
    let receiver = Receiver::start(&[], 410).await?;
    let target = target().await?;
    let server = Sundial::start(options(&redis, &[Secret::generate()]))?;
    create_job(&server, "gone", &target, &receiver.url()).await?;
    let sid = server.trigger("gone").await?;

    let run = callback_settled(&server, &sid, Duration::from_secs(20)).await?;
    ensure!(
        run.callback_state == pb::CallbackState::Failed as i32,
        "{run:?}"
    );
    ensure!(run.state == pb::RunState::Succeeded as i32, "{run:?}");
    // Longer than the whole retry schedule: nothing more arrives.
    tokio::time::sleep(Duration::from_millis(600)).await;
    ensure!(receiver.hits_for(&sid).len() == 1, "{:?}", receiver.hits());
    let rest = rest_run(&server, &sid).await?;
    ensure!(
        rest["callbackAttempts"] == 1
            && rest["callbackStatus"] == 410
            && rest["callbackError"]
                .as_str()
                .is_some_and(|e| e.contains("410 Gone")),
        "{rest}"
    );
    let log = server.stderr();
    ensure!(
        log.lines()
            .any(|l| l.contains("callback_failed") && l.contains("410 Gone") && l.contains(&sid)),
        "no alert line saying 410 for {sid}:\n{log}"
    );
    Ok(())
}

/// A job that names an app is signed with that app's secrets (from `AppService`), and
/// after a rotation with both the old and the new one; `X-Sundial-App-Id` is the app.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_naming_an_app_is_signed_with_its_secrets_through_a_rotation() -> Result<()> {
    use sundial_proto::v1::app_service_client::AppServiceClient;
    let redis = RedisServer::start()?;
    let receiver = Receiver::start(&[], 200).await?;
    let target = target().await?;
    let server_secret = Secret::generate();
    let server = Sundial::start(options(&redis, std::slice::from_ref(&server_secret)))?;
    let mut apps = AppServiceClient::new(server.channel().await?);
    let first: Secret = apps
        .create_app(pb::CreateAppRequest {
            app_id: "billing".into(),
            name: "Billing".into(),
            secret: String::new(),
        })
        .await?
        .into_inner()
        .secret
        .parse()?;
    server
        .jobs()
        .await?
        .create_job(pb::CreateJobRequest {
            spec: Some(pb::JobSpec {
                callback_url: receiver.url(),
                app_id: "billing".into(),
                ..sundial_tests::manual_http_job("billed", &target)
            }),
        })
        .await?;

    let sid = server.trigger("billed").await?;
    let run = callback_settled(&server, &sid, Duration::from_secs(20)).await?;
    ensure!(
        run.callback_state == pb::CallbackState::Done as i32,
        "{run:?}"
    );
    let hit = receiver.hits_for(&sid).pop().context("delivered")?;
    Verifier::new(first.clone())
        .verify_standard(&hit.headers, &hit.body)
        .context("signed with the app's secret")?;
    Verifier::new(first.clone())
        .verify_classic(&hit.headers, &hit.body)
        .context("classic, the app's secret")?;
    ensure!(
        Verifier::new(server_secret.clone())
            .verify_standard(&hit.headers, &hit.body)
            .is_err(),
        "signed with the server's secret instead of the app's"
    );
    ensure!(
        hit.headers.get("x-sundial-app-id").map(|v| v.as_bytes()) == Some(b"billing".as_slice()),
        "{:?}",
        hit.headers
    );

    let second: Secret = apps
        .rotate_app_secret(pb::RotateAppSecretRequest {
            app_id: "billing".into(),
            overlap_ms: 60_000,
            new_secret: String::new(),
        })
        .await?
        .into_inner()
        .secret
        .parse()?;
    let sid = server.trigger("billed").await?;
    callback_settled(&server, &sid, Duration::from_secs(20)).await?;
    let hit = receiver.hits_for(&sid).pop().context("delivered")?;
    for secret in [&first, &second] {
        Verifier::new(secret.clone())
            .verify_standard(&hit.headers, &hit.body)
            .context("both secrets sign during the overlap")?;
    }
    Ok(())
}

/// What a [`HeldReceiver`] saw: the ids it got, how many it holds now and at most.
#[derive(Clone)]
struct Held {
    ids: Arc<Mutex<Vec<String>>>,
    now: Arc<std::sync::atomic::AtomicUsize>,
    most: Arc<std::sync::atomic::AtomicUsize>,
    released: tokio::sync::watch::Receiver<bool>,
}

/// A receiver that holds every request until `release` is sent, counting how many it
/// holds at once.
struct HeldReceiver {
    url: String,
    held: Held,
    release: tokio::sync::watch::Sender<bool>,
}

async fn held_hook(State(mut h): State<Held>, headers: HeaderMap) -> StatusCode {
    use std::sync::atomic::Ordering;
    let id = headers
        .get("webhook-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    h.ids
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(id);
    let now = h.now.fetch_add(1, Ordering::SeqCst) + 1;
    h.most.fetch_max(now, Ordering::SeqCst);
    let _ = h.released.wait_for(|r| *r).await;
    h.now.fetch_sub(1, Ordering::SeqCst);
    StatusCode::OK
}

impl HeldReceiver {
    async fn start() -> Result<Self> {
        let (release, released) = tokio::sync::watch::channel(false);
        let held = Held {
            ids: Arc::default(),
            now: Arc::default(),
            most: Arc::default(),
            released,
        };
        let app = Router::new()
            .route("/hook", post(held_hook))
            .with_state(held.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/hook", listener.local_addr()?);
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(Self { url, held, release })
    }

    /// (requests held now, most held at once)
    fn held(&self) -> (usize, usize) {
        use std::sync::atomic::Ordering;
        (
            self.held.now.load(Ordering::SeqCst),
            self.held.most.load(Ordering::SeqCst),
        )
    }

    fn ids(&self) -> Vec<String> {
        self.held
            .ids
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// One destination that stops answering holds at most its bound of the instance's
/// deliveries (`--webhook-destination-concurrency`), so another destination's webhooks
/// still go out while it hangs; the ones past its bound wait (or are deferred), no
/// attempt spent, and are each delivered once when it answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_receiver_holds_only_its_bound_and_never_the_others() -> Result<()> {
    let redis = RedisServer::start()?;
    let hanging = HeldReceiver::start().await?;
    let fast = Receiver::start(&[], 200).await?;
    let target = target().await?;
    let server = Sundial::start(
        options(&redis, &[Secret::generate()])
            .arg("webhook-concurrency", "4")
            .arg("webhook-destination-concurrency", "2")
            .arg("webhook-timeout", "60s"),
    )?;
    let mut slow = Vec::new();
    for i in 0..5 {
        let id = format!("slow-{i}");
        create_job(&server, &id, &target, &hanging.url).await?;
        slow.push(server.trigger(&id).await?);
    }
    wait_for(
        "the hanging receiver to hold two deliveries",
        Duration::from_secs(20),
        || async { Ok((hanging.held().0 >= 2).then_some(())) },
    )
    .await?;
    // The instance has two slots left (4 - 2), whatever the three other slow
    // deliveries do meanwhile.
    for i in 0..3 {
        let id = format!("fast-{i}");
        create_job(&server, &id, &target, &fast.url()).await?;
        let sid = server.trigger(&id).await?;
        let run = callback_settled(&server, &sid, Duration::from_secs(20)).await?;
        ensure!(
            run.callback_state == pb::CallbackState::Done as i32,
            "{run:?}"
        );
    }
    ensure!(
        hanging.held() == (2, 2),
        "the hanging destination holds (now, at most) {:?}",
        hanging.held()
    );
    // The three past the bound wait (or, once they have waited as long as their claim
    // allows, are deferred): each is delivered with its first attempt below.

    hanging.release.send_replace(true);
    for sid in &slow {
        let run = callback_settled(&server, sid, Duration::from_secs(20)).await?;
        ensure!(
            run.callback_state == pb::CallbackState::Done as i32 && run.callback_attempts == 1,
            "{run:?}"
        );
    }
    let mut ids = hanging.ids();
    ids.sort();
    let mut expected = slow.clone();
    expected.sort();
    ensure!(ids == expected, "each slow webhook sent once: {ids:?}");
    Ok(())
}

/// A receiver down for 30 s while 500 webhooks queue up, then back: with the job's
/// limit of 10 shared by two instances it never has more than 10 requests at once and
/// never a second copy of one while the first is in flight; its breaker closes on a
/// probe, the window ramps up to the limit, and each of the 500 arrives once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_back_from_an_outage_is_drained_at_its_limit() -> Result<()> {
    let redis = RedisServer::start()?;
    drained_after_an_outage(2, |name| {
        SundialOptions::redis(&redis).arg("instance-id", name)
    })
    .await
}

/// The same on the embedded store, whose slots are held in memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_back_from_an_outage_is_drained_at_its_limit_embedded() -> Result<()> {
    let dir = tempfile::tempdir()?;
    drained_after_an_outage(1, |_| SundialOptions::embedded(dir.path())).await
}

async fn drained_after_an_outage(
    instances: usize,
    store: impl Fn(&str) -> SundialOptions,
) -> Result<()> {
    const RUNS: usize = 500;
    const LIMIT: usize = 10;
    const OUTAGE: Duration = Duration::from_secs(30);
    let mut receiver = Receiver::start(&[], 200).await?;
    lock(&receiver.script).then_delay = Duration::from_millis(50);
    receiver.stop().await?;
    let down = tokio::time::Instant::now();
    let target = target().await?;
    let secret = Secret::generate();
    // Enough retries that no webhook runs out of them while probes fail.
    let schedule = vec!["500ms"; 20].join(",");
    let mut servers = Vec::new();
    for i in 0..instances {
        let opts = settings(store(&format!("i{i}")), std::slice::from_ref(&secret))
            .arg("webhook-breaker-cooldown", "2s")
            .arg("webhook-retry-schedule", &schedule);
        servers.push(Sundial::start(opts)?);
    }
    let a = &servers[0];
    let mut jobs = a.jobs().await?;
    jobs.create_job(pb::CreateJobRequest {
        spec: Some(pb::JobSpec {
            callback_url: receiver.url(),
            callback_max_in_flight: LIMIT as i32,
            ..sundial_tests::manual_http_job("outage", &target)
        }),
    })
    .await?;
    let mut sids = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let t = jobs
            .trigger_job(pb::TriggerJobRequest {
                job_id: "outage".into(),
                ..Default::default()
            })
            .await?;
        sids.push(t.into_inner().schedule_id);
    }
    tokio::time::sleep_until(down + OUTAGE).await;
    ensure!(receiver.hits().is_empty(), "the receiver was down");
    receiver.restart().await?;
    let back = std::time::Instant::now();
    let delivered = || {
        let s = lock(&receiver.script);
        s.hits.iter().filter(|h| h.answered == 200).count()
    };
    wait_for(
        "every webhook delivered",
        Duration::from_secs(120),
        || async { Ok((delivered() >= RUNS).then_some(())) },
    )
    .await?;
    let drained = back.elapsed();
    for sid in &sids {
        let run = callback_settled(a, sid, Duration::from_secs(20)).await?;
        ensure!(
            run.callback_state == pb::CallbackState::Done as i32,
            "{run:?}"
        );
    }
    let s = lock(&receiver.script);
    let mut ids: Vec<&str> = s.hits.iter().map(|h| h.id.as_str()).collect();
    ids.sort_unstable();
    let mut expected: Vec<&str> = sids.iter().map(String::as_str).collect();
    expected.sort_unstable();
    eprintln!(
        "{instances} instance(s), outage of {OUTAGE:?}: {RUNS} webhooks drained in {drained:?} after the receiver came back, at most {} in flight, {} requests",
        s.most_in_flight,
        s.hits.len()
    );
    print_pace(&s.hits, back);
    ensure!(ids == expected, "each webhook arrived once");
    ensure!(s.overlaps == 0, "{} sent again while in flight", s.overlaps);
    ensure!(
        s.most_in_flight == LIMIT,
        "at most {LIMIT} at once, and the window ramped up to it: {}",
        s.most_in_flight
    );
    Ok(())
}

/// Prints the requests that came in each half second after `from`, and the most in
/// flight among them: where a drain slowed down (a fair share held too long, deliveries
/// deferred too far) shows as a gap or a run of half-full windows.
fn print_pace(hits: &[Hit], from: std::time::Instant) {
    let mut halves: std::collections::BTreeMap<u128, (usize, usize)> = Default::default();
    for h in hits.iter().filter(|h| h.at >= from) {
        let half = halves
            .entry(h.at.duration_since(from).as_millis() / 500)
            .or_default();
        half.0 += 1;
        half.1 = half.1.max(h.in_flight);
    }
    for (half, (n, most)) in halves {
        eprintln!(
            "  from {:>6} ms: {n:>4} requests, at most {most:>2} in flight",
            half * 500
        );
    }
}
