//! The web console as a browser meets it over HTTP: its files at `/` (open, with a
//! policy that allows this origin only), `GET /api/v1/whoami` telling an admin from a
//! read-only token and dev mode, `--console false`, and the job search by id prefix it
//! uses.

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use sundial_tests::rest::header;
use sundial_tests::{Sundial, SundialOptions, every_second};

const ADMIN: &str = "console-admin-token-0042";
const READER: &str = "console-reader-token-0042";

fn http_base(server: &Sundial) -> Result<String> {
    server.http_url().context("no http address")
}

async fn get(url: &str, token: Option<&str>) -> Result<reqwest::Response> {
    let mut req = reqwest::Client::new().get(url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    Ok(req.send().await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_is_served_at_the_root_and_can_be_turned_off() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let server = Sundial::start(SundialOptions::embedded(dir.path()))?;
    let base = http_base(&server)?;

    let page = get(&format!("{base}/"), None).await?;
    ensure!(page.status() == 200, "GET /: {}", page.status());
    ensure!(header(&page, "content-type").is_some_and(|t| t.starts_with("text/html")));
    let csp = header(&page, "content-security-policy").context("no CSP on the page")?;
    ensure!(
        csp.contains("default-src 'none'") && csp.contains("script-src 'self'"),
        "{csp}"
    );
    let html = page.text().await?;
    ensure!(html.contains("\"/console/app.js\""), "{html}");
    for (path, kind) in [
        ("/console/app.js", "text/javascript"),
        ("/console/app.css", "text/css"),
        ("/console/favicon.svg", "image/svg+xml"),
    ] {
        let resp = get(&format!("{base}{path}"), None).await?;
        ensure!(resp.status() == 200, "{path}: {}", resp.status());
        ensure!(
            header(&resp, "content-type").is_some_and(|t| t.starts_with(kind)),
            "{path}"
        );
    }

    // Dev mode: anyone may write, and the console says so.
    let me: Value = get(&format!("{base}/api/v1/whoami"), None)
        .await?
        .json()
        .await?;
    ensure!(
        me["caller"] == "open" && me["mayWrite"] == true && me["devMode"] == true,
        "{me}"
    );

    // Off: `/` is a missing route like any other; the API it calls stays.
    let dir2 = tempfile::tempdir()?;
    let off = Sundial::start(SundialOptions::embedded(dir2.path()).arg("console", "false"))?;
    let off_base = http_base(&off)?;
    let resp = get(&format!("{off_base}/"), None).await?;
    ensure!(
        resp.status() == 404,
        "GET / with the console off: {}",
        resp.status()
    );
    let err: Value = resp.json().await?;
    ensure!(err["error"]["code"] == "NOT_FOUND", "{err}");
    ensure!(
        get(&format!("{off_base}/console/app.js"), None)
            .await?
            .status()
            == 404
    );
    ensure!(
        get(&format!("{off_base}/api/v1/whoami"), None)
            .await?
            .status()
            == 200
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whoami_tells_an_admin_from_a_reader() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let server = Sundial::start(
        SundialOptions::embedded(dir.path())
            .arg("bearer-token", &format!("ops={ADMIN}"))
            .arg("read-token", &format!("viewer={READER}")),
    )?;
    let base = http_base(&server)?;
    // The files are open (they hold no data); the data is not.
    ensure!(get(&format!("{base}/"), None).await?.status() == 200);
    let url = format!("{base}/api/v1/whoami");
    let none = get(&url, None).await?;
    ensure!(none.status() == 401, "no token: {}", none.status());
    ensure!(get(&url, Some("wrong")).await?.status() == 401);

    let admin: Value = get(&url, Some(ADMIN)).await?.json().await?;
    ensure!(
        admin["caller"] == "admin" && admin["name"] == "ops" && admin["mayWrite"] == true,
        "{admin}"
    );
    ensure!(admin["devMode"] == false, "{admin}");
    let reader: Value = get(&url, Some(READER)).await?.json().await?;
    ensure!(
        reader["caller"] == "reader" && reader["name"] == "viewer" && reader["mayWrite"] == false,
        "{reader}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_are_searched_by_the_start_of_their_id() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let server = Sundial::start(SundialOptions::embedded(dir.path()))?;
    let base = http_base(&server)?;
    for id in ["billing-daily", "billing-hourly", "payroll", "bill"] {
        server.create_job(every_second(id)).await?;
    }
    let ids = |v: &Value| -> Vec<String> {
        let mut ids: Vec<String> = v["jobs"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|j| j["spec"]["id"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        ids.sort();
        ids
    };
    let found: Value = get(&format!("{base}/api/v1/jobs?idPrefix=billing-"), None)
        .await?
        .json()
        .await?;
    ensure!(
        ids(&found) == ["billing-daily", "billing-hourly"],
        "{found}"
    );
    let found: Value = get(&format!("{base}/api/v1/jobs?id_prefix=bill"), None)
        .await?
        .json()
        .await?;
    ensure!(
        ids(&found) == ["bill", "billing-daily", "billing-hourly"],
        "{found}"
    );
    let none: Value = get(&format!("{base}/api/v1/jobs?idPrefix=zzz"), None)
        .await?
        .json()
        .await?;
    ensure!(ids(&none).is_empty(), "{none}");

    let long = "x".repeat(129);
    let resp = get(&format!("{base}/api/v1/jobs?idPrefix={long}"), None).await?;
    ensure!(resp.status() == 400, "{}", resp.status());
    let err: Value = resp.json().await?;
    ensure!(
        err["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("id_prefix:")),
        "{err}"
    );
    Ok(())
}
