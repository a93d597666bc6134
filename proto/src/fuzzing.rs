//! Fuzz entry points, one per fuzz target in `fuzz/` (cargo-fuzz, nightly) and run by
//! the stable smoke test `tests/fuzz_smoke.rs` over the committed corpora plus
//! deterministic mutations, so the two cannot drift apart.
//!
//! Each takes arbitrary bytes and must neither panic nor allocate without bound. Beyond
//! "no panic" they assert properties every parser here promises:
//!
//! * incremental parsing: every proper prefix of a complete message is `Ok(None)`, an
//!   error found in a prefix is the same error for the whole input, and a message
//!   parses the same with or without trailing bytes;
//! * round trips: what was decoded encodes back to the same bytes (binary formats) or
//!   decodes again to the same value (JSON);
//! * `frame_len` agrees with the parser it stands in for.
//!
//! Not part of the crate's API (`#[doc(hidden)]`).

use std::fmt::Debug;

use crate::beacon::{Beacon, Solicitation};
use crate::channel::{self, WireError};
use crate::greeting::{parse_greet_msg, parse_greet_reply};
use crate::hex::unhex;
use crate::socks::{self, ProtoError};

/// Longest SOCKS message (a request or reply with a 255-byte domain name is 262 bytes;
/// a greeting with 255 methods 257). Prefix checks stop past it.
const MAX_SOCKS_MESSAGE: usize = 3 + 1 + 1 + 255 + 2;

type Parse<T> = fn(&[u8]) -> Result<Option<(T, usize)>, ProtoError>;

/// Runs `parse` on `data` and on its prefixes, checking the incremental contract, and
/// exercises the error's `Display` and `reply`.
fn incremental<T: PartialEq + Debug>(data: &[u8], parse: Parse<T>) -> Option<(T, usize)> {
    let whole = parse(data);
    match &whole {
        Ok(Some((value, n))) => {
            assert!(*n > 0 && *n <= data.len(), "consumed {n} of {}", data.len());
            assert!(*n <= MAX_SOCKS_MESSAGE, "message of {n} bytes");
            for k in 0..*n {
                assert_eq!(parse(&data[..k]), Ok(None), "prefix of {k} bytes");
            }
            // Trailing bytes do not change the message.
            match parse(&data[..*n]) {
                Ok(Some((v, m))) => assert!(v == *value && m == *n),
                other => panic!("the message alone parses as {other:?}"),
            }
        }
        Ok(None) => {
            assert!(
                data.len() < MAX_SOCKS_MESSAGE,
                "incomplete after {}",
                data.len()
            );
            for k in 0..data.len() {
                assert_eq!(parse(&data[..k]), Ok(None), "prefix of {k} bytes");
            }
        }
        Err(e) => {
            let _ = (e.to_string(), e.reply());
            for k in 0..data.len().min(MAX_SOCKS_MESSAGE + 1) {
                match parse(&data[..k]) {
                    Ok(None) => {}
                    Err(p) => assert_eq!(&p, e, "prefix of {k} bytes"),
                    Ok(Some(v)) => panic!("prefix of {k} bytes parses as {v:?}, all as {e:?}"),
                }
            }
        }
    }
    whole.ok().flatten()
}

/// `frame_len` agrees with a complete request or reply at the start of `data`.
fn check_frame_len(data: &[u8], parsed: Option<usize>) {
    match (socks::frame_len(data), parsed) {
        (Ok(Some(len)), Some(n)) => assert_eq!(len, n),
        (Ok(None), Some(n)) => panic!("frame_len unknown for a parsed frame of {n}"),
        (Err(e), Some(n)) => panic!("frame_len fails ({e}) on a parsed frame of {n}"),
        (Ok(Some(len)), None) => assert!((4..=MAX_SOCKS_MESSAGE).contains(&len)),
        _ => {}
    }
}

/// Server side of the SOCKS codec (`parse_greeting`, `parse_token`, `parse_request`,
/// `frame_len`): each parser on the whole input and its prefixes, then the three in
/// sequence as msrd reads one connection.
pub fn socks_server(data: &[u8]) {
    let mut out = Vec::new();
    if let Some((methods, n)) = incremental(data, socks::parse_greeting) {
        out.clear();
        socks::encode_greeting(&mut out, &methods);
        assert_eq!(out, &data[..n]);
        let _ = socks::Method::select(&methods);
    }
    if let Some((token, n)) = incremental(data, socks::parse_token) {
        out.clear();
        socks::encode_token(&mut out, &token);
        assert_eq!(out, &data[..n]);
        // Sealed for some key share: opening must fail or succeed, never panic.
        let _ = (
            format!("{token:?}"),
            token.open(&[7; 32], [10, 2, 0, 100].into()),
        );
    }
    let request = incremental(data, socks::parse_request);
    check_frame_len(data, request.as_ref().map(|r| r.1));
    if let Some((req, n)) = request {
        out.clear();
        socks::encode_request(&mut out, req.command, &req.addr).expect("decoded requests encode");
        assert_eq!(out, &data[..n]);
        assert_eq!(req.addr.encoded_len() + 3, n);
        let _ = (req.addr.to_string(), req.command.name());
    }
    // One connection: greeting, token if method 0x80 was offered, request.
    let mut rest = data;
    if let Ok(Some((methods, n))) = socks::parse_greeting(rest) {
        rest = &rest[n..];
        if socks::Method::select(&methods) == socks::Method::ITCP_SESSION {
            match socks::parse_token(rest) {
                Ok(Some((_, n))) => rest = &rest[n..],
                _ => return,
            }
        }
        let _ = socks::parse_request(rest);
    }
}

/// Client side of the SOCKS codec (`parse_method_choice`, `parse_key_share`, `parse_token_status`,
/// `parse_reply`, `frame_len`), as [`socks_server`].
pub fn socks_client(data: &[u8]) {
    let mut out = Vec::new();
    if let Some((method, n)) = incremental(data, socks::parse_method_choice) {
        out.clear();
        socks::encode_method_choice(&mut out, method);
        assert_eq!(out, &data[..n]);
        let _ = format!("{method:?}");
    }
    if let Some((share, n)) = incremental(data, socks::parse_key_share) {
        out.clear();
        socks::encode_key_share(&mut out, &share);
        assert_eq!(out, &data[..n]);
        let t = socks::Token([1; 16]);
        let _ = crate::token_kx::SealedToken::seal(&t, &[3; 32], &share, [10, 2, 0, 100].into());
    }
    if let Some((status, n)) = incremental(data, socks::parse_token_status) {
        out.clear();
        socks::encode_token_status(&mut out, status);
        assert_eq!(out, &data[..n]);
    }
    let reply = incremental(data, socks::parse_reply);
    check_frame_len(data, reply.as_ref().map(|r| r.1));
    if let Some((resp, n)) = reply {
        out.clear();
        socks::encode_reply(&mut out, resp.reply, &resp.addr).expect("decoded replies encode");
        assert_eq!(out, &data[..n]);
        let _ = (resp.reply.to_string(), resp.reply.to_io_error_kind());
    }
    // One connection: method choice, token status if 0x80 was chosen, reply.
    let mut rest = data;
    if let Ok(Some((method, n))) = socks::parse_method_choice(rest) {
        rest = &rest[n..];
        if method == socks::Method::ITCP_SESSION {
            match socks::parse_key_share(rest) {
                Ok(Some((_, n))) => rest = &rest[n..],
                _ => return,
            }
            match socks::parse_token_status(rest) {
                Ok(Some((socks::TOKEN_STATUS_OK, n))) => rest = &rest[n..],
                _ => return,
            }
        }
        let _ = socks::parse_reply(rest);
    }
    // Tokens as the MH reads them from its token file.
    if let Ok(s) = std::str::from_utf8(data) {
        if let Some(t) = socks::Token::from_hex(s) {
            assert_eq!(socks::Token::from_hex(&t.to_hex()), Some(t));
        }
    }
}

/// `Beacon::parse` and `Solicitation::parse`; a decoded beacon or solicitation
/// re-encodes to one that decodes the same, and nothing is both.
pub fn beacon(data: &[u8]) {
    let beacon = Beacon::parse(data);
    if let Ok(b) = &beacon {
        let bytes = b.to_bytes();
        if bytes.len() <= crate::beacon::MAX_DATAGRAM {
            assert_eq!(Beacon::parse(&bytes).as_ref(), Ok(b));
        }
    }
    if let Ok(s) = Solicitation::parse(data) {
        assert!(
            beacon.is_err(),
            "{data:?} parses as a beacon and a solicitation"
        );
        assert_eq!(Solicitation::parse(&s.to_bytes()), Ok(s));
    }
}

/// A fixed MH session token for [`greeting`].
const FUZZ_TOKEN: &[u8; 16] = b"fuzz-mh-token-16";

/// `parse_greet_msg` (and `Greeting::verify` under the token it carries and a fixed
/// one), `parse_greet_reply` (and its tag: verify, seal); decoded values survive a
/// JSON round trip.
pub fn greeting(data: &[u8]) {
    if let Ok(msg) = parse_greet_msg(data) {
        let _ = msg.greeting.verify(FUZZ_TOKEN);
        if let Some(token) = msg.token.as_deref().and_then(unhex) {
            let _ = msg.greeting.verify(&token);
        }
        let json = serde_json::to_vec(&msg).expect("greetings serialize");
        assert_eq!(serde_json::from_slice(&json).ok(), Some(msg));
    }
    if let Ok(reply) = parse_greet_reply(data) {
        let _ = reply.verify(FUZZ_TOKEN);
        // Whatever it says, a reply sealed under a token verifies under it, and only it.
        let mut sealed = reply.clone();
        sealed.seal(FUZZ_TOKEN);
        assert!(sealed.verify(FUZZ_TOKEN));
        assert!(!sealed.verify(b"another token..."));
        let json = serde_json::to_vec(&reply).expect("replies serialize");
        assert_eq!(serde_json::from_slice(&json).ok(), Some(reply));
    }
}

/// The receiving MSR of [`channel_frame`] and its peers' keys.
pub const FUZZ_ME: &str = "msr1";
/// Key of peer `msr2` in [`channel_frame`].
pub const FUZZ_KEY2: &[u8] = b"fuzz psk of msr2 and msr1";
/// Key of peer `msr3` in [`channel_frame`].
pub const FUZZ_KEY3: &[u8] = b"fuzz psk of msr3 and msr1";
/// The acceptor's challenge nonce in [`channel_frame`].
pub const FUZZ_NONCE: [u8; channel::NONCE] = [0x5a; channel::NONCE];

/// The fixed key function of [`channel_frame`].
pub fn fuzz_keys(peer: &str) -> Option<Vec<u8>> {
    match peer {
        "msr2" => Some(FUZZ_KEY2.to_vec()),
        "msr3" => Some(FUZZ_KEY3.to_vec()),
        _ => None,
    }
}

/// The acceptor's side of a channel (`open_hello`, then `Session::open` on whatever
/// follows).
///
/// The first byte picks the mode. Bit 0 clear: the rest is what an unknown connector
/// sent (hello and frames as received: magic, ids, tags, lengths). Bit 0 set: a genuine
/// hello from the peer named by bit 1 (msr2 or msr3) opens the channel, and the rest is
/// `json_len:u16 · json · attachment`, sealed on that channel so envelopes and
/// attachments are reached past the tags. Bit 2 set: the same inside mutual TLS (the
/// short hello, then sessions without tags).
pub fn channel_frame(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode & 1 == 0 {
        // Prefixes of a hello are incomplete or the same error, never a session. Bit 2:
        // the short hello inside mutual TLS, then frames of a session without tags.
        let whole = if mode & 4 != 0 {
            channel::open_tls_hello(rest, FUZZ_ME)
                .map(|o| o.map(|(from, n)| (channel::Session::over_tls(FUZZ_ME, &from), n)))
        } else {
            channel::open_hello(rest, FUZZ_ME, fuzz_keys, &FUZZ_NONCE)
        };
        match whole {
            Ok(Some((mut session, n))) => {
                assert!(n <= rest.len() && n <= channel::MAX_HELLO);
                let mut tail = &rest[n..];
                while let Ok(Some((_, m))) = session.open(tail) {
                    tail = &tail[m..];
                }
            }
            Ok(None) => assert!(rest.len() < channel::MAX_HELLO),
            Err(e) => {
                let _ = e.to_string();
            }
        }
        return;
    }
    if rest.len() < 2 {
        return;
    }
    let (peer, key) = if mode & 2 == 0 {
        ("msr2", FUZZ_KEY2)
    } else {
        ("msr3", FUZZ_KEY3)
    };
    let (mut client, mut server) = if mode & 4 != 0 {
        (
            channel::Session::over_tls(peer, FUZZ_ME),
            channel::Session::over_tls(FUZZ_ME, peer),
        )
    } else {
        let (hello, client) = channel::hello(peer, FUZZ_ME, key, &FUZZ_NONCE, &[7; channel::NONCE]);
        let (server, _) = channel::open_hello(&hello, FUZZ_ME, fuzz_keys, &FUZZ_NONCE)
            .expect("a genuine hello opens")
            .expect("a whole hello");
        (client, server)
    };
    let n = usize::from(u16::from_be_bytes([rest[0], rest[1]])).min(rest.len() - 2);
    let (json, att) = rest[2..].split_at(n);
    let frame = client.seal_raw(json, att);
    // Prefixes are incomplete, never errors or messages.
    for k in [0, channel::HEADER - 1, channel::HEADER, frame.len() - 1] {
        assert!(
            matches!(server.clone().open(&frame[..k]), Ok(None)),
            "prefix of {k} bytes"
        );
    }
    match server.open(&frame) {
        Ok(Some((msg, used))) => {
            assert_eq!(used, frame.len());
            // The same frame again is out of order (a replay).
            assert!(matches!(
                server.open(&frame),
                Err(WireError::OutOfOrder { .. })
            ));
            // What was opened seals and opens again to the same message.
            let again = client.seal(&msg);
            let reopened = server.open(&again).expect("re-sealed opens");
            assert_eq!(reopened.map(|(m, _)| m), Some(msg));
        }
        Ok(None) => panic!("a complete frame was not opened"),
        Err(e) => {
            let _ = e.to_string();
        }
    }
}
