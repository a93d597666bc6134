//! Text output of scenarios: result tables in the paper's layout and a readable account
//! of one run.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::scenario::Outcome;

/// The paper's Tables 1–2 (KB/s), columns: no moves, overlapped, non-overlapped 0 s, 1 s.
pub struct PaperRows {
    pub lan: [f64; 4],
    pub wan: [f64; 4],
}

pub const PAPER_REGULAR: PaperRows = PaperRows {
    lan: [65.49, 62.59, 38.66, 23.73],
    wan: [13.35, 13.26, 8.89, 5.19],
};

pub const PAPER_ITCP: PaperRows = PaperRows {
    lan: [70.06, 65.37, 44.83, 36.31],
    wan: [26.78, 27.97, 19.12, 16.01],
};

pub const COLUMNS: [&str; 4] = [
    "no moves",
    "overlapped",
    "non-overlapped 0 s",
    "non-overlapped 1 s",
];

/// Median of a non-empty slice.
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// Samples per (network, column).
#[derive(Debug, Default)]
pub struct Table {
    cells: BTreeMap<(String, String), Vec<f64>>,
}

impl Table {
    pub fn add(&mut self, net: &str, column: &str, value: f64) {
        self.cells
            .entry((net.to_string(), column.to_string()))
            .or_default()
            .push(value);
    }

    pub fn samples(&self, net: &str, column: &str) -> Option<&[f64]> {
        self.cells
            .get(&(net.to_string(), column.to_string()))
            .map(Vec::as_slice)
    }

    /// Markdown table: one row per network, ours as "median [min–max]" and the paper's.
    pub fn render(&self, paper: &PaperRows) -> String {
        let mut s = String::from("| network |");
        for c in COLUMNS {
            let _ = write!(s, " {c} |");
        }
        s += "\n|---|---|---|---|---|\n";
        for (net, prow) in [("LAN", paper.lan), ("WAN", paper.wan)] {
            if !self.cells.keys().any(|(n, _)| n == net) {
                continue;
            }
            let _ = write!(s, "| {net} (ours) |");
            for c in COLUMNS {
                match self.samples(net, c) {
                    Some(v) if !v.is_empty() => {
                        let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
                        let hi = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        if v.len() > 1 {
                            let _ = write!(s, " {:.2} [{lo:.2}–{hi:.2}] |", median(v));
                        } else {
                            let _ = write!(s, " {:.2} |", v[0]);
                        }
                    }
                    _ => s += " – |",
                }
            }
            let _ = write!(s, "\n| {net} (paper) |");
            for p in prow {
                let _ = write!(s, " {p:.2} |");
            }
            s += "\n";
        }
        s
    }
}

/// One character per bin: the fraction of `full` the bin reached.
pub fn sparkline(values: &[f64], full: f64) -> String {
    const BARS: [char; 9] = [' ', '▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    values
        .iter()
        .map(|v| {
            let f = (v / full).clamp(0.0, 1.0);
            BARS[(f * 8.0).round() as usize]
        })
        .collect()
}

/// A human account of one run: goodput, integrity, stalls, moves and reroutes, losses.
pub fn describe(o: &Outcome) -> String {
    let r = &o.recv;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "received {} bytes in {:.2} s: goodput {:.1} KB/s ({:.3} Mbit/s) at the MH",
        r.bytes,
        r.duration_s,
        o.kbytes_per_s(),
        r.goodput_bps / 1e6
    );
    let _ = writeln!(
        s,
        "integrity: {}",
        if r.ok {
            "every byte arrived once, in order (verified against the seeded stream)".to_string()
        } else {
            format!("FAILED: {}", r.error.clone().unwrap_or_default())
        }
    );
    let _ = writeln!(
        s,
        "longest stall: {:.2} s, starting {:.2} s into the transfer",
        r.longest_stall_s, r.longest_stall_at_s
    );
    let _ = writeln!(
        s,
        "the MH had a cell {:.1} % of the time",
        o.coverage * 100.0
    );
    let t0 = r.t0_mono_ns as f64;
    let rel = |t: u64| (t as f64 - t0) / 1e9;
    let _ = writeln!(s, "cell changes (s from connection start → cells):");
    for e in &o.events {
        let t = rel(e.t_ns);
        if t > -1.0 && t <= r.duration_s {
            let _ = writeln!(s, "  {t:7.2}  {:?}", e.cells);
        }
    }
    if !o.registrations.is_empty() {
        let _ = writeln!(s, "reroutes (heard new MSR → routes moved):");
        for g in &o.registrations {
            let _ = writeln!(
                s,
                "  {:7.2}  MSR{} heard, routed {:.1} ms later",
                rel(g.heard_ns),
                g.msr,
                (g.routed_ns.saturating_sub(g.heard_ns)) as f64 / 1e6
            );
        }
    }
    if !o.handoffs.is_empty() {
        // Handoff log phases are wall-clock µs; place them on the transfer's clock via
        // the offset between the two clocks now (good to a few µs).
        let wall_now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as f64)
            .unwrap_or(0.0);
        let mono_now = crate::sys::mono_ns() as f64 / 1000.0;
        let _ = writeln!(s, "handoffs (from the MSRs' handoff logs):");
        for h in &o.handoffs {
            let t = h
                .phases
                .greeting
                .map(|g| (g as f64 - wall_now + mono_now) * 1000.0 - t0)
                .map_or("?".to_string(), |ns| format!("{:7.2}", ns / 1e9));
            let q: u64 = h.connections.iter().map(|c| c.queued_bytes).sum();
            let _ = writeln!(
                s,
                "  {t}  {} → {}: {:?}, {} connection(s), {} bytes queued, greeting → resumed {:.2} ms",
                h.old_msr,
                h.new_msr,
                h.outcome,
                h.connections.len(),
                q,
                greeting_to_resumed_ms(h).unwrap_or(f64::NAN)
            );
        }
    }
    if let Some((a, b, c, d)) = o.rsts {
        let _ = writeln!(
            s,
            "RSTs seen: FH received {a}, sent {b}; MH received {c}, sent {d}{}",
            if a + b + c + d == 0 { " (none)" } else { "" }
        );
    }
    // Per-second goodput as a bar line, full bar = the 2 Mbit/s cell's ideal.
    let per_s: Vec<f64> = r
        .timeline_bytes
        .chunks(10)
        .map(|c| c.iter().sum::<u64>() as f64 * 8.0)
        .collect();
    let _ = writeln!(
        s,
        "goodput per second (full bar = 1.93 Mbit/s):\n  |{}|",
        sparkline(&per_s, 1.93e6)
    );
    if !o.counters.is_empty() {
        let _ = writeln!(s, "emulator counters (packets):");
        for (name, l) in &o.counters {
            for (dir, c) in [("down", &l.down), ("up", &l.up)] {
                let _ = writeln!(
                    s,
                    "  {name:>5} {dir:<4} in {:>6}  out {:>6}  lost {:>4}  queue-drop {:>4}  flushed {:>4}  no-cell {:>4}",
                    c.pkts_in, c.pkts_out, c.drop_loss, c.drop_queue, c.drop_flush, c.drop_no_cell
                );
            }
        }
    }
    s
}

/// A handoff record's greeting → resumed at the new MSR in ms (what msrd's duration
/// histogram times there), else its first to last phase.
pub fn greeting_to_resumed_ms(h: &itcp_handoff::log::Record) -> Option<f64> {
    match (h.phases.greeting, h.phases.resumed) {
        (Some(g), Some(r)) if r >= g => Some((r - g) as f64 / 1000.0),
        _ => h.duration_ms(),
    }
}

/// The figures of `itcp-lab demo` that [`explain_demo`] puts into words.
#[derive(Debug, Clone, PartialEq)]
pub struct DemoFigures {
    /// Goodput at the MH, KB/s (1 KB = 1024 bytes, as the paper).
    pub itcp_kbs: f64,
    pub regular_kbs: f64,
    /// Longest time without a byte at the MH, s.
    pub itcp_stall_s: f64,
    pub regular_stall_s: f64,
    /// Share of the transfer's time the MH had a cell (I-TCP's run; both runs move alike).
    pub coverage: f64,
    /// Each I-TCP handoff's greeting → resumed at the new MSR, ms.
    pub handoff_ms: Vec<f64>,
    /// Handoffs that did not move every connection.
    pub handoffs_failed: usize,
    /// Both transfers verified byte for byte.
    pub verified: bool,
    /// RSTs seen during the I-TCP run (FH and MH, in and out).
    pub rsts: u64,
}

/// TCP goodput of the demo's 2 Mbit/s cell at best (IP bytes counted, 1.93 Mbit/s of
/// payload), KB/s.
const CELL_KBS: f64 = 1.93e6 / 8.0 / 1024.0;

/// What the demo's figures mean, whether they are good and compared with what, and
/// what to try next: the words after the two runs' reports.
pub fn explain_demo(f: &DemoFigures) -> String {
    let mut s = String::new();
    let mut out = String::new();
    let ratio = f.itcp_kbs / f.regular_kbs.max(1e-9);
    let bound = CELL_KBS * f.coverage;
    let _ = writeln!(s, "What the figures mean");
    let _ = writeln!(
        s,
        "* Goodput is what the MH's application received per second. I-TCP: {:.1} KB/s, \
         regular TCP: {:.1} KB/s, so I-TCP was {ratio:.2}x as fast {}.",
        f.itcp_kbs,
        f.regular_kbs,
        if ratio > 1.05 {
            "(better: the MSR's split connection resumes at once after a move, while \
             regular TCP waits for its retransmission timer, which backed off during the \
             blackout)"
        } else if ratio >= 0.95 {
            "(no better this time: with one seed, luck with the 1 % losses can hide the \
             difference; run it again with --seed)"
        } else {
            "(worse this time, which is not what the paper or our results show: see \
             the handoffs below and docs/results.md)"
        }
    );
    let _ = writeln!(
        s,
        "* The bound: the cell carries at most {CELL_KBS:.0} KB/s of TCP payload, and \
         the MH had a cell {:.0} % of the time, so no protocol could beat {bound:.0} KB/s. \
         I-TCP reached {:.0} % of that, regular TCP {:.0} %; the rest is TCP's own \
         reaction to the 1 % loss with 16 KiB windows, and the moves.",
        f.coverage * 100.0,
        100.0 * f.itcp_kbs / bound.max(1e-9),
        100.0 * f.regular_kbs / bound.max(1e-9)
    );
    let _ = writeln!(
        s,
        "* The paper (Bakre and Badrinath, Table 1, LAN, moves with a 1 s gap) measured \
         {:.2} KB/s for regular TCP and {:.2} KB/s for I-TCP, {:.2}x, on 1994 hardware \
         that got far less out of its 2 Mbit/s WaveLAN, and with moves every 8 s (the \
         demo's come every 4 s): compare the ratio, not the KB/s.",
        PAPER_REGULAR.lan[3],
        PAPER_ITCP.lan[3],
        PAPER_ITCP.lan[3] / PAPER_REGULAR.lan[3]
    );
    let _ = writeln!(
        s,
        "* Longest stall (time without a byte at the MH): I-TCP {:.2} s, regular TCP \
         {:.2} s. Each move has a 1 s blackout, so about 1 s is the floor; {}",
        f.itcp_stall_s,
        f.regular_stall_s,
        if f.regular_stall_s > f.itcp_stall_s + 0.2 {
            "regular TCP lost more to its backed-off timer."
        } else {
            "here neither waited much longer than the other (a loss right after a move \
             costs either a retransmission timeout)."
        }
    );
    if f.handoff_ms.is_empty() {
        let _ = writeln!(s, "* No handoff was logged: the MH never changed MSR.");
    } else {
        let mut v = f.handoff_ms.clone();
        v.sort_by(f64::total_cmp);
        let _ = writeln!(
            s,
            "* Handoffs: {} ({} not moving every connection); greeting → resumed at the \
             new MSR took {:.1} ms at the median, {:.1} ms at most: small against the \
             1 s blackout, as it should be (docs/operations.md says what each handoff \
             time measures).",
            v.len(),
            f.handoffs_failed,
            median(&v),
            v[v.len() - 1]
        );
    }
    let _ = writeln!(
        s,
        "* Integrity: {}; RSTs during the I-TCP run: {}.",
        if f.verified {
            "every byte of both transfers arrived once and in order"
        } else {
            "a transfer FAILED verification"
        },
        if f.rsts == 0 {
            "none, as it should be".to_string()
        } else {
            format!("{} (there should be none)", f.rsts)
        }
    );
    // Filled to a terminal's width, each point with a hanging indent.
    for point in s.lines() {
        match point.strip_prefix("* ") {
            Some(text) => {
                // A figure stays on the line of its unit.
                let glued = [" %", " KB/s", " ms", " s ", " s,", " s.", " s:", " MiB"]
                    .iter()
                    .fold(text.to_string(), |t, u| {
                        t.replace(u, &u.replacen(' ', "\u{a0}", 1))
                    });
                for (i, l) in itcp_cli::table::wrap(&glued, 2, 88).into_iter().enumerate() {
                    let l = l.replace('\u{a0}', " ");
                    let l = if i == 0 { format!("* {}", &l[2..]) } else { l };
                    let _ = writeln!(out, "{l}");
                }
            }
            None => {
                let _ = writeln!(out, "{point}");
            }
        }
    }
    let mut s = out;
    let _ = writeln!(s, "\nTry next");
    for l in [
        "target/release/itcp-lab up --itcp       a running I-TCP network to try by hand (docs/try-it.md)",
        "target/release/itcp-lab demo --seed 2   the same runs with other losses",
        "target/release/itcp-lab bench paper     the paper's Tables 1-2, several seeds (~25 min; docs/results.md)",
        "target/release/itcp-lab bench handoff   handoff latency with 1 to 1000 connections",
        "./scripts/test                          every test, on real namespaces (docs/testing.md)",
    ] {
        let _ = writeln!(s, "  {l}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_table() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        let mut t = Table::default();
        t.add("LAN", "no moves", 60.0);
        t.add("LAN", "no moves", 62.0);
        t.add("LAN", "no moves", 70.0);
        let r = t.render(&PAPER_REGULAR);
        assert!(r.contains("62.00 [60.00–70.00]"), "{r}");
        assert!(r.contains("| LAN (paper) | 65.49 |"), "{r}");
        assert!(!r.contains("WAN"));
    }

    #[test]
    fn sparkline_scales() {
        assert_eq!(sparkline(&[0.0, 0.5, 1.0, 2.0], 1.0), " ▄██");
    }

    #[test]
    fn the_demo_is_explained_in_words_with_its_comparisons() {
        let f = DemoFigures {
            itcp_kbs: 40.0,
            regular_kbs: 25.0,
            itcp_stall_s: 1.1,
            regular_stall_s: 2.9,
            coverage: 0.8,
            handoff_ms: vec![12.0, 9.0, 30.0],
            handoffs_failed: 0,
            verified: true,
            rsts: 0,
        };
        // Points are wrapped: read them as one line each.
        let t = explain_demo(&f).replace("\n  ", " ");
        assert!(t.contains("I-TCP was 1.60x as fast (better:"), "{t}");
        // The bound: 235.6 KB/s × 0.8.
        assert!(t.contains("no protocol could beat 188 KB/s"), "{t}");
        assert!(t.contains("I-TCP reached 21 %"), "{t}");
        assert!(
            t.contains("23.73 KB/s for regular TCP and 36.31 KB/s for I-TCP, 1.53x"),
            "{t}"
        );
        assert!(t.contains("12.0 ms at the median, 30.0 ms at most"), "{t}");
        assert!(t.contains("none, as it should be"), "{t}");
        assert!(
            t.contains("Try next") && t.contains("itcp-lab up --itcp"),
            "{t}"
        );
        let worse = explain_demo(&DemoFigures {
            itcp_kbs: 20.0,
            rsts: 3,
            verified: false,
            handoff_ms: vec![],
            ..f
        })
        .replace("\n  ", " ");
        assert!(
            explain_demo(&f).lines().all(|l| l.chars().count() <= 110),
            "{t}"
        );
        assert!(worse.contains("(worse this time"), "{worse}");
        assert!(
            worse.contains("FAILED verification") && worse.contains("3 (there should be none)")
        );
        assert!(worse.contains("No handoff was logged"));
    }
}
