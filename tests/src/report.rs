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
                h.duration_ms().unwrap_or(f64::NAN)
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
}
