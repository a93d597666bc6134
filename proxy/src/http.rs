//! The `[metrics] listen` HTTP server: Prometheus text on `/metrics`, the status page
//! on `/` and its data on `/status.json`.
//!
//! Deliberately small: HTTP/1.1, GET only, one request per connection
//! (`Connection: close`), a bounded request head read within a deadline, a bounded
//! number of connections at once overall and per client address (more are closed at
//! accept), and an accept loop that backs off on EMFILE and keeps serving. It answers
//! on the configured address only, and only requests naming it (an IP literal),
//! `localhost` or a name in `[metrics] hosts` in `Host:`: a web page whose DNS name an
//! attacker rebinds to the MSR's address cannot read it from a browser on the LAN.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tracing::{debug, warn};

use crate::sessions::Sessions;

/// Largest request head read (request line and headers).
pub const MAX_REQUEST: usize = 8192;
/// The whole request head must arrive within this.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// The response must be taken within this.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once; more are closed at accept.
pub const MAX_CONNECTIONS: usize = 32;
/// The same per client address: one host's slow clients leave the others most slots.
pub const MAX_PER_CLIENT: usize = 4;

/// The status page: one self-contained document (inline CSS and JS, no external
/// assets) that polls `/status.json`.
pub const STATUS_PAGE: &str = include_str!("status.html");

/// What a request head says that we care about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub method: String,
    /// The path, without query or fragment.
    pub path: String,
    /// The `Host:` header, if any.
    pub host: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// The head has not ended yet.
    Incomplete,
    Done(Head),
    /// Unusable: answer this status and close.
    Bad(u16, &'static str),
}

/// Parses a request head from the bytes read so far.
pub fn parse_head(buf: &[u8]) -> Parsed {
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .or_else(|| buf.windows(2).position(|w| w == b"\n\n"));
    if end.is_none() {
        if buf.len() >= MAX_REQUEST {
            return Parsed::Bad(431, "request head too large");
        }
        // A request line that is already wrong need not wait for the rest.
        if let Some(nl) = buf.iter().position(|&b| b == b'\n') {
            if let Err(bad) = request_line(&buf[..nl]) {
                return bad;
            }
        }
        return Parsed::Incomplete;
    }
    let nl = buf.iter().position(|&b| b == b'\n').unwrap_or(buf.len());
    let mut head = match request_line(&buf[..nl]) {
        Ok(h) => h,
        Err(bad) => return bad,
    };
    let end = end.unwrap_or(buf.len());
    for line in buf[nl.min(end)..end].split(|&b| b == b'\n').skip(1) {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        if !line[..colon].eq_ignore_ascii_case(b"host") {
            continue;
        }
        let Ok(v) = std::str::from_utf8(&line[colon + 1..]) else {
            return Parsed::Bad(400, "malformed Host header");
        };
        if head.host.is_some() {
            return Parsed::Bad(400, "more than one Host header");
        }
        head.host = Some(v.trim().to_string());
    }
    Parsed::Done(head)
}

/// Whether a request naming `host` (its `Host:` header, port and all) is served: an IP
/// literal (the browser was pointed at an address, not at a name that could be
/// rebound), `localhost`, or one of `names` (`[metrics] hosts`). Without the header
/// (HTTP/1.0 tools; browsers always send it) too.
pub fn host_allowed(host: Option<&str>, names: &[String]) -> bool {
    let Some(host) = host else { return true };
    let name = if let Some(rest) = host.strip_prefix('[') {
        // "[v6]" or "[v6]:port"
        match rest.split_once(']') {
            Some((ip, port)) if port.is_empty() || port.starts_with(':') => {
                return ip.parse::<std::net::Ipv6Addr>().is_ok();
            }
            _ => return false,
        }
    } else {
        match host.rsplit_once(':') {
            Some((n, port)) if port.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => host,
        }
    };
    let name = name.strip_suffix('.').unwrap_or(name);
    name.parse::<std::net::Ipv4Addr>().is_ok()
        || name.eq_ignore_ascii_case("localhost")
        || names
            .iter()
            .any(|n| n.strip_suffix('.').unwrap_or(n).eq_ignore_ascii_case(name))
}

fn request_line(line: &[u8]) -> Result<Head, Parsed> {
    let bad = Parsed::Bad(400, "malformed request line");
    let line = std::str::from_utf8(line).map_err(|_| bad.clone())?;
    let line = line.strip_suffix('\r').unwrap_or(line);
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad);
    };
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(bad);
    }
    if !matches!(version, "HTTP/1.0" | "HTTP/1.1") {
        return Err(Parsed::Bad(505, "HTTP version not supported"));
    }
    // Origin form ("/metrics?x") or absolute form ("http://host:port/metrics").
    let path = if target.starts_with('/') {
        target
    } else if let Some(rest) = target
        .strip_prefix("http://")
        .or_else(|| target.strip_prefix("https://"))
    {
        rest.find('/').map_or("/", |i| &rest[i..])
    } else {
        return Err(bad);
    };
    let path = path.split(['?', '#']).next().unwrap_or("/");
    Ok(Head {
        method: method.to_string(),
        path: path.to_string(),
        host: None,
    })
}

/// One response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        505 => "HTTP Version Not Supported",
        _ => "Error",
    }
}

impl Response {
    fn text(status: u16, body: &str) -> Response {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            body: format!("{body}\n").into_bytes(),
        }
    }

    /// Status line, headers and body.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut h = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\
             Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n",
            self.status,
            reason(self.status),
            self.content_type,
            self.body.len()
        );
        if self.status == 405 {
            h.push_str("Allow: GET\r\n");
        }
        if self.content_type.starts_with("text/html") {
            // The page needs its own inline script and style and its JSON, nothing else.
            h.push_str(
                "Content-Security-Policy: default-src 'none'; script-src 'unsafe-inline'; \
                 style-src 'unsafe-inline'; connect-src 'self'; img-src data:; \
                 base-uri 'none'; form-action 'none'; frame-ancestors 'none'\r\n",
            );
        }
        h.push_str("\r\n");
        let mut out = h.into_bytes();
        out.extend_from_slice(&self.body);
        out
    }
}

/// JSON that may sit inside a `<script>` element: no `<`, `>` or `&` (escaped as
/// `\u003c` etc., which is the same JSON).
pub fn script_safe_json<T: serde::Serialize>(v: &T) -> String {
    let s = serde_json::to_string(v).expect("status serializes");
    s.replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
}

/// The status page with the current status already in it (drawn before the first
/// poll returns).
pub fn status_page(status: &crate::metrics::Status) -> String {
    STATUS_PAGE.replace("\"__INITIAL_STATUS__\"", &script_safe_json(status))
}

/// Answers a request; `hosts`: the names served besides IP literals and localhost.
pub fn route(head: &Head, sessions: &Sessions, msr: &str, hosts: &[String]) -> Response {
    if !host_allowed(head.host.as_deref(), hosts) {
        return Response::text(
            403,
            "Host not served here: use the listener's address, or list the name in [metrics] hosts",
        );
    }
    let known = matches!(head.path.as_str(), "/" | "/metrics" | "/status.json");
    if !known {
        return Response::text(404, "not found (try /metrics, / or /status.json)");
    }
    if head.method != "GET" {
        return Response::text(405, "only GET is served here");
    }
    match head.path.as_str() {
        "/metrics" => Response {
            status: 200,
            content_type: "text/plain; version=0.0.4; charset=utf-8",
            body: sessions.metrics().into_bytes(),
        },
        "/status.json" => Response {
            status: 200,
            content_type: "application/json",
            body: serde_json::to_vec(&sessions.status(msr)).expect("status serializes"),
        },
        _ => Response {
            status: 200,
            content_type: "text/html; charset=utf-8",
            body: status_page(&sessions.status(msr)).into_bytes(),
        },
    }
}

/// Connections of each client address being served.
type PerClient = Arc<Mutex<HashMap<IpAddr, usize>>>;

/// One client address's connection, counted until dropped.
struct ClientSlot(PerClient, IpAddr);

impl ClientSlot {
    fn take(per: &PerClient, ip: IpAddr) -> Option<ClientSlot> {
        let mut m = per.lock().unwrap();
        let n = m.entry(ip).or_default();
        if *n >= MAX_PER_CLIENT {
            return None;
        }
        *n += 1;
        Some(ClientSlot(per.clone(), ip))
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut m = self.0.lock().unwrap();
        if let Some(n) = m.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.1);
            }
        }
    }
}

/// Serves HTTP on `listener` until the task is dropped; `hosts`: `[metrics] hosts`.
pub async fn serve(
    listener: TcpListener,
    sessions: Arc<Sessions>,
    msr: String,
    hosts: Vec<String>,
) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let per_client = PerClient::default();
    let msr: Arc<str> = msr.into();
    let hosts: Arc<[String]> = hosts.into();
    loop {
        let (s, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // EMFILE and friends: back off and keep serving.
                warn!(error = %e, "metrics listener: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let ip = crate::admission::canonical(peer.ip());
        // Per client first: a client at its bound takes no slot from the others.
        let Some(client) = ClientSlot::take(&per_client, ip) else {
            debug!(client = %peer, "metrics listener: too many connections from this client, closing");
            continue;
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            debug!(client = %peer, "metrics listener: too many connections, closing");
            continue;
        };
        let (sessions, msr, hosts) = (sessions.clone(), msr.clone(), hosts.clone());
        tokio::spawn(async move {
            if let Err(e) = handle(s, &sessions, &msr, &hosts).await {
                debug!(client = %peer, error = %e, "metrics request dropped");
            }
            drop((slot, client));
        });
    }
}

async fn handle(
    mut s: TcpStream,
    sessions: &Sessions,
    msr: &str,
    hosts: &[String],
) -> io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let read = async {
        let mut chunk = [0u8; 2048];
        loop {
            let n = s.read(&mut chunk).await?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "closed before the request ended",
                ));
            }
            buf.extend_from_slice(&chunk[..n]);
            match parse_head(&buf) {
                Parsed::Incomplete => continue,
                p => return Ok(p),
            }
        }
    };
    let parsed = tokio::time::timeout(READ_TIMEOUT, read)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "request too slow"))??;
    let resp = match parsed {
        Parsed::Done(head) => route(&head, sessions, msr, hosts),
        Parsed::Bad(status, why) => Response::text(status, why),
        Parsed::Incomplete => unreachable!("the read loop returns complete heads"),
    };
    let write = async {
        s.write_all(&resp.to_bytes()).await?;
        s.shutdown().await
    };
    tokio::time::timeout(WRITE_TIMEOUT, write)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "response not taken"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(m: &str, p: &str) -> Head {
        Head {
            method: m.into(),
            path: p.into(),
            host: None,
        }
    }

    #[test]
    fn parses_heads() {
        assert_eq!(
            parse_head(b"GET /metrics HTTP/1.1\r\nHost: x"),
            Parsed::Incomplete
        );
        assert_eq!(
            parse_head(b"GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\n\r\n"),
            Parsed::Done(Head {
                host: Some("x".into()),
                ..head("GET", "/metrics")
            })
        );
        assert_eq!(
            parse_head(b"GET http://10.1.0.11:9473/status.json HTTP/1.0\n\n"),
            Parsed::Done(head("GET", "/status.json"))
        );
        assert_eq!(
            parse_head(b"POST / HTTP/1.1\r\n\r\n"),
            Parsed::Done(head("POST", "/"))
        );
        assert_eq!(
            parse_head(b"GET / HTTP/2\r\n\r\n"),
            Parsed::Bad(505, "HTTP version not supported")
        );
        for bad in [
            &b"GET /\r\n\r\n"[..],
            b"get / HTTP/1.1\r\n\r\n",
            b"GET  / HTTP/1.1\r\n\r\n",
            b"GET relative HTTP/1.1\r\n\r\n",
            b"\xff / HTTP/1.1\r\n\r\n",
        ] {
            assert!(matches!(parse_head(bad), Parsed::Bad(400, _)), "{bad:?}");
        }
        // A wrong request line is refused before the head ends.
        assert!(matches!(parse_head(b"HELLO\r\nmore"), Parsed::Bad(400, _)));
        let mut big = b"GET / HTTP/1.1\r\n".to_vec();
        big.resize(MAX_REQUEST, b'a');
        assert_eq!(parse_head(&big), Parsed::Bad(431, "request head too large"));
    }

    #[test]
    fn routes() {
        let s = Sessions::default();
        let r = route(&head("GET", "/metrics"), &s, "m", &[]);
        assert_eq!(r.status, 200);
        assert!(r.content_type.contains("version=0.0.4"));
        assert!(String::from_utf8(r.body)
            .unwrap()
            .contains("msrd_connections_active 0"));
        let r = route(&head("GET", "/status.json"), &s, "m<1>", &[]);
        let j = String::from_utf8(r.body).unwrap();
        assert!(j.contains("\"msr\":\"m<1>\""), "{j}");
        let r = route(&head("GET", "/"), &s, "m</script><b>", &[]);
        let page = String::from_utf8(r.body.clone()).unwrap();
        assert!(
            page.contains("m\\u003c/script\\u003e\\u003cb\\u003e"),
            "not escaped"
        );
        assert!(!page.contains("</script><b>"));
        assert!(!page.contains("__INITIAL_STATUS__"));
        let bytes = String::from_utf8(r.to_bytes()).unwrap();
        assert!(bytes.starts_with("HTTP/1.1 200 OK\r\n"));
        assert!(bytes.contains("Content-Security-Policy: default-src 'none'"));
        assert!(bytes.contains("Connection: close\r\n"));
        assert_eq!(route(&head("GET", "/nope"), &s, "m", &[]).status, 404);
        let r = route(&head("POST", "/metrics"), &s, "m", &[]);
        assert_eq!(r.status, 405);
        assert!(String::from_utf8(r.to_bytes())
            .unwrap()
            .contains("Allow: GET\r\n"));
        assert_eq!(route(&head("HEAD", "/"), &s, "m", &[]).status, 405);
    }

    #[test]
    fn only_our_own_names_are_served() {
        let names = vec!["msr1.example.net".to_string()];
        for ok in [
            None,
            Some("10.1.0.11"),
            Some("10.1.0.11:9473"),
            Some("[2001:db8:1::11]:9473"),
            Some("[::1]"),
            Some("localhost:9473"),
            Some("LOCALHOST"),
            Some("msr1.example.net"),
            Some("MSR1.example.net.:9473"),
        ] {
            assert!(host_allowed(ok, &names), "{ok:?}");
        }
        for bad in [
            "rebind.attacker.example",
            "rebind.attacker.example:9473",
            "10.1.0.11.attacker.example",
            "localhost.attacker.example",
            "[not-v6]:9473",
            "[::1]x",
            "",
        ] {
            assert!(!host_allowed(Some(bad), &names), "{bad}");
        }
        let s = Sessions::default();
        let mut h = head("GET", "/status.json");
        h.host = Some("rebind.attacker.example:9473".into());
        assert_eq!(route(&h, &s, "m", &names).status, 403);
        h.host = Some("msr1.example.net:9473".into());
        assert_eq!(route(&h, &s, "m", &names).status, 200);
        assert!(matches!(
            parse_head(b"GET / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n"),
            Parsed::Bad(400, _)
        ));
    }

    #[tokio::test]
    async fn one_client_holds_a_few_slots_only() {
        let (addr, server) = start().await;
        // 64 slow clients from 127.0.0.1: all but MAX_PER_CLIENT closed at once.
        let mut slow = Vec::new();
        for _ in 0..64 {
            let mut c = TcpStream::connect(addr).await.unwrap();
            c.write_all(b"GET / HT").await.unwrap();
            slow.push(c);
        }
        let mut open = 0;
        for c in &mut slow {
            let mut b = [0u8; 16];
            let r = tokio::time::timeout(Duration::from_millis(200), c.read(&mut b)).await;
            if r.is_err() {
                open += 1;
            }
        }
        assert_eq!(open, MAX_PER_CLIENT);
        // Another client address is served meanwhile.
        let c = tokio::net::TcpSocket::new_v4().unwrap();
        c.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        let mut c = c.connect(addr).await.unwrap();
        c.write_all(b"GET /status.json HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        c.read_to_end(&mut out).await.unwrap();
        assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 200"));
        server.abort();
    }

    #[test]
    fn the_page_has_no_external_assets() {
        for needle in ["src=\"http", "href=\"http", "@import", "url(http", "<link"] {
            assert!(!STATUS_PAGE.contains(needle), "{needle}");
        }
        assert!(STATUS_PAGE.contains("\"__INITIAL_STATUS__\""));
        assert!(
            !STATUS_PAGE.contains("innerHTML"),
            "draw with textContent only"
        );
    }

    /// The listener on a free loopback port, serving an empty session table.
    async fn start() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let names = Vec::new();
        let server = tokio::spawn(serve(l, Arc::new(Sessions::default()), "m".into(), names));
        (addr, server)
    }

    async fn get(addr: std::net::SocketAddr, req: &[u8]) -> String {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(req).await.unwrap();
        let mut out = Vec::new();
        c.read_to_end(&mut out).await.unwrap();
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn serves_over_tcp_and_drops_slow_and_huge_requests() {
        let (addr, server) = start().await;
        let r = get(addr, b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.1 200 OK"), "{r}");
        assert!(r.contains("# TYPE msrd_handoff_duration_seconds histogram"));
        let r = get(addr, b"DELETE /metrics HTTP/1.1\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.1 405"), "{r}");
        let r = get(addr, b"GET /x HTTP/1.1\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.1 404"), "{r}");
        // Exactly MAX_REQUEST bytes without an end of head (all read: no reset).
        let mut huge = b"GET / HTTP/1.1\r\nX: ".to_vec();
        huge.resize(MAX_REQUEST, b'a');
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(&huge).await.unwrap();
        let mut out = Vec::new();
        let _ = c.read_to_end(&mut out).await;
        assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 431"));
        // A slow client is dropped after READ_TIMEOUT, and others are served meanwhile.
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET / HT").await.unwrap();
        let r = get(addr, b"GET /status.json HTTP/1.1\r\n\r\n").await;
        assert!(r.contains("\"msr\":\"m\""), "{r}");
        let t = std::time::Instant::now();
        let mut out = Vec::new();
        let n = tokio::time::timeout(READ_TIMEOUT * 2, slow.read_to_end(&mut out))
            .await
            .expect("slow client not dropped")
            .unwrap_or(0);
        assert_eq!(n, 0);
        assert!(t.elapsed() >= READ_TIMEOUT - Duration::from_millis(500));
        server.abort();
    }
}
