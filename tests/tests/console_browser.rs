//! The web console in a real browser: Debian's Chromium driven through chromedriver
//! (WebDriver, the `thirtyfour` crate) against a live server with a real executor. An
//! operator signs in, creates a job (its fire times previewed before saving), sees its
//! runs succeed, reads a run's log, pauses the job and sees no further runs, resumes
//! it and runs it now, drains and undrains the executor; a read-only token is shown no button that
//! writes. Then, at 10,000 jobs, each page's load time is printed (not asserted). A
//! screenshot of each page is saved under `target/console-screenshots/`.
//!
//! `scripts/test` installs `chromium` and `chromium-driver`; `SUNDIAL_TEST_CHROMIUM`
//! and `SUNDIAL_TEST_CHROMEDRIVER` name other binaries.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};
use sundial_tests::{Sundial, SundialOptions, TestExecutor, free_port, wait_for, workspace_root};
use thirtyfour::prelude::*;

const ADMIN: &str = "console-browser-admin-0042";
const READER: &str = "console-browser-reader-0042";
const WAIT: Duration = Duration::from_secs(20);

/// chromedriver on a free port and one headless Chromium session through it; both end
/// with this value.
struct Browser {
    driver: Option<WebDriver>,
    chromedriver: Child,
    _profile: tempfile::TempDir,
    shots: PathBuf,
}

impl Browser {
    async fn start() -> Result<Self> {
        let chromium =
            std::env::var("SUNDIAL_TEST_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
        let driver_bin = std::env::var("SUNDIAL_TEST_CHROMEDRIVER")
            .unwrap_or_else(|_| "/usr/bin/chromedriver".into());
        ensure!(
            Path::new(&chromium).exists() && Path::new(&driver_bin).exists(),
            "{chromium} or {driver_bin} is missing: scripts/test installs Debian's chromium and chromium-driver"
        );
        let port = free_port()?;
        let chromedriver = Command::new(&driver_bin)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {driver_bin}"))?;
        let url = format!("http://127.0.0.1:{port}");
        let status = format!("{url}/status");
        wait_for("chromedriver to answer", WAIT, || {
            let status = status.clone();
            async move {
                Ok(reqwest::get(&status)
                    .await
                    .ok()
                    .filter(|r| r.status() == 200)
                    .map(|_| ()))
            }
        })
        .await?;
        let profile = tempfile::tempdir()?;
        let mut caps = DesiredCapabilities::chrome();
        caps.set_binary(&chromium)?;
        for arg in [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1400,1000",
        ] {
            caps.add_arg(arg)?;
        }
        caps.add_arg(&format!("--user-data-dir={}", profile.path().display()))?;
        let driver = WebDriver::new(url, caps)
            .await
            .context("a Chromium session")?;
        let shots = workspace_root().join("target/console-screenshots");
        std::fs::create_dir_all(&shots)?;
        Ok(Self {
            driver: Some(driver),
            chromedriver,
            _profile: profile,
            shots,
        })
    }

    fn d(&self) -> &WebDriver {
        self.driver.as_ref().expect("the session lives until quit")
    }

    /// Opens `url` and waits for the console to have rendered `page` (the route path
    /// it writes on `<body>` once its data is shown); returns the milliseconds from
    /// the navigation's start.
    async fn open(&self, url: &str, page: &str) -> Result<u64> {
        self.d().goto(url).await?;
        self.rendered(page).await
    }

    /// Waits until the console shows `page`, after a navigation or a click.
    async fn rendered(&self, page: &str) -> Result<u64> {
        let d = self.d().clone();
        wait_for(&format!("the console to render {page}"), WAIT, || {
            let d = d.clone();
            let page = page.to_owned();
            async move {
                let v = d
                    .execute(
                        "const b = document.body.dataset; return b.page === arguments[0] ? Number(b.sinceLoadMs) : null;",
                        vec![json!(page)],
                    )
                    .await?;
                Ok(v.json().as_u64())
            }
        })
        .await
    }

    /// Marks the current page as left, so that [`Self::rendered`] waits for the next.
    async fn leaving(&self) -> Result<()> {
        self.d()
            .execute("delete document.body.dataset.page;", Vec::<Value>::new())
            .await?;
        Ok(())
    }

    async fn el(&self, css: &str) -> Result<WebElement> {
        let d = self.d().clone();
        wait_for(&format!("an element {css}"), WAIT, || {
            let d = d.clone();
            let css = css.to_owned();
            async move { Ok(d.find_all(By::Css(css)).await?.into_iter().next()) }
        })
        .await
    }

    async fn count(&self, css: &str) -> Result<usize> {
        Ok(self.d().find_all(By::Css(css)).await?.len())
    }

    /// Waits until the element `css` shows `text`.
    async fn shows(&self, css: &str, text: &str) -> Result<()> {
        let d = self.d().clone();
        wait_for(&format!("{css} to show {text:?}"), WAIT, || {
            let d = d.clone();
            let css = css.to_owned();
            let text = text.to_owned();
            async move {
                for e in d.find_all(By::Css(css)).await? {
                    if e.text().await?.contains(&text) {
                        return Ok(Some(()));
                    }
                }
                Ok(None)
            }
        })
        .await
    }

    async fn click(&self, css: &str) -> Result<()> {
        self.el(css).await?.click().await?;
        Ok(())
    }

    async fn type_into(&self, css: &str, text: &str) -> Result<()> {
        let e = self.el(css).await?;
        e.clear().await?;
        e.send_keys(text).await?;
        Ok(())
    }

    async fn shot(&self, name: &str) -> Result<PathBuf> {
        let path = self.shots.join(format!("{name}.png"));
        self.d().screenshot(&path).await?;
        Ok(path)
    }

    async fn quit(mut self) -> Result<()> {
        if let Some(d) = self.driver.take() {
            d.quit().await?;
        }
        Ok(())
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.chromedriver.kill();
        let _ = self.chromedriver.wait();
    }
}

/// The job `id` as GET /api/v1/jobs/{id} answers it.
async fn job_json(base: &str, id: &str) -> Result<Value> {
    let got: Value = reqwest::Client::new()
        .get(format!("{base}/api/v1/jobs/{id}"))
        .bearer_auth(ADMIN)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    Ok(got["job"].clone())
}

/// Another operator renames the job (UpdateJob at its current version).
async fn change_name_behind_the_page(base: &str, id: &str, name: &str) -> Result<()> {
    let job = job_json(base, id).await?;
    let mut spec = job["spec"].clone();
    spec["name"] = json!(name);
    reqwest::Client::new()
        .put(format!("{base}/api/v1/jobs/{id}"))
        .bearer_auth(ADMIN)
        .json(&json!({"spec": spec, "expectedVersion": job["version"]}))
        .send()
        .await?
        .error_for_status()?;
    Ok(())
}

/// Creates the job `id` running `handler` with `payload` (one retry allowed, armed far
/// ahead) and runs it now; returns the run's schedule_id.
async fn trigger_run(base: &str, id: &str, handler: &str, payload: &str) -> Result<String> {
    use base64::Engine as _;
    let http = reqwest::Client::new();
    let payload = base64::engine::general_purpose::STANDARD.encode(payload);
    let spec = json!({"id": id, "cron": "0 0 0 1 1 * 2099", "payload": payload,
        "executor": {"group": "g", "handler": handler}, "retry": {"maxRetries": 1}});
    http.post(format!("{base}/api/v1/jobs"))
        .bearer_auth(ADMIN)
        .json(&json!({ "spec": spec }))
        .send()
        .await?
        .error_for_status()?;
    let queued: Value = http
        .post(format!("{base}/api/v1/jobs/{id}/trigger"))
        .bearer_auth(ADMIN)
        .json(&json!({}))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    queued["scheduleId"]
        .as_str()
        .map(str::to_owned)
        .context("no scheduleId")
}

/// The `data-action` buttons and links on the page (what a caller may do there).
async fn actions(b: &Browser) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for e in b.d().find_all(By::Css("[data-action]")).await? {
        if let Some(a) = e.attr("data-action").await? {
            out.push(a);
        }
    }
    Ok(out)
}

/// The schedule ids of the runs the job page lists.
/// The runs the job page lists, read in one script: the page re-renders its runs every
/// 2 s, so rows found in one call and read in the next may be gone (a stale element).
async fn listed_runs(b: &Browser) -> Result<Vec<String>> {
    let listed = b
        .d()
        .execute(
            "return [...document.querySelectorAll('#runs tr[data-run]')].map(e => e.dataset.run);",
            Vec::<Value>::new(),
        )
        .await?;
    Ok(listed.convert()?)
}

async fn sign_in(b: &Browser, base: &str, token: &str) -> Result<()> {
    b.d().goto(format!("{base}/#/login")).await?;
    b.type_into("#token", token).await?;
    b.leaving().await?;
    b.click("button[data-action=sign-in]").await?;
    b.rendered("/jobs").await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_manages_jobs_in_a_real_browser() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let server = Sundial::start(
        SundialOptions::embedded(dir.path())
            .arg("bearer-token", &format!("ops={ADMIN}"))
            .arg("read-token", &format!("viewer={READER}")),
    )?;
    let base = server.http_url().context("no http address")?;
    let journal = dir.path().join("journal");
    let _executor = TestExecutor::start(
        env!("CARGO_BIN_EXE_test_executor"),
        &[server.grpc_url()],
        "console-node",
        &journal,
    )?;
    let b = Browser::start().await?;

    // Not signed in: the console asks for a token.
    b.d().goto(format!("{base}/")).await?;
    b.el("#token").await?;
    b.shot("login").await?;
    sign_in(&b, &base, ADMIN).await?;
    b.shows(".who", "ops").await?;

    // A new job, its fire times previewed before it is saved.
    b.click("[data-action=new-job]").await?;
    b.rendered("/new").await?;
    b.type_into("#f-id", "console-demo").await?;
    // Across Berlin's spring-forward of 2030-03-31: 02:30 does not exist that day and
    // fires at 03:00 CEST, as the scheduler fires it (the CLI's `job next` test).
    b.type_into("#f-cron", "30 2 * * *").await?;
    b.type_into("#f-timeZone", "Europe/Berlin").await?;
    b.type_into("#preview-from", "2030-03-29").await?;
    b.shows(
        "#preview li:nth-child(1)",
        "2030-03-29 02:30:00 Europe/Berlin GMT+1",
    )
    .await?;
    b.shows(
        "#preview li:nth-child(3)",
        "2030-03-31 03:00:00 Europe/Berlin GMT+2",
    )
    .await?;
    b.shows(
        "#preview li:nth-child(4)",
        "2030-04-01 02:30:00 Europe/Berlin GMT+2",
    )
    .await?;
    b.shot("new-job-dst-preview").await?;
    b.type_into("#preview-from", "").await?;
    b.type_into("#f-timeZone", "UTC").await?;
    b.type_into("#f-cron", "*/2 * * * * *").await?;
    b.type_into("#f-group", "g").await?;
    b.type_into("#f-handler", "ticks").await?;
    b.type_into("#f-payload", "3").await?;
    b.type_into("#f-labels", "team=console").await?;
    b.shows("#preview li", "UTC").await?;
    ensure!(
        b.count("#preview li").await? == 8,
        "eight fire times previewed"
    );
    b.shot("new-job").await?;
    b.leaving().await?;
    b.click("button[data-action=save]").await?;
    b.rendered("/jobs/console-demo").await?;
    b.shows("#job-id", "console-demo").await?;

    // An edit from a version someone else changed meanwhile is refused and shown,
    // never written over theirs.
    b.open(
        &format!("{base}/#/jobs/console-demo/edit"),
        "/jobs/console-demo/edit",
    )
    .await?;
    b.type_into("#f-name", "my edit").await?;
    change_name_behind_the_page(&base, "console-demo", "their edit").await?;
    b.click("button[data-action=save]").await?;
    b.shows("#conflict", "Someone changed this job after you opened it")
        .await?;
    b.shot("edit-conflict").await?;
    let job = job_json(&base, "console-demo").await?;
    ensure!(job["spec"]["name"] == "their edit", "{job}");
    b.open(&format!("{base}/#/jobs/console-demo"), "/jobs/console-demo")
        .await?;

    // Its runs appear and succeed (the page follows them).
    b.shows("#runs", "SUCCEEDED").await?;
    b.shot("job").await?;

    // A run's timeline and log.
    let browser = &b;
    let run = wait_for("a succeeded run listed", WAIT, || async move {
        for row in browser.d().find_all(By::Css("#runs tr[data-run]")).await? {
            if row.text().await?.contains("SUCCEEDED") {
                return Ok(row.attr("data-run").await?);
            }
        }
        Ok(None)
    })
    .await?;
    b.leaving().await?;
    b.click(&format!("#runs tr[data-run='{run}'] a")).await?;
    b.rendered(&format!("/runs/{run}")).await?;
    b.shows("#timeline", "Dispatched to console-node").await?;
    b.shows("#timeline", "Started on console-node").await?;
    b.shows("#log", "tick 3").await?;
    b.shot("run").await?;

    // A run's page opened before its run is recorded (as the "Run now" notice's link
    // can be, a manual trigger being answered once queued) waits for it instead of
    // answering "not found": here a fire due in a few seconds, whose schedule_id is
    // known ahead.
    let due = (sundial_tests::now_ms() + 3_000) / 1000 * 1000 + 1000;
    let spec = json!({"id": "soon-demo", "cron": "* * * * * *", "startTimeMs": due,
        "endTimeMs": due + 1, "executor": {"group": "g", "handler": "noop"}});
    reqwest::Client::new()
        .post(format!("{base}/api/v1/jobs"))
        .bearer_auth(ADMIN)
        .json(&json!({ "spec": spec }))
        .send()
        .await?
        .error_for_status()?;
    let soon = format!("soon-demo@{due}");
    b.d()
        .goto(format!("{base}/#/runs/{}", soon.replace('@', "%40")))
        .await?;
    b.shows("#run-queued", "is queued").await?;
    b.rendered(&format!("/runs/{soon}")).await?;
    b.shows("h1 .badge", "SUCCEEDED").await?;

    // A retried run's timeline has both attempts: the failure that caused the retry,
    // then the second attempt to its end.
    let flaky = trigger_run(&base, "flaky-demo", "flaky", "").await?;
    b.open(
        &format!("{base}/#/runs/{}", flaky.replace('@', "%40")),
        &format!("/runs/{flaky}"),
    )
    .await?;
    b.shows("h1 .badge", "SUCCEEDED").await?;
    b.shows("#timeline li", "retry: flaky").await?;
    b.shows("#timeline li", "attempt 2 on console-node").await?;
    b.shot("run-retried").await?;

    // A run cancelled from its page while its log is followed.
    let slow = trigger_run(&base, "slow-demo", "ticks", "30").await?;
    b.open(
        &format!("{base}/#/runs/{}", slow.replace('@', "%40")),
        &format!("/runs/{slow}"),
    )
    .await?;
    b.shows("#log", "tick 2").await?;
    b.shows("#log-state", "following").await?;
    b.click("[data-action=cancel]").await?;
    b.shows("h1 .badge", "CANCELLED").await?;
    b.shows("#timeline li", "cancelled from the console")
        .await?;
    b.shot("run-cancelled").await?;

    // Paused: no further runs.
    b.open(&format!("{base}/#/jobs/console-demo"), "/jobs/console-demo")
        .await?;
    b.leaving().await?;
    b.click("[data-action=pause]").await?;
    b.rendered("/jobs/console-demo").await?;
    b.shows("h1 .badge", "PAUSED").await?;
    let paused_at = sundial_tests::now_ms();
    // Three fire times of the cron pass; the page refreshes its runs every 2 s. A run
    // planned before the pause may still show up; none planned after it may.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let after = listed_runs(&b).await?;
    ensure!(!after.is_empty(), "the runs before the pause are listed");
    let planned = |sid: &String| -> Option<i64> { sid.split_once('@')?.1.parse().ok() };
    let new: Vec<_> = after
        .iter()
        .filter(|sid| planned(sid).is_some_and(|p| p > paused_at))
        .collect();
    ensure!(new.is_empty(), "runs planned after the pause: {new:?}");

    // Resumed, and run now: the queued run is followed to its end.
    b.leaving().await?;
    b.click("[data-action=resume]").await?;
    b.rendered("/jobs/console-demo").await?;
    b.shows("h1 .badge", "ACTIVE").await?;
    b.click("[data-action=trigger]").await?;
    b.shows(".notice", "Queued").await?;
    b.leaving().await?;
    b.click(".notice a").await?;
    b.shows("#run-id", "console-demo@manual-").await?;
    b.shows("#log", "tick 1").await?;
    b.shows("h1 .badge", "SUCCEEDED").await?;
    b.shows("#log-state", "lines").await?;

    // The executors page, and a drain.
    b.open(&format!("{base}/#/executors"), "/executors").await?;
    b.shows("#nodes tr[data-node=console-node]", "HEALTHY")
        .await?;
    b.shot("executors").await?;
    b.leaving().await?;
    b.click("#nodes tr[data-node=console-node] [data-action=drain]")
        .await?;
    b.d().send_alert_text("maintenance").await?;
    b.d().accept_alert().await?;
    b.rendered("/executors").await?;
    b.shows("#nodes tr[data-node=console-node]", "DRAINING")
        .await?;
    b.shot("executors-draining").await?;
    // Undrained: it reports ready at its next heartbeat (the page is reloaded until
    // it shows), and the job's runs succeed on it again.
    b.leaving().await?;
    b.click("#nodes tr[data-node=console-node] [data-action=undrain]")
        .await?;
    b.rendered("/executors").await?;
    let browser = &b;
    wait_for("the node healthy again", WAIT, || async move {
        browser.leaving().await?;
        browser.d().refresh().await?;
        browser.rendered("/executors").await?;
        let row = browser.el("#nodes tr[data-node=console-node]").await?;
        Ok(row.text().await?.contains("HEALTHY").then_some(()))
    })
    .await?;

    // A read-only token sees no button that writes.
    b.click("[data-action=sign-out]").await?;
    sign_in(&b, &base, READER).await?;
    b.shows(".who", "viewer (read-only)").await?;
    b.el("#jobs tr[data-job=console-demo]").await?;
    let writes = [
        "new-job", "pause", "resume", "trigger", "edit", "delete", "drain", "undrain", "cancel",
        "save",
    ];
    for (url, page) in [
        (format!("{base}/#/jobs"), "/jobs".to_owned()),
        (
            format!("{base}/#/jobs/console-demo"),
            "/jobs/console-demo".to_owned(),
        ),
        (format!("{base}/#/runs/{run}"), format!("/runs/{run}")),
        (format!("{base}/#/executors"), "/executors".to_owned()),
    ] {
        b.open(&url, &page).await?;
        let shown = actions(&b).await?;
        ensure!(
            !shown.iter().any(|a| writes.contains(&a.as_str())),
            "a reader is shown {shown:?} on {page}"
        );
    }
    b.open(&format!("{base}/#/jobs"), "/jobs").await?;
    b.shot("jobs-read-only").await?;

    page_times_at_10000_jobs(&b, &base, &run).await?;

    // A server with no credentials configured: anyone is in, and the banner says so.
    let open_dir = tempfile::tempdir()?;
    let open = Sundial::start(SundialOptions::embedded(open_dir.path()))?;
    let open_base = open.http_url().context("no http address")?;
    b.open(&format!("{open_base}/#/jobs"), "/jobs").await?;
    b.shows("#banner", "Dev mode").await?;
    b.shows(".who", "dev mode").await?;
    b.el("[data-action=new-job]").await?;
    b.shot("dev-mode").await?;
    b.quit().await
}

/// Registers 10,000 more jobs (armed far ahead, through the REST API) and prints how
/// long each page takes to show its data after a fresh load. Printed, never asserted.
async fn page_times_at_10000_jobs(b: &Browser, base: &str, run: &str) -> Result<()> {
    let http = reqwest::Client::new();
    let started = Instant::now();
    for chunk in 0..10 {
        let specs: Vec<Value> = (0..1000)
            .map(|i| {
                json!({"id": format!("bulk-{:05}", chunk * 1000 + i), "cron": "0 0 0 1 1 * 2099",
                       "executor": {"group": "g", "handler": "echo"}, "labels": {"team": "bulk"}})
            })
            .collect();
        let resp = http
            .put(format!("{base}/api/v1/jobs"))
            .bearer_auth(ADMIN)
            .json(&json!({ "specs": specs }))
            .send()
            .await?;
        if !resp.status().is_success() {
            bail!(
                "ApplyJobs over REST: {} {}",
                resp.status(),
                resp.text().await?
            );
        }
        let answer: Value = resp.json().await?;
        let created = answer["results"].as_array().map_or(0, |r| {
            r.iter()
                .filter(|x| x["outcome"] == "APPLY_OUTCOME_CREATED")
                .count()
        });
        ensure!(
            created == 1000,
            "ApplyJobs created {created} of 1000: {answer:.300}"
        );
    }
    println!(
        "registered 10000 jobs in {} ms",
        started.elapsed().as_millis()
    );
    sign_in(b, base, ADMIN).await?;
    let pages = [
        ("jobs", format!("{base}/#/jobs"), "/jobs".to_owned()),
        (
            "jobs by label",
            format!("{base}/#/jobs?label=team%3Dbulk"),
            "/jobs".to_owned(),
        ),
        (
            "jobs by prefix",
            format!("{base}/#/jobs?prefix=bulk-09999"),
            "/jobs".to_owned(),
        ),
        (
            "job",
            format!("{base}/#/jobs/console-demo"),
            "/jobs/console-demo".to_owned(),
        ),
        (
            "run",
            format!("{base}/#/runs/{run}"),
            format!("/runs/{run}"),
        ),
        ("new job", format!("{base}/#/new"), "/new".to_owned()),
        (
            "executors",
            format!("{base}/#/executors"),
            "/executors".to_owned(),
        ),
    ];
    println!("console pages at 10,000 jobs (fresh load to data shown, ms; three loads each):");
    for (name, url, page) in &pages {
        let mut times = Vec::new();
        for _ in 0..3 {
            b.d().goto("about:blank").await?;
            times.push(b.open(url, page).await?);
        }
        println!("  {name:<15} {times:?}");
        if *name == "jobs by prefix" {
            // The one match, found past thousands of jobs that do not match.
            b.el("#jobs tr[data-job=bulk-09999]").await?;
        }
    }
    b.open(&format!("{base}/#/jobs"), "/jobs").await?;
    b.shot("jobs-10000").await?;
    let rows = b.count("#jobs tbody tr").await?;
    ensure!(rows == 50, "a page of 50 jobs, not {rows}");
    b.shot("jobs-10000").await?;
    Ok(())
}
