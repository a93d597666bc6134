//! A tiny fake MSR for loopback tests, built on the codec's server-side functions.
//!
//! One thread accepts request connections on 127.0.0.1; each gets its own thread.
//! CONNECT really connects (unless `connect_reply` overrides the answer); LISTEN binds a
//! real listener on 127.0.0.1 that lives as long as the control connection; ACCEPT
//! takes the next connection from it. Successful connections are relayed with two
//! copy threads (half-close propagated).

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use itcp_mh::socks::{self, Addr, Command, Method, ProtoError, Reply, Token};

/// How the fake MSR answers the method negotiation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// As protocol.md says: 0x80 if offered, else 0x00.
    Normal,
    /// Always choose 0x00 (a stock SOCKS server).
    NoAuthOnly,
    /// Answer 05 FF.
    NoneAcceptable,
    /// Choose 0x80 but reject every token (status 01).
    RejectToken,
    /// Never answer anything.
    Silent,
    /// Negotiate normally but never answer the request.
    SilentAfterRequest,
}

type ConnectHook = Arc<dyn Fn(&Addr) -> Option<Reply> + Send + Sync>;

#[derive(Default)]
struct Shared {
    offered: Vec<Vec<Method>>,
    tokens: Vec<Option<Token>>,
    requests: Vec<socks::Request>,
    listeners: HashMap<u16, Arc<TcpListener>>,
}

/// Handle to a running fake MSR.
#[derive(Clone)]
pub struct FakeMsr {
    pub addr: SocketAddr,
    shared: Arc<Mutex<Shared>>,
}

impl FakeMsr {
    pub fn start(policy: Policy) -> FakeMsr {
        Self::start_with(policy, None)
    }

    /// `connect_reply`: for a CONNECT target, `Some(reply)` answers that reply code
    /// instead of connecting.
    pub fn start_with(policy: Policy, connect_reply: Option<ConnectHook>) -> FakeMsr {
        Self::start_on(
            TcpListener::bind("127.0.0.1:0").unwrap(),
            policy,
            connect_reply,
        )
    }

    /// Serves on an already bound listener (e.g. on `[::1]`).
    pub fn start_on(
        listener: TcpListener,
        policy: Policy,
        connect_reply: Option<ConnectHook>,
    ) -> FakeMsr {
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Mutex::new(Shared::default()));
        let sh = shared.clone();
        thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let sh = sh.clone();
                let hook = connect_reply.clone();
                thread::spawn(move || {
                    let _ = serve(conn, policy, &sh, hook);
                });
            }
        });
        FakeMsr { addr, shared }
    }

    /// Tokens received, one entry per connection that got past the negotiation
    /// (`None`: method 0x00, no token).
    pub fn tokens(&self) -> Vec<Option<Token>> {
        self.shared.lock().unwrap().tokens.clone()
    }

    pub fn offered(&self) -> Vec<Vec<Method>> {
        self.shared.lock().unwrap().offered.clone()
    }

    pub fn requests(&self) -> Vec<socks::Request> {
        self.shared.lock().unwrap().requests.clone()
    }

    pub fn has_listener(&self, port: u16) -> bool {
        self.shared.lock().unwrap().listeners.contains_key(&port)
    }

    /// Waits (up to 1 s) until `cond` holds.
    pub fn wait_for(&self, cond: impl Fn(&FakeMsr) -> bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(1);
        while Instant::now() < deadline {
            if cond(self) {
                return true;
            }
            thread::sleep(Duration::from_millis(5));
        }
        cond(self)
    }
}

/// A request connection with its receive buffer (bytes read but not yet consumed).
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    fn next<T>(
        &mut self,
        parse: impl Fn(&[u8]) -> Result<Option<(T, usize)>, ProtoError>,
    ) -> io::Result<Result<T, ProtoError>> {
        loop {
            match parse(&self.buf) {
                Ok(Some((v, n))) => {
                    self.buf.drain(..n);
                    return Ok(Ok(v));
                }
                Ok(None) => {}
                Err(e) => return Ok(Err(e)),
            }
            let mut chunk = [0u8; 512];
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)
    }

    fn reply(&mut self, reply: Reply, addr: &Addr) -> io::Result<()> {
        let mut out = Vec::new();
        socks::encode_reply(&mut out, reply, addr).unwrap();
        self.send(&out)
    }
}

fn serve(
    stream: TcpStream,
    policy: Policy,
    shared: &Mutex<Shared>,
    hook: Option<ConnectHook>,
) -> io::Result<()> {
    let mut c = Conn {
        stream,
        buf: Vec::new(),
    };
    if policy == Policy::Silent {
        thread::sleep(Duration::from_secs(5));
        return Ok(());
    }
    let offered = match c.next(socks::parse_greeting)? {
        Ok(m) => m,
        Err(_) => return Ok(()),
    };
    shared.lock().unwrap().offered.push(offered.clone());
    let choice = match policy {
        Policy::NoAuthOnly if offered.contains(&Method::NO_AUTH) => Method::NO_AUTH,
        Policy::NoAuthOnly | Policy::NoneAcceptable => Method::NONE_ACCEPTABLE,
        _ => Method::select(&offered),
    };
    let mut out = Vec::new();
    socks::encode_method_choice(&mut out, choice);
    c.send(&out)?;
    let token = match choice {
        Method::NONE_ACCEPTABLE => return Ok(()),
        Method::ITCP_SESSION => {
            // As msrd: a key share, then the MH's token sealed under it.
            let secret = [0x5a; 32];
            out.clear();
            socks::encode_key_share(&mut out, &itcp_proto::token_kx::public_key(&secret));
            c.send(&out)?;
            let sealed = match c.next(socks::parse_token)? {
                Ok(t) => t,
                Err(_) => return Ok(()),
            };
            let mh = c.stream.peer_addr()?.ip();
            let Ok(token) = sealed.open(&secret, mh) else {
                return Ok(());
            };
            let status = if policy == Policy::RejectToken { 1 } else { 0 };
            out.clear();
            socks::encode_token_status(&mut out, status);
            c.send(&out)?;
            if status != 0 {
                return Ok(());
            }
            Some(token)
        }
        _ => None,
    };
    shared.lock().unwrap().tokens.push(token);
    let req = match c.next(socks::parse_request)? {
        Ok(r) => r,
        Err(e) => return c.reply(e.reply(), &Addr::UNSPECIFIED_V4),
    };
    shared.lock().unwrap().requests.push(req.clone());
    if policy == Policy::SilentAfterRequest {
        thread::sleep(Duration::from_secs(5));
        return Ok(());
    }
    match req.command {
        Command::Connect => {
            if let Some(reply) = hook.as_ref().and_then(|h| h(&req.addr)) {
                return c.reply(reply, &Addr::UNSPECIFIED_V4);
            }
            let Some(target) = req.addr.socket_addr() else {
                return c.reply(Reply::AddressTypeNotSupported, &Addr::UNSPECIFIED_V4);
            };
            match TcpStream::connect(target) {
                Err(e) => c.reply(Reply::from_io_error(&e), &Addr::UNSPECIFIED_V4),
                Ok(fixed) => {
                    c.reply(Reply::Succeeded, &Addr::Ip(fixed.local_addr()?))?;
                    relay(c, fixed);
                    Ok(())
                }
            }
        }
        Command::Listen => {
            let port = req.addr.port();
            let l = match TcpListener::bind(("127.0.0.1", port)) {
                Ok(l) => Arc::new(l),
                Err(e) => return c.reply(Reply::from_io_error(&e), &Addr::UNSPECIFIED_V4),
            };
            let bound = l.local_addr()?;
            shared.lock().unwrap().listeners.insert(bound.port(), l);
            c.reply(Reply::Succeeded, &Addr::Ip(bound))?;
            // The listener lives until the control connection closes.
            let mut sink = [0u8; 64];
            while matches!(c.stream.read(&mut sink), Ok(n) if n > 0) {}
            shared.lock().unwrap().listeners.remove(&bound.port());
            Ok(())
        }
        Command::Accept => {
            let l = shared
                .lock()
                .unwrap()
                .listeners
                .get(&req.addr.port())
                .cloned();
            let Some(l) = l else {
                return c.reply(Reply::NoSuchListener, &Addr::UNSPECIFIED_V4);
            };
            let (fixed, peer) = l.accept()?;
            drop(l);
            c.reply(Reply::Succeeded, &Addr::Ip(peer))?;
            relay(c, fixed);
            Ok(())
        }
        Command::Bind | Command::Register => {
            c.reply(Reply::CommandNotSupported, &Addr::UNSPECIFIED_V4)
        }
    }
}

fn relay(c: Conn, fixed: TcpStream) {
    let Conn { stream: mh, buf } = c;
    let (mut mh_r, mut fixed_w) = (mh.try_clone().unwrap(), fixed.try_clone().unwrap());
    let (mut fixed_r, mut mh_w) = (fixed, mh);
    let up = thread::spawn(move || {
        let _ = fixed_w.write_all(&buf);
        let _ = io::copy(&mut mh_r, &mut fixed_w);
        let _ = fixed_w.shutdown(Shutdown::Write);
    });
    let _ = io::copy(&mut fixed_r, &mut mh_w);
    let _ = mh_w.shutdown(Shutdown::Write);
    let _ = up.join();
}

/// An echo server on 127.0.0.1; each connection echoes until EOF, then closes.
pub fn echo_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut conn) = conn else { continue };
            thread::spawn(move || {
                let mut r = conn.try_clone().unwrap();
                let _ = io::copy(&mut r, &mut conn);
                let _ = conn.shutdown(Shutdown::Write);
            });
        }
    });
    addr
}

/// A loopback port with nothing listening on it.
pub fn closed_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}
