use super::*;
use http_body_util::Empty;
use std::net::SocketAddr;
use tokio::sync::oneshot;

async fn get(addr: SocketAddr, path: &str) -> (StatusCode, String) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::get(path)
        .header(http::header::HOST, "x")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let res = send.send_request(req).await.unwrap();
    let code = res.status();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (code, String::from_utf8(body.to_vec()).unwrap())
}

async fn start(delay: Duration) -> (SocketAddr, oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = oneshot::channel::<()>();
    let settings = Arc::new(Settings {
        name: "hello-00001".into(),
        response_delay: delay,
        counts: Arc::default(),
    });
    let task = tokio::spawn(serve(listener, settings, async {
        let _ = rx.await;
    }));
    (addr, tx, task)
}

#[test]
fn durations_are_go_style_and_non_negative() {
    assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
    assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
    assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
    assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
    assert!(parse_duration("-1s").is_err());
    assert!(parse_duration("5").is_err());
}

#[tokio::test]
async fn answers_hello_health_stream_and_404() {
    let (addr, stop, task) = start(Duration::ZERO).await;
    assert_eq!(
        get(addr, "/").await,
        (StatusCode::OK, "Hello from hello-00001!\n".to_string())
    );
    assert_eq!(get(addr, "/healthz").await, (StatusCode::OK, "ok\n".into()));
    assert_eq!(
        get(addr, "/stream?chunks=3&delay=1ms").await,
        (StatusCode::OK, "chunk 0\nchunk 1\nchunk 2\n".into())
    );
    assert_eq!(get(addr, "/nope").await.0, StatusCode::NOT_FOUND);
    assert_eq!(
        get(addr, "/inflight").await,
        (StatusCode::OK, "{\"inFlight\":0,\"peak\":1}\n".into())
    );
    stop.send(()).unwrap();
    task.await.unwrap();
}

#[tokio::test]
async fn stopping_finishes_in_flight_requests_and_refuses_new_ones() {
    let (addr, stop, task) = start(Duration::ZERO).await;
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::get("/stream?chunks=3&delay=50ms")
        .header(http::header::HOST, "x")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let mut body = send.send_request(req).await.unwrap().into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(&first[..], b"chunk 0\n");
    // The request is in flight: stop the server; the stream must still complete.
    stop.send(()).unwrap();
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(&rest[..], b"chunk 1\nchunk 2\n");
    task.await.unwrap();
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

#[test]
fn host_is_loopback_unless_given() {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        app: SampleAppArgs,
    }
    let parse = |args: &[&str]| {
        <Cli as clap::Parser>::try_parse_from(
            std::iter::once("sample-app").chain(args.iter().copied()),
        )
        .map(|c| c.app.host)
    };
    assert_eq!(
        parse(&["--port", "1"]).unwrap(),
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    );
    assert_eq!(
        parse(&["--port", "1", "--host", "127.0.0.5"]).unwrap(),
        "127.0.0.5".parse::<IpAddr>().unwrap()
    );
    assert!(parse(&["--host", "pod-1"]).is_err());
}
