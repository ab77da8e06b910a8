//! `sundial node …` (the executor nodes with their health; drain or undrain one) and
//! `sundial app …` (the apps whose secrets sign webhooks; create one, rotate its secret).

use std::time::Duration;

use clap::Subcommand;
use sundial_proto::v1 as pb;

use super::connect::{Server, ask};
use super::{ClientArgs, Exit, Output, Result, show};

#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// Executor nodes: group, health and why, active runs, handlers.
    List {
        /// Only this group's nodes.
        #[arg(long)]
        group: Option<String>,
    },
    /// Drain a node: it finishes the runs it holds and gets no new work.
    Drain {
        node_id: String,
        /// Why, kept on the node.
        #[arg(long, default_value = "drained by an operator")]
        reason: String,
    },
    /// End a node's drain: it takes work again.
    Undrain {
        node_id: String,
        /// Why, for the executor's log.
        #[arg(long, default_value = "undrained by an operator")]
        reason: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum AppCommand {
    /// Create an app; prints its webhook signing secret, shown this once.
    Create {
        app_id: String,
        /// A name for people (none unless given).
        #[arg(long)]
        name: Option<String>,
    },
    /// Give an app a new secret; the old one keeps signing too for --overlap.
    Rotate {
        app_id: String,
        /// How long the old secret keeps signing beside the new one.
        #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
        overlap: Duration,
    },
}

pub async fn nodes(client: &ClientArgs, command: NodeCommand) -> Result<Exit> {
    let server = Server::connect(client).await?;
    let out = client.output;
    match command {
        NodeCommand::List { group } => {
            let req = pb::ListNodesRequest {
                group: group.unwrap_or_default(),
            };
            let nodes = ask("list nodes", server.nodes().list_nodes(req))
                .await?
                .nodes;
            if out == Output::Json {
                show::json(&nodes)?;
                return Ok(Exit::Ok);
            }
            show::table(
                &[
                    "NODE", "GROUP", "HEALTH", "ACTIVE", "SUCCESS", "HANDLERS", "INSTANCE", "WHY",
                ],
                nodes.iter().map(node_row),
            );
        }
        NodeCommand::Drain { node_id, reason } => {
            let req = pb::DrainNodeRequest {
                node_id: node_id.clone(),
                reason,
            };
            let what = format_args!("drain node {node_id:?}");
            let node = ask(what, server.nodes().drain_node(req)).await?.node;
            match out {
                Output::Json => show::json(&node.unwrap_or_default())?,
                Output::Table => say!("node {node_id} draining"),
            }
        }
        NodeCommand::Undrain { node_id, reason } => {
            let req = pb::UndrainNodeRequest {
                node_id: node_id.clone(),
                reason,
            };
            let what = format_args!("undrain node {node_id:?}");
            let node = ask(what, server.nodes().undrain_node(req)).await?.node;
            match out {
                Output::Json => show::json(&node.unwrap_or_default())?,
                Output::Table => say!("node {node_id} takes work again"),
            }
        }
    }
    Ok(Exit::Ok)
}

fn node_row(n: &pb::Node) -> Vec<String> {
    let active = if n.max_concurrency == 0 {
        n.active.to_string()
    } else {
        format!("{}/{}", n.active, n.max_concurrency)
    };
    vec![
        n.node_id.clone(),
        n.group.clone(),
        show::short(n.health().as_str_name(), "NODE_HEALTH_"),
        active,
        format!("{:.0}%", n.success_rate * 100.0),
        n.handlers.join(","),
        n.server_instance.clone(),
        n.health_reason.clone(),
    ]
}

pub async fn apps(client: &ClientArgs, command: AppCommand) -> Result<Exit> {
    let server = Server::connect(client).await?;
    let out = client.output;
    let (what, answer) = match command {
        AppCommand::Create { app_id, name } => {
            let req = pb::CreateAppRequest {
                app_id: app_id.clone(),
                name: name.unwrap_or_default(),
                secret: String::new(),
            };
            let what = format_args!("create app {app_id:?}");
            let a = ask(what, server.apps().create_app(req)).await?;
            ("created", (a.app, a.secret))
        }
        AppCommand::Rotate { app_id, overlap } => {
            let req = pb::RotateAppSecretRequest {
                app_id: app_id.clone(),
                overlap_ms: i64::try_from(overlap.as_millis()).unwrap_or(i64::MAX),
                new_secret: String::new(),
            };
            let what = format_args!("rotate the secret of app {app_id:?}");
            let a = ask(what, server.apps().rotate_app_secret(req)).await?;
            ("rotated", (a.app, a.secret))
        }
    };
    let (app, secret) = answer;
    let app = app.unwrap_or_default();
    match out {
        Output::Json => show::json(&serde_json::json!({
            "app": app,
            "secret": secret,
        }))?,
        Output::Table => {
            say!(
                "app {} {what} ({} active secrets); its secret, shown this once:",
                app.app_id,
                app.active_secrets
            );
            say!("{secret}");
        }
    }
    Ok(Exit::Ok)
}
