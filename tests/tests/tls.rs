//! TLS by flags: with `--tls-cert` and `--tls-key`, gRPC and REST answer over TLS and
//! only over TLS; an SDK executor dials `https://` trusting a private CA and runs a
//! job; with `--tls-client-ca`, gRPC callers need a client certificate. The
//! certificates come from a throwaway CA made with rcgen for `localhost`/127.0.0.1.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use sundial_proto::v1 as pb;
use sundial_server::config::{Config, Settings};
use sundial_server::testing::TestPki;
use sundial_tests::cli::Cli;
use sundial_tests::{
    JobServiceClient, RedisServer, Sundial, SundialOptions, TestExecutor, unique_prefix, wait_for,
};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

const EXECUTOR: &str = env!("CARGO_BIN_EXE_test_executor");

/// A server on the embedded store in `data`, serving TLS with `pki`'s certificate.
fn tls_server(pki: &TestPki, data: &Path) -> SundialOptions {
    SundialOptions::embedded(data)
        .arg("tls-cert", &pki.arg("server.pem"))
        .arg("tls-key", &pki.arg("server.key"))
        .tls(pki.ca_pem.as_bytes())
}

/// The job `id`: the test executor's echo handler, run only when triggered.
fn echo_job(id: &str) -> pb::JobSpec {
    pb::JobSpec {
        id: id.into(),
        cron: sundial_tests::MANUAL_ONLY.into(),
        target: Some(pb::job_spec::Target::Executor(pb::ExecutorTarget {
            group: "g".into(),
            handler: "echo".into(),
        })),
        ..Default::default()
    }
}

/// Triggers `job_id` with `payload` and waits for its run to succeed.
async fn trigger_and_wait(server: &Sundial, job_id: &str, payload: &[u8]) -> Result<pb::Run> {
    let sid = server
        .jobs()
        .await?
        .trigger_job(pb::TriggerJobRequest {
            job_id: job_id.into(),
            payload: payload.to_vec(),
            ..Default::default()
        })
        .await?
        .into_inner()
        .schedule_id;
    wait_for(
        &format!("{sid} to succeed"),
        Duration::from_secs(20),
        || async {
            let run = server.run(&sid).await?;
            ensure!(
                run.state != pb::RunState::Failed as i32,
                "run failed: {run:?}"
            );
            Ok(Some(run).filter(|r| r.state == pb::RunState::Succeeded as i32))
        },
    )
    .await
}

/// The store over mutual TLS (`--redis-url rediss://…` to a Redis that asks clients
/// for a certificate): with `--redis-tls-ca` naming the CA that signed Redis's
/// certificate and `--redis-tls-cert`/`--redis-tls-key` a client certificate it signed,
/// a job runs. Trusting the system's authorities only, or presenting no certificate,
/// the server does not start, and says it was the certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_over_mutual_tls_trusts_the_ca_and_presents_the_certificate_it_is_given()
-> Result<()> {
    let pki = TestPki::new()?;
    let redis = RedisServer::start_mutual_tls(&pki)?;
    let url = redis.tls_url().context("no TLS port")?;
    let prefix = unique_prefix("redis-tls");
    let untrusted = Sundial::start(SundialOptions::redis_url(&url, &prefix))
        .err()
        .context("started against a Redis signed by an authority it does not trust")?;
    ensure!(
        format!("{untrusted:#}").contains("certificate"),
        "the refusal names no certificate: {untrusted:#}"
    );
    let trusting =
        || SundialOptions::redis_url(&url, &prefix).arg("redis-tls-ca", &pki.arg("ca.pem"));
    let uncertified = Sundial::start(trusting())
        .err()
        .context("started without the client certificate Redis asks for")?;
    ensure!(
        format!("{uncertified:#}").contains("CertificateRequired"),
        "the refusal names no certificate: {uncertified:#}"
    );

    let mut server = Sundial::start(
        trusting()
            .arg("redis-tls-cert", &pki.arg("client.pem"))
            .arg("redis-tls-key", &pki.arg("client.key")),
    )?;
    server
        .jobs()
        .await?
        .create_job(pb::CreateJobRequest {
            spec: Some(echo_job("redis-tls-echo")),
        })
        .await?;
    let dir = tempfile::tempdir()?;
    let executor = TestExecutor::start(
        EXECUTOR,
        &[server.grpc_url()],
        "redis-tls-node",
        &dir.path().join("exec.log"),
    )?;
    let run = trigger_and_wait(&server, "redis-tls-echo", b"store over tls").await?;
    ensure!(run.node_id == executor.node_id, "ran on {}", run.node_id);
    let status = server.stop()?;
    ensure!(status.success(), "exit status {status}");
    Ok(())
}

async fn get_job(channel: Channel, id: &str) -> Result<pb::Job> {
    JobServiceClient::new(channel)
        .get_job(pb::GetJobRequest { job_id: id.into() })
        .await?
        .into_inner()
        .job
        .context("GetJob answered without a job")
}

/// A channel to `url` trusting only `ca` (and presenting `identity`, if any).
async fn tls_channel(url: String, ca: &str, identity: Option<Identity>) -> Result<Channel> {
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
    if let Some(identity) = identity {
        tls = tls.identity(identity);
    }
    Ok(Channel::from_shared(url)?
        .connect_timeout(Duration::from_secs(5))
        .tls_config(tls)?
        .connect()
        .await?)
}

/// A plaintext gRPC call to `addr`: fails, at connect or at the call.
async fn plaintext_get_job(addr: std::net::SocketAddr, id: &str) -> Result<pb::Job> {
    let channel = Channel::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5))
        .connect()
        .await?;
    get_job(channel, id).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_rest_and_an_executor_speak_tls_and_only_tls() -> Result<()> {
    let pki = TestPki::new()?;
    let data = tempfile::tempdir()?;
    let mut server = Sundial::start(tls_server(&pki, data.path()))?;
    ensure!(server.grpc_url().starts_with("https://"));

    // gRPC over TLS (the harness's channel trusts the test CA).
    server
        .jobs()
        .await?
        .create_job(pb::CreateJobRequest {
            spec: Some(echo_job("tls-echo")),
        })
        .await?;
    let job = get_job(server.channel().await?, "tls-echo").await?;
    ensure!(job.spec.map(|s| s.id).as_deref() == Some("tls-echo"));

    // Plaintext gRPC to the same port is refused.
    let plain = plaintext_get_job(server.grpc, "tls-echo").await;
    ensure!(plain.is_err(), "plaintext gRPC answered: {plain:?}");

    // The CLI over TLS: it trusts the CA of --ca-file; without it the server's
    // certificate is unknown and the server cannot be reached (exit 5).
    let cli = Cli::new(&server.grpc_url());
    let ca = pki.arg("ca.pem");
    let got = cli
        .run(&["job", "get", "tls-echo", "--ca-file", &ca])
        .await?;
    ensure!(got.code == 0 && got.stdout.contains("tls-echo"), "{got:?}");
    let untrusted = cli.run(&["job", "get", "tls-echo"]).await?;
    ensure!(untrusted.code == 5, "{untrusted:?}");

    // REST over https answers; plain http does not, nor https without trusting the CA.
    let base = server.http_url().context("no http address")?;
    ensure!(base.starts_with("https://"), "{base}");
    let https = reqwest::Client::builder()
        .use_rustls_tls()
        .add_root_certificate(reqwest::Certificate::from_pem(pki.ca_pem.as_bytes())?)
        .build()?;
    let health = https.get(format!("{base}/healthz")).send().await?;
    ensure!(health.status() == 200, "healthz: {}", health.status());
    ensure!(health.text().await? == "ok");
    let http_addr = server.http.context("no http address")?;
    let plain = reqwest::Client::new()
        .get(format!("http://{http_addr}/healthz"))
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    ensure!(plain.is_err(), "plain http answered: {plain:?}");
    let untrusted = reqwest::Client::builder()
        .use_rustls_tls()
        .build()?
        .get(format!("{base}/healthz"))
        .send()
        .await;
    ensure!(
        untrusted.is_err(),
        "https without the CA answered: {untrusted:?}"
    );

    // An SDK executor dials https:// with the private CA and runs a job.
    let journal = data.path().join("exec.log");
    let executor = TestExecutor::start_with(
        EXECUTOR,
        &[server.grpc_url()],
        "tls-node",
        &journal,
        &["--tls-ca", &pki.arg("ca.pem")],
    )?;
    let run = trigger_and_wait(&server, "tls-echo", b"over tls").await?;
    ensure!(run.node_id == executor.node_id, "ran on {}", run.node_id);
    ensure!(run.output == b"over tls", "output {:?}", run.output);

    // Both TLS listeners shut down gracefully.
    let status = server.stop()?;
    ensure!(status.success(), "exit status {status}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_ca_makes_grpc_callers_present_a_certificate() -> Result<()> {
    let pki = TestPki::new()?;
    let data = tempfile::tempdir()?;
    let server =
        Sundial::start(tls_server(&pki, data.path()).arg("tls-client-ca", &pki.arg("ca.pem")))?;

    let anonymous = async {
        let channel = tls_channel(server.grpc_url(), &pki.ca_pem, None).await?;
        get_job(channel, "none").await
    }
    .await;
    ensure!(
        anonymous.is_err(),
        "a caller without a certificate answered: {anonymous:?}"
    );

    let identity = Identity::from_pem(&pki.client_cert_pem, &pki.client_key_pem);
    let channel = tls_channel(server.grpc_url(), &pki.ca_pem, Some(identity)).await?;
    let missing = get_job(channel, "none").await.expect_err("no such job");
    let status = missing
        .downcast_ref::<tonic::Status>()
        .context("not a gRPC status")?;
    ensure!(
        status.code() == tonic::Code::NotFound,
        "with a client certificate the call reaches the API: {status:?}"
    );

    // REST asks for no client certificate (health probes and scrapers).
    let https = reqwest::Client::builder()
        .use_rustls_tls()
        .add_root_certificate(reqwest::Certificate::from_pem(pki.ca_pem.as_bytes())?)
        .build()?;
    let base = server.http_url().context("no http address")?;
    let health = https.get(format!("{base}/healthz")).send().await?;
    ensure!(health.status() == 200, "healthz: {}", health.status());
    Ok(())
}

#[test]
fn tls_files_are_checked_with_the_configuration() -> Result<()> {
    let pki = TestPki::new()?;
    let settings = |cert: Option<&str>, key: Option<&str>| Settings {
        tls_cert: cert.map(|c| pki.path(c)),
        tls_key: key.map(|k| pki.path(k)),
        ..Settings::default()
    };
    let err = |s: Settings| Config::from_settings(s).expect_err("invalid").to_string();

    let e = err(settings(Some("server.pem"), None));
    ensure!(e.starts_with("tls_key:"), "{e}");
    let e = err(settings(None, Some("server.key")));
    ensure!(e.starts_with("tls_cert:"), "{e}");

    // A key that is not the certificate's: named, and never shown.
    let e = err(settings(Some("server.pem"), Some("other.key")));
    ensure!(e.starts_with("tls_key:"), "{e}");
    ensure!(e.contains("other.key"), "names the file: {e}");
    let key = std::fs::read_to_string(pki.path("other.key"))?;
    let body = key.lines().nth(1).context("key body")?;
    ensure!(!e.contains(body), "key material shown: {e}");

    // The key where the certificate should be.
    let e = err(settings(Some("server.key"), Some("server.key")));
    ensure!(
        e.starts_with("tls_cert:") && e.contains("server.key"),
        "{e}"
    );

    let config = Config::from_settings(settings(Some("server.pem"), Some("server.key")))?;
    let shown = format!("{config:?}");
    let key = std::fs::read_to_string(pki.path("server.key"))?;
    let body = key.lines().nth(1).context("key body")?;
    ensure!(config.tls.is_some());
    ensure!(!shown.contains(body), "the config's Debug shows the key");
    Ok(())
}
