//! A REST client for the tests that checks every answer against the server's own
//! OpenAPI document: the status must be one the operation documents, and the body must
//! validate against the schema documented for that status (JSON Schema 2020-12, with
//! the `jsonschema` crate).

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// A response header's value, if present and visible ASCII.
pub fn header(resp: &reqwest::Response, name: &str) -> Option<String> {
    resp.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// The media type of a streaming route's answer.
pub const NDJSON: &str = "application/x-ndjson";

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
        let mut req = self.request(method, path)?;
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

    /// `method path` with the client's bearer token, if any.
    fn request(&self, method: &str, path: &str) -> Result<reqwest::RequestBuilder> {
        let m = reqwest::Method::from_bytes(method.as_bytes())?;
        let req = self.http.request(m, format!("{}{path}", self.base));
        Ok(match &self.bearer {
            Some(t) => req.bearer_auth(t),
            None => req,
        })
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

    /// Sends `GET path` to a streaming route and answers the status and a reader of
    /// its lines, each checked against the document as it is read.
    pub async fn lines(&self, path: &str) -> Result<(u16, Lines<'_>)> {
        let resp = self.request("GET", path)?.send().await?;
        let status = resp.status().as_u16();
        let content_type = header(&resp, "content-type").unwrap_or_default();
        if status == 200 && content_type != NDJSON {
            bail!("GET {path}: 200 as {content_type:?}, not {NDJSON}");
        }
        Ok((
            status,
            Lines {
                client: self,
                path: path.to_owned(),
                resp,
                buf: Vec::new(),
            },
        ))
    }

    fn check(&self, method: &str, path: &str, status: u16, value: &Value) -> Result<()> {
        self.check_as(method, path, status, "application/json", value)
    }

    fn check_as(
        &self,
        method: &str,
        path: &str,
        status: u16,
        media: &str,
        value: &Value,
    ) -> Result<()> {
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
        let mut schema = response["content"][media]["schema"].clone();
        if schema.is_null() {
            bail!("{status} of {method} {template} documents no {media} body");
        }
        if media == NDJSON && value.get("error").is_some() {
            // A stream that failed midway ends with one error line.
            schema = serde_json::json!({"$ref": "#/components/schemas/Error"});
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

/// The lines of a streaming answer.
pub struct Lines<'a> {
    client: &'a RestClient,
    path: String,
    resp: reqwest::Response,
    buf: Vec<u8>,
}

impl Lines<'_> {
    /// The next line as JSON (checked against the document), or `None` at the end.
    pub async fn next(&mut self) -> Result<Option<Value>> {
        loop {
            if let Some(at) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=at).collect();
                let value: Value = serde_json::from_slice(&line)
                    .with_context(|| format!("GET {}: a line that is not JSON", self.path))?;
                self.client
                    .check_as("GET", &self.path, 200, NDJSON, &value)
                    .with_context(|| format!("GET {}: line {value}", self.path))?;
                return Ok(Some(value));
            }
            match self.resp.chunk().await? {
                Some(chunk) => self.buf.extend_from_slice(&chunk),
                None if self.buf.is_empty() => return Ok(None),
                None => bail!("GET {}: the stream ended inside a line", self.path),
            }
        }
    }

    /// Every remaining line.
    pub async fn rest(mut self) -> Result<Vec<Value>> {
        let mut out = Vec::new();
        while let Some(v) = self.next().await? {
            out.push(v);
        }
        Ok(out)
    }
}
