//! Signing and verification of Sundial webhooks. This module owns the two header
//! schemes every delivery carries, the [`Secret`] format they share, and the
//! receiver-side checks: signature, timestamp tolerance and replay. The server signs
//! with the same functions ([`headers`], [`sign_classic`], [`sign_standard`]) that
//! receivers verify with, so the two cannot drift apart.
//!
//! Every delivery carries both schemes:
//!
//! - **Standard Webhooks** (<https://www.standardwebhooks.com/>), so stock verifier
//!   libraries work: `webhook-id` (the run's schedule_id, the same on every retry),
//!   `webhook-timestamp` (unix seconds) and `webhook-signature`, space-separated
//!   `v1,<base64 HMAC-SHA256 over "{id}.{timestamp}.{body}">`.
//! - **Classic**: `X-Sundial-App-Id`, `X-Sundial-Timestamp` (unix seconds),
//!   `X-Sundial-Nonce` and `X-Sundial-Signature`, comma-separated lowercase hex
//!   HMAC-SHA256 over the exact bytes `body ‖ timestamp ‖ nonce` (no separators). The
//!   app id is not signed.
//!
//! While a secret is being rotated two are active, and each scheme lists one signature
//! per active secret; a receiver accepts a delivery if any of its secrets matches any
//! listed signature. Both schemes use the same key: the bytes of a `whsec_<base64>`
//! secret after base64 decoding.
//!
//! The server signs every delivery attempt afresh, with a new timestamp and nonce, so a
//! retry is never mistaken for a replay; the idempotency key that stays the same across
//! retries is `webhook-id`.
//!
//! ```
//! use sundial_sdk::webhook::{self, MemoryNonceCache, Secret, Verifier};
//!
//! let secret = Secret::generate();
//! let body = br#"{"schedule_id":"invoice:1700000000000","status":"SUCCEEDED"}"#;
//! let now = 1_700_000_000;
//!
//! // The sender's side.
//! let mut request = http::HeaderMap::new();
//! for (name, value) in webhook::headers(
//!     "billing",
//!     &[secret.clone()],
//!     "invoice:1700000000000",
//!     now,
//!     "5f2b9c0e",
//!     body,
//! ) {
//!     request.insert(name, value.parse().expect("header values are visible ASCII"));
//! }
//!
//! // The receiver's side.
//! let verifier = Verifier::new(secret)
//!     .nonce_cache(MemoryNonceCache::default())
//!     .clock(move || now);
//! let verified = verifier.verify(&request, body).expect("signed above");
//! assert_eq!(verified.id.as_deref(), Some("invoice:1700000000000"));
//! ```

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, KeyInit, Mac};
use http::HeaderMap;
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Classic scheme: the sending app's id (not covered by the signature).
pub const HEADER_APP_ID: &str = "x-sundial-app-id";
/// Classic scheme: unix seconds when this attempt was signed.
pub const HEADER_TIMESTAMP: &str = "x-sundial-timestamp";
/// Classic scheme: a value unique to this attempt.
pub const HEADER_NONCE: &str = "x-sundial-nonce";
/// Classic scheme: comma-separated lowercase hex signatures, one per active secret.
pub const HEADER_SIGNATURE: &str = "x-sundial-signature";
/// Standard Webhooks: the message id, the run's schedule_id.
pub const HEADER_WEBHOOK_ID: &str = "webhook-id";
/// Standard Webhooks: unix seconds when this attempt was signed.
pub const HEADER_WEBHOOK_TIMESTAMP: &str = "webhook-timestamp";
/// Standard Webhooks: space-separated `v1,<base64>` signatures, one per active secret.
pub const HEADER_WEBHOOK_SIGNATURE: &str = "webhook-signature";

/// How far a delivery's timestamp may be from the receiver's clock, either way,
/// unless [`Verifier::tolerance`] says otherwise.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(5 * 60);

const SECRET_PREFIX: &str = "whsec_";
/// Key lengths Standard Webhooks allows: 24 bytes (192 bits) to 64 bytes (512 bits).
const SECRET_BYTES: std::ops::RangeInclusive<usize> = 24..=64;
const GENERATED_SECRET_BYTES: usize = 32;
const SIGNATURE_VERSION: &str = "v1";

/// An HMAC key shared by the server and one receiver. It parses from and displays as
/// the Standard Webhooks form `whsec_<base64 of the key>` (so `Display` reveals it:
/// never log it that way); its `Debug` never shows it.
#[derive(Clone)]
pub struct Secret {
    key: Vec<u8>,
}

/// Why a string is not a webhook secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("a webhook secret starts with \"whsec_\"")]
    MissingPrefix,
    /// Says where the base64 is broken without echoing any of the secret's characters.
    #[error("the part after \"whsec_\" is not standard base64: {0}")]
    NotBase64(String),
    #[error("the key is {0} bytes; a webhook secret's key has 24 to 64 bytes")]
    BadLength(usize),
}

impl Secret {
    /// A new secret of 32 random bytes from the thread-local CSPRNG (seeded by the OS).
    pub fn generate() -> Secret {
        Secret {
            key: rand::random::<[u8; GENERATED_SECRET_BYTES]>().to_vec(),
        }
    }

    /// A secret from raw key bytes (24 to 64 of them).
    pub fn from_bytes(key: impl Into<Vec<u8>>) -> Result<Secret, SecretError> {
        let key = key.into();
        if !SECRET_BYTES.contains(&key.len()) {
            return Err(SecretError::BadLength(key.len()));
        }
        Ok(Secret { key })
    }

    /// The raw key bytes: the HMAC key of both schemes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.key
    }

    fn mac(&self) -> HmacSha256 {
        // HMAC is defined for keys of any length; this cannot fail.
        HmacSha256::new_from_slice(&self.key).expect("HMAC takes a key of any length")
    }
}

impl FromStr for Secret {
    type Err = SecretError;

    /// Parses `whsec_<base64>`; surrounding whitespace (a trailing newline from a file
    /// or an environment variable) is ignored.
    fn from_str(s: &str) -> Result<Secret, SecretError> {
        let encoded = s
            .trim()
            .strip_prefix(SECRET_PREFIX)
            .ok_or(SecretError::MissingPrefix)?;
        let key = BASE64.decode(encoded).map_err(|e| {
            SecretError::NotBase64(match e {
                base64::DecodeError::InvalidByte(at, _) => format!("bad character at offset {at}"),
                base64::DecodeError::InvalidLength(n) => {
                    format!("{n} symbols is not a valid length")
                }
                base64::DecodeError::InvalidLastSymbol(at, _) => {
                    format!("bad last character at offset {at}")
                }
                base64::DecodeError::InvalidPadding => "bad padding".to_owned(),
            })
        })?;
        Secret::from_bytes(key)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SECRET_PREFIX}{}", BASE64.encode(&self.key))
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// The classic `X-Sundial-Signature` value: one lowercase hex HMAC-SHA256 over
/// `body ‖ timestamp ‖ nonce` per secret, comma-separated (empty with no secrets).
pub fn sign_classic(secrets: &[Secret], body: &[u8], timestamp: i64, nonce: &str) -> String {
    let timestamp = timestamp.to_string();
    secrets
        .iter()
        .map(|secret| {
            hex(&classic_mac(secret, body, &timestamp, nonce)
                .finalize()
                .into_bytes())
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The Standard Webhooks `webhook-signature` value: one `v1,<base64 HMAC-SHA256 over
/// "{id}.{timestamp}.{body}">` per secret, space-separated (empty with no secrets).
pub fn sign_standard(secrets: &[Secret], id: &str, timestamp: i64, body: &[u8]) -> String {
    let timestamp = timestamp.to_string();
    secrets
        .iter()
        .map(|secret| {
            let tag = standard_mac(secret, id, &timestamp, body)
                .finalize()
                .into_bytes();
            format!("{SIGNATURE_VERSION},{}", BASE64.encode(tag))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Every header of one delivery attempt, both schemes, names in lowercase (HTTP
/// header names are case-insensitive). `id` is the schedule_id; `timestamp` (unix
/// seconds) and `nonce` must be new for every attempt.
pub fn headers(
    app_id: &str,
    secrets: &[Secret],
    id: &str,
    timestamp: i64,
    nonce: &str,
    body: &[u8],
) -> Vec<(&'static str, String)> {
    vec![
        (HEADER_APP_ID, app_id.to_owned()),
        (HEADER_TIMESTAMP, timestamp.to_string()),
        (HEADER_NONCE, nonce.to_owned()),
        (
            HEADER_SIGNATURE,
            sign_classic(secrets, body, timestamp, nonce),
        ),
        (HEADER_WEBHOOK_ID, id.to_owned()),
        (HEADER_WEBHOOK_TIMESTAMP, timestamp.to_string()),
        (
            HEADER_WEBHOOK_SIGNATURE,
            sign_standard(secrets, id, timestamp, body),
        ),
    ]
}

/// The MAC state after the classic signed bytes; `timestamp` and `nonce` exactly as sent.
fn classic_mac(secret: &Secret, body: &[u8], timestamp: &str, nonce: &str) -> HmacSha256 {
    secret
        .mac()
        .chain_update(body)
        .chain_update(timestamp)
        .chain_update(nonce)
}

/// The MAC state after the Standard Webhooks signed content `{id}.{timestamp}.{body}`.
fn standard_mac(secret: &Secret, id: &str, timestamp: &str, body: &[u8]) -> HmacSha256 {
    secret
        .mac()
        .chain_update(id)
        .chain_update(".")
        .chain_update(timestamp)
        .chain_update(".")
        .chain_update(body)
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

/// Hex digits (either case) to bytes; `None` if `s` is not an even number of them.
fn unhex(s: &str) -> Option<Vec<u8>> {
    fn nibble(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }
    if !s.len().is_multiple_of(2) {
        return None;
    }
    s.as_bytes()
        .chunks_exact(2)
        .map(|pair| Some(nibble(pair[0])? << 4 | nibble(pair[1])?))
        .collect()
}

/// Remembers nonces to refuse a delivery seen before. Shared by every request a
/// receiver handles, so it must be cheap and thread-safe; a store shared by several
/// receiver processes (Redis `SET NX EX`, a database unique key) makes replay
/// protection hold across all of them.
pub trait NonceCache: Send + Sync {
    /// Records `nonce` for at least `ttl` and says whether this is the first time it
    /// was seen (`true`) or a replay (`false`), atomically.
    fn check_and_remember(&self, nonce: &str, ttl: Duration) -> bool;
}

impl<T: NonceCache + ?Sized> NonceCache for Arc<T> {
    fn check_and_remember(&self, nonce: &str, ttl: Duration) -> bool {
        (**self).check_and_remember(nonce, ttl)
    }
}

/// A [`NonceCache`] in this process's memory: entries expire after their ttl, and at
/// most `capacity` are kept. When it is full the entry nearest to expiry is dropped
/// first: it belongs to the oldest delivery, whose timestamp leaves the verifier's
/// tolerance before any other's, so forgetting it opens the smallest replay window.
/// (A full cache must not turn away the server's fresh deliveries.) Size it for the
/// peak delivery rate times the ttl.
#[derive(Debug)]
pub struct MemoryNonceCache {
    capacity: usize,
    entries: Mutex<Entries>,
}

#[derive(Debug, Default)]
struct Entries {
    /// Nonce → when it may be forgotten.
    expiry_of: HashMap<String, Instant>,
    /// The same entries ordered by expiry, to drop the expired and the oldest first.
    by_expiry: BTreeSet<(Instant, String)>,
}

impl MemoryNonceCache {
    /// Remembers nonces until their ttl passes, at most `capacity` of them (at least 1).
    pub fn new(capacity: usize) -> MemoryNonceCache {
        MemoryNonceCache {
            capacity: capacity.max(1),
            entries: Mutex::new(Entries::default()),
        }
    }

    /// How many nonces are remembered now (expired ones may still count until the
    /// next check drops them).
    pub fn len(&self) -> usize {
        self.lock().expiry_of.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        // The map stays consistent even if a holder panicked: each step below leaves
        // both indexes in agreement.
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn check_and_remember_at(&self, nonce: &str, ttl: Duration, now: Instant) -> bool {
        let mut entries = self.lock();
        while let Some(first) = entries.by_expiry.first() {
            if first.0 > now {
                break;
            }
            if let Some((_, gone)) = entries.by_expiry.pop_first() {
                entries.expiry_of.remove(&gone);
            }
        }
        if entries.expiry_of.contains_key(nonce) {
            return false;
        }
        while entries.expiry_of.len() >= self.capacity {
            match entries.by_expiry.pop_first() {
                Some((_, oldest)) => {
                    entries.expiry_of.remove(&oldest);
                }
                None => break,
            }
        }
        // A ttl beyond a year is a mistake, and capping it keeps the addition in range.
        let expiry = now
            .checked_add(ttl.min(Duration::from_secs(365 * 24 * 3600)))
            .unwrap_or(now);
        entries.expiry_of.insert(nonce.to_owned(), expiry);
        entries.by_expiry.insert((expiry, nonce.to_owned()));
        true
    }
}

impl Default for MemoryNonceCache {
    /// Room for 100 000 nonces.
    fn default() -> MemoryNonceCache {
        MemoryNonceCache::new(100_000)
    }
}

impl NonceCache for MemoryNonceCache {
    fn check_and_remember(&self, nonce: &str, ttl: Duration) -> bool {
        self.check_and_remember_at(nonce, ttl, Instant::now())
    }
}

/// Which header scheme a delivery was verified by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// `X-Sundial-*` headers.
    Classic,
    /// `webhook-*` headers (Standard Webhooks).
    Standard,
}

/// What a verified delivery's signed headers say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub scheme: Scheme,
    /// `webhook-id`, the schedule_id, under the standard scheme (which signs it);
    /// `None` under the classic scheme, whose body carries the schedule_id.
    pub id: Option<String>,
    /// When the attempt was signed, unix seconds.
    pub timestamp: i64,
    /// `X-Sundial-Nonce` under the classic scheme; `None` under the standard one.
    pub nonce: Option<String>,
}

/// Why a delivery was refused. A receiver answers any of them with 401; the server
/// retries later, and a retry is signed afresh.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("neither {HEADER_WEBHOOK_SIGNATURE} nor {HEADER_SIGNATURE} is present")]
    Unsigned,
    #[error("missing header {0}")]
    MissingHeader(&'static str),
    #[error("header {0} is empty or not visible ASCII")]
    MalformedHeader(&'static str),
    #[error("header {header} is not unix seconds: {value:?}")]
    BadTimestamp { header: &'static str, value: String },
    #[error(
        "timestamp {timestamp} is {} s {} now ({now}); the tolerance is {tolerance} s",
        timestamp.abs_diff(*now),
        if timestamp < now { "before" } else { "after" }
    )]
    TimestampOutsideTolerance {
        timestamp: i64,
        now: i64,
        tolerance: u64,
    },
    #[error("no signature matches any of the secrets")]
    BadSignature,
    #[error("this delivery was seen before (replay)")]
    ReplayedNonce,
}

/// Checks deliveries against one or more active secrets. Cheap to clone; clones share
/// the nonce cache.
#[derive(Clone)]
pub struct Verifier {
    /// At least one; two while a secret is rotated.
    secrets: Vec<Secret>,
    tolerance: Duration,
    nonces: Option<Arc<dyn NonceCache>>,
    /// Unix seconds now; a test or a caller with its own clock replaces it.
    clock: Arc<dyn Fn() -> i64 + Send + Sync>,
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verifier")
            .field("secrets", &self.secrets)
            .field("tolerance", &self.tolerance)
            .field("nonce_cache", &self.nonces.is_some())
            .finish_non_exhaustive()
    }
}

impl Verifier {
    /// Accepts deliveries signed with `secret`, within [`DEFAULT_TOLERANCE`] of the
    /// system clock, with no replay check.
    pub fn new(secret: Secret) -> Verifier {
        Verifier {
            secrets: vec![secret],
            tolerance: DEFAULT_TOLERANCE,
            nonces: None,
            clock: Arc::new(system_unix_now),
        }
    }

    /// Also accepts deliveries signed with `secret`: during a rotation, the other one.
    pub fn also_accept(mut self, secret: Secret) -> Verifier {
        self.secrets.push(secret);
        self
    }

    /// How far a timestamp may be from now, in the past or the future (whole seconds).
    pub fn tolerance(mut self, tolerance: Duration) -> Verifier {
        self.tolerance = tolerance;
        self
    }

    /// Refuses a delivery seen before. Each verified delivery is remembered for twice
    /// the tolerance, so it cannot come back before its timestamp is refused anyway.
    /// The classic scheme remembers its nonce; the standard scheme, which has none,
    /// remembers `"{webhook-id}.{webhook-timestamp}"`. Only deliveries whose signature
    /// checked out are remembered, so a forger cannot fill the cache.
    pub fn nonce_cache(mut self, cache: impl NonceCache + 'static) -> Verifier {
        self.nonces = Some(Arc::new(cache));
        self
    }

    /// Where "now" (unix seconds) comes from; the system clock by default.
    pub fn clock(mut self, now: impl Fn() -> i64 + Send + Sync + 'static) -> Verifier {
        self.clock = Arc::new(now);
        self
    }

    /// Verifies a delivery by the standard scheme when `webhook-signature` is present
    /// (it also signs `webhook-id`, the idempotency key), otherwise by the classic
    /// scheme when `X-Sundial-Signature` is. It never falls back from one scheme to the
    /// other: a delivery whose standard signature fails is refused.
    pub fn verify(&self, headers: &HeaderMap, body: &[u8]) -> Result<Verified, VerifyError> {
        if headers.contains_key(HEADER_WEBHOOK_SIGNATURE) {
            self.verify_standard(headers, body)
        } else if headers.contains_key(HEADER_SIGNATURE) {
            self.verify_classic(headers, body)
        } else {
            Err(VerifyError::Unsigned)
        }
    }

    /// Verifies the Standard Webhooks headers only.
    pub fn verify_standard(
        &self,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<Verified, VerifyError> {
        let id = header(headers, HEADER_WEBHOOK_ID)?;
        let raw_timestamp = header(headers, HEADER_WEBHOOK_TIMESTAMP)?;
        let signatures = header(headers, HEADER_WEBHOOK_SIGNATURE)?;
        let timestamp = self.check_timestamp(HEADER_WEBHOOK_TIMESTAMP, raw_timestamp)?;
        let candidates: Vec<Vec<u8>> = signatures
            .split(' ')
            .filter_map(|token| token.split_once(','))
            .filter(|(version, _)| *version == SIGNATURE_VERSION)
            .filter_map(|(_, encoded)| BASE64.decode(encoded).ok())
            .collect();
        self.check_signature(&candidates, |secret| {
            standard_mac(secret, id, raw_timestamp, body)
        })?;
        // Sundial sends a fresh classic nonce with every attempt: with it, two attempts
        // within one second are told apart; without it, id and timestamp are the key.
        match header(headers, HEADER_NONCE) {
            Ok(nonce) => self.check_replay(&format!("{id}.{raw_timestamp}.{nonce}"))?,
            Err(_) => self.check_replay(&format!("{id}.{raw_timestamp}"))?,
        }
        Ok(Verified {
            scheme: Scheme::Standard,
            id: Some(id.to_owned()),
            timestamp,
            nonce: None,
        })
    }

    /// Verifies the classic `X-Sundial-*` headers only.
    pub fn verify_classic(
        &self,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<Verified, VerifyError> {
        let raw_timestamp = header(headers, HEADER_TIMESTAMP)?;
        let nonce = header(headers, HEADER_NONCE)?;
        let signatures = header(headers, HEADER_SIGNATURE)?;
        let timestamp = self.check_timestamp(HEADER_TIMESTAMP, raw_timestamp)?;
        let candidates: Vec<Vec<u8>> = signatures
            .split(',')
            .filter_map(|token| unhex(token.trim()))
            .collect();
        self.check_signature(&candidates, |secret| {
            classic_mac(secret, body, raw_timestamp, nonce)
        })?;
        self.check_replay(nonce)?;
        Ok(Verified {
            scheme: Scheme::Classic,
            id: None,
            timestamp,
            nonce: Some(nonce.to_owned()),
        })
    }

    fn check_timestamp(&self, name: &'static str, raw: &str) -> Result<i64, VerifyError> {
        let bad = || VerifyError::BadTimestamp {
            header: name,
            value: raw.to_owned(),
        };
        if !raw.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let timestamp: i64 = raw.parse().map_err(|_| bad())?;
        let now = (self.clock)();
        let tolerance = self.tolerance.as_secs();
        if timestamp.abs_diff(now) > tolerance {
            return Err(VerifyError::TimestampOutsideTolerance {
                timestamp,
                now,
                tolerance,
            });
        }
        Ok(timestamp)
    }

    /// Accepts if any secret's MAC equals any candidate, compared in constant time.
    fn check_signature(
        &self,
        candidates: &[Vec<u8>],
        mac_of: impl Fn(&Secret) -> HmacSha256,
    ) -> Result<(), VerifyError> {
        for secret in &self.secrets {
            let mac = mac_of(secret);
            if candidates
                .iter()
                .any(|candidate| mac.clone().verify_slice(candidate).is_ok())
            {
                return Ok(());
            }
        }
        Err(VerifyError::BadSignature)
    }

    fn check_replay(&self, key: &str) -> Result<(), VerifyError> {
        match &self.nonces {
            Some(cache) if !cache.check_and_remember(key, self.tolerance.saturating_mul(2)) => {
                Err(VerifyError::ReplayedNonce)
            }
            _ => Ok(()),
        }
    }
}

/// A required header's value: present, visible ASCII and not empty.
fn header<'a>(headers: &'a HeaderMap, name: &'static str) -> Result<&'a str, VerifyError> {
    let value = headers.get(name).ok_or(VerifyError::MissingHeader(name))?;
    match value.to_str() {
        Ok(text) if !text.is_empty() => Ok(text),
        _ => Err(VerifyError::MalformedHeader(name)),
    }
}

fn system_unix_now() -> i64 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(since) => i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
        // A clock before 1970 is broken; every timestamp will be out of tolerance.
        Err(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The README's worked example ("Verifying a delivery, in any language") is what
    /// the signing functions produce, and the README shows exactly these figures.
    #[test]
    fn the_readmes_worked_example_is_what_is_signed() {
        let secret: Secret = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="
            .parse()
            .expect("a valid secret");
        assert_eq!(secret.key, b"0123456789abcdef0123456789abcdef");
        let body = br#"{"schedule_id":"hello@1764680400000","status":"SUCCEEDED"}"#;
        let (id, timestamp, nonce) = (
            "hello@1764680400000",
            1_764_680_401,
            "0193a5f0c2d47c3e9b1f2a6d8e4c5b7a",
        );
        let standard = sign_standard(std::slice::from_ref(&secret), id, timestamp, body);
        let classic = sign_classic(std::slice::from_ref(&secret), body, timestamp, nonce);
        assert_eq!(standard, "v1,dBeCNEsmEaMuiiC5+x3dXT/OeA7k3Y37nx+SNmZUiik=");
        assert_eq!(
            classic,
            "0995e3a800721e0d2373d4cf4f3f07dbfbf2c7076997a339d56a6fa214960918"
        );
        let readme = include_str!("../../README.md");
        for shown in [
            format!("webhook-signature: {standard}"),
            format!("X-Sundial-Signature: {classic}"),
            format!("body `{}`", std::str::from_utf8(body).expect("ascii")),
            format!("`{timestamp}`, nonce `{nonce}`"),
        ] {
            assert!(readme.contains(&shown), "README.md does not show {shown:?}");
        }
        // Two secrets (a rotation): one signature each, in the README's separators.
        let other = Secret::generate();
        let both = [secret, other];
        assert_eq!(
            sign_standard(&both, id, timestamp, body).split(' ').count(),
            2
        );
        assert_eq!(
            sign_classic(&both, body, timestamp, nonce)
                .split(',')
                .count(),
            2
        );
    }

    #[test]
    fn hex_round_trips_and_refuses_non_hex() {
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(unhex(&hex(&bytes)), Some(bytes));
        assert_eq!(unhex("0A"), Some(vec![10]));
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
        assert_eq!(unhex("é0"), None);
        assert_eq!(unhex(""), Some(vec![]));
    }

    #[test]
    fn memory_nonce_cache_forgets_after_ttl() {
        let cache = MemoryNonceCache::new(10);
        let t0 = Instant::now();
        let ttl = Duration::from_secs(60);
        assert!(cache.check_and_remember_at("a", ttl, t0));
        assert!(!cache.check_and_remember_at("a", ttl, t0 + Duration::from_secs(59)));
        assert!(cache.check_and_remember_at("a", ttl, t0 + Duration::from_secs(60)));
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn memory_nonce_cache_drops_the_oldest_when_full() {
        let cache = MemoryNonceCache::new(2);
        let t0 = Instant::now();
        let ttl = Duration::from_secs(60);
        let at = |s| t0 + Duration::from_secs(s);
        assert!(cache.check_and_remember_at("a", ttl, at(0)));
        assert!(cache.check_and_remember_at("b", ttl, at(1)));
        assert!(cache.check_and_remember_at("c", ttl, at(2)));
        assert_eq!(cache.len(), 2);
        // "a" was dropped to make room; "b" and "c" are still remembered.
        assert!(!cache.check_and_remember_at("b", ttl, at(3)));
        assert!(!cache.check_and_remember_at("c", ttl, at(3)));
        assert!(cache.check_and_remember_at("a", ttl, at(3)));
    }
}
