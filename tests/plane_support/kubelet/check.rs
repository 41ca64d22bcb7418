//! The checks behind probes and hooks, each one attempt: httpGet (HTTP/1.1, or HTTPS
//! without verifying the certificate, as the kubelet's prober does), tcpSocket, and grpc
//! (grpc.health.v1 over h2c, encoded by hand). Exec is not played: it fails.

use std::net::Ipv4Addr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use k8s_openapi::api::core::v1::{Container, GRPCAction, HTTPGetAction, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use super::probe::secs;

/// The kubelet's probe User-Agent.
const USER_AGENT: &str = "kube-probe/1.34";

/// Runs probe `p` once against the container at `ip`, within its `timeoutSeconds`.
pub(super) async fn check(p: &Probe, ip: Ipv4Addr, c: &Container) -> Result<(), String> {
    let timeout = secs(p.timeout_seconds, 1);
    if let Some(h) = &p.http_get {
        return http_get(h, ip, c, timeout).await;
    }
    if let Some(t) = &p.tcp_socket {
        let host = t
            .host
            .clone()
            .filter(|h| !h.is_empty())
            .unwrap_or(ip.to_string());
        let port = port_of(&t.port, c)?;
        return match tokio::time::timeout(timeout, TcpStream::connect((host.as_str(), port))).await
        {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!("dial tcp {host}:{port}: {e}")),
            Err(_) => Err(format!("dial tcp {host}:{port}: i/o timeout")),
        };
    }
    if let Some(g) = &p.grpc {
        return tokio::time::timeout(timeout, grpc(g, ip))
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "timeout: health rpc did not complete within {timeout:?}"
                ))
            });
    }
    // Exec probes would run a command in the container: not played, so they fail.
    Err("exec probes are not played by the test kubelet".into())
}

/// A port by number or by the container's port name.
fn port_of(p: &IntOrString, c: &Container) -> Result<u16, String> {
    match p {
        IntOrString::Int(n) => u16::try_from(*n).map_err(|_| format!("invalid port {n}")),
        IntOrString::String(name) => c
            .ports
            .iter()
            .flatten()
            .find(|cp| cp.name.as_deref() == Some(name.as_str()))
            .and_then(|cp| u16::try_from(cp.container_port).ok())
            .ok_or_else(|| format!("port {name:?} not found in the container")),
    }
}

/// One httpGet (probe or preStop hook): 200..400 passes, as the kubelet judges it.
pub(super) async fn http_get(
    h: &HTTPGetAction,
    ip: Ipv4Addr,
    c: &Container,
    timeout: Duration,
) -> Result<(), String> {
    let host = h
        .host
        .clone()
        .filter(|h| !h.is_empty())
        .unwrap_or(ip.to_string());
    let port = port_of(&h.port, c)?;
    let https = h
        .scheme
        .as_deref()
        .is_some_and(|s| s.eq_ignore_ascii_case("HTTPS"));
    let path = h
        .path
        .clone()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "/".into());
    let path = if path.starts_with('/') {
        path
    } else {
        format!("/{path}")
    };
    let mut req = http::Request::get(path.as_str());
    let headers = req.headers_mut().ok_or("bad request")?;
    headers.insert(
        http::header::USER_AGENT,
        http::HeaderValue::from_static(USER_AGENT),
    );
    headers.insert(http::header::ACCEPT, http::HeaderValue::from_static("*/*"));
    if let Ok(v) = http::HeaderValue::from_str(&format!("{host}:{port}")) {
        headers.insert(http::header::HOST, v);
    }
    for hh in h.http_headers.iter().flatten() {
        if let (Ok(n), Ok(v)) = (
            http::HeaderName::from_bytes(hh.name.as_bytes()),
            http::HeaderValue::from_str(&hh.value),
        ) {
            headers.insert(n, v);
        }
    }
    let req = req.body(Empty::<Bytes>::new()).map_err(|e| e.to_string())?;
    let attempt = async {
        let tcp = TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| format!("dial tcp {host}:{port}: {e}"))?;
        let status = if https {
            let name = rustls::pki_types::ServerName::try_from(host.clone())
                .map_err(|e| format!("server name {host}: {e}"))?;
            let tls = tls_connector()
                .connect(name, tcp)
                .await
                .map_err(|e| format!("tls handshake with {host}:{port}: {e}"))?;
            send(tls, req).await?
        } else {
            send(tcp, req).await?
        };
        if (200..400).contains(&status) {
            Ok(())
        } else {
            Err(format!("HTTP probe failed with statuscode: {status}"))
        }
    };
    tokio::time::timeout(timeout, attempt)
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "Get \"http{}://{host}:{port}{path}\": context deadline exceeded",
                if https { "s" } else { "" }
            ))
        })
}

/// Sends `req` over HTTP/1.1 on `io` and returns the response's status.
async fn send<IO>(io: IO, req: http::Request<Empty<Bytes>>) -> Result<u16, String>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| e.to_string())?;
    let driver = tokio::spawn(conn);
    let resp = sender.send_request(req).await.map_err(|e| e.to_string());
    driver.abort();
    Ok(resp?.status().as_u16())
}

/// A TLS connector that accepts any server certificate, as the kubelet's HTTPS probes do.
fn tls_connector() -> tokio_rustls::TlsConnector {
    static CONNECTOR: OnceLock<tokio_rustls::TlsConnector> = OnceLock::new();
    CONNECTOR
        .get_or_init(|| {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let cfg = rustls::ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .expect("ring supports the default protocol versions")
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCert(provider)))
                .with_no_client_auth();
            tokio_rustls::TlsConnector::from(Arc::new(cfg))
        })
        .clone()
}

/// Accepts every certificate (signatures are still checked, so the handshake is sound).
#[derive(Debug)]
struct AnyCert(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// grpc.health.v1.Health/Check over h2c: passes when the answer is SERVING, as the kubelet's
/// gRPC probe does. The request and response are encoded by hand (one string field in, one
/// enum field out).
async fn grpc(g: &GRPCAction, ip: Ipv4Addr) -> Result<(), String> {
    let port = u16::try_from(g.port).map_err(|_| format!("invalid port {}", g.port))?;
    let tcp = TcpStream::connect((ip, port))
        .await
        .map_err(|e| format!("failed to connect service {ip}:{port}: {e}"))?;
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .map_err(|e| e.to_string())?;
    let driver = tokio::spawn(conn);
    // HealthCheckRequest { service = 1 }.
    let service = g.service.clone().unwrap_or_default();
    let mut msg = Vec::new();
    if !service.is_empty() {
        msg.push(0x0a);
        let mut n = service.len();
        while n >= 0x80 {
            msg.push((n as u8 & 0x7f) | 0x80);
            n >>= 7;
        }
        msg.push(n as u8);
        msg.extend_from_slice(service.as_bytes());
    }
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    frame.extend_from_slice(&msg);
    let req = http::Request::post(format!("http://{ip}:{port}/grpc.health.v1.Health/Check"))
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .header(http::header::USER_AGENT, USER_AGENT)
        .body(Full::new(Bytes::from(frame)))
        .map_err(|e| e.to_string())?;
    let result = async {
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        if resp.status() != http::StatusCode::OK {
            return Err(format!("health rpc answered HTTP {}", resp.status()));
        }
        let head_status = resp.headers().get("grpc-status").cloned();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?;
        let status = body
            .trailers()
            .and_then(|t| t.get("grpc-status").cloned())
            .or(head_status);
        let status = status.as_ref().and_then(|v| v.to_str().ok()).unwrap_or("");
        if status != "0" {
            return Err(format!("health rpc failed with grpc-status {status:?}"));
        }
        // HealthCheckResponse { status = 1 (enum) }: SERVING is 1.
        let data = body.to_bytes();
        let serving = data.len() >= 7 && data[0] == 0 && data[5] == 0x08 && data[6] == 1;
        if serving {
            Ok(())
        } else {
            Err("service unhealthy (responded with NOT_SERVING)".into())
        }
    }
    .await;
    driver.abort();
    result
}
