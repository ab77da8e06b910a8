//! Signing admin calls as an app: the four `X-Sundial-*` headers a server checks, over
//! REST (the signature covers method, path, timestamp, nonce and body) and over gRPC
//! (the same, with METHOD `POST`, PATH the gRPC path and BODY the request message's
//! bytes as sent, so a signature made for one request cannot carry another).
//!
//! ```
//! use sundial_proto::v1 as pb;
//! use sundial_sdk::app_auth::AppSigner;
//!
//! let signer = AppSigner::from_secret("billing", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
//!     .expect("a whsec_ secret");
//! let req = signer.grpc(
//!     "/sundial.v1.JobService/GetJob",
//!     pb::GetJobRequest { job_id: "hello".into() },
//! );
//! // jobs_client.get_job(req).await
//! # assert!(req.metadata().contains_key("x-sundial-signature"));
//! ```

use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// The same four headers (and names) as a classic-scheme webhook's.
pub use crate::webhook::{HEADER_APP_ID, HEADER_NONCE, HEADER_SIGNATURE, HEADER_TIMESTAMP};

/// What an app signs: `METHOD \n PATH \n TIMESTAMP \n NONCE \n BODY`.
pub fn canonical_string(
    method: &str,
    path: &str,
    timestamp: &str,
    nonce: &str,
    body: &[u8],
) -> Vec<u8> {
    let mut s = Vec::with_capacity(
        method.len() + path.len() + timestamp.len() + nonce.len() + 4 + body.len(),
    );
    for part in [method, path, timestamp, nonce] {
        s.extend_from_slice(part.as_bytes());
        s.push(b'\n');
    }
    s.extend_from_slice(body);
    s
}

/// The `X-Sundial-Signature` value: the lowercase hex HMAC-SHA256 of the canonical
/// string, keyed with the app secret's decoded key.
pub fn signature(
    key: &[u8],
    method: &str,
    path: &str,
    timestamp: &str,
    nonce: &str,
    body: &[u8],
) -> String {
    // HMAC takes keys of any length; `new_from_slice` cannot fail for it.
    let Ok(mut mac) = <Hmac<Sha256> as KeyInit>::new_from_slice(key) else {
        unreachable!("HMAC accepts a key of any length")
    };
    mac.update(&canonical_string(method, path, timestamp, nonce, body));
    let bytes = mac.finalize().into_bytes();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Why an app secret was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AppSecretError {
    #[error("an app secret starts with \"whsec_\"")]
    MissingPrefix,
    #[error("the part after \"whsec_\" is not standard base64")]
    NotBase64,
    #[error("the key is empty")]
    Empty,
}

/// Signs requests as one app, each with the current time and a fresh random nonce.
#[derive(Clone)]
pub struct AppSigner {
    app_id: String,
    key: Vec<u8>,
}

impl std::fmt::Debug for AppSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppSigner")
            .field("app_id", &self.app_id)
            .field("key", &"<redacted>")
            .finish()
    }
}

impl AppSigner {
    /// A signer for `app_id` with an app secret as the server gives it
    /// (`whsec_<base64 key>`).
    pub fn from_secret(app_id: impl Into<String>, secret: &str) -> Result<Self, AppSecretError> {
        let b64 = secret
            .strip_prefix("whsec_")
            .ok_or(AppSecretError::MissingPrefix)?;
        let key = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|_| AppSecretError::NotBase64)?;
        if key.is_empty() {
            return Err(AppSecretError::Empty);
        }
        Ok(AppSigner {
            app_id: app_id.into(),
            key,
        })
    }

    /// The four headers (lowercase names) for a request of `method` to `path` (the
    /// request target as sent, query included) with `body`, signed now.
    pub fn headers(&self, method: &str, path: &str, body: &[u8]) -> [(&'static str, String); 4] {
        let timestamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
            .to_string();
        let nonce: String = rand::random::<[u8; 16]>()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let sig = signature(&self.key, method, path, &timestamp, &nonce, body);
        [
            (HEADER_APP_ID, self.app_id.clone()),
            (HEADER_TIMESTAMP, timestamp),
            (HEADER_NONCE, nonce),
            (HEADER_SIGNATURE, sig),
        ]
    }

    /// A unary gRPC request to the method at `path` (`/sundial.v1.JobService/GetJob`)
    /// carrying `message`, signed over the message's encoding. The client encodes the
    /// message again when it sends it and gets the same bytes: prost writes fields in
    /// order, and a map field the same way twice while it is not changed.
    pub fn grpc<M: prost::Message>(&self, path: &str, message: M) -> tonic::Request<M> {
        let body = message.encode_to_vec();
        let mut req = tonic::Request::new(message);
        for (name, value) in self.headers("POST", path, &body) {
            // Hex, digits and the app id (checked by the server): always a valid value.
            if let Ok(value) = tonic::metadata::MetadataValue::try_from(value.as_str()) {
                req.metadata_mut().insert(name, value);
            }
        }
        req
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_hmac_sha256_of_the_canonical_string() {
        // GetJobRequest { job_id: "hello" } is the bytes 0a 05 "hello". The value was
        // printed by: printf 'POST\n/sundial.v1.JobService/GetJob\n1700000000\nn-1\n\x0a\x05hello'
        //   | openssl dgst -sha256 -mac HMAC -macopt key:Jefe
        let body = prost::Message::encode_to_vec(&sundial_proto::v1::GetJobRequest {
            job_id: "hello".into(),
        });
        assert_eq!(body, b"\x0a\x05hello");
        assert_eq!(
            signature(
                b"Jefe",
                "POST",
                "/sundial.v1.JobService/GetJob",
                "1700000000",
                "n-1",
                &body
            ),
            "7bf3745a8649ce85a0a556330f29a018d3216bc852d726cf1a27852d684bebf7"
        );
    }

    #[test]
    fn secrets_must_be_whsec_base64() {
        assert_eq!(
            AppSigner::from_secret("a", "c2VjcmV0").err(),
            Some(AppSecretError::MissingPrefix)
        );
        assert_eq!(
            AppSigner::from_secret("a", "whsec_!!").err(),
            Some(AppSecretError::NotBase64)
        );
        assert_eq!(
            AppSigner::from_secret("a", "whsec_").err(),
            Some(AppSecretError::Empty)
        );
        let s = AppSigner::from_secret("a", "whsec_c2VjcmV0").expect("good secret");
        assert!(!format!("{s:?}").contains("c2VjcmV0"));
    }
}
