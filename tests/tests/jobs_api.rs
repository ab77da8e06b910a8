//! The admin surface over real gRPC: validation that names the field and writes
//! nothing, optimistic concurrency, manual triggers, status, health and reflection.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use sundial_proto::v1 as pb;
use sundial_tests::{
    RedisServer, Sundial, SundialOptions, all_jobs, all_runs, every_second, manual_job, redis_now,
    wait_for,
};
use tonic::Code;

/// A codec that sends and receives message bytes as they are, to send what no stub
/// would.
#[derive(Clone, Copy, Default)]
struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }
    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        use prost::bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        use prost::bytes::Buf;
        let bytes = src.copy_to_bytes(src.remaining());
        Ok(Some(bytes.to_vec()))
    }
}

fn spec(f: impl FnOnce(&mut pb::JobSpec)) -> pb::JobSpec {
    let mut s = every_second("valid-id");
    f(&mut s);
    s
}

/// Each invalid request, the field its error must name.
fn invalid_cases() -> Vec<(&'static str, pb::JobSpec)> {
    use pb::job_spec::Target;
    vec![
        ("spec.id", spec(|s| s.id = String::new())),
        ("spec.id", spec(|s| s.id = "has space".into())),
        ("spec.id", spec(|s| s.id = "a@b".into())),
        ("spec.id", spec(|s| s.id = "x".repeat(129))),
        ("spec.id", spec(|s| s.id = ".".into())),
        ("spec.id", spec(|s| s.id = "..".into())),
        ("spec.name", spec(|s| s.name = "n".repeat(257))),
        ("spec.cron", spec(|s| s.cron = String::new())),
        ("spec.cron", spec(|s| s.cron = "not a cron".into())),
        ("spec.cron", spec(|s| s.cron = "61 * * * *".into())),
        ("spec.cron", spec(|s| s.cron = "* * * *".into())),
        ("spec.cron", spec(|s| s.cron = "0 0 30 2 *".into())), // never fires
        (
            "spec.time_zone",
            spec(|s| s.time_zone = "Mars/Olympus".into()),
        ),
        ("spec.start_time_ms", spec(|s| s.start_time_ms = -5)),
        (
            "spec.end_time_ms",
            spec(|s| {
                s.start_time_ms = 2_000_000_000_000;
                s.end_time_ms = 1_000_000_000_000;
            }),
        ),
        ("spec.jitter_ms", spec(|s| s.jitter_ms = -1)),
        ("spec.target", spec(|s| s.target = None)),
        (
            "spec.executor.group",
            spec(|s| {
                s.target = Some(Target::Executor(pb::ExecutorTarget {
                    group: String::new(),
                    handler: "h".into(),
                }))
            }),
        ),
        (
            "spec.executor.handler",
            spec(|s| {
                s.target = Some(Target::Executor(pb::ExecutorTarget {
                    group: "g".into(),
                    handler: String::new(),
                }))
            }),
        ),
        (
            "spec.http.url",
            spec(|s| {
                s.target = Some(Target::Http(pb::HttpTarget {
                    url: "ftp://example.com/x".into(),
                    method: String::new(),
                }))
            }),
        ),
        (
            "spec.http.method",
            spec(|s| {
                s.target = Some(Target::Http(pb::HttpTarget {
                    url: "http://example.com/x".into(),
                    method: "BREW".into(),
                }))
            }),
        ),
        ("spec.route_strategy", spec(|s| s.route_strategy = 99)),
        ("spec.route_key", spec(|s| s.route_key = "k".repeat(257))),
        ("spec.timeout_ms", spec(|s| s.timeout_ms = Some(0))),
        ("spec.timeout_ms", spec(|s| s.timeout_ms = Some(-1000))),
        // Numbers past the documented bounds (30 days; 7 days; the year 3000), i64::MAX
        // among them: Lua's cjson would have written it back as a float.
        ("spec.timeout_ms", spec(|s| s.timeout_ms = Some(i64::MAX))),
        (
            "spec.timeout_ms",
            spec(|s| s.timeout_ms = Some(30 * 86_400_000 + 1)),
        ),
        (
            "spec.retry.backoff_ms",
            spec(|s| {
                s.retry = Some(pb::RetryPolicy {
                    backoff_ms: i64::MAX,
                    ..Default::default()
                })
            }),
        ),
        (
            "spec.retry.max_backoff_ms",
            spec(|s| {
                s.retry = Some(pb::RetryPolicy {
                    max_backoff_ms: 7 * 86_400_000 + 1,
                    ..Default::default()
                })
            }),
        ),
        ("spec.start_time_ms", spec(|s| s.start_time_ms = i64::MAX)),
        (
            "spec.end_time_ms",
            spec(|s| s.end_time_ms = 99_999_999_999_999),
        ),
        (
            "spec.retry.max_retries",
            spec(|s| {
                s.retry = Some(pb::RetryPolicy {
                    max_retries: -1,
                    ..Default::default()
                })
            }),
        ),
        (
            "spec.retry.backoff_ms",
            spec(|s| {
                s.retry = Some(pb::RetryPolicy {
                    backoff_ms: -1,
                    ..Default::default()
                })
            }),
        ),
        (
            "spec.retry.backoff_multiplier",
            spec(|s| {
                s.retry = Some(pb::RetryPolicy {
                    backoff_multiplier: f64::NAN,
                    ..Default::default()
                })
            }),
        ),
        ("spec.misfire_policy", spec(|s| s.misfire_policy = 42)),
        (
            "spec.misfire_catch_up_limit",
            spec(|s| s.misfire_catch_up_limit = -1),
        ),
        ("spec.overlap_policy", spec(|s| s.overlap_policy = 42)),
        (
            "spec.callback_url",
            spec(|s| s.callback_url = "mailto:ops@example.com".into()),
        ),
        (
            "spec.callback_url",
            spec(|s| s.callback_url = "not a url".into()),
        ),
        ("spec.app_id", spec(|s| s.app_id = "bad app".into())),
        (
            "spec.callback_max_in_flight",
            spec(|s| s.callback_max_in_flight = -1),
        ),
        (
            "spec.callback_max_in_flight",
            spec(|s| s.callback_max_in_flight = 10_001),
        ),
        // Destinations that can never be reached, and an app that does not exist.
        (
            "spec.callback_url",
            spec(|s| s.callback_url = "http://169.254.169.254/latest/meta-data".into()),
        ),
        (
            "spec.callback_url",
            spec(|s| s.callback_url = "http://10.0.0.1/hook".into()),
        ),
        (
            "spec.callback_url",
            spec(|s| s.callback_url = "http://[::1]:8080/hook".into()),
        ),
        (
            "spec.http.url",
            spec(|s| {
                s.target = Some(Target::Http(pb::HttpTarget {
                    url: "http://169.254.169.254/latest/meta-data".into(),
                    ..Default::default()
                }))
            }),
        ),
        ("spec.app_id", spec(|s| s.app_id = "no-such-app".into())),
        (
            "spec.payload",
            spec(|s| s.payload = vec![0u8; 64 * 1024 + 1]),
        ),
        (
            "spec.labels",
            spec(|s| {
                s.labels.insert(String::new(), "v".into());
            }),
        ),
    ]
}

/// Every key in Redis with its type and size, except the schedulers' short-lived
/// partition leases (which come and go while they poll) and the audit log.
async fn store_snapshot(redis: &RedisServer) -> Result<Vec<(String, String, i64)>> {
    let mut c = redis.connection().await?;
    let mut keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut c).await?;
    keys.retain(|k| !k.ends_with(":claimer"));
    // The audit log records each refused call, as it must (auth::admin_calls_are_audited
    // checks it): that is not the refused call writing.
    keys.retain(|k| !k.contains(":{audit}:"));
    keys.sort();
    let mut out = Vec::new();
    for k in keys {
        let t: String = redis::cmd("TYPE").arg(&k).query_async(&mut c).await?;
        let size: i64 = match t.as_str() {
            "hash" => redis::cmd("HLEN").arg(&k).query_async(&mut c).await?,
            "zset" => redis::cmd("ZCARD").arg(&k).query_async(&mut c).await?,
            "stream" => redis::cmd("XLEN").arg(&k).query_async(&mut c).await?,
            _ => redis::cmd("STRLEN")
                .arg(&k)
                .query_async(&mut c)
                .await
                .unwrap_or(0),
        };
        out.push((k, t, size));
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_jobs_are_rejected_naming_the_field_and_change_nothing() -> Result<()> {
    let redis = RedisServer::start()?;
    let server = Sundial::start(SundialOptions::redis(&redis))?;
    let mut jobs = server.jobs().await?;
    let before = store_snapshot(&redis).await?;
    for (field, spec) in invalid_cases() {
        let err = jobs
            .create_job(pb::CreateJobRequest {
                spec: Some(spec.clone()),
            })
            .await
            .expect_err(field);
        ensure!(
            err.code() == Code::InvalidArgument,
            "{field}: expected INVALID_ARGUMENT, got {:?}: {}",
            err.code(),
            err.message()
        );
        ensure!(
            err.message().starts_with(&format!("{field}:")),
            "error {:?} should name {field}",
            err.message()
        );
    }
    let err = jobs
        .create_job(pb::CreateJobRequest { spec: None })
        .await
        .expect_err("no spec");
    ensure!(err.code() == Code::InvalidArgument && err.message().starts_with("spec:"));
    // A huge zone is quoted cut, and no message says its field twice.
    let err = jobs
        .create_job(pb::CreateJobRequest {
            spec: Some(spec(|s| s.time_zone = "Z".repeat(10_000))),
        })
        .await
        .expect_err("10 KB zone");
    ensure!(
        err.message()
            .starts_with("spec.time_zone: unknown IANA time zone \"ZZZ")
            && err.message().len() < 300,
        "{} bytes: {}",
        err.message().len(),
        &err.message()[..err.message().len().min(200)]
    );
    let err = jobs
        .create_job(pb::CreateJobRequest {
            spec: Some(spec(|s| s.cron = "nope".into())),
        })
        .await
        .expect_err("bad cron");
    ensure!(
        err.message().starts_with("spec.cron: ") && !err.message().contains("cron: cron"),
        "{}",
        err.message()
    );

    // Bytes that are not a CreateJobRequest (field 1 with wire type 7, which does not
    // exist): the caller's fault, INVALID_ARGUMENT, not INTERNAL.
    let mut raw = tonic::client::Grpc::new(server.channel().await?);
    raw.ready().await?;
    let err = raw
        .unary(
            tonic::Request::new(vec![0x0f_u8, 0x01]),
            http::uri::PathAndQuery::from_static("/sundial.v1.JobService/CreateJob"),
            RawCodec,
        )
        .await
        .expect_err("undecodable");
    ensure!(
        err.code() == Code::InvalidArgument
            && err
                .message()
                .starts_with("failed to decode Protobuf message"),
        "{:?}: {}",
        err.code(),
        err.message()
    );

    // Nothing was written: no job listed, and not one key more in Redis.
    let list = jobs
        .list_jobs(pb::ListJobsRequest::default())
        .await?
        .into_inner();
    ensure!(
        list.jobs.is_empty(),
        "invalid requests created {:?}",
        list.jobs
    );
    ensure!(
        store_snapshot(&redis).await? == before,
        "invalid requests wrote to the store"
    );

    // Update and trigger validate the same way, and also write nothing.
    jobs.create_job(pb::CreateJobRequest {
        spec: Some(every_second("valid-id")),
    })
    .await?;
    let err = jobs
        .update_job(pb::UpdateJobRequest {
            spec: Some(spec(|s| s.cron = "nope".into())),
            expected_version: 1,
        })
        .await
        .expect_err("bad cron");
    ensure!(err.code() == Code::InvalidArgument && err.message().starts_with("spec.cron:"));
    let err = jobs
        .update_job(pb::UpdateJobRequest {
            spec: Some(every_second("valid-id")),
            expected_version: 0,
        })
        .await
        .expect_err("no version");
    ensure!(err.message().starts_with("expected_version:"));
    let err = jobs
        .trigger_job(pb::TriggerJobRequest {
            job_id: "valid-id".into(),
            payload: vec![1; 64 * 1024 + 1],
            ..Default::default()
        })
        .await
        .expect_err("big payload");
    ensure!(err.code() == Code::InvalidArgument && err.message().starts_with("payload:"));
    let err = jobs
        .trigger_job(pb::TriggerJobRequest {
            job_id: "valid-id".into(),
            idempotency_key: "no spaces allowed".into(),
            ..Default::default()
        })
        .await
        .expect_err("bad key");
    ensure!(err.message().starts_with("idempotency_key:"));
    let err = jobs
        .get_job(pb::GetJobRequest {
            job_id: "bad id".into(),
        })
        .await
        .expect_err("bad id");
    ensure!(err.code() == Code::InvalidArgument && err.message().starts_with("job_id:"));
    // The job exists and keeps firing, so only compare its own record.
    let job = jobs
        .get_job(pb::GetJobRequest {
            job_id: "valid-id".into(),
        })
        .await?
        .into_inner()
        .job
        .context("job")?;
    ensure!(
        job.version == 1,
        "rejected updates must not bump the version"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crud_versions_triggers_and_status() -> Result<()> {
    let redis = RedisServer::start()?;
    let server = Sundial::start(SundialOptions::redis(&redis))?;
    let mut jobs = server.jobs().await?;
    let mut runs = server.runs().await?;

    let mut s = every_second("report");
    s.cron = "0 0 12 * * ?".into(); // noon, Quartz form
    s.time_zone = "Asia/Shanghai".into();
    s.labels.insert("team".into(), "billing".into());
    let created = jobs
        .create_job(pb::CreateJobRequest {
            spec: Some(s.clone()),
        })
        .await?
        .into_inner()
        .job
        .context("job")?;
    ensure!(created.version == 1 && created.state == pb::JobState::Active as i32);
    // 12:00 in Shanghai is 04:00 UTC.
    ensure!(created.next_fire_time_ms % 86_400_000 == 4 * 3_600_000);

    let dup = jobs
        .create_job(pb::CreateJobRequest {
            spec: Some(s.clone()),
        })
        .await
        .expect_err("duplicate");
    ensure!(dup.code() == Code::AlreadyExists, "{dup:?}");

    // Optimistic concurrency: the version read is the version written against.
    s.cron = "0 30 12 * * ?".into();
    let updated = jobs
        .update_job(pb::UpdateJobRequest {
            spec: Some(s.clone()),
            expected_version: 1,
        })
        .await?
        .into_inner()
        .job
        .context("job")?;
    ensure!(updated.version == 2);
    let stale = jobs
        .update_job(pb::UpdateJobRequest {
            spec: Some(s.clone()),
            expected_version: 1,
        })
        .await
        .expect_err("stale");
    ensure!(stale.code() == Code::Aborted, "{stale:?}");
    let missing = jobs
        .update_job(pb::UpdateJobRequest {
            spec: Some(every_second("ghost")),
            expected_version: 1,
        })
        .await
        .expect_err("missing");
    ensure!(missing.code() == Code::NotFound);

    // Status: the next fires, in order, a day apart.
    let status = runs
        .get_job_status(pb::GetJobStatusRequest {
            job_id: "report".into(),
            next_fires: 3,
        })
        .await?
        .into_inner();
    ensure!(status.next_fire_times_ms.len() == 3);
    ensure!(status.next_fire_times_ms[1] - status.next_fire_times_ms[0] == 86_400_000);
    ensure!(status.latest_run.is_none());

    // Manual triggers: an idempotency key triggers once.
    let first = jobs
        .trigger_job(pb::TriggerJobRequest {
            job_id: "report".into(),
            idempotency_key: "invoice-42".into(),
            payload: b"{\"n\":1}".to_vec(),
            ..Default::default()
        })
        .await?
        .into_inner();
    ensure!(first.schedule_id == "report@manual-invoice-42" && !first.duplicate);
    let again = jobs
        .trigger_job(pb::TriggerJobRequest {
            job_id: "report".into(),
            idempotency_key: "invoice-42".into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    ensure!(again.duplicate && again.schedule_id == first.schedule_id);
    let fresh = jobs
        .trigger_job(pb::TriggerJobRequest {
            job_id: "report".into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    ensure!(
        fresh.schedule_id.starts_with("report@manual-") && fresh.schedule_id != first.schedule_id
    );
    wait_for("both manual runs", Duration::from_secs(20), || {
        let mut runs = runs.clone();
        async move { Ok((all_runs(&mut runs, "report").await?.len() == 2).then_some(())) }
    })
    .await?;
    let run = server.finished(&first.schedule_id).await?;
    ensure!(run.trigger_kind == pb::TriggerKind::Manual as i32);
    // No executor is connected: the run waited `dispatch_wait` (2 s here) for one,
    // then failed.
    ensure!(
        run.state == pb::RunState::Failed as i32 && run.error_code == "no_executor",
        "{run:?}"
    );
    ensure!(run.attempt == 1);
    let status = runs
        .get_job_status(pb::GetJobStatusRequest {
            job_id: "report".into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    ensure!(status.latest_run.is_some() && status.next_fire_times_ms.len() == 5);
    let trig_missing = jobs
        .trigger_job(pb::TriggerJobRequest {
            job_id: "ghost".into(),
            ..Default::default()
        })
        .await
        .expect_err("no such job");
    ensure!(trig_missing.code() == Code::NotFound);

    // Listing filters by label and state.
    jobs.create_job(pb::CreateJobRequest {
        spec: Some(pb::JobSpec {
            paused: true,
            ..every_second("other")
        }),
    })
    .await?;
    let billing = jobs
        .list_jobs(pb::ListJobsRequest {
            label_selector: [("team".to_owned(), "billing".to_owned())].into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    ensure!(billing.jobs.len() == 1);
    let paused = jobs
        .list_jobs(pb::ListJobsRequest {
            state: pb::JobState::Paused as i32,
            ..Default::default()
        })
        .await?
        .into_inner();
    ensure!(paused.jobs.len() == 1 && paused.jobs[0].spec.as_ref().context("spec")?.id == "other");
    // And by the start of the id (the console's search box).
    let by_prefix = jobs
        .list_jobs(pb::ListJobsRequest {
            id_prefix: "oth".into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    ensure!(
        by_prefix.jobs.len() == 1 && by_prefix.jobs[0].spec.as_ref().context("spec")?.id == "other",
        "{by_prefix:?}"
    );
    let too_long = jobs
        .list_jobs(pb::ListJobsRequest {
            id_prefix: "x".repeat(129),
            ..Default::default()
        })
        .await
        .expect_err("a prefix longer than any id");
    ensure!(
        too_long.code() == Code::InvalidArgument && too_long.message().starts_with("id_prefix:"),
        "{too_long:?}"
    );

    // Pause, resume, delete.
    let p = jobs
        .pause_job(pb::PauseJobRequest {
            job_id: "report".into(),
        })
        .await?
        .into_inner()
        .job
        .context("job")?;
    ensure!(p.state == pb::JobState::Paused as i32 && p.next_fire_time_ms == 0 && p.version == 3);
    let now = redis_now(&redis).await?;
    let r = jobs
        .resume_job(pb::ResumeJobRequest {
            job_id: "report".into(),
        })
        .await?
        .into_inner()
        .job
        .context("job")?;
    ensure!(r.state == pb::JobState::Active as i32 && r.next_fire_time_ms > now && r.version == 4);
    jobs.delete_job(pb::DeleteJobRequest {
        job_id: "report".into(),
    })
    .await?;
    let gone = jobs
        .get_job(pb::GetJobRequest {
            job_id: "report".into(),
        })
        .await
        .expect_err("deleted");
    ensure!(gone.code() == Code::NotFound);
    // Its runs stay readable until retention ends.
    ensure!(all_runs(&mut runs, "report").await?.len() == 2);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_reflection_v1_and_v1alpha_list_every_service() -> Result<()> {
    use tonic_reflection::pb::{v1, v1alpha};
    let dir = tempfile::tempdir()?;
    let mut server = Sundial::start(SundialOptions::embedded(dir.path()))?;
    let channel = server.channel().await?;

    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    for service in ["", "sundial.v1.JobService", "sundial.v1.RunService"] {
        let status = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await?
            .into_inner()
            .status;
        ensure!(
            status == tonic_health::pb::health_check_response::ServingStatus::Serving as i32,
            "{service:?} not serving"
        );
    }

    let expected = [
        "grpc.health.v1.Health",
        "sundial.v1.AppService",
        "sundial.v1.ExecutorService",
        "sundial.v1.JobService",
        "sundial.v1.NodeService",
        "sundial.v1.RunService",
    ];
    let mut client = v1::server_reflection_client::ServerReflectionClient::new(channel.clone());
    let req = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let mut stream = client
        .server_reflection_info(tokio_stream::iter([req]))
        .await?
        .into_inner();
    let resp = stream.message().await?.context("no reflection answer")?;
    let Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        resp.message_response
    else {
        anyhow::bail!("unexpected reflection answer");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for e in expected {
        ensure!(
            names.iter().any(|n| n == e),
            "v1 reflection lacks {e}: {names:?}"
        );
    }

    let mut alpha = v1alpha::server_reflection_client::ServerReflectionClient::new(channel);
    let req = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::FileContainingSymbol(
                "sundial.v1.JobService".into(),
            ),
        ),
    };
    let mut stream = alpha
        .server_reflection_info(tokio_stream::iter([req]))
        .await?
        .into_inner();
    let resp = stream.message().await?.context("no v1alpha answer")?;
    ensure!(
        matches!(
            resp.message_response,
            Some(v1alpha::server_reflection_response::MessageResponse::FileDescriptorResponse(ref f)) if !f.file_descriptor_proto.is_empty()
        ),
        "v1alpha reflection cannot describe JobService"
    );

    // Graceful shutdown on SIGTERM: exits cleanly, saying so.
    let status = server.stop()?;
    ensure!(status.success(), "exit status {status}");
    ensure!(server.stderr().contains("health NOT_SERVING"));
    ensure!(server.stderr().contains("stopped"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_runs_and_later_work_answer_precisely() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let server = Sundial::start(SundialOptions::embedded(dir.path()))?;
    let channel = server.channel().await?;
    let mut runs = server.runs().await?;
    let err = runs
        .cancel_run(pb::CancelRunRequest {
            schedule_id: "a@1".into(),
            reason: String::new(),
        })
        .await
        .expect_err("no such run");
    ensure!(
        err.code() == Code::NotFound && err.message().contains("a@1"),
        "{err:?}"
    );
    let err = runs
        .cancel_run(pb::CancelRunRequest {
            schedule_id: "not a schedule id".into(),
            reason: String::new(),
        })
        .await
        .expect_err("malformed");
    ensure!(
        err.code() == Code::InvalidArgument && err.message().starts_with("schedule_id:"),
        "{err:?}"
    );
    let err = runs
        .get_run_logs(pb::GetRunLogsRequest {
            schedule_id: "a@1".into(),
            follow: true,
        })
        .await
        .expect_err("no such run");
    ensure!(err.code() == Code::NotFound, "{err:?}");
    let mut apps = pb::app_service_client::AppServiceClient::new(channel);
    let err = apps
        .get_app(pb::GetAppRequest {
            app_id: "nobody".into(),
        })
        .await
        .expect_err("no such app");
    ensure!(err.code() == Code::NotFound, "{err:?}");
    Ok(())
}

/// `ApplyJobs` on one store: creates what is new, replaces what differs, leaves equal
/// specs alone (a re-apply writes nothing), names bad items by index and field while
/// the rest apply, and refuses an empty or oversized request with nothing written.
async fn apply_jobs_on(opts: SundialOptions) -> Result<()> {
    let server = Sundial::start(opts)?;
    let mut jobs = server.jobs().await?;
    let apply = |specs: Vec<pb::JobSpec>| pb::ApplyJobsRequest {
        specs,
        dry_run: false,
    };
    let outcomes = |r: &pb::ApplyJobsResponse| -> Vec<pb::ApplyOutcome> {
        r.results.iter().map(|x| x.outcome()).collect()
    };
    let noon = |id: &str| {
        let mut s = every_second(id);
        s.cron = "0 0 12 * * ?".into();
        s
    };
    let mut paused = noon("apply-b");
    paused.paused = true;
    let mut bad = noon("apply-c");
    bad.cron = "61 * * * *".into();
    let mut unreachable = noon("apply-d");
    unreachable.callback_url = "http://169.254.169.254/latest/meta-data".into();
    let list = vec![
        noon("apply-a"),
        paused.clone(),
        bad,
        noon("apply-a"),
        unreachable,
    ];

    let first = jobs.apply_jobs(apply(list.clone())).await?.into_inner();
    use pb::ApplyOutcome::{Created, Invalid, Unchanged, Updated};
    ensure!(
        outcomes(&first) == [Created, Created, Invalid, Invalid, Invalid],
        "{first:?}"
    );
    ensure!(
        first.results[4]
            .error
            .starts_with("specs[4].callback_url: egress to 169.254.169.254 refused"),
        "{:?}",
        first.results[4].error
    );
    ensure!(
        first.results[2].error.starts_with("specs[2].cron: "),
        "{:?}",
        first.results[2].error
    );
    ensure!(
        first.results[3].error == r#"specs[3].id: "apply-a" is also specs[0]"#,
        "{:?}",
        first.results[3].error
    );
    let a = first.results[0].job.clone().context("a's job")?;
    ensure!(a.version == 1 && a.next_fire_time_ms > 0, "{a:?}");
    let b = first.results[1].job.clone().context("b's job")?;
    ensure!(b.state() == pb::JobState::Paused, "{b:?}");
    let missing = jobs
        .get_job(pb::GetJobRequest {
            job_id: "apply-c".into(),
        })
        .await
        .expect_err("the invalid item was not written");
    ensure!(missing.code() == Code::NotFound, "{missing:?}");

    // The same list again: nothing changes.
    let again = jobs.apply_jobs(apply(list)).await?.into_inner();
    ensure!(
        outcomes(&again) == [Unchanged, Unchanged, Invalid, Invalid, Invalid],
        "{again:?}"
    );
    ensure!(
        again.results[..2]
            .iter()
            .all(|r| r.job.as_ref().is_some_and(|j| j.version == 1)),
        "{again:?}"
    );

    // A changed spec is updated; `paused` of an existing job is left to Pause/Resume.
    let mut renamed = noon("apply-a");
    renamed.name = "renamed".into();
    let mut unpaused = paused;
    unpaused.paused = false;

    // A dry run says what applying would do and writes nothing.
    let mut bad_zone = noon("apply-z");
    bad_zone.time_zone = "Mars/Olympus".into();
    let dry = jobs
        .apply_jobs(pb::ApplyJobsRequest {
            specs: vec![
                renamed.clone(),
                unpaused.clone(),
                noon("apply-new"),
                bad_zone,
            ],
            dry_run: true,
        })
        .await?
        .into_inner();
    ensure!(
        outcomes(&dry) == [Updated, Unchanged, Created, Invalid],
        "{dry:?}"
    );
    let would = dry.results[0].job.clone().context("a as it would be")?;
    ensure!(
        would.version == 2 && would.spec.as_ref().context("spec")?.name == "renamed",
        "{would:?}"
    );
    ensure!(
        dry.results[3].error.starts_with("specs[3].time_zone: "),
        "{:?}",
        dry.results[3].error
    );
    let a_now = jobs
        .get_job(pb::GetJobRequest {
            job_id: "apply-a".into(),
        })
        .await?
        .into_inner()
        .job
        .context("a")?;
    ensure!(a_now.version == 1, "a dry run wrote a: {a_now:?}");
    let new = jobs
        .get_job(pb::GetJobRequest {
            job_id: "apply-new".into(),
        })
        .await
        .expect_err("a dry run created nothing");
    ensure!(new.code() == Code::NotFound, "{new:?}");

    let third = jobs
        .apply_jobs(apply(vec![renamed, unpaused]))
        .await?
        .into_inner();
    ensure!(outcomes(&third) == [Updated, Unchanged], "{third:?}");
    let a = third.results[0].job.clone().context("a")?;
    ensure!(a.version == 2 && a.spec.context("spec")?.name == "renamed");
    let b = third.results[1].job.clone().context("b")?;
    ensure!(b.state() == pb::JobState::Paused, "{b:?}");

    // Request-level refusals write nothing.
    let err = jobs.apply_jobs(apply(Vec::new())).await.expect_err("empty");
    ensure!(
        err.code() == Code::InvalidArgument && err.message().starts_with("specs: "),
        "{err:?}"
    );
    let too_many: Vec<pb::JobSpec> = (0..1001).map(|i| noon(&format!("bulk-{i}"))).collect();
    let err = jobs
        .apply_jobs(apply(too_many.clone()))
        .await
        .expect_err("1001 specs");
    ensure!(
        err.code() == Code::InvalidArgument && err.message().contains("at most 1000"),
        "{err:?}"
    );
    ensure!(
        jobs.get_job(pb::GetJobRequest {
            job_id: "bulk-0".into()
        })
        .await
        .is_err(),
        "nothing of an oversized request is written"
    );

    // A full batch of 1000, across every partition.
    let full = jobs
        .apply_jobs(apply(too_many[..1000].to_vec()))
        .await?
        .into_inner();
    ensure!(
        full.results.len() == 1000 && outcomes(&full).iter().all(|o| *o == Created),
        "{:?}",
        outcomes(&full).iter().filter(|o| **o != Created).count()
    );
    let bulk = all_jobs(&mut jobs)
        .await?
        .iter()
        .filter(|j| j.spec.as_ref().is_some_and(|s| s.id.starts_with("bulk-")))
        .count();
    ensure!(bulk == 1000, "listed {bulk} bulk jobs");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_jobs_creates_updates_leaves_alone_and_names_bad_items() -> Result<()> {
    let redis = RedisServer::start()?;
    apply_jobs_on(SundialOptions::redis(&redis)).await?;
    let dir = tempfile::tempdir()?;
    apply_jobs_on(SundialOptions::embedded(dir.path())).await
}

/// Payloads may be 64 KiB each, and a page of a thousand jobs would pass gRPC's 4 MiB
/// answer limit (the client refuses it): ListJobs stops before its items pass 3 MiB and
/// its page token continues after the last job it gave (on Redis, inside a partition),
/// so every job is listed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_jobs_are_listed_in_pages_that_fit() -> Result<()> {
    let redis = RedisServer::start()?;
    let server = Sundial::start(SundialOptions::redis(&redis))?;
    let mut jobs = server.jobs().await?;
    let mut ids = std::collections::BTreeSet::new();
    for i in 0..80 {
        let mut spec = manual_job(&format!("big-{i:02}"), "work");
        spec.payload = vec![b'p'; 60_000];
        jobs.create_job(pb::CreateJobRequest { spec: Some(spec) })
            .await?;
        ids.insert(format!("big-{i:02}"));
    }
    let mut pages = Vec::new();
    let mut listed = Vec::new();
    let mut token = String::new();
    for _ in 0..10 {
        let page = jobs
            .list_jobs(pb::ListJobsRequest {
                page_size: 1000,
                page_token: token.clone(),
                ..Default::default()
            })
            .await?
            .into_inner();
        pages.push(page.jobs.len());
        listed.extend(page.jobs.into_iter().filter_map(|j| Some(j.spec?.id)));
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    ensure!(
        pages.len() == 2 && pages[0] > 40,
        "page sizes {pages:?}: one page past 3 MiB, and no tiny pages"
    );
    ensure!(listed.len() == 80, "{} listed: {listed:?}", listed.len());
    ensure!(
        listed
            .into_iter()
            .collect::<std::collections::BTreeSet<_>>()
            == ids
    );
    Ok(())
}

/// `PreviewFireTimes` answers a schedule that is not saved from the server's own cron
/// code: across the spring-forward change in Europe/Berlin, inside a window, and the same times `GetJobStatus` gives once a job with that schedule is
/// saved; bad input is refused naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fire_times_of_an_unsaved_schedule() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let server = Sundial::start(SundialOptions::embedded(dir.path()))?;
    let mut jobs = server.jobs().await?;
    let preview = |cron: &str, after_ms: i64, count: i32| pb::PreviewFireTimesRequest {
        cron: cron.into(),
        time_zone: "Europe/Berlin".into(),
        after_ms,
        count,
        ..Default::default()
    };
    // 2030-03-30T00:00:00Z: Berlin springs forward on 2030-03-31 at 02:00 local, so
    // 02:30 does not exist that day: a fixed-time line fires once at 03:00 CEST, the
    // first real instant after the gap (the DST rule of `schedule::cron`).
    let before_spring = 1_901_059_200_000;
    let fires = jobs
        .preview_fire_times(preview("0 30 2 * * ?", before_spring, 3))
        .await?
        .into_inner()
        .fire_times_ms;
    let day = 86_400_000;
    // 2030-03-30 02:30 CET = 01:30Z, 2030-03-31 03:00 CEST = 01:00Z, then
    // 2030-04-01 02:30 CEST = 00:30Z.
    let first = before_spring + 90 * 60_000;
    ensure!(
        fires == [first, first + day - 1_800_000, first + 2 * day - 3_600_000],
        "{fires:?}"
    );
    // The window: nothing before the start or after the end.
    let windowed = jobs
        .preview_fire_times(pb::PreviewFireTimesRequest {
            start_time_ms: first + day,
            end_time_ms: first + 2 * day,
            ..preview("0 30 2 * * ?", before_spring, 10)
        })
        .await?
        .into_inner()
        .fire_times_ms;
    ensure!(windowed == [first + 2 * day - 3_600_000], "{windowed:?}");

    // The same schedule saved: GetJobStatus gives the times the preview gives.
    let mut spec = every_second("berlin");
    spec.cron = "0 30 2 * * ?".into();
    spec.time_zone = "Europe/Berlin".into();
    jobs.create_job(pb::CreateJobRequest { spec: Some(spec) })
        .await?;
    let status = server
        .runs()
        .await?
        .get_job_status(pb::GetJobStatusRequest {
            job_id: "berlin".into(),
            next_fires: 20,
        })
        .await?
        .into_inner()
        .next_fire_times_ms;
    let from_now = jobs
        .preview_fire_times(preview("0 30 2 * * ?", 0, 20))
        .await?
        .into_inner()
        .fire_times_ms;
    ensure!(
        status == from_now,
        "status {status:?} vs preview {from_now:?}"
    );

    for (req, field) in [
        (preview("", 0, 5), "cron: required"),
        (preview("61 * * * *", 0, 5), "cron: "),
        (
            pb::PreviewFireTimesRequest {
                time_zone: "Mars/Olympus".into(),
                ..preview("* * * * *", 0, 5)
            },
            "time_zone: ",
        ),
        (
            preview("* * * * *", 0, 101),
            "count: 101 is not between 0 and 100",
        ),
        (preview("* * * * *", -1, 5), "after_ms: "),
        (
            pb::PreviewFireTimesRequest {
                start_time_ms: 2_000,
                end_time_ms: 1_000,
                ..preview("* * * * *", 0, 5)
            },
            "end_time_ms: must be after start_time_ms",
        ),
    ] {
        let err = jobs
            .preview_fire_times(req.clone())
            .await
            .expect_err("refused");
        ensure!(
            err.code() == Code::InvalidArgument && err.message().starts_with(field),
            "{req:?}: {err:?}"
        );
    }
    Ok(())
}
