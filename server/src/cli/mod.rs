//! The operator's subcommands beside `serve`: `sundial job|run|node|app …`, each a client
//! of a running server's gRPC API (the same calls grpcurl would make), with human tables
//! by default and `-o json` (the proto's canonical JSON mapping) for scripts.
//!
//! Owns the command line of the client side, the exit codes ([`Exit`]) and how a failure
//! is told ([`Failure`]); the connection is `connect.rs`, job files and `job apply` are
//! `files.rs` and `apply.rs`, output is `show.rs`, one file per noun for the rest.

/// `println!` for answers: a closed stdout (`sundial job list | head -1`) ends the
/// process quietly, as a command killed by SIGPIPE would, instead of a panic.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::cli::show::line(format_args!($($arg)*))
    };
}

mod admin;
mod apply;
mod connect;
mod files;
mod jobs;
mod runs;
mod show;

use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};

pub use connect::DEFAULT_SERVER;

/// How the command ends, as the process's exit code (README, "The CLI").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Ok = 0,
    /// A usage error, a bad job file, or a request the server refused as invalid (and
    /// any failure without a code of its own).
    Usage = 1,
    NotFound = 2,
    /// Exists already, or changed by another caller meanwhile (apply again).
    Conflict = 3,
    /// No credentials, wrong ones, or a read-only token asking to write.
    Auth = 4,
    /// The server cannot be reached or is shutting down.
    Unavailable = 5,
}

impl Exit {
    /// The exit code of a gRPC status.
    pub fn of(code: tonic::Code) -> Self {
        use tonic::Code as C;
        match code {
            C::Ok => Self::Ok,
            C::NotFound => Self::NotFound,
            C::AlreadyExists | C::Aborted | C::FailedPrecondition => Self::Conflict,
            C::Unauthenticated | C::PermissionDenied => Self::Auth,
            C::Unavailable | C::DeadlineExceeded => Self::Unavailable,
            _ => Self::Usage,
        }
    }
}

/// Why a command failed: the message printed (naming the file, the job and the field
/// where there is one) and the exit code.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Failure {
    pub exit: Exit,
    pub message: String,
}

impl Failure {
    pub fn usage(message: impl Into<String>) -> Self {
        Self {
            exit: Exit::Usage,
            message: message.into(),
        }
    }

    /// A refused call, `what` saying which (`get job "a"`).
    pub fn rpc(what: impl std::fmt::Display, status: &tonic::Status) -> Self {
        Self {
            exit: Exit::of(status.code()),
            message: format!("{what}: {} ({:?})", status.message(), status.code()),
        }
    }
}

pub type Result<T, E = Failure> = std::result::Result<T, E>;

/// `-o`: how answers are printed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Aligned columns, times in each job's zone.
    #[default]
    Table,
    /// The proto's canonical JSON mapping, one document.
    Json,
}

/// Where the server is and how to talk to it; accepted after any subcommand.
#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    /// The server's gRPC address (https:// for TLS; host:port alone is http://).
    #[arg(long, env = "SUNDIAL_SERVER", default_value = DEFAULT_SERVER, global = true)]
    pub server: String,
    /// A file holding the bearer token (else SUNDIAL_TOKEN, else none).
    #[arg(long, env = "SUNDIAL_TOKEN_FILE", global = true)]
    pub token_file: Option<PathBuf>,
    /// PEM file of the CA that signed the server's certificate (else the web's roots).
    #[arg(long, env = "SUNDIAL_CA_FILE", global = true)]
    pub ca_file: Option<PathBuf>,
    /// How answers are printed.
    #[arg(short, long, value_enum, default_value_t = Output::Table, global = true)]
    pub output: Output,
}

/// The client subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Jobs: create, read, pause, run now, delete; `apply -f` a folder of job files.
    Job {
        #[command(flatten)]
        client: ClientArgs,
        #[command(subcommand)]
        command: jobs::JobCommand,
    },
    /// Runs: list a job's, read one, cancel, read or follow its log.
    Run {
        #[command(flatten)]
        client: ClientArgs,
        #[command(subcommand)]
        command: runs::RunCommand,
    },
    /// Executor nodes: list them with their health, drain or undrain one.
    Node {
        #[command(flatten)]
        client: ClientArgs,
        #[command(subcommand)]
        command: admin::NodeCommand,
    },
    /// Apps: the webhook signing secrets; create one, rotate its secret.
    App {
        #[command(flatten)]
        client: ClientArgs,
        #[command(subcommand)]
        command: admin::AppCommand,
    },
}

/// Runs one client command: prints its answer on stdout, a failure on stderr, and
/// gives the exit code.
pub async fn run(command: Command) -> Exit {
    let outcome = match command {
        Command::Job { client, command } => jobs::run(&client, command).await,
        Command::Run { client, command } => runs::run(&client, command).await,
        Command::Node { client, command } => admin::nodes(&client, command).await,
        Command::App { client, command } => admin::apps(&client, command).await,
    };
    match outcome {
        Ok(exit) => exit,
        Err(failure) => {
            eprintln!("error: {failure}");
            failure.exit
        }
    }
}
