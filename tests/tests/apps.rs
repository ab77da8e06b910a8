//! `AppService` over real gRPC: apps are created with a generated or given secret,
//! rotated with an overlap, and their secrets are returned once and never again —
//! not by `GetApp`, not in the server's log. Bad input names the field and changes
//! nothing.

use anyhow::{Context, Result, ensure};
use sundial_proto::v1 as pb;
use sundial_proto::v1::app_service_client::AppServiceClient;
use sundial_sdk::webhook::Secret;
use sundial_tests::{Sundial, SundialOptions};
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apps_keep_their_secrets_write_only() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let server = Sundial::start(SundialOptions::embedded(dir.path()).env("RUST_LOG", "debug"))?;
    let mut apps = AppServiceClient::new(server.channel().await?);

    // Generated secret: returned once, in the whsec_ form.
    let created = apps
        .create_app(pb::CreateAppRequest {
            app_id: "billing".into(),
            name: "Billing".into(),
            secret: String::new(),
        })
        .await?
        .into_inner();
    let first = created.secret.clone();
    first.parse::<Secret>().context("a whsec_ secret")?;
    let app = created.app.context("app")?;
    ensure!(
        app.app_id == "billing" && app.active_secrets == 1 && app.created_at_ms > 0,
        "{app:?}"
    );

    // A given secret is kept as given.
    let given = Secret::generate().to_string();
    let other = apps
        .create_app(pb::CreateAppRequest {
            app_id: "crm".into(),
            name: String::new(),
            secret: given.clone(),
        })
        .await?
        .into_inner();
    ensure!(other.secret == given, "the given secret came back changed");

    // Bad input: named, not echoed, nothing stored.
    let bad_secret = "whsec_this-is-not-base64!!";
    for (req, field) in [
        (
            pb::CreateAppRequest {
                app_id: "bad id".into(),
                ..Default::default()
            },
            "app_id",
        ),
        (
            pb::CreateAppRequest {
                app_id: "x".repeat(129),
                ..Default::default()
            },
            "app_id",
        ),
        (
            pb::CreateAppRequest {
                app_id: "oops".into(),
                secret: bad_secret.into(),
                ..Default::default()
            },
            "secret",
        ),
        (
            pb::CreateAppRequest {
                app_id: "oops".into(),
                name: "n".repeat(257),
                ..Default::default()
            },
            "name",
        ),
    ] {
        let e = apps.create_app(req).await.expect_err("bad input");
        ensure!(
            e.code() == Code::InvalidArgument && e.message().starts_with(field),
            "{field}: {e:?}"
        );
        ensure!(!e.message().contains(bad_secret), "echoed: {e:?}");
    }
    let gone = apps
        .get_app(pb::GetAppRequest {
            app_id: "oops".into(),
        })
        .await
        .expect_err("not stored");
    ensure!(gone.code() == Code::NotFound, "{gone:?}");
    let dup = apps
        .create_app(pb::CreateAppRequest {
            app_id: "billing".into(),
            ..Default::default()
        })
        .await
        .expect_err("duplicate");
    ensure!(dup.code() == Code::AlreadyExists, "{dup:?}");

    // Rotation: a new secret, both sign during the overlap.
    let rotated = apps
        .rotate_app_secret(pb::RotateAppSecretRequest {
            app_id: "billing".into(),
            overlap_ms: 60_000,
            new_secret: String::new(),
        })
        .await?
        .into_inner();
    ensure!(rotated.secret != first && rotated.secret.starts_with("whsec_"));
    ensure!(
        rotated.app.as_ref().map(|a| a.active_secrets) == Some(2),
        "{rotated:?}"
    );
    let got = apps
        .get_app(pb::GetAppRequest {
            app_id: "billing".into(),
        })
        .await?
        .into_inner()
        .app
        .context("app")?;
    ensure!(got.active_secrets == 2, "{got:?}");
    for (req, code, field) in [
        (
            pb::RotateAppSecretRequest {
                app_id: "billing".into(),
                overlap_ms: -1,
                ..Default::default()
            },
            Code::InvalidArgument,
            "overlap_ms",
        ),
        (
            pb::RotateAppSecretRequest {
                app_id: "billing".into(),
                new_secret: bad_secret.into(),
                ..Default::default()
            },
            Code::InvalidArgument,
            "new_secret",
        ),
        (
            pb::RotateAppSecretRequest {
                app_id: "nobody".into(),
                ..Default::default()
            },
            Code::NotFound,
            "app",
        ),
    ] {
        let e = apps.rotate_app_secret(req).await.expect_err("refused");
        ensure!(
            e.code() == code && e.message().starts_with(field),
            "{field}: {e:?}"
        );
    }
    let still = apps
        .get_app(pb::GetAppRequest {
            app_id: "billing".into(),
        })
        .await?
        .into_inner()
        .app
        .context("app")?;
    ensure!(
        still.active_secrets == 2,
        "a refused rotation changed the app"
    );

    // No secret in the server's log, even at debug.
    let log = server.stderr();
    for s in [&first, &given, &rotated.secret] {
        let key = s.trim_start_matches("whsec_");
        ensure!(!log.contains(key), "a secret appears in the server log");
    }
    ensure!(
        log.contains("app secret rotated"),
        "the log is not captured"
    );
    Ok(())
}

/// With authentication on, an app created through `AppService` signs requests with its
/// secret (both secrets while a rotation overlaps); an unknown app, a wrong key or a
/// replayed nonce is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apps_created_by_the_api_sign_requests() -> Result<()> {
    use sundial_sdk::app_auth::signature as sign;
    use sundial_server::auth::unix_now;
    let dir = tempfile::tempdir()?;
    let server = Sundial::start(
        SundialOptions::embedded(dir.path()).env("SUNDIAL_BEARER_TOKENS", "admin-token-1"),
    )?;
    let channel = server.channel().await?;
    let mut apps = AppServiceClient::with_interceptor(channel, |mut req: tonic::Request<()>| {
        req.metadata_mut().insert(
            "authorization",
            "Bearer admin-token-1".parse().expect("ascii"),
        );
        Ok(req)
    });
    let first: Secret = apps
        .create_app(pb::CreateAppRequest {
            app_id: "ops".into(),
            ..Default::default()
        })
        .await?
        .into_inner()
        .secret
        .parse()?;
    let base = server.http.context("no http address")?;
    let client = reqwest::Client::new();
    let get = |app: &'static str, key: Vec<u8>, nonce: &'static str| {
        let client = client.clone();
        async move {
            let path = "/api/v1/tasks/nothing";
            let ts = unix_now().to_string();
            let signature = sign(&key, "GET", path, &ts, nonce, b"");
            client
                .get(format!("http://{base}{path}"))
                .header("x-sundial-app-id", app)
                .header("x-sundial-timestamp", ts)
                .header("x-sundial-nonce", nonce)
                .header("x-sundial-signature", signature)
                .send()
                .await
                .map(|r| r.status().as_u16())
        }
    };
    // Admitted: 404 is the API's answer about the (missing) job, past authentication.
    ensure!(get("ops", first.as_bytes().to_vec(), "n-1").await? == 404);
    ensure!(
        get("ops", first.as_bytes().to_vec(), "n-1").await? == 401,
        "replay"
    );
    ensure!(get("ops", Secret::generate().as_bytes().to_vec(), "n-2").await? == 401);
    ensure!(get("nobody", first.as_bytes().to_vec(), "n-3").await? == 401);
    let second: Secret = apps
        .rotate_app_secret(pb::RotateAppSecretRequest {
            app_id: "ops".into(),
            overlap_ms: 60_000,
            new_secret: String::new(),
        })
        .await?
        .into_inner()
        .secret
        .parse()?;
    ensure!(get("ops", second.as_bytes().to_vec(), "n-4").await? == 404);
    ensure!(
        get("ops", first.as_bytes().to_vec(), "n-5").await? == 404,
        "overlap"
    );
    Ok(())
}
