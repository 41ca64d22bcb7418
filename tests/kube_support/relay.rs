//! A loopback TCP relay between a client and the API server that a test can cut (every open
//! connection closed, new ones refused) and restore, and that records each request line the
//! client sends (to count LISTs and WATCHes).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The relay; its accept task ends when it is dropped.
pub struct Relay {
    addr: SocketAddr,
    /// `true` while cut. Connection tasks watch it and close when it turns true.
    cut: watch::Sender<bool>,
    requests: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
        let _ = self.cut.send(true);
    }
}

impl Relay {
    /// Relays `127.0.0.1:0` to `target`.
    pub async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (cut, cut_rx) = watch::channel(false);
        let requests = Arc::new(Mutex::new(Vec::new()));
        let reqs = requests.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((down, _)) = listener.accept().await else {
                    return;
                };
                if *cut_rx.borrow() {
                    drop(down);
                    continue;
                }
                tokio::spawn(pipe(down, target, cut_rx.clone(), reqs.clone()));
            }
        });
        Self {
            addr,
            cut,
            requests,
            task,
        }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Closes every open connection and refuses new ones until [`Relay::restore`].
    pub fn cut(&self) {
        let _ = self.cut.send(true);
    }

    /// Accepts connections again.
    pub fn restore(&self) {
        let _ = self.cut.send(false);
    }

    /// Every request line seen so far (`GET /apis/...?... HTTP/1.1`).
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }

    /// Request lines of GETs on `path_fragment` that are watches.
    pub fn watches(&self, path_fragment: &str) -> Vec<String> {
        self.requests()
            .into_iter()
            .filter(|l| l.contains(path_fragment) && l.contains("watch=true"))
            .collect()
    }

    /// Request lines of GETs on `path_fragment` that are lists (not watches).
    pub fn lists(&self, path_fragment: &str) -> Vec<String> {
        self.requests()
            .into_iter()
            .filter(|l| {
                l.starts_with("GET ") && l.contains(path_fragment) && !l.contains("watch=true")
            })
            .collect()
    }
}

async fn pipe(
    mut down: TcpStream,
    target: SocketAddr,
    mut cut: watch::Receiver<bool>,
    requests: Arc<Mutex<Vec<String>>>,
) {
    let Ok(mut up) = TcpStream::connect(target).await else {
        return;
    };
    let (mut dr, mut dw) = down.split();
    let (mut ur, mut uw) = up.split();
    let client_to_server = async {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match dr.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            // hyper writes a request head in one write: a chunk starting with a method is a
            // new request.
            let chunk = &buf[..n];
            for method in ["GET ", "POST ", "PUT ", "PATCH ", "DELETE "] {
                if chunk.starts_with(method.as_bytes()) {
                    let line_end = chunk
                        .windows(2)
                        .position(|w| w == b"\r\n")
                        .unwrap_or(chunk.len());
                    let line = String::from_utf8_lossy(&chunk[..line_end]).into_owned();
                    requests.lock().unwrap().push(line);
                }
            }
            if uw.write_all(chunk).await.is_err() {
                return;
            }
        }
    };
    let server_to_client = async {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match ur.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if dw.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        _ = client_to_server => {}
        _ = server_to_client => {}
        _ = cut.wait_for(|c| *c) => {}
    }
}
