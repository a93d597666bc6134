//! The stable-toolchain smoke run of a fuzz entry point, shared (by `#[path]`) by the
//! `tests/fuzz_smoke.rs` of proto, handoff, config, wire and proxy: the committed
//! corpus and seeds of a target (`fuzz/corpus/TARGET`, `fuzz/seeds/TARGET`), then
//! deterministic pseudo-random mutations of them (xorshift, no dependencies), each
//! input checked for no panic and bounded time. The same function is the body of the
//! cargo-fuzz target, so the two cannot drift apart.

#![allow(dead_code)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Mutated inputs per target.
pub const MUTATIONS: usize = 3000;
/// Longest any one input may take (release or debug build).
pub const PER_INPUT: Duration = Duration::from_secs(2);

/// xorshift64*: deterministic, good enough to pick mutations.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: &str) -> Rng {
        // FNV-1a of the target name: each target its own fixed sequence.
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for b in seed.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
        Rng(h | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform-ish in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Bytes fuzzers like to put into inputs: boundaries, and the syntax of the formats
/// (JSON, TOML, SOCKS) the targets read.
const INTERESTING: &[&[u8]] = &[
    b"\x00",
    b"\xff",
    b"\x7f",
    b"\x80",
    b"\xff\xff\xff\xff",
    b"\x00\x00\x00\x00",
    b"\x7f\xff\xff\xff",
    b"\x80\x00\x00\x00",
    b"\x05",
    b"\x01",
    b"\x03",
    b"\x04",
    b"18446744073709551615",
    b"9223372036854775808",
    b"-1",
    b"0",
    b"1e999",
    b"\"",
    b"\\u0000",
    b"\\ud800",
    b"[",
    b"]",
    b"{",
    b"}",
    b",",
    b":",
    b"=",
    b"\n",
    b"[[",
    b"]]",
    b"\"\"\"",
    b"null",
    b"true",
    b"\xc3\xa9",
    b"\xed\xa0\x80",
];

/// One to four random edits of `input`, sometimes spliced with `other`.
pub fn mutate(rng: &mut Rng, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        let len = v.len();
        match rng.below(9) {
            0 if len > 0 => {
                let i = rng.below(len);
                v[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                v[i] = rng.next() as u8;
            }
            2 => {
                let i = rng.below(len + 1);
                v.insert(i, rng.next() as u8);
            }
            3 if len > 0 => {
                let i = rng.below(len);
                let n = 1 + rng.below((len - i).min(16));
                v.drain(i..i + n);
            }
            4 if len > 0 => {
                // Duplicate a chunk (grows lengths, repeats tables and fields).
                let i = rng.below(len);
                let n = 1 + rng.below((len - i).min(64));
                let chunk = v[i..i + n].to_vec();
                let at = rng.below(len + 1);
                v.splice(at..at, chunk);
            }
            5 => v.truncate(rng.below(len + 1)),
            6 if !other.is_empty() => {
                // Splice: a prefix of this input, the tail of another.
                let cut = rng.below(len + 1);
                let from = rng.below(other.len());
                v.truncate(cut);
                v.extend_from_slice(&other[from..]);
            }
            7 => {
                let word = INTERESTING[rng.below(INTERESTING.len())];
                let at = rng.below(len + 1);
                if rng.below(2) == 0 || at + word.len() > len {
                    v.splice(at..at, word.iter().copied());
                } else {
                    v[at..at + word.len()].copy_from_slice(word);
                }
            }
            _ if len >= 4 => {
                // Overwrite a length-like field with an extreme value.
                let at = rng.below(len - 3);
                let x: [u8; 4] = match rng.below(4) {
                    0 => [0xff; 4],
                    1 => [0; 4],
                    2 => (rng.next() as u32).to_be_bytes(),
                    _ => (rng.below(1 << 16) as u32).to_le_bytes(),
                };
                v[at..at + 4].copy_from_slice(&x);
            }
            _ => v.push(rng.next() as u8),
        }
    }
    v
}

/// The committed corpus and seeds of `target`, in a fixed order.
pub fn inputs(target: &str) -> Vec<(String, Vec<u8>)> {
    let fuzz = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut out = Vec::new();
    for dir in ["corpus", "seeds"] {
        let Ok(entries) = std::fs::read_dir(fuzz.join(dir).join(target)) else {
            continue;
        };
        let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for p in paths {
            let data = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            out.push((p.display().to_string(), data));
        }
    }
    assert!(
        !out.is_empty(),
        "no corpus for {target} under {}",
        fuzz.display()
    );
    out
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Runs `f` on `data` once: no panic, at most [`PER_INPUT`].
pub fn check(target: &str, what: &str, data: &[u8], f: fn(&[u8])) {
    let start = Instant::now();
    if let Err(e) = catch_unwind(AssertUnwindSafe(|| f(data))) {
        let msg = e
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| e.downcast_ref::<&str>().copied())
            .unwrap_or("?");
        panic!(
            "{target}: {what} panicked: {msg}\ninput ({} bytes): {}",
            data.len(),
            hex(data)
        );
    }
    let took = start.elapsed();
    assert!(
        took <= PER_INPUT,
        "{target}: {what} took {took:?}\ninput ({} bytes): {}",
        data.len(),
        hex(data)
    );
}

/// The smoke run of one target: every committed input, then [`MUTATIONS`] mutants.
pub fn run(target: &str, f: fn(&[u8])) {
    let inputs = inputs(target);
    for (name, data) in &inputs {
        check(target, name, data, f);
    }
    let mut rng = Rng::new(target);
    for i in 0..MUTATIONS {
        let a = &inputs[rng.below(inputs.len())].1;
        let b = &inputs[rng.below(inputs.len())].1;
        let m = mutate(&mut rng, a, b);
        check(target, &format!("mutation {i}"), &m, f);
    }
}
