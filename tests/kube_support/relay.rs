//! A loopback TCP relay between a client and the API server that a test can cut (every open
//! connection closed, new ones refused) and restore, and that records each request line the
//! client sends (to count LISTs and WATCHes) and the bytes of each write ([`Relay::writes`]).
//! It can also answer chosen requests itself with an error status instead of forwarding them
//! ([`Relay::fail_next`]; every one, until [`Relay::forward`], with [`Relay::refuse`]: an API
//! server that does not serve a group, `/apis/networking.istio.io` answered 404 as when
//! Istio's CRDs are not installed), and hold back the
//! answers to chosen requests (a watch's events) until released ([`Relay::hold`]): an injected
//! delay that puts a client's view of one kind behind the server's.

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
    requests: Arc<Mutex<Vec<(tokio::time::Instant, String)>>>,
    /// Every write (POST, PUT, PATCH) with the bytes sent for it: head and body.
    writes: Writes,
    faults: Faults,
    /// Request lines answered by the relay itself.
    answered_here: Arc<Mutex<Vec<String>>>,
    held: Held,
    task: tokio::task::JoinHandle<()>,
}

/// Writes sent through the relay: the request line and every byte of the request.
type Writes = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// A request line and the bytes of its answer forwarded so far.
type Answer = (String, Vec<u8>);

/// Request-line fragments whose answers are held back, and what was forwarded so far of the
/// answers to each request line (for [`Relay::forwarded`]).
#[derive(Clone, Default)]
struct Held {
    fragments: Arc<watch::Sender<Vec<String>>>,
    answered: Arc<Mutex<Vec<Answer>>>,
    /// Fragments of the request lines whose answers are kept for [`Relay::forwarded`].
    recorded: Arc<Mutex<Vec<String>>>,
}

/// Status codes to answer, in order, to requests whose request line contains the fragment;
/// then the standing refusals (answered to every matching request, never used up).
#[derive(Clone, Default)]
struct Faults {
    once: Arc<Mutex<Vec<(String, u16)>>>,
    always: Arc<Mutex<Vec<(String, u16)>>>,
}

impl Faults {
    /// The status to answer `line` with instead of forwarding it, if any.
    fn take(&self, line: &str) -> Option<u16> {
        let mut f = self.once.lock().unwrap();
        if let Some(i) = f.iter().position(|(frag, _)| line.contains(frag.as_str())) {
            return Some(f.remove(i).1);
        }
        drop(f);
        self.always
            .lock()
            .unwrap()
            .iter()
            .find(|(frag, _)| line.contains(frag.as_str()))
            .map(|(_, c)| *c)
    }
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
        let faults = Faults::default();
        let f = faults.clone();
        let held = Held::default();
        let h = held.clone();
        let writes: Writes = Arc::new(Mutex::new(Vec::new()));
        let w = writes.clone();
        let answered_here = Arc::new(Mutex::new(Vec::new()));
        let here = answered_here.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((down, _)) = listener.accept().await else {
                    return;
                };
                if *cut_rx.borrow() {
                    drop(down);
                    continue;
                }
                tokio::spawn(pipe(
                    down,
                    target,
                    cut_rx.clone(),
                    Taps {
                        requests: reqs.clone(),
                        faults: f.clone(),
                        answered_here: here.clone(),
                        held: h.clone(),
                        writes: w.clone(),
                    },
                ));
            }
        });
        Self {
            addr,
            cut,
            requests,
            writes,
            faults,
            answered_here,
            held,
            task,
        }
    }

    /// Every write sent so far (POST, PUT, PATCH): its request line and the bytes sent for it
    /// (head and body, however many reads they came in).
    pub fn writes(&self) -> Vec<(String, Vec<u8>)> {
        self.writes.lock().unwrap().clone()
    }

    /// Holds back the server's bytes on connections whose current request line contains
    /// every one of `fragments` (e.g. `["/revisions?", "watch=true"]`) until [`Relay::release`]:
    /// the client sees nothing of them meanwhile, then everything in order.
    pub fn hold(&self, fragments: &[&str]) {
        let key = fragments.join("\u{0}");
        self.held.fragments.send_modify(|h| h.push(key));
    }

    /// Forwards what was held, and holds nothing more.
    pub fn release(&self) {
        self.held.fragments.send_modify(Vec::clear);
    }

    /// Keeps, from now on, what is forwarded of the answers to requests whose line contains
    /// `fragment` (for [`Relay::forwarded`]).
    pub fn record(&self, fragment: &str) {
        self.held.recorded.lock().unwrap().push(fragment.into());
    }

    /// Whether the answer to a request whose line contains `fragment` (recorded with
    /// [`Relay::record`]) has carried `needle` to the client: what was forwarded, not held.
    pub fn forwarded(&self, fragment: &str, needle: &str) -> bool {
        self.held
            .answered
            .lock()
            .unwrap()
            .iter()
            .any(|(line, bytes)| {
                line.contains(fragment)
                    && bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
            })
    }

    /// Answers the next requests whose request line contains `fragment` with `codes`, one
    /// each, in order (a Kubernetes `Status` body), instead of forwarding them.
    pub fn fail_next(&self, fragment: &str, codes: &[u16]) {
        let mut f = self.faults.once.lock().unwrap();
        f.extend(codes.iter().map(|c| (fragment.to_string(), *c)));
    }

    /// Drops the faults not yet used: matching requests are forwarded again.
    pub fn clear_faults(&self) {
        self.faults.once.lock().unwrap().clear();
    }

    /// Faults not yet used.
    pub fn faults_left(&self) -> usize {
        self.faults.once.lock().unwrap().len()
    }

    /// Answers every request whose request line contains `fragment` with `code` (a Kubernetes
    /// `Status` body) until [`Relay::forward`]: discovery, lists and watches of a group the
    /// server does not serve (`refuse("/apis/networking.istio.io", 404)`).
    pub fn refuse(&self, fragment: &str, code: u16) {
        self.faults
            .always
            .lock()
            .unwrap()
            .push((fragment.to_string(), code));
    }

    /// Forwards the requests [`Relay::refuse`] answered for `fragment` again.
    pub fn forward(&self, fragment: &str) {
        self.faults
            .always
            .lock()
            .unwrap()
            .retain(|(f, _)| f != fragment);
    }

    /// Requests answered by [`Relay::refuse`] or [`Relay::fail_next`] so far, whose line
    /// contains `fragment`.
    pub fn answered_here(&self, fragment: &str) -> usize {
        self.answered_here
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(fragment))
            .count()
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
        self.requests_at().into_iter().map(|(_, l)| l).collect()
    }

    /// Every request line seen so far, with when its first bytes arrived.
    pub fn requests_at(&self) -> Vec<(tokio::time::Instant, String)> {
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

/// What one connection's pipe records into and answers from (the relay's shared state).
struct Taps {
    requests: Arc<Mutex<Vec<(tokio::time::Instant, String)>>>,
    faults: Faults,
    answered_here: Arc<Mutex<Vec<String>>>,
    held: Held,
    writes: Writes,
}

async fn pipe(down: TcpStream, target: SocketAddr, mut cut: watch::Receiver<bool>, taps: Taps) {
    let Taps {
        requests,
        faults,
        answered_here,
        held,
        writes,
    } = taps;
    let Ok(mut up) = TcpStream::connect(target).await else {
        return;
    };
    let (mut dr, dw) = down.into_split();
    // Written by both directions: server bytes, or an injected answer.
    let dw = tokio::sync::Mutex::new(dw);
    let (mut ur, mut uw) = up.split();
    // The request line the server is answering now (HTTP/1: one at a time per connection).
    let current = Mutex::new(String::new());
    let client_to_server = async {
        let mut buf = vec![0u8; 16 * 1024];
        // The write this connection is sending now (its index in `writes`).
        let mut writing: Option<usize> = None;
        loop {
            let n = match dr.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            // hyper writes a request head in one write: a chunk starting with a method is a
            // new request.
            let chunk = &buf[..n];
            let mut skip = false;
            let starts_request = ["GET ", "POST ", "PUT ", "PATCH ", "DELETE "]
                .iter()
                .any(|m| chunk.starts_with(m.as_bytes()));
            if starts_request {
                writing = None;
                if ["POST ", "PUT ", "PATCH "]
                    .iter()
                    .any(|m| chunk.starts_with(m.as_bytes()))
                {
                    let line_end = chunk
                        .windows(2)
                        .position(|w| w == b"\r\n")
                        .unwrap_or(chunk.len());
                    let line = String::from_utf8_lossy(&chunk[..line_end]).into_owned();
                    let mut w = writes.lock().unwrap();
                    w.push((line, chunk.to_vec()));
                    writing = Some(w.len() - 1);
                }
            } else if let Some(i) = writing {
                writes.lock().unwrap()[i].1.extend_from_slice(chunk);
            }
            for method in ["GET ", "POST ", "PUT ", "PATCH ", "DELETE "] {
                if chunk.starts_with(method.as_bytes()) {
                    let line_end = chunk
                        .windows(2)
                        .position(|w| w == b"\r\n")
                        .unwrap_or(chunk.len());
                    let line = String::from_utf8_lossy(&chunk[..line_end]).into_owned();
                    let fault = faults.take(&line);
                    if fault.is_some() {
                        answered_here.lock().unwrap().push(line.clone());
                    }
                    *current.lock().unwrap() = line.clone();
                    requests
                        .lock()
                        .unwrap()
                        .push((tokio::time::Instant::now(), line));
                    if let Some(code) = fault {
                        let body = format!(
                            r#"{{"kind":"Status","apiVersion":"v1","status":"Failure","message":"injected","reason":"Injected","code":{code}}}"#
                        );
                        let resp = format!(
                            "HTTP/1.1 {code} Injected\r\ncontent-type: application/json\r\n\
                             content-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        // The connection stays usable: hyper writes a small request's head
                        // and body in one write, so the whole request is this chunk.
                        if dw.lock().await.write_all(resp.as_bytes()).await.is_err() {
                            return;
                        }
                        skip = true;
                    }
                }
            }
            if !skip && uw.write_all(chunk).await.is_err() {
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
            let line = current.lock().unwrap().clone();
            let mut fragments = held.fragments.subscribe();
            let _ = fragments
                .wait_for(|h| {
                    !h.iter()
                        .any(|key| key.split('\u{0}').all(|f| line.contains(f)))
                })
                .await;
            if dw.lock().await.write_all(&buf[..n]).await.is_err() {
                return;
            }
            if !held
                .recorded
                .lock()
                .unwrap()
                .iter()
                .any(|f| line.contains(f.as_str()))
            {
                continue;
            }
            let mut answered = held.answered.lock().unwrap();
            match answered.iter_mut().find(|(l, _)| *l == line) {
                Some((_, bytes)) => bytes.extend_from_slice(&buf[..n]),
                None => answered.push((line, buf[..n].to_vec())),
            }
        }
    };
    tokio::select! {
        _ = client_to_server => {}
        _ = server_to_client => {}
        _ = cut.wait_for(|c| *c) => {}
    }
}
