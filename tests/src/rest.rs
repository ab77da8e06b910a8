//! A REST client for the tests that checks every answer against the server's own
//! OpenAPI document: the status must be one the operation documents, and the body must
//! validate against the schema documented for that status (JSON Schema 2020-12, with
//! the `jsonschema` crate).

use anyhow::{Context, Result, bail};
use serde_json::Value;

pub struct RestClient {
    pub http: reqwest::Client,
    pub base: String,
    bearer: Option<String>,
    doc: Value,
}

impl RestClient {
    /// A client of the server at `base` (`http://host:port`), reading its document.
    pub async fn new(base: &str, bearer: Option<&str>) -> Result<Self> {
        let http = reqwest::Client::new();
        let mut req = http.get(format!("{base}/api/v1/openapi.json"));
        if let Some(t) = bearer {
            req = req.bearer_auth(t);
        }
        let doc: Value = req
            .send()
            .await?
            .error_for_status()
            .context("the OpenAPI document")?
            .json()
            .await?;
        Ok(Self {
            http,
            base: base.to_owned(),
            bearer: bearer.map(str::to_owned),
            doc,
        })
    }

    pub fn document(&self) -> &Value {
        &self.doc
    }

    /// Sends `method path` (with `?query` if any) and a JSON body if given; answers
    /// the status and the JSON body after checking both against the document.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<(u16, Value)> {
        let m = reqwest::Method::from_bytes(method.as_bytes())?;
        let mut req = self.http.request(m, format!("{}{path}", self.base));
        if let Some(t) = &self.bearer {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await?;
        let status = resp.status().as_u16();
        let text = resp.text().await?;
        let value: Value = serde_json::from_str(&text)
            .with_context(|| format!("{method} {path}: {status} not JSON: {text:?}"))?;
        self.check(method, path, status, &value)
            .with_context(|| format!("{method} {path} answered {status} {value}"))?;
        Ok((status, value))
    }

    /// As [`Self::call`], failing unless the status is `want`.
    pub async fn expect(
        &self,
        want: u16,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value> {
        let (status, value) = self.call(method, path, body).await?;
        if status != want {
            bail!("{method} {path}: expected {want}, got {status} {value}");
        }
        Ok(value)
    }

    /// The documented path template `path` matches (segments in braces match any).
    pub fn template(&self, path: &str) -> Option<String> {
        let path = path.split('?').next().unwrap_or_default();
        let segments: Vec<&str> = path.split('/').collect();
        self.doc["paths"].as_object()?.keys().find_map(|t| {
            let ts: Vec<&str> = t.split('/').collect();
            let fits = ts.len() == segments.len()
                && ts
                    .iter()
                    .zip(&segments)
                    .all(|(t, s)| t == s || (t.starts_with('{') && t.ends_with('}')));
            fits.then(|| t.clone())
        })
    }

    fn check(&self, method: &str, path: &str, status: u16, value: &Value) -> Result<()> {
        let template = self.template(path).context("no documented path")?;
        let op = &self.doc["paths"][&template][method.to_ascii_lowercase()];
        let mut response = op["responses"]
            .get(status.to_string())
            .with_context(|| format!("{status} is not documented for {method} {template}"))?
            .clone();
        if let Some(target) = response.get("$ref").and_then(Value::as_str) {
            response = self
                .doc
                .pointer(target.trim_start_matches('#'))
                .cloned()
                .with_context(|| format!("{target} does not resolve"))?;
        }
        let schema = response["content"]["application/json"]["schema"].clone();
        if schema.is_null() {
            bail!("{status} of {method} {template} documents no JSON body");
        }
        let mut root = self.doc.clone();
        root["$schema"] = Value::from("https://json-schema.org/draft/2020-12/schema");
        let Some(obj) = root.as_object_mut() else {
            bail!("the document is not an object");
        };
        for (k, v) in schema.as_object().into_iter().flatten() {
            obj.insert(k.clone(), v.clone());
        }
        let validator = jsonschema::validator_for(&root)
            .map_err(|e| anyhow::anyhow!("the documented schema does not compile: {e}"))?;
        let errors: Vec<String> = validator
            .iter_errors(value)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        if !errors.is_empty() {
            bail!(
                "does not match its documented schema: {}",
                errors.join("; ")
            );
        }
        Ok(())
    }
}
