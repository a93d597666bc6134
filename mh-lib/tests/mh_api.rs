//! The MH API against a fake MSR on loopback. Options are always passed explicitly, so
//! the tests do not depend on `ITCP_GATEWAY`/`ITCP_TOKEN` in the environment.

mod fake_msr;

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fake_msr::{closed_port, echo_server, FakeMsr, Policy};
use itcp_mh::socks::{Addr, Command, Method, Reply, Token};
use itcp_mh::{ItcpListener, ItcpStream, MhOptions};

const TOKEN: Token = Token([0x5a; 16]);

fn opts(msr: &FakeMsr) -> MhOptions {
    MhOptions::new()
        .gateway(msr.addr)
        .token(TOKEN)
        .connect_timeout(Duration::from_secs(1))
}

#[test]
fn connect_and_echo() {
    let msr = FakeMsr::start(Policy::Normal);
    let echo = echo_server();
    let mut s = ItcpStream::connect_with(&opts(&msr), echo).unwrap();
    assert_eq!(s.peer_addr().unwrap(), echo);
    assert_eq!(s.target(), &Addr::Ip(echo));
    assert_eq!(s.gateway(), msr.addr);
    assert_eq!(s.local_addr().unwrap(), s.get_ref().local_addr().unwrap());
    s.write_all(b"hello through the MSR").unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let mut back = String::new();
    s.read_to_string(&mut back).unwrap();
    assert_eq!(back, "hello through the MSR");

    assert_eq!(
        msr.offered(),
        vec![vec![Method::ITCP_SESSION, Method::NO_AUTH]]
    );
    assert_eq!(msr.tokens(), vec![Some(TOKEN)]);
    let reqs = msr.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].command, Command::Connect);
    assert_eq!(reqs[0].addr, Addr::Ip(echo));
}

#[test]
fn connect_by_host_and_port_and_into_inner() {
    let msr = FakeMsr::start(Policy::Normal);
    let echo = echo_server();
    let s = ItcpStream::connect_with(&opts(&msr), ("127.0.0.1", echo.port())).unwrap();
    assert_eq!(s.peer_addr().unwrap(), echo);
    // After the handshake the socket is an ordinary TCP stream.
    let mut tcp: TcpStream = s.into_inner();
    tcp.write_all(b"xyz").unwrap();
    let mut buf = [0u8; 3];
    tcp.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"xyz");
}

#[test]
fn close_sends_fin() {
    let msr = FakeMsr::start(Policy::Normal);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let s = ItcpStream::connect_with(&opts(&msr), l.local_addr().unwrap()).unwrap();
    let (mut fixed, _) = l.accept().unwrap();
    (&s).write_all(b"bye").unwrap();
    s.close().unwrap();
    let mut got = Vec::new();
    fixed.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"bye");
}

#[test]
fn domain_target_is_sent_as_is() {
    let msr = FakeMsr::start_with(
        Policy::Normal,
        Some(Arc::new(|_: &Addr| Some(Reply::HostUnreachable))),
    );
    let e =
        ItcpStream::connect_target(&opts(&msr), Addr::Domain("fh.example".into(), 80)).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::HostUnreachable);
    assert!(
        e.to_string()
            .ends_with("could not connect to fh.example:80: host unreachable"),
        "{e}"
    );
    assert_eq!(
        msr.requests()[0].addr,
        Addr::Domain("fh.example".into(), 80)
    );
}

#[test]
fn every_reply_code_maps_to_its_error_kind() {
    // The fake MSR answers CONNECT to 192.0.2.1:N with reply code N.
    let msr = FakeMsr::start_with(
        Policy::Normal,
        Some(Arc::new(|a: &Addr| Reply::from_u8(a.port() as u8))),
    );
    use io::ErrorKind as K;
    let table = [
        (0x01, K::Other),
        (0x02, K::PermissionDenied),
        (0x03, K::NetworkUnreachable),
        (0x04, K::HostUnreachable),
        (0x05, K::ConnectionRefused),
        (0x06, K::TimedOut),
        (0x07, K::Unsupported),
        (0x08, K::Unsupported),
        (0x09, K::NotFound),
        (0x0A, K::AddrInUse),
    ];
    for (code, kind) in table {
        let target: SocketAddr = format!("192.0.2.1:{code}").parse().unwrap();
        let e = ItcpStream::connect_with(&opts(&msr), target).unwrap_err();
        assert_eq!(e.kind(), kind, "reply 0x{code:02x}: {e}");
    }
    let e = ItcpStream::connect_with(&opts(&msr), "192.0.2.1:5").unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "I-TCP gateway {} could not connect to 192.0.2.1:5: connection refused",
            msr.addr
        )
    );
}

#[test]
fn real_refusal_at_the_fixed_side() {
    let msr = FakeMsr::start(Policy::Normal);
    let e = ItcpStream::connect_with(&opts(&msr), closed_port()).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
    assert!(e.to_string().starts_with("I-TCP gateway"), "{e}");
}

#[test]
fn gateway_unreachable() {
    let gw = closed_port();
    let o = MhOptions::new().gateway(gw).token(TOKEN);
    let e = ItcpStream::connect_with(&o, "10.0.0.1:80").unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
    // Our end is named too, to find the attempt in msrd's logs.
    assert!(
        e.to_string()
            .starts_with(&format!("cannot reach I-TCP gateway {gw} (from 127.0.0.1:")),
        "{e}"
    );
    let e = ItcpListener::bind_with(&o, 80).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
}

#[test]
fn no_token_when_server_selects_no_auth() {
    let msr = FakeMsr::start(Policy::NoAuthOnly);
    let echo = echo_server();
    // Had the client sent the token anyway, the fake MSR would have read it as a
    // malformed request and answered "general failure".
    let mut s = ItcpStream::connect_with(&opts(&msr), echo).unwrap();
    s.write_all(b"ok").unwrap();
    let mut buf = [0u8; 2];
    s.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ok");
    assert_eq!(msr.tokens(), vec![None]);
}

#[test]
fn negotiation_failures() {
    let msr = FakeMsr::start(Policy::NoneAcceptable);
    let e = ItcpStream::connect_with(&opts(&msr), "10.0.0.1:80").unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
    assert!(
        e.to_string()
            .contains("accepts neither of the offered methods"),
        "{e}"
    );

    let msr = FakeMsr::start(Policy::RejectToken);
    let e = ItcpStream::connect_with(&opts(&msr), "10.0.0.1:80").unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
    assert!(e.to_string().contains("rejected the session token"), "{e}");
}

#[test]
fn negotiation_timeout() {
    let msr = FakeMsr::start(Policy::Silent);
    let o = opts(&msr).connect_timeout(Duration::from_millis(200));
    let t0 = Instant::now();
    let e = ItcpStream::connect_with(&o, "10.0.0.1:80").unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(1));
    assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    // Our end is named too, to find the connection in msrd's logs.
    let msg = e.to_string();
    let (head, tail) = msg.split_once(" (from 127.0.0.1:").expect(&msg);
    assert_eq!(head, format!("I-TCP gateway {}", msr.addr), "{msg}");
    let (port, rest) = tail.split_once(')').expect(&msg);
    assert!(port.parse::<u16>().is_ok(), "{msg}");
    assert_eq!(rest, " did not answer the method negotiation within 200ms");
}

#[test]
fn reply_timeout() {
    let msr = FakeMsr::start(Policy::SilentAfterRequest);
    let o = opts(&msr).reply_timeout(Some(Duration::from_millis(200)));
    let e = ItcpStream::connect_with(&o, "10.0.0.1:80").unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    assert!(
        e.to_string().contains("connect request within 200ms"),
        "{e}"
    );
}

#[test]
fn listener_bind_and_two_accepts() {
    let msr = FakeMsr::start(Policy::Normal);
    let listener = ItcpListener::bind_with(&opts(&msr), 0).unwrap();
    let local = listener.local_addr().unwrap();
    assert_ne!(local.port(), 0);
    let req = &msr.requests()[0];
    assert_eq!(req.command, Command::Listen);
    assert_eq!(req.addr, Addr::Ip("0.0.0.0:0".parse().unwrap()));

    for i in 0..2u8 {
        // The fixed host connects to the MH's (here: the fake MSR's) listening address.
        let mut fh = TcpStream::connect(local).unwrap();
        fh.write_all(&[i]).unwrap();
        let (mut s, peer) = listener.accept().unwrap();
        assert_eq!(peer, fh.local_addr().unwrap());
        assert_eq!(s.peer_addr().unwrap(), peer);
        let mut b = [0u8; 1];
        s.read_exact(&mut b).unwrap();
        assert_eq!(b[0], i);
        s.write_all(b"reply").unwrap();
        drop(s);
        let mut got = Vec::new();
        fh.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"reply");
    }
    let accepts: Vec<_> = msr
        .requests()
        .into_iter()
        .filter(|r| r.command == Command::Accept)
        .collect();
    assert_eq!(accepts.len(), 2);
    assert!(accepts.iter().all(|r| r.addr.port() == local.port()));
}

#[test]
fn concurrent_accepts_from_threads() {
    let msr = FakeMsr::start(Policy::Normal);
    let listener = ItcpListener::bind_with(&opts(&msr), 0).unwrap();
    let local = listener.local_addr().unwrap();
    let mut got: Vec<u8> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    let (mut c, _) = listener.accept().unwrap();
                    let mut b = [0u8; 1];
                    c.read_exact(&mut b).unwrap();
                    b[0]
                })
            })
            .collect();
        for i in 0..4u8 {
            let mut fh = TcpStream::connect(local).unwrap();
            fh.write_all(&[i]).unwrap();
            std::mem::forget(fh); // keep it open until the process ends
        }
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    got.sort();
    assert_eq!(got, [0, 1, 2, 3]);
}

#[test]
fn listener_drop_closes_it_at_the_msr() {
    let msr = FakeMsr::start(Policy::Normal);
    let listener = ItcpListener::bind_with(&opts(&msr), 0).unwrap();
    let port = listener.local_addr().unwrap().port();
    assert!(msr.has_listener(port));
    drop(listener);
    assert!(msr.wait_for(|m| !m.has_listener(port)));
    let e = TcpStream::connect(("127.0.0.1", port)).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
}

#[test]
fn listen_on_a_taken_port() {
    let msr = FakeMsr::start(Policy::Normal);
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let e = ItcpListener::bind_with(&opts(&msr), port).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
    assert_eq!(
        e.to_string(),
        format!(
            "I-TCP gateway {} could not listen on port {port}: address in use",
            msr.addr
        )
    );
}

#[test]
fn ipv6_gateway_listens_on_the_ipv6_any_address() {
    let Ok(l) = TcpListener::bind("[::1]:0") else {
        eprintln!("no IPv6 loopback; skipped");
        return;
    };
    let msr = FakeMsr::start_on(l, Policy::Normal, None);
    assert!(msr.addr.is_ipv6());
    let listener = ItcpListener::bind_with(&opts(&msr), 0).unwrap();
    assert_eq!(msr.requests()[0].addr, Addr::Ip("[::]:0".parse().unwrap()));
    let fh = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (_s, peer) = listener.accept().unwrap();
    assert_eq!(peer, fh.local_addr().unwrap());
    let accept = &msr.requests()[1];
    assert_eq!(accept.command, Command::Accept);
    assert_eq!(
        accept.addr,
        Addr::Ip(SocketAddr::new(
            "::".parse().unwrap(),
            listener.local_addr().unwrap().port()
        ))
    );
}

#[test]
fn incoming_iterator() {
    let msr = FakeMsr::start(Policy::Normal);
    let listener = ItcpListener::bind_with(&opts(&msr), 0).unwrap();
    let local = listener.local_addr().unwrap();
    let fh = TcpStream::connect(local).unwrap();
    let s = listener.incoming().next().unwrap().unwrap();
    assert_eq!(s.peer_addr().unwrap(), fh.local_addr().unwrap());
}

#[cfg(feature = "tokio")]
mod nonblocking {
    use super::*;
    use itcp_mh::nonblocking::{ItcpListener, ItcpStream};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn connect_and_echo() {
        let msr = FakeMsr::start(Policy::Normal);
        let echo = echo_server();
        let mut s = ItcpStream::connect_with(&opts(&msr), echo).await.unwrap();
        assert_eq!(s.peer_addr().unwrap(), echo);
        s.write_all(b"async hello").await.unwrap();
        s.shutdown().await.unwrap();
        let mut back = Vec::new();
        s.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, b"async hello");
        assert_eq!(msr.tokens(), vec![Some(TOKEN)]);

        let s = ItcpStream::connect_with(&opts(&msr), ("127.0.0.1", echo.port()))
            .await
            .unwrap();
        let mut tcp = s.into_inner();
        tcp.write_all(b"z").await.unwrap();
        assert_eq!(tcp.read_u8().await.unwrap(), b'z');
    }

    #[tokio::test]
    async fn errors() {
        let msr = FakeMsr::start(Policy::Normal);
        let e = ItcpStream::connect_with(&opts(&msr), closed_port())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);

        let msr = FakeMsr::start(Policy::Silent);
        let o = opts(&msr).connect_timeout(Duration::from_millis(200));
        let e = ItcpStream::connect_with(&o, "10.0.0.1:80")
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(e.to_string().contains("within 200ms"), "{e}");

        let msr = FakeMsr::start(Policy::NoAuthOnly);
        let echo = echo_server();
        ItcpStream::connect_with(&opts(&msr), echo).await.unwrap();
        assert_eq!(msr.tokens(), vec![None]);

        // No gateway there: the error names it and our end.
        let gw = closed_port();
        let o = MhOptions::new().gateway(gw).token(TOKEN);
        let e = ItcpStream::connect_with(&o, "10.0.0.1:80")
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
        assert!(
            e.to_string()
                .starts_with(&format!("cannot reach I-TCP gateway {gw} (from 127.0.0.1:")),
            "{e}"
        );
    }

    #[tokio::test]
    async fn listener_bind_and_two_concurrent_accepts() {
        let msr = FakeMsr::start(Policy::Normal);
        let listener = ItcpListener::bind_with(&opts(&msr), 0).await.unwrap();
        let local = listener.local_addr().unwrap();
        let fixed = tokio::task::spawn_blocking(move || {
            let mut a = TcpStream::connect(local).unwrap();
            let mut b = TcpStream::connect(local).unwrap();
            a.write_all(b"A").unwrap();
            b.write_all(b"B").unwrap();
            (a, b)
        });
        let (r1, r2) = tokio::join!(listener.accept(), listener.accept());
        let (mut s1, p1) = r1.unwrap();
        let (mut s2, p2) = r2.unwrap();
        assert_ne!(p1, p2);
        let mut got = vec![s1.read_u8().await.unwrap(), s2.read_u8().await.unwrap()];
        got.sort();
        assert_eq!(got, b"AB");
        let (a, b) = fixed.await.unwrap();
        let mut peers = vec![a.local_addr().unwrap(), b.local_addr().unwrap()];
        let mut seen = vec![p1, p2];
        peers.sort();
        seen.sort();
        assert_eq!(peers, seen);

        drop(listener);
        assert!(msr.wait_for(|m| !m.has_listener(local.port())));
    }
}
