//! The `sundial` CLI run as a process against a server, as an operator would run it:
//! its exit code and what it printed on stdout and stderr.

use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::sundial_bin;

/// What one CLI command did.
#[derive(Debug)]
pub struct CliRun {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl CliRun {
    /// stdout parsed as JSON (for `-o json`).
    pub fn json(&self) -> Result<serde_json::Value> {
        serde_json::from_str(&self.stdout).with_context(|| format!("not JSON: {}", self.stdout))
    }
}

/// The CLI aimed at one server, with the environment it runs in.
#[derive(Debug, Clone)]
pub struct Cli {
    server: String,
    env: Vec<(String, String)>,
}

impl Cli {
    /// Talks to the server at `grpc_url` (through `SUNDIAL_SERVER`); no token unless
    /// one is given with [`Cli::env`] or `--token-file`.
    pub fn new(grpc_url: &str) -> Self {
        Self {
            server: grpc_url.to_owned(),
            env: Vec::new(),
        }
    }

    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.to_owned(), value.to_owned()));
        self
    }

    fn command(&self, args: &[&str]) -> Result<tokio::process::Command> {
        let mut cmd = tokio::process::Command::new(sundial_bin()?);
        cmd.args(args)
            .env_remove("SUNDIAL_TOKEN")
            .env_remove("SUNDIAL_TOKEN_FILE")
            .env_remove("SUNDIAL_CA_FILE")
            .env("SUNDIAL_SERVER", &self.server)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .kill_on_drop(true);
        Ok(cmd)
    }

    /// Runs `sundial <args>` to its end (at most 120 s).
    pub async fn run(&self, args: &[&str]) -> Result<CliRun> {
        let out = tokio::time::timeout(Duration::from_secs(120), self.command(args)?.output())
            .await
            .with_context(|| format!("sundial {args:?} ran past 120 s"))??;
        Ok(CliRun {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    /// Starts `sundial <args>` with stdout piped, for a command that keeps printing
    /// (`run logs --follow`).
    pub fn spawn(&self, args: &[&str]) -> Result<tokio::process::Child> {
        Ok(self
            .command(args)?
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?)
    }
}
