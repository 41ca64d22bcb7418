//! gRPC on the data ports (the activator's and the sidecar's): which requests are gRPC calls,
//! their deadline (`grpc-timeout`), and how an answer of thaw's own is put to a gRPC client.
//!
//! A gRPC call is an HTTP/2 request whose `content-type` is `application/grpc` or one of its
//! `application/grpc+…` / `application/grpc-…` forms (gRPC's wire protocol is HTTP/2 only; a
//! gRPC-Web request over HTTP/1.1 is served as any HTTP/1.1 request). Nothing here runs for an
//! HTTP/1.x request beyond a comparison of its version.
//!
//! thaw's own errors go to a gRPC client as gRPC errors: an HTTP 200 "trailers-only" response
//! (one HEADERS frame with `content-type: application/grpc`, `grpc-status` and `grpc-message`,
//! ending the stream, no body), the status mapped from the HTTP status thaw would answer with
//! ([`code_for`]; the caller may know better, as the activator does for a revision that did not
//! become ready) and the message the same reason text as the HTTP answer's body.

use bytes::{BufMut, BytesMut};
use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Response, StatusCode, Version};
use tokio::time::Duration;

use super::fields::HeadersRef;

/// `grpc-status`.
pub const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// `grpc-message`.
pub const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
/// `grpc-timeout`.
pub const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// gRPC status codes thaw answers with (gRPC's `statuscodes.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Code {
    Unknown = 2,
    DeadlineExceeded = 4,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    Unauthenticated = 16,
}

/// What the data port knows of a gRPC call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    /// The client's deadline (`grpc-timeout`), when it sent a valid one.
    pub timeout: Option<Duration>,
}

impl Call {
    /// `total` shortened to the call's deadline, if it has a shorter one.
    pub fn bound(call: Option<Self>, total: Duration) -> Duration {
        match call.and_then(|c| c.timeout) {
            Some(t) => t.min(total),
            None => total,
        }
    }
}

/// The request as a gRPC call, or `None` (every HTTP/1.x request, at the cost of comparing its
/// version). An invalid `grpc-timeout` is ignored: the call runs under the revision's timeout,
/// and the field goes on to the application, which decides.
pub fn call(version: Version, fields: HeadersRef<'_>) -> Option<Call> {
    if version != Version::HTTP_2 {
        return None;
    }
    // HTTP/2 requests are hyper's, in a map.
    let HeadersRef::Map(map) = fields else {
        return None;
    };
    if !is_grpc_content_type(map.get(header::CONTENT_TYPE)?.as_bytes()) {
        return None;
    }
    Some(Call {
        timeout: map
            .get(GRPC_TIMEOUT)
            .and_then(|v| parse_timeout(v.as_bytes())),
    })
}

/// Whether the request is a gRPC call ([`call`]).
pub fn is_call(version: Version, fields: HeadersRef<'_>) -> bool {
    call(version, fields).is_some()
}

/// `application/grpc`, alone or followed by `+format`, `-variant` or `;parameters`.
fn is_grpc_content_type(v: &[u8]) -> bool {
    const GRPC: &[u8] = b"application/grpc";
    v.len() >= GRPC.len()
        && v[..GRPC.len()].eq_ignore_ascii_case(GRPC)
        && matches!(v.get(GRPC.len()), None | Some(b'+' | b'-' | b';'))
}

/// A `grpc-timeout` value (gRPC over HTTP/2: `TimeoutValue TimeoutUnit`, at most 8 ASCII
/// digits, unit `H`, `M`, `S`, `m`, `u` or `n`); `None` when it is not one.
pub fn parse_timeout(v: &[u8]) -> Option<Duration> {
    let (unit, digits) = v.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = digits
        .iter()
        .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// `d` as a `grpc-timeout` value: whole milliseconds (at least 1), or whole seconds when that
/// takes more than 8 digits.
pub fn timeout_value(d: Duration) -> HeaderValue {
    let ms = d.as_millis().max(1);
    let text = if ms <= 99_999_999 {
        format!("{ms}m")
    } else {
        format!("{}S", d.as_secs().min(99_999_999))
    };
    HeaderValue::from_str(&text).expect("digits and a unit")
}

/// The gRPC status for an answer thaw would give with `status` (gRPC's "HTTP to gRPC Status
/// Code Mapping", with thaw's own choices where it is silent or where thaw knows more: 429
/// and the header limits are resource exhaustion, 504 and 408 a deadline, 404 and 501 a
/// method not served here).
pub fn code_for(status: StatusCode) -> Code {
    match status.as_u16() {
        400 => Code::Internal,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 | 501 => Code::Unimplemented,
        408 | 504 => Code::DeadlineExceeded,
        413 | 429 | 431 => Code::ResourceExhausted,
        502 | 503 => Code::Unavailable,
        _ => Code::Unknown,
    }
}

/// `text` as a `grpc-message` value: percent-encoded as gRPC requires (every byte outside
/// printable ASCII, and `%`).
pub fn message_value(text: &str) -> HeaderValue {
    let text = text.trim_end();
    let mut out = BytesMut::with_capacity(text.len());
    for &b in text.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.put_u8(b);
        } else {
            out.put_slice(format!("%{b:02X}").as_bytes());
        }
    }
    HeaderValue::from_maybe_shared(out.freeze()).expect("printable ASCII")
}

/// The fields that end a call with `code` and `message` (as trailers, or in a trailers-only
/// answer's head).
pub fn status_fields(code: Code, message: &str) -> HeaderMap {
    let mut h = HeaderMap::with_capacity(3);
    h.insert(GRPC_STATUS, HeaderValue::from(u16::from(code as u8)));
    h.insert(GRPC_MESSAGE, message_value(message));
    h
}

/// A trailers-only gRPC answer: HTTP 200, `content-type: application/grpc`, `code` with
/// `message`, and `body` (empty: the stream ends with the head).
pub fn trailers_only<B>(code: Code, message: &str, body: B) -> Response<B> {
    let mut resp = Response::new(body);
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.extend(status_fields(code, message));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_read_as_the_grpc_spec_writes_them() {
        let ms = Duration::from_millis;
        assert_eq!(parse_timeout(b"1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_timeout(b"2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse_timeout(b"3S"), Some(Duration::from_secs(3)));
        assert_eq!(parse_timeout(b"250m"), Some(ms(250)));
        assert_eq!(
            parse_timeout(b"99999999u"),
            Some(Duration::from_micros(99_999_999))
        );
        assert_eq!(parse_timeout(b"7n"), Some(Duration::from_nanos(7)));
        for bad in [
            &b""[..],
            b"S",
            b"100",
            b"123456789S",
            b"-1S",
            b"1.5S",
            b"10s",
            b"10 S",
            b"1x",
        ] {
            assert_eq!(
                parse_timeout(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn deadlines_are_written_back_as_grpc_timeouts() {
        let ms = Duration::from_millis;
        assert_eq!(timeout_value(ms(1500)), "1500m");
        assert_eq!(timeout_value(Duration::from_micros(10)), "1m");
        assert_eq!(timeout_value(Duration::from_secs(200_000)), "200000S");
        for d in [ms(7), ms(99_999_999), Duration::from_secs(100_000)] {
            let back = parse_timeout(timeout_value(d).as_bytes()).unwrap();
            assert!(back <= d && d - back < Duration::from_secs(1), "{d:?}");
        }
    }

    #[test]
    fn only_http2_requests_with_a_grpc_content_type_are_calls() {
        let mut map = HeaderMap::new();
        map.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        map.insert(GRPC_TIMEOUT, HeaderValue::from_static("150m"));
        let fields = HeadersRef::Map(&map);
        assert_eq!(
            call(Version::HTTP_2, fields),
            Some(Call {
                timeout: Some(Duration::from_millis(150))
            })
        );
        assert_eq!(call(Version::HTTP_11, fields), None);
        for (ct, grpc) in [
            ("application/grpc+proto", true),
            ("Application/GRPC;charset=utf-8", true),
            ("application/grpc-web", true),
            ("application/grpcx", false),
            ("application/json", false),
        ] {
            map.insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
            assert_eq!(
                is_call(Version::HTTP_2, HeadersRef::Map(&map)),
                grpc,
                "{ct}"
            );
        }
        map.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        map.insert(GRPC_TIMEOUT, HeaderValue::from_static("soon"));
        assert_eq!(
            call(Version::HTTP_2, HeadersRef::Map(&map)),
            Some(Call { timeout: None }),
            "an invalid grpc-timeout is ignored"
        );
        assert_eq!(
            Call::bound(
                Some(Call {
                    timeout: Some(Duration::from_secs(1))
                }),
                Duration::from_secs(300)
            ),
            Duration::from_secs(1)
        );
        assert_eq!(
            Call::bound(
                Some(Call {
                    timeout: Some(Duration::from_secs(900))
                }),
                Duration::from_secs(300)
            ),
            Duration::from_secs(300)
        );
    }

    #[test]
    fn http_statuses_map_to_grpc_codes() {
        for (http, code) in [
            (404, 12),
            (501, 12),
            (502, 14),
            (503, 14),
            (504, 4),
            (408, 4),
            (429, 8),
            (431, 8),
            (413, 8),
            (400, 13),
            (401, 16),
            (403, 7),
            (500, 2),
        ] {
            assert_eq!(
                code_for(StatusCode::from_u16(http).unwrap()) as u8,
                code,
                "{http}"
            );
        }
    }

    #[test]
    fn a_trailers_only_answer_carries_the_status_and_an_encoded_message() {
        let resp = trailers_only(Code::Unavailable, "overloaded: 100% é\n", ());
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.headers()[header::CONTENT_TYPE], "application/grpc");
        assert_eq!(resp.headers()[GRPC_STATUS], "14");
        assert_eq!(resp.headers()[GRPC_MESSAGE], "overloaded: 100%25 %C3%A9");
    }
}
