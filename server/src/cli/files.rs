//! Job files: job specs written in YAML, TOML or JSON with the proto's field names (or
//! their lowerCamelCase JSON names; enums by name, `payload` in base64), read into
//! `JobSpec`s. A file holds one spec, a list of them, or `jobs:` and a list (TOML:
//! `[[jobs]]`); a YAML file may hold several documents. A folder is every `.yaml`,
//! `.yml`, `.toml` and `.json` file under it, in path order; hidden entries are skipped.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use sundial_proto::v1 as pb;

use super::{Failure, Result};

/// One spec and the file it came from.
#[derive(Debug, Clone)]
pub struct JobFile {
    pub path: PathBuf,
    pub spec: pb::JobSpec,
}

const EXTENSIONS: &[&str] = &["yaml", "yml", "toml", "json"];

/// Every spec of `paths` (files, or folders read whole), in path order. Fails naming
/// the file (and the job and field) of the first spec that cannot be read, or two
/// files naming the same job id.
pub fn load(paths: &[PathBuf]) -> Result<Vec<JobFile>> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            walk(path, &mut files)?;
        } else {
            files.push(path.clone());
        }
    }
    files.sort();
    let mut out = Vec::new();
    let mut seen: HashMap<String, PathBuf> = HashMap::new();
    for path in files {
        let text = std::fs::read_to_string(&path)
            .map_err(|e| Failure::usage(format!("{}: cannot read: {e}", path.display())))?;
        let specs =
            parse(&path, &text).map_err(|e| Failure::usage(format!("{}: {e}", path.display())))?;
        for spec in specs {
            if let Some(first) = seen.get(&spec.id) {
                return Err(Failure::usage(format!(
                    "{}: job {:?} is also in {}",
                    path.display(),
                    spec.id,
                    first.display()
                )));
            }
            seen.insert(spec.id.clone(), path.clone());
            out.push(JobFile {
                path: path.clone(),
                spec,
            });
        }
    }
    Ok(out)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| Failure::usage(format!("{}: cannot read the folder: {e}", dir.display())))?;
    for entry in entries {
        let path = entry
            .map_err(|e| Failure::usage(format!("{}: {e}", dir.display())))?
            .path();
        let hidden = path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with('.'));
        if hidden {
            continue;
        }
        if path.is_dir() {
            walk(&path, out)?;
        } else if path
            .extension()
            .is_some_and(|e| EXTENSIONS.contains(&e.to_string_lossy().as_ref()))
        {
            out.push(path);
        }
    }
    Ok(())
}

/// The specs of one file's text; the error names the job (by id, else by its place)
/// and the field.
pub fn parse(path: &Path, text: &str) -> Result<Vec<pb::JobSpec>, String> {
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    let documents: Vec<Value> = match ext.as_str() {
        "yaml" | "yml" => {
            let mut docs = Vec::new();
            for doc in serde_yaml_ng::Deserializer::from_str(text) {
                let value: Value =
                    serde::Deserialize::deserialize(doc).map_err(|e| format!("not YAML: {e}"))?;
                docs.push(value);
            }
            docs
        }
        "toml" => {
            let table: toml::Table = toml::from_str(text).map_err(|e| format!("not TOML: {e}"))?;
            vec![serde_json::to_value(table).map_err(|e| format!("not TOML: {e}"))?]
        }
        "json" => vec![serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?],
        other => {
            return Err(format!(
                "{other:?} is not a job file's extension (yaml, yml, toml or json)"
            ));
        }
    };
    let mut items = Vec::new();
    for doc in documents {
        match doc {
            Value::Null => {}
            Value::Array(list) => items.extend(list),
            Value::Object(mut map) if map.len() == 1 && map.contains_key("jobs") => {
                match map.remove("jobs") {
                    Some(Value::Array(list)) => items.extend(list),
                    _ => return Err("jobs: must be a list of job specs".into()),
                }
            }
            spec @ Value::Object(_) => items.push(spec),
            other => return Err(format!("holds {other}, not a job spec")),
        }
    }
    if items.is_empty() {
        return Err("holds no job spec".into());
    }
    let many = items.len() > 1;
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            let which = match item.get("id").and_then(Value::as_str) {
                Some(id) => format!("job {id:?}"),
                None if many => format!("job #{} (it has no id)", i + 1),
                None => "the job (it has no id)".into(),
            };
            let spec: pb::JobSpec = serde_path_to_error::deserialize(item).map_err(|e| {
                let field = e.path().to_string();
                if field == "." {
                    format!("{which}: {}", e.inner())
                } else {
                    format!("{which}: {field}: {}", e.inner())
                }
            })?;
            if spec.id.is_empty() {
                return Err(format!("{which}: id: required"));
            }
            Ok(spec)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(name: &str, text: &str) -> Result<pb::JobSpec, String> {
        let mut specs = parse(Path::new(name), text)?;
        assert_eq!(specs.len(), 1);
        Ok(specs.remove(0))
    }

    #[test]
    fn the_three_formats_read_the_same_spec() {
        let yaml = "id: report\ncron: \"0 9 * * *\"\ntime_zone: Europe/Berlin\n\
                    executor: {group: billing, handler: report}\n\
                    retry: {max_retries: 2, backoff_ms: 1000}\nlabels: {team: a}\n";
        let toml = "id = \"report\"\ncron = \"0 9 * * *\"\ntime_zone = \"Europe/Berlin\"\n\
                    labels = { team = \"a\" }\n[executor]\ngroup = \"billing\"\nhandler = \"report\"\n\
                    [retry]\nmax_retries = 2\nbackoff_ms = 1000\n";
        let json = r#"{"id": "report", "cron": "0 9 * * *", "timeZone": "Europe/Berlin",
            "executor": {"group": "billing", "handler": "report"},
            "retry": {"maxRetries": 2, "backoffMs": "1000"}, "labels": {"team": "a"}}"#;
        let a = one("a.yaml", yaml).expect("yaml");
        assert_eq!(a, one("a.toml", toml).expect("toml"));
        assert_eq!(a, one("a.json", json).expect("json"));
        assert_eq!(a.retry.as_ref().map(|r| r.backoff_ms), Some(1000));
    }

    #[test]
    fn lists_and_documents_hold_several_specs() {
        let docs = "id: a\ncron: '* * * * *'\n---\n- id: b\n  cron: '* * * * *'\n";
        let ids: Vec<String> = parse(Path::new("x.yml"), docs)
            .expect("two docs")
            .into_iter()
            .map(|s| s.id)
            .collect();
        assert_eq!(ids, ["a", "b"]);
        let toml = "[[jobs]]\nid = \"a\"\n[[jobs]]\nid = \"b\"\n";
        assert_eq!(
            parse(Path::new("x.toml"), toml).expect("toml list").len(),
            2
        );
    }

    /// The README's example of one job in each format reads as the same spec.
    #[test]
    fn the_readme_examples_are_one_job() {
        let readme = include_str!("../../../README.md");
        let start = readme
            .find("### The `sundial` CLI")
            .expect("the CLI section");
        let section = &readme[start..];
        let block = |lang: &str| {
            let open = format!("```{lang}\n");
            let from = section.find(&open).expect("an example") + open.len();
            let len = section[from..].find("```").expect("its end");
            section[from..from + len].to_owned()
        };
        let yaml = one("r.yaml", &block("yaml")).expect("yaml");
        assert_eq!(yaml, one("r.toml", &block("toml")).expect("toml"));
        assert_eq!(yaml, one("r.json", &block("json")).expect("json"));
        assert_eq!(yaml.retry.map(|r| r.max_retries), Some(3));
    }

    #[test]
    fn errors_name_the_job_and_the_field() {
        let err = one("a.yaml", "id: a\nretry: {max_retries: lots}\n").expect_err("bad type");
        assert!(err.starts_with("job \"a\": retry.max_retries: "), "{err}");
        let err = one("a.yaml", "id: a\ncronn: x\n").expect_err("unknown field");
        assert!(
            err.starts_with("job \"a\": ") && err.contains("cronn"),
            "{err}"
        );
        let err = one("a.json", r#"{"cron": "* * * * *"}"#).expect_err("no id");
        assert_eq!(err, "the job (it has no id): id: required");
        let err = parse(Path::new("a.yaml"), "").expect_err("empty");
        assert_eq!(err, "holds no job spec");
        let err = parse(Path::new("a.txt"), "id: a").expect_err("extension");
        assert!(err.contains("not a job file's extension"), "{err}");
        let err = one("a.yaml", "id: a\nroute_strategy: FASTEST\n").expect_err("enum");
        assert!(err.starts_with("job \"a\": route_strategy: "), "{err}");
    }
}
