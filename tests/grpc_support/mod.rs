//! A real gRPC service and client for the gRPC tests: tonic's generic server (`tonic::server::Grpc`)
//! served by hyper's HTTP/2 server on a loopback port, tonic's generic client over a
//! `tonic::transport::Channel`, and one hand-written prost message (no code generation). A raw
//! h2c client reads thaw's own answers field by field.
#![allow(dead_code)] // each test binary uses its part

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use futures::{Stream, StreamExt};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc};
use tonic::codec::Streaming;
use tonic::{Code, Request, Response, Status};
use tonic_prost::ProstCodec;

/// Generous: the suite shares 2 cores with other test binaries.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// The one message of the test service, both ways.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Msg {
    /// What the server is asked to do (see [`Server`]), or what it answers.
    #[prost(string, tag = "1")]
    pub text: String,
    #[prost(bytes = "vec", tag = "2")]
    pub payload: Vec<u8>,
}

impl Msg {
    pub fn new(text: &str) -> Self {
        Msg {
            text: text.into(),
            payload: Vec::new(),
        }
    }
}

/// `grpc.health.v1.HealthCheckRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HealthCheckRequest {
    #[prost(string, tag = "1")]
    pub service: String,
}

/// `grpc.health.v1.HealthCheckResponse` (`status`: 1 SERVING, 2 NOT_SERVING).
#[derive(Clone, PartialEq, prost::Message)]
pub struct HealthCheckResponse {
    #[prost(int32, tag = "1")]
    pub status: i32,
}

/// The health-checking protocol's method.
pub const HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";

/// The largest message either side accepts (tonic's default is 4 MiB, under a 4 MiB payload
/// and its framing).
pub const MAX_MESSAGE: usize = 16 << 20;

/// The service's methods.
pub const UNARY: &str = "/thaw.test.Test/Unary";
pub const SERVER_STREAM: &str = "/thaw.test.Test/ServerStream";
pub const CLIENT_STREAM: &str = "/thaw.test.Test/ClientStream";
pub const BIDI: &str = "/thaw.test.Test/Bidi";

/// What the server saw, for the tests to wait on.
#[derive(Debug, Default)]
pub struct Seen {
    /// Server streams that found their client gone (the response stream was dropped: the
    /// client's cancel reached the server).
    pub cancelled: AtomicU32,
    /// Calls received.
    pub calls: AtomicU32,
    /// Streams waiting on `release` right now.
    pub waiting: AtomicU32,
    /// Lets `wait` streams finish.
    pub release: Notify,
    /// The health service answers NOT_SERVING.
    pub not_serving: std::sync::atomic::AtomicBool,
    /// Health checks received, by the service they named: "" and `thaw.test.Test` are known.
    pub health_checks: std::sync::Mutex<Vec<String>>,
    changed: Notify,
}

impl Seen {
    /// Waits until `f` holds (polled on each change, and every 10 ms).
    pub async fn until(&self, what: &str, f: impl Fn(&Seen) -> bool) {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        while !f(self) {
            assert!(tokio::time::Instant::now() < deadline, "never: {what}");
            let _ = tokio::time::timeout(Duration::from_millis(10), self.changed.notified()).await;
        }
    }
}

/// A gRPC server on loopback speaking h2c (prior knowledge), as a replica.
///
/// Unary: `echo` answers the request (payload included); `fail` answers FAILED_PRECONDITION
/// with a message; `sleep:MS` echoes after MS milliseconds; `deadline` answers the
/// `grpc-timeout` it received (or `none`). Server stream: `count:N` sends N
/// messages; `tick:MS` sends one every MS until the client goes (counted in
/// [`Seen::cancelled`]); `wait` sends `first`, waits for [`Seen::release`], sends `done`.
/// Client stream: answers `N messages, B bytes`. Bidirectional: answers each message with
/// `echo:TEXT` and the payload, and ends when the client does.
pub struct Server {
    pub addr: SocketAddr,
    pub seen: Arc<Seen>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::serve(listener)
    }

    /// Serves on `listener` (bound earlier: a cold start's replica comes up on a known port).
    pub fn serve(listener: TcpListener) -> Self {
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Seen::default());
        let s = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let s = s.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let s = s.clone();
                        async move { Ok::<_, Infallible>(route(s, req).await) }
                    });
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Server { addr, seen, task }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn grpc() -> tonic::server::Grpc<ProstCodec<Msg, Msg>> {
    tonic::server::Grpc::new(ProstCodec::default())
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE)
}

async fn route(seen: Arc<Seen>, req: http::Request<Incoming>) -> http::Response<tonic::body::Body> {
    seen.calls.fetch_add(1, SeqCst);
    seen.changed.notify_waiters();
    let svc = Svc(seen);
    match req.uri().path() {
        UNARY => grpc().unary(svc, req).await,
        SERVER_STREAM => grpc().server_streaming(svc, req).await,
        CLIENT_STREAM => grpc().client_streaming(svc, req).await,
        BIDI => grpc().streaming(svc, req).await,
        HEALTH_CHECK => {
            tonic::server::Grpc::new(
                ProstCodec::<HealthCheckResponse, HealthCheckRequest>::default(),
            )
            .unary(svc, req)
            .await
        }
        _ => Status::unimplemented("no such method").into_http(),
    }
}

type Fut<T> = Pin<Box<dyn Future<Output = Result<Response<T>, Status>> + Send>>;
type MsgStream = Pin<Box<dyn Stream<Item = Result<Msg, Status>> + Send>>;

struct Svc(Arc<Seen>);

impl tonic::server::UnaryService<Msg> for Svc {
    type Response = Msg;
    type Future = Fut<Msg>;

    fn call(&mut self, req: Request<Msg>) -> Self::Future {
        Box::pin(async move {
            let deadline = req.metadata().get("grpc-timeout").cloned();
            let msg = req.into_inner();
            if msg.text == "deadline" {
                let text = deadline.map_or("none".into(), |v| v.to_str().unwrap().to_string());
                return Ok(Response::new(Msg::new(&text)));
            }
            if msg.text == "fail" {
                return Err(Status::failed_precondition(
                    "the replica refused: ünïcode, 100%",
                ));
            }
            if let Some(ms) = msg.text.strip_prefix("sleep:") {
                tokio::time::sleep(Duration::from_millis(ms.parse().unwrap())).await;
            }
            Ok(Response::new(msg))
        })
    }
}

impl tonic::server::UnaryService<HealthCheckRequest> for Svc {
    type Response = HealthCheckResponse;
    type Future = Fut<HealthCheckResponse>;

    fn call(&mut self, req: Request<HealthCheckRequest>) -> Self::Future {
        let seen = self.0.clone();
        Box::pin(async move {
            let service = req.into_inner().service;
            seen.health_checks.lock().unwrap().push(service.clone());
            seen.changed.notify_waiters();
            if !["", "thaw.test.Test"].contains(&service.as_str()) {
                return Err(Status::not_found("unknown service"));
            }
            let status = if seen.not_serving.load(SeqCst) { 2 } else { 1 };
            Ok(Response::new(HealthCheckResponse { status }))
        })
    }
}

impl tonic::server::ServerStreamingService<Msg> for Svc {
    type Response = Msg;
    type ResponseStream = MsgStream;
    type Future = Fut<MsgStream>;

    fn call(&mut self, req: Request<Msg>) -> Self::Future {
        let seen = self.0.clone();
        Box::pin(async move {
            let text = req.into_inner().text;
            let (tx, rx) = mpsc::channel::<Result<Msg, Status>>(1);
            tokio::spawn(async move {
                if let Some(n) = text.strip_prefix("count:") {
                    for i in 0..n.parse::<u32>().unwrap() {
                        let _ = tx.send(Ok(Msg::new(&i.to_string()))).await;
                    }
                } else if let Some(ms) = text.strip_prefix("tick:") {
                    let every = Duration::from_millis(ms.parse().unwrap());
                    loop {
                        if tx.send(Ok(Msg::new("tick"))).await.is_err() {
                            seen.cancelled.fetch_add(1, SeqCst);
                            seen.changed.notify_waiters();
                            return;
                        }
                        tokio::time::sleep(every).await;
                    }
                } else if text == "wait" {
                    let _ = tx.send(Ok(Msg::new("first"))).await;
                    let released = seen.release.notified();
                    seen.waiting.fetch_add(1, SeqCst);
                    seen.changed.notify_waiters();
                    released.await;
                    seen.waiting.fetch_sub(1, SeqCst);
                    let _ = tx.send(Ok(Msg::new("done"))).await;
                }
            });
            let stream =
                futures::stream::unfold(
                    rx,
                    |mut rx| async move { rx.recv().await.map(|m| (m, rx)) },
                );
            Ok(Response::new(Box::pin(stream) as MsgStream))
        })
    }
}

impl tonic::server::ClientStreamingService<Msg> for Svc {
    type Response = Msg;
    type Future = Fut<Msg>;

    fn call(&mut self, req: Request<Streaming<Msg>>) -> Self::Future {
        Box::pin(async move {
            let mut stream = req.into_inner();
            let (mut n, mut bytes) = (0, 0);
            while let Some(m) = stream.message().await? {
                n += 1;
                bytes += m.payload.len();
            }
            Ok(Response::new(Msg::new(&format!(
                "{n} messages, {bytes} bytes"
            ))))
        })
    }
}

impl tonic::server::StreamingService<Msg> for Svc {
    type Response = Msg;
    type ResponseStream = MsgStream;
    type Future = Fut<MsgStream>;

    fn call(&mut self, req: Request<Streaming<Msg>>) -> Self::Future {
        Box::pin(async move {
            let stream = req.into_inner().map(|m| {
                m.map(|m| Msg {
                    text: format!("echo:{}", m.text),
                    payload: m.payload,
                })
            });
            Ok(Response::new(Box::pin(stream) as MsgStream))
        })
    }
}

/// tonic's generic client on one channel, adding `metadata` (Knative's routing headers through
/// an activator) to every call.
#[derive(Clone)]
pub struct Client {
    grpc: tonic::client::Grpc<tonic::transport::Channel>,
    metadata: Vec<(&'static str, String)>,
}

impl Client {
    /// A client of `addr` (h2c).
    pub async fn connect(addr: SocketAddr, metadata: &[(&'static str, &str)]) -> Self {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .expect("connect");
        let grpc = tonic::client::Grpc::new(channel)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        Client {
            grpc,
            metadata: metadata.iter().map(|(k, v)| (*k, v.to_string())).collect(),
        }
    }

    fn request<T>(&self, message: T) -> Request<T> {
        let mut req = Request::new(message);
        for (k, v) in &self.metadata {
            req.metadata_mut().insert(*k, v.parse().unwrap());
        }
        req
    }

    async fn ready(&mut self) -> &mut tonic::client::Grpc<tonic::transport::Channel> {
        self.grpc.ready().await.expect("channel ready");
        &mut self.grpc
    }

    pub async fn unary(&mut self, msg: Msg) -> Result<Msg, Status> {
        let req = self.request(msg);
        let path = http::uri::PathAndQuery::from_static(UNARY);
        let resp = self.ready().await.unary(req, path, ProstCodec::default());
        bounded(resp).await.map(Response::into_inner)
    }

    pub async fn server_stream(&mut self, msg: Msg) -> Result<Streaming<Msg>, Status> {
        let req = self.request(msg);
        let path = http::uri::PathAndQuery::from_static(SERVER_STREAM);
        let resp = self
            .ready()
            .await
            .server_streaming(req, path, ProstCodec::default());
        bounded(resp).await.map(Response::into_inner)
    }

    pub async fn client_stream(
        &mut self,
        msgs: impl Stream<Item = Msg> + Send + 'static,
    ) -> Result<Msg, Status> {
        let req = self.request(msgs);
        let path = http::uri::PathAndQuery::from_static(CLIENT_STREAM);
        let resp = self
            .ready()
            .await
            .client_streaming(req, path, ProstCodec::default());
        bounded(resp).await.map(Response::into_inner)
    }

    pub async fn bidi(
        &mut self,
        msgs: impl Stream<Item = Msg> + Send + 'static,
    ) -> Result<Streaming<Msg>, Status> {
        let req = self.request(msgs);
        let path = http::uri::PathAndQuery::from_static(BIDI);
        let resp = self
            .ready()
            .await
            .streaming(req, path, ProstCodec::default());
        bounded(resp).await.map(Response::into_inner)
    }
}

/// A call's answer within [`DEADLINE`] (a hang fails the test).
async fn bounded<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, f)
        .await
        .expect("no answer in time")
}

/// The next message of a stream within [`DEADLINE`].
pub async fn next(stream: &mut Streaming<Msg>) -> Result<Option<Msg>, Status> {
    bounded(stream.message()).await
}

/// All messages' texts until the stream ends, and how it ended.
pub async fn drain(stream: &mut Streaming<Msg>) -> (Vec<String>, Result<(), Status>) {
    let mut texts = Vec::new();
    loop {
        match next(stream).await {
            Ok(Some(m)) => texts.push(m.text),
            Ok(None) => return (texts, Ok(())),
            Err(s) => return (texts, Err(s)),
        }
    }
}

/// One message in gRPC's length-prefixed framing.
pub fn frame(msg: &Msg) -> Bytes {
    let body = prost::Message::encode_to_vec(msg);
    let mut b = BytesMut::with_capacity(5 + body.len());
    b.put_u8(0);
    b.put_u32(body.len() as u32);
    b.put_slice(&body);
    b.freeze()
}

/// What a raw h2c exchange got: the HTTP status, the head's fields, the body's length and the
/// trailers (if any).
#[derive(Debug)]
pub struct Raw {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body_len: usize,
    pub body: Bytes,
    pub trailers: Option<http::HeaderMap>,
}

impl Raw {
    /// `grpc-status` and `grpc-message` from the trailers, else the head (trailers-only).
    pub fn grpc_status(&self) -> (Option<String>, Option<String>) {
        let from = |h: &http::HeaderMap, n: &str| h.get(n).map(|v| v.to_str().unwrap().to_string());
        match &self.trailers {
            Some(t) if t.contains_key("grpc-status") => {
                (from(t, "grpc-status"), from(t, "grpc-message"))
            }
            _ => (
                from(&self.headers, "grpc-status"),
                from(&self.headers, "grpc-message"),
            ),
        }
    }

    /// A trailers-only gRPC answer: 200, `application/grpc`, no body, no trailers.
    pub fn assert_trailers_only(&self) {
        assert_eq!(self.status, 200, "{self:?}");
        assert_eq!(self.headers["content-type"], "application/grpc", "{self:?}");
        assert_eq!(self.body_len, 0, "{self:?}");
        assert!(self.trailers.is_none(), "{self:?}");
    }
}

/// One POST of a unary call over h2c (prior knowledge), with `headers`, read whole.
pub async fn raw_call(addr: SocketAddr, path: &str, headers: &[(&str, &str)], msg: &Msg) -> Raw {
    let client = HyperClient::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let mut req = http::Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(frame(msg))).unwrap();
    let resp = bounded(client.request(req)).await.expect("h2c exchange");
    let (parts, body) = resp.into_parts();
    let collected = bounded(body.collect()).await.expect("body");
    let trailers = collected.trailers().cloned();
    let body = collected.to_bytes();
    Raw {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body_len: body.len(),
        body,
        trailers,
    }
}

/// The text of the one message a raw unary call got back.
pub fn unary_answer(raw: &Raw) -> String {
    assert!(raw.body.len() >= 5 && raw.body[0] == 0, "{raw:?}");
    let msg: Msg = prost::Message::decode(&raw.body[5..]).unwrap();
    msg.text
}

/// `n` messages of `size` bytes each, as a stream.
pub fn messages(n: usize, size: usize) -> impl Stream<Item = Msg> + Send + 'static {
    futures::stream::iter((0..n).map(move |i| Msg {
        text: i.to_string(),
        payload: vec![(i % 251) as u8; size],
    }))
}

/// Each kind of call through `c`: unary, server-, client- and bidirectional streaming; the
/// replica's error status and message arriving intact; a 4 MiB message each way.
pub async fn four_kinds_status_and_4mib(c: &mut Client) {
    assert_eq!(c.unary(Msg::new("echo")).await.unwrap().text, "echo");
    // The replica's own error status and message reach the client intact (trailers).
    let err = c.unary(Msg::new("fail")).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert_eq!(err.message(), "the replica refused: ünïcode, 100%");

    let mut stream = c.server_stream(Msg::new("count:5")).await.unwrap();
    let (texts, end) = drain(&mut stream).await;
    assert_eq!(texts, ["0", "1", "2", "3", "4"]);
    end.unwrap();

    let sum = c.client_stream(messages(10, 1000)).await.unwrap();
    assert_eq!(sum.text, "10 messages, 10000 bytes");

    let mut echoes = c.bidi(messages(3, 10)).await.unwrap();
    let (texts, end) = drain(&mut echoes).await;
    assert_eq!(texts, ["echo:0", "echo:1", "echo:2"]);
    end.unwrap();

    // A 4 MiB message each way.
    let big = Msg {
        text: "echo".into(),
        payload: (0..4 << 20).map(|i| (i % 253) as u8).collect(),
    };
    let back = c.unary(big.clone()).await.unwrap();
    assert!(back == big, "the 4 MiB message came back changed");
    let sum = c.client_stream(messages(1, 4 << 20)).await.unwrap();
    assert_eq!(sum.text, format!("1 messages, {} bytes", 4 << 20));
}

/// Dropping a call mid-stream reaches `server`: its stream sees the client gone.
pub async fn a_cancel_reaches(c: &mut Client, server: &Server) {
    let mut stream = c.server_stream(Msg::new("tick:20")).await.unwrap();
    assert_eq!(next(&mut stream).await.unwrap().unwrap().text, "tick");
    let before = server.seen.cancelled.load(SeqCst);
    drop(stream);
    server
        .seen
        .until("the replica saw the cancel", |s| {
            s.cancelled.load(SeqCst) == before + 1
        })
        .await;
}

/// A TCP relay to `target` counting the bytes that come back from it: an h2 connection with
/// no stream sending anything shows its PINGs here.
pub async fn counting_relay(target: SocketAddr) -> (SocketAddr, Arc<std::sync::atomic::AtomicU64>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let back = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = back.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(upstream) = tokio::net::TcpStream::connect(target).await else {
                return;
            };
            let (mut cr, mut cw) = client.into_split();
            let (mut ur, mut uw) = upstream.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut cr, &mut uw).await;
                let _ = uw.shutdown().await;
            });
            let counted = counted.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 << 10];
                loop {
                    match ur.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            counted.fetch_add(n as u64, SeqCst);
                            if cw.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    }
                }
                let _ = cw.shutdown().await;
            });
        }
    });
    (addr, back)
}

/// Opens a `wait` server stream through `c` and returns it once `server` holds it open.
pub async fn open_waiting(c: &mut Client, server: &Server) -> Streaming<Msg> {
    let before = server.seen.waiting.load(SeqCst);
    let mut stream = c.server_stream(Msg::new("wait")).await.unwrap();
    assert_eq!(next(&mut stream).await.unwrap().unwrap().text, "first");
    server
        .seen
        .until("the stream waits", |s| s.waiting.load(SeqCst) > before)
        .await;
    stream
}

/// Lets `server`'s waiting streams finish, and checks that `stream` ends normally with `done`.
pub async fn finish_waiting(server: &Server, stream: &mut Streaming<Msg>) {
    server.seen.release.notify_waiters();
    let (texts, end) = drain(stream).await;
    assert_eq!(texts, ["done"]);
    end.unwrap();
}

/// A server stream through `c` cut mid-way by a revision timeout: messages, then
/// DEADLINE_EXCEEDED from thaw in trailers.
pub async fn cut_mid_stream(c: &mut Client) {
    let mut stream = c.server_stream(Msg::new("tick:50")).await.unwrap();
    let (texts, end) = drain(&mut stream).await;
    assert!(!texts.is_empty(), "messages before the cut");
    let err = end.unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
    assert_eq!(err.message(), "request exceeded its total timeout");
}
