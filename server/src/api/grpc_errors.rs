//! A unary request whose message does not decode answers `INVALID_ARGUMENT`.
//!
//! tonic answers such a request (bytes that are not the method's message, or a field
//! of the wrong wire type) with `INTERNAL` "failed to decode Protobuf message: …",
//! before any service code runs, as a trailers-only answer: the status in the response
//! headers. The fault is the caller's, so this layer, in front of every service,
//! rewrites exactly that answer's status to `INVALID_ARGUMENT` and keeps its message.
//! Every other answer passes untouched. (A message that fails to decode inside a
//! stream ends the stream in its trailers, which this layer does not rewrite: the only
//! client-streaming call is the executor stream, whose SDKs send what they generate.)

use http::HeaderValue;

/// How tonic starts the message of a request it could not decode, as it sends it
/// (percent-encoded) in `grpc-message`.
const DECODE_FAILURE: &str = "failed%20to%20decode%20Protobuf%20message";

/// `grpc-status` of `INTERNAL` and `INVALID_ARGUMENT`.
const INTERNAL: &str = "13";
const INVALID_ARGUMENT: &str = "3";

/// The layer: every gRPC answer through [`undecodable_is_invalid`].
pub fn layer<B>() -> tower::util::MapResponseLayer<fn(http::Response<B>) -> http::Response<B>> {
    tower::util::MapResponseLayer::new(undecodable_is_invalid)
}

/// The answer, with tonic's decode failure turned into `INVALID_ARGUMENT`.
fn undecodable_is_invalid<B>(mut res: http::Response<B>) -> http::Response<B> {
    rewrite(res.headers_mut());
    res
}

/// `INTERNAL` "failed to decode…" in trailers-only headers becomes `INVALID_ARGUMENT`.
fn rewrite(headers: &mut http::HeaderMap) {
    let undecodable = headers.get("grpc-status").is_some_and(|s| s == INTERNAL)
        && headers
            .get("grpc-message")
            .and_then(|m| m.to_str().ok())
            .is_some_and(|m| m.starts_with(DECODE_FAILURE));
    if undecodable {
        headers.insert("grpc-status", HeaderValue::from_static(INVALID_ARGUMENT));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(status: &'static str, message: &'static str) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        h.insert("grpc-status", HeaderValue::from_static(status));
        h.insert("grpc-message", HeaderValue::from_static(message));
        h
    }

    #[test]
    fn only_a_decode_failure_becomes_invalid_argument() {
        let mut h = headers(
            INTERNAL,
            "failed%20to%20decode%20Protobuf%20message:%20invalid%20wire%20type",
        );
        rewrite(&mut h);
        assert_eq!(h["grpc-status"], INVALID_ARGUMENT);
        for (status, message) in [
            (INTERNAL, "store%20data%20is%20corrupt"),
            ("5", "failed%20to%20decode%20Protobuf%20message"),
        ] {
            let mut h = headers(status, message);
            rewrite(&mut h);
            assert_eq!(h["grpc-status"], status, "{message}");
        }
        let mut ok = http::HeaderMap::new();
        rewrite(&mut ok);
        assert!(ok.is_empty());
    }
}
