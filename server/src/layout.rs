//! The allowed import directions between the server's modules, checked over the
//! source tree (ARCHITECTURE.md, "Architecture Invariant: imports go down").
//!
//! Layers, top to bottom: `cli` (a client of the gRPC API) → `server` and `config` (wiring) → `api` (the surfaces) →
//! `schedule` and `dispatch` (when and where; never each other) → `deliver` (how the
//! world learns) → the foundation (`auth`, `tls`, `metrics`, then `store`, then
//! `model`, `egress`, `fault`). A module imports its own layer's module and the layers
//! below it, never above; `store` imports only `model` (and the test helpers).
//!
//! And the store traits each part of the server holds (ARCHITECTURE.md, "who holds
//! which store trait"): a part names exactly the traits its row gives it, so nothing
//! under `deliver/` can reach `RunStore::assign_run`, and only the wiring holds the
//! whole `Store`.

use std::path::{Path, PathBuf};

/// The layer of a top-level module: higher may import lower.
fn layer(module: &str) -> Option<u8> {
    Some(match module {
        "model" | "egress" | "fault" | "testing" | "telemetry" => 0,
        "store" => 1,
        "auth" | "metrics" => 2,
        "tls" => 3,
        "deliver" => 4,
        "schedule" | "dispatch" => 5,
        "api" => 6,
        "config" => 7,
        "server" => 8,
        "cli" => 9,
        _ => return None,
    })
}

/// Why `from` may not import `to`, if it may not.
fn refusal(from: &str, to: &str) -> Option<String> {
    if from == to {
        return None;
    }
    let (Some(f), Some(t)) = (layer(from), layer(to)) else {
        return Some(format!(
            "{from} or {to} has no layer: add it to layout::layer"
        ));
    };
    if t >= f {
        return Some(format!(
            "{from} (layer {f}) may not import {to} (layer {t})"
        ));
    }
    None
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every `crate::<module>` a file's code (not its comments) names.
fn imports(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            let after = &rest[i + "crate::".len()..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.push((n + 1, name));
            }
            rest = after;
        }
    }
    out
}

/// Every source file of the crate but `lib.rs`, `main.rs` and this one: its path under
/// `src/` (with `/`) and its text.
fn sources() -> Vec<(String, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files
        .iter()
        .map(|file| {
            let rel = file.strip_prefix(&src).expect("under src");
            let rel = rel.to_string_lossy().replace('\\', "/");
            (rel, std::fs::read_to_string(file).expect("read source"))
        })
        .filter(|(rel, _)| !matches!(rel.as_str(), "lib.rs" | "main.rs" | "layout.rs"))
        .collect()
}

#[test]
fn imports_go_down() {
    let files = sources();
    let mut wrong = Vec::new();
    for (rel, text) in &files {
        let first = rel.split('/').next().expect("a path");
        let from = first.trim_end_matches(".rs");
        for (line, to) in imports(text) {
            if let Some(why) = refusal(from, &to) {
                wrong.push(format!("{rel}:{line}: {why}"));
            }
        }
    }
    assert!(files.len() > 40, "found only {} files", files.len());
    assert!(
        wrong.is_empty(),
        "imports that go up:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_rule_refuses_what_the_architecture_forbids() {
    assert!(refusal("dispatch", "api").is_some());
    assert!(refusal("dispatch", "schedule").is_some());
    assert!(refusal("schedule", "dispatch").is_some());
    assert!(refusal("deliver", "dispatch").is_some());
    assert!(refusal("store", "metrics").is_some());
    assert!(refusal("metrics", "deliver").is_some());
    assert!(refusal("model", "store").is_some());
    assert!(refusal("dispatch", "deliver").is_none());
    assert!(refusal("api", "dispatch").is_none());
    assert!(refusal("server", "config").is_none());
    assert_eq!(
        imports(
            "use crate::store::{self, Store};\n// crate::api in a comment\nlet x = crate::model::now_ms();"
        ),
        vec![(1, "store".to_owned()), (3, "model".to_owned())]
    );
}

/// The store traits (and backends, which give every trait) a part of the server may
/// name outside its tests, by path under `src/`; a path not listed names none.
const STORE_TRAITS: &[(&str, &[&str])] = &[
    ("server/mod.rs", &["Store"]),
    (
        "server/store.rs",
        &["Store", "StoreMeta", "EmbeddedStore", "RedisStore"],
    ),
    ("auth.rs", &["AppStore"]),
    ("api/apps.rs", &["AppStore"]),
    ("api/audit.rs", &["AuditLog"]),
    ("api/destinations.rs", &["AppStore"]),
    ("api/queries.rs", &["RunStore"]),
    ("api/runs.rs", &["RunStore"]),
    ("api/scrape.rs", &["NodeRegistry"]),
    ("schedule/jobs.rs", &["JobStore"]),
    ("schedule/scheduler.rs", &["JobStore"]),
    (
        "dispatch/router/mod.rs",
        &["JobStore", "RunStore", "NodeRegistry"],
    ),
    ("dispatch/router/node_cache.rs", &["NodeRegistry"]),
    ("dispatch/consumer.rs", &["TriggerQueue", "RunStore"]),
    ("dispatch/executors/mod.rs", &["RunStore", "NodeRegistry"]),
    ("dispatch/http_target.rs", &["RunStore"]),
    ("dispatch/sweeper.rs", &["RunStore"]),
    ("dispatch/links.rs", &["Inboxes"]),
    ("deliver/webhooks.rs", &["Outbox", "JobStore", "AppStore"]),
    ("deliver/senders.rs", &["JobStore", "AppStore"]),
];

const STORE_NAMES: &[&str] = &[
    "Store",
    "StoreMeta",
    "JobStore",
    "TriggerQueue",
    "RunStore",
    "NodeRegistry",
    "Inboxes",
    "Outbox",
    "AppStore",
    "AuditLog",
    "EmbeddedStore",
    "RedisStore",
];

/// The code of a file before its `#[cfg(test)] mod …` (tests may hold a whole store),
/// without comment lines.
fn code_outside_tests(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let end = lines
        .windows(2)
        .position(|w| w[0].trim() == "#[cfg(test)]" && w[1].trim_start().starts_with("mod "))
        .unwrap_or(lines.len());
    lines[..end]
        .iter()
        .filter(|l| !l.trim_start().starts_with("//"))
        .copied()
        .collect::<Vec<_>>()
        .join("\n")
}

/// Which of [`STORE_NAMES`] a piece of code names, as whole words not followed by `(`
/// (a name followed by `(` is an enum variant such as `Error::Store(e)`).
fn store_names(code: &str) -> Vec<&'static str> {
    let is_word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut words = std::collections::HashSet::new();
    let mut rest = code;
    while let Some(start) = rest.find(|c: char| c.is_ascii_alphabetic()) {
        let after = &rest[start..];
        let len = after.find(|c: char| !is_word(c)).unwrap_or(after.len());
        if !after[len..].starts_with('(') {
            words.insert(&after[..len]);
        }
        rest = &after[len..];
    }
    STORE_NAMES
        .iter()
        .copied()
        .filter(|n| words.contains(n))
        .collect()
}

#[test]
fn each_part_holds_only_its_store_traits() {
    let mut wrong = Vec::new();
    for (rel, text) in sources() {
        if rel.starts_with("store/") {
            continue;
        }
        let mut named = store_names(&code_outside_tests(&text));
        named.sort_unstable();
        let mut allowed: Vec<&str> = STORE_TRAITS
            .iter()
            .find(|(path, _)| *path == rel)
            .map(|(_, traits)| traits.to_vec())
            .unwrap_or_default();
        allowed.sort_unstable();
        if named != allowed {
            wrong.push(format!(
                "{rel}: names {named:?}, its row in STORE_TRAITS says {allowed:?}"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "store traits held where the table does not say so:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn store_names_are_found_as_words_outside_tests_and_comments() {
    let code = code_outside_tests(
        "use crate::store::{Outbox, WebhookDelivery};\n// RunStore in a comment\nstruct WebhookStore;\nlet e = Error::Store(e);\n#[cfg(test)]\nmod tests {\n    use crate::store::Store;\n}",
    );
    assert_eq!(store_names(&code), vec!["Outbox"]);
}
