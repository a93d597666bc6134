#!/usr/bin/env python3
"""Writes the seed inputs of every fuzz target into fuzz/seeds/TARGET/ (valid messages
encoded by hand from the formats' documentation, plus the example configs). The
committed corpora (fuzz/corpus/TARGET/) were grown from these by fuzzing and then
minimized with `cargo fuzz cmin`; see README.md."""

import hashlib
import hmac
import json
import os
import struct

ROOT = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(ROOT, "seeds")


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# --- SOCKS (docs/protocol.md): server side reads greeting, token, request.
def addr(kind):
    if kind == "v4":
        return bytes([1, 10, 0, 0, 1]) + struct.pack(">H", 80)
    if kind == "v6":
        return bytes([4]) + bytes(15) + b"\x01" + struct.pack(">H", 443)
    if kind == "dom":
        return bytes([3, 11]) + b"example.com" + struct.pack(">H", 8080)
    if kind == "dom255":
        return bytes([3, 255]) + b"x" * 255 + struct.pack(">H", 65535)


greeting = bytes([5, 2, 0x80, 0x00])
token = bytes([1]) + b"0123456789abcdef"
for cmd in (1, 2, 0x80, 0x81):
    for a in ("v4", "v6", "dom"):
        put("socks_server", f"req-{cmd:02x}-{a}", bytes([5, cmd, 0]) + addr(a))
put("socks_server", "req-dom255", bytes([5, 1, 0]) + addr("dom255"))
put("socks_server", "greeting", greeting)
put("socks_server", "greeting-noauth", bytes([5, 1, 0]))
put("socks_server", "token", token)
put("socks_server", "session-itcp", greeting + token + bytes([5, 1, 0]) + addr("v4") + b"GET /")
put("socks_server", "session-noauth", bytes([5, 1, 0, 5, 1, 0]) + addr("dom"))

put("socks_client", "choice-itcp", bytes([5, 0x80]))
put("socks_client", "choice-none", bytes([5, 0xFF]))
put("socks_client", "status-ok", bytes([1, 0]))
put("socks_client", "token-hex", "00112233445566778899aabbccddeeff\n")
for rep in range(0, 11):
    put("socks_client", f"reply-{rep:02x}", bytes([5, rep, 0]) + addr("v4"))
put("socks_client", "reply-v6", bytes([5, 0, 0]) + addr("v6"))
put("socks_client", "reply-dom", bytes([5, 0, 0]) + addr("dom"))
put("socks_client", "session", bytes([5, 0x80, 1, 0, 5, 0, 0]) + addr("v4") + b"data")

# --- Beacons and greetings (JSON datagrams).
put("beacon", "beacon", json.dumps({"msr": "msr1", "mac": "02:00:00:00:01:01",
                                    "lifetime_ms": 3000, "seq": 42}))
put("beacon", "beacon-compact", '{"msr":"m","mac":"","lifetime_ms":0,"seq":18446744073709551615}')
put("beacon", "solicit", '{"solicit":{"seq":1}}')
put("beacon", "solicit-spaced", ' { "solicit" : { "seq" : 18446744073709551615 } }\n')

g = {"mh": "10.2.0.100", "prev_msr": "msr1", "new_msr": "msr2", "ts_ms": 1700000000000,
     "nonce": "03" * 16, "proof": "ab" * 32}
put("greeting", "greet", json.dumps({"greeting": g}))
put("greeting", "greet-token", json.dumps({"greeting": dict(g, prev_msr="", mh="fd00::64"),
                                           "token": "66757a7a2d6d682d746f6b656e2d3136"}))
for st in ("holding", "attached", "moved", "failed", "refused"):
    put("greeting", f"reply-{st}", json.dumps({"msr": "msr2", "nonce": "03" * 16, "status": st,
                                               "reason": "x", "connections": 3}))

# --- MSR channel frames (proto/src/channel.rs). Mode byte even: raw frame; odd:
# json_len:u16 json attachment, sealed by the target (bit 1: msr3's key, else msr2's).
KEY2 = b"fuzz psk of msr2 and msr1"
NOW = 1_700_000_000_000


def frame(env, att=b"", key=KEY2):
    j = json.dumps(env, separators=(",", ":")).encode()
    signed = b"ITH2" + struct.pack(">II", len(j), len(att)) + j + att
    return signed + hmac.new(key, signed, hashlib.sha256).digest()


def env(body, seq=1, frm="msr2"):
    return {"from": frm, "to": "msr1", "seq": seq, "ts_ms": NOW, "body": body}


def sealed(mode, e, att=b""):
    j = json.dumps(e, separators=(",", ":")).encode()
    return bytes([mode]) + struct.pack(">H", len(j)) + j + att


def fields(*fs):
    return b"".join(struct.pack(">I", len(f)) + f for f in fs)


bodies = {
    "abort": {"type": "abort", "handoff_id": 7, "reason": "test"},
    "ack": {"type": "ack", "handoff_id": 7, "restored": [1, 2], "failed": [[3, "gone"]]},
    "request": {"type": "handoff_request", "handoff_id": 9, "greeting": g},
    "images": {"type": "images", "handoff_id": 9, "token": "00" * 16,
               "images": [{"id": 1, "kind": "connect"},
                          {"id": 2, "kind": "listen", "listen": "10.2.0.100:5001"}]},
}
att = fields(b"wireless-image", b"fixed-image", b"up", b"") + fields(b"w2", b"", b"", b"down")
for name, body in bodies.items():
    a = att if name == "images" else b""
    put("channel_frame", f"raw-{name}", b"\x00" + frame(env(body), a))
    put("channel_frame", f"sealed-{name}", sealed(1, env(body), a))
put("channel_frame", "sealed-msr3", sealed(3, env(bodies["abort"], frm="msr3")))

# --- Socket images (handoff/src/image.rs, binary form; JSON form below).
def image(v6=False, state=1, fin=0, rfin=0, unacked=b"", unsent=b"", data=b"",
          wscale=True, cong=b"bbr", dev=b""):
    b = b"ISIM" + struct.pack("<I", 1) + bytes([state])
    for port, last in ((7000, 2), (40000, 1)):
        if v6:
            b += bytes([6]) + bytes(15) + bytes([last]) + struct.pack("<HII", port, 0, 0)
        else:
            b += bytes([4, 10, 77, 0, last]) + struct.pack("<H", port)
    b += struct.pack("<I", 0xfffffff0) + bytes([fin])
    b += struct.pack("<I", len(unacked)) + unacked + struct.pack("<I", len(unsent)) + unsent
    b += struct.pack("<I", 12345) + bytes([rfin]) + struct.pack("<I", len(data)) + data
    b += struct.pack("<5I", 1, 65535, 70000, 64000, 12340)
    b += struct.pack("<I", 1448) + (bytes([1, 7, 9]) if wscale else bytes(3)) + bytes([1, 1])
    b += struct.pack("<I", 0xdeadbeef) + struct.pack("<II", 46080, 131072)
    b += (bytes([1]) + struct.pack("<H", len(cong)) + cong) if cong else b"\x00"
    b += bytes([1, 1]) + struct.pack("<III", 30, 5, 4) + struct.pack("<I", 0x42) + bytes([1])
    b += struct.pack("<III", 16384, 30000, 1 << 20)
    b += (bytes([1]) + struct.pack("<H", len(dev)) + dev) if dev else b"\x00"
    return b


put("image_decode", "established-v4", image(unacked=bytes(range(64)), data=b"hello"))
put("image_decode", "established-v6", image(v6=True, unsent=b"\x07" * 40, wscale=False, cong=b""))
put("image_decode", "last-ack", image(state=9, fin=2, rfin=1, unacked=b"abc", dev=b"cell0"))
put("image_decode", "fin-wait2", image(state=5, fin=3))
put("image_decode", "close-wait", image(state=8, rfin=1, data=b"tail"))
img_json = {
    "version": 1, "local": "10.77.0.2:7000", "remote": "10.77.0.1:40000",
    "state": "established",
    "send": {"una": 4294967280, "unacked": "000102", "unsent": "", "fin": "none"},
    "recv": {"seq": 12345, "data": [104, 101, 108, 108, 111], "fin": False},
    "window": {"snd_wl1": 1, "snd_wnd": 65535, "max_window": 70000, "rcv_wnd": 64000,
               "rcv_wup": 12340},
    "options": {"mss": 1448, "wscale": {"snd": 7, "rcv": 9}, "sack": True, "timestamps": True},
    "timestamp": 3735928559,
    "sockopts": {"sndbuf": 46080, "rcvbuf": 131072, "congestion": "bbr", "nodelay": True,
                 "keepalive": {"idle_s": 30, "interval_s": 5, "count": 4}, "mark": 66,
                 "transparent": True, "notsent_lowat": 16384, "user_timeout_ms": 30000,
                 "window_clamp": 1048576, "bind_device": None},
}
put("image_decode", "json", json.dumps(img_json))

# --- Control socket requests.
for op in ("sessions", "stats", "metrics", "dance"):
    put("control_request", op, json.dumps({"op": op}))
put("control_request", "no-op", '{"id": 1, "op": null}')
put("control_request", "array", '[1, 2.5e3, "x", true, {"op": ["sessions"]}]')

# --- Configs: the examples plus a few small ones.
EX = os.path.join(ROOT, "..", "config", "examples")
for f in ("msrd.toml", "msrd-transparent.toml"):
    put("config_msrd", f, open(os.path.join(EX, f), "rb").read())
put("config_msrd", "minimal.toml", '[msr]\ngateway = "10.2.0.1"\n[access]\nmh_prefixes = ["10.2.0.0/24"]\n')
put("config_msrd", "peers.toml",
    '[msr]\nid = "msr1"\ngateway = ["10.2.0.1", "fd00::1"]\n[access]\nmh_prefixes = ["10.2.0.0/24", "fd00::/64"]\n'
    '[[cell]]\ninterface = "wl0"\ncongestion = "bbr"\n'
    '[handoff]\nlisten = "10.1.0.11:4347"\n[[handoff.peer]]\nid = "msr2"\naddress = "10.1.0.12:4347"\n'
    'key = "00112233445566778899aabbccddeeff"\n')
put("config_mh", "mh.toml", open(os.path.join(EX, "mh.toml"), "rb").read())
put("config_mh", "gateway.toml", '[mh]\ngateway = "[2001:db8::1]:1080"\n[mobility]\npolicy = "lazy"\n')
put("config_mh", "empty.toml", "")

# --- Packets for the wire views: IPv4 and IPv6 TCP (options, data, a cut head, a
# fragment), UDP, Ethernet/IPv4 ARP.
def tcp(opts=b"", flags=0x11, data=b""):
    opts += b"\x01" * (-len(opts) % 4)
    hdr = struct.pack(">HHIIBBHHH", 40000, 80, 1000, 5000, (20 + len(opts)) // 4 << 4, flags,
                      512, 0, 0)
    return hdr + opts + data


def ipv4(proto, payload, frag=0x4000):
    return struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), 0, frag, 64, proto, 0,
                       bytes([10, 2, 0, 100]), bytes([10, 0, 0, 1])) + payload


def ipv6(nxt, payload):
    return (struct.pack(">IHBB", 0x60000000, len(payload), nxt, 64) + bytes(15) + b"\x01"
            + bytes(15) + b"\x02" + payload)


TS = bytes([1, 1, 8, 10, 0, 0, 0, 77, 0, 0, 0, 99])
SACK = bytes([1, 1, 5, 10, 0, 0, 0, 1, 0, 0, 0, 2])
put("wire_views", "v4-fin-ts", ipv4(6, tcp(TS, data=b"bye")))
put("wire_views", "v4-synack", ipv4(6, tcp(bytes([2, 4, 5, 0xb4, 4, 2]) + TS + bytes([1, 3, 3, 7]),
                                          flags=0x12)))
put("wire_views", "v4-sack-head", ipv4(6, tcp(TS + SACK, flags=0x10, data=bytes(100)))[:64])
put("wire_views", "v4-fragment", ipv4(6, tcp(), frag=0x2000))
put("wire_views", "v6-ack", ipv6(6, tcp(SACK, flags=0x10, data=b"x")))
put("wire_views", "v4-udp", ipv4(17, struct.pack(">HHHH", 40000, 8000, 13, 0) + b"hello") + bytes(6))
put("wire_views", "v6-udp", ipv6(17, struct.pack(">HHHH", 40000, 8000, 13, 0) + b"hello"))
put("wire_views", "arp", bytes([0, 1, 8, 0, 6, 4, 0, 1, 2, 0, 0, 0, 0, 0x66, 10, 2, 0, 102])
    + bytes(6) + bytes([10, 2, 0, 1]))
