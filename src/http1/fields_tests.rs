//! The raw fields' name recognition, and what httparse lets through.

use super::*;

/// Names are recognised in any case, and only whole names are.
#[test]
fn known_names_in_any_case() {
    for (name, known) in [
        (&b"HOST"[..], Known::Host),
        (b"Content-Length", Known::ContentLength),
        (b"TRANSFER-encoding", Known::TransferEncoding),
        (b"Knative-Serving-Namespace", Known::ServingNamespace),
        (b"X-Forwarded-Proto", Known::ForwardedProto),
        (b"x-forwarded-HOST", Known::ForwardedHost),
        (b"Forwarded", Known::Forwarded),
        (b"X-Real-IP", Known::RealIp),
        (b"X-Forwarded-Client-Cert", Known::ClientCert),
        (b"hosts", Known::Other),
        (b"hos", Known::Other),
        (b"x-forwarded-fox", Known::Other),
        (b"", Known::Other),
    ] {
        assert_eq!(classify(name), known, "{}", String::from_utf8_lossy(name));
    }
}

/// The raw form relies on this: any name and value httparse accepts, the `http` crate accepts
/// too, so raw fields never need the `http` crate's checks (and always convert to a map).
#[test]
fn httparse_accepts_no_byte_that_http_refuses() {
    let mut accepted_names = 0;
    let mut accepted_values = 0;
    for b in 0..=255u8 {
        let mut name = b"GET / HTTP/1.1\r\nX".to_vec();
        name.extend_from_slice(&[b, b'y']);
        name.extend_from_slice(b": v\r\n\r\n");
        let mut value = b"GET / HTTP/1.1\r\nX: a".to_vec();
        value.extend_from_slice(&[b, b'z']);
        value.extend_from_slice(b"\r\n\r\n");
        for (head, is_name) in [(name, true), (value, false)] {
            let mut slots = [httparse::EMPTY_HEADER; 4];
            let mut req = httparse::Request::new(&mut slots);
            if !matches!(req.parse(&head), Ok(httparse::Status::Complete(_))) {
                continue;
            }
            for h in req.headers.iter() {
                assert!(
                    HeaderName::from_bytes(h.name.as_bytes()).is_ok(),
                    "byte {b:#04x}: http refuses the name {:?}",
                    h.name
                );
                assert!(
                    HeaderValue::from_bytes(h.value).is_ok(),
                    "byte {b:#04x}: http refuses the value {:?}",
                    h.value
                );
            }
            if is_name && req.headers.len() == 1 && req.headers[0].name.len() == 3 {
                accepted_names += 1;
            } else if !is_name && req.headers[0].value.len() == 3 {
                accepted_values += 1;
            }
        }
    }
    // Not vacuous: tokens' characters and visible values got through.
    assert!(accepted_names >= 70, "{accepted_names} name bytes");
    assert!(accepted_values >= 180, "{accepted_values} value bytes");
}

/// `eq_lower`'s bit trick agrees with a plain case-insensitive comparison for every token
/// character in every position of every known name.
#[test]
fn eq_lower_matches_eq_ignore_ascii_case_on_tokens() {
    const TCHAR: &[u8] =
        b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let names: [&[u8]; 6] = [
        b"te",
        b"x-request-id",
        b"transfer-encoding",
        b"knative-serving-namespace",
        b"k-network-probe",
        b"date",
    ];
    for lower in names {
        assert!(super::eq_lower(lower, lower));
        assert!(super::eq_lower(&lower.to_ascii_uppercase(), lower));
        assert!(!super::eq_lower(&lower[1..], lower));
        for i in 0..lower.len() {
            for &c in TCHAR {
                let mut name = lower.to_vec();
                name[i] = c;
                assert_eq!(
                    super::eq_lower(&name, lower),
                    name.eq_ignore_ascii_case(lower),
                    "{:?} vs {:?}",
                    String::from_utf8_lossy(&name),
                    String::from_utf8_lossy(lower)
                );
            }
        }
    }
}
