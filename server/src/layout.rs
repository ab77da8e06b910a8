//! The allowed import directions between the server's modules, checked over the
//! source tree (ARCHITECTURE.md, "Architecture Invariant: imports go down").
//!
//! Layers, top to bottom: `server` and `config` (wiring) → `api` (the surfaces) →
//! `schedule` and `dispatch` (when and where; never each other) → `deliver` (how the
//! world learns) → the foundation (`auth`, `tls`, `metrics`, then `store`, then
//! `model`, `egress`, `fault`). A module imports its own layer's module and the layers
//! below it, never above; `store` imports only `model` (and the test helpers).

use std::path::{Path, PathBuf};

/// The layer of a top-level module: higher may import lower.
fn layer(module: &str) -> Option<u8> {
    Some(match module {
        "model" | "egress" | "fault" | "testing" => 0,
        "store" => 1,
        "auth" | "metrics" => 2,
        "tls" => 3,
        "deliver" => 4,
        "schedule" | "dispatch" => 5,
        "api" => 6,
        "config" => 7,
        "server" => 8,
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

#[test]
fn imports_go_down() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut wrong = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).expect("under src");
        let first = rel
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .expect("a path");
        let from = first.trim_end_matches(".rs");
        if matches!(from, "lib" | "main" | "layout") {
            continue;
        }
        let text = std::fs::read_to_string(file).expect("read source");
        for (line, to) in imports(&text) {
            if let Some(why) = refusal(from, &to) {
                wrong.push(format!("{}:{line}: {why}", rel.display()));
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
