//! One direction of an emulated link: loss, a byte-limited drop-tail queue, a
//! transmitter of fixed rate (or a mahimahi-style delivery trace), and propagation delay.
//!
//! Sans-IO: the caller passes the current time in nanoseconds of one monotonic clock and
//! gets back frames whose delivery time has come. Departure and delivery times come from
//! an ideal virtual clock (`next_free`), so a late wake-up of the caller delays a frame
//! but never shifts the schedule of the frames behind it.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::rng::SplitMix64;

/// Ethernet header bytes: rates and queue limits count IP bytes, as a link's
/// "2 Mbit/s" does, so a 1500-byte IP packet costs 1500 bytes of link time.
pub const ETH_HEADER: usize = 14;

/// Bytes one delivery opportunity of a mahimahi trace can carry.
pub const TRACE_MTU: u64 = 1500;

/// Random loss model of one link direction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "model", rename_all = "snake_case", deny_unknown_fields)]
pub enum Loss {
    #[default]
    None,
    /// Each packet is lost independently with probability `p`.
    Bernoulli { p: f64 },
    /// Two-state Markov chain (bursty loss): `p_gb` = P(good→bad) and `p_bg` =
    /// P(bad→good) per packet; loss probability `loss_good` / `loss_bad` in each state.
    GilbertElliott {
        p_gb: f64,
        p_bg: f64,
        #[serde(default)]
        loss_good: f64,
        #[serde(default = "one")]
        loss_bad: f64,
    },
}

fn one() -> f64 {
    1.0
}

/// Parameters of one link direction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkParams {
    /// Transmit rate in bit/s of IP bytes; 0 means unlimited (no serialisation delay).
    #[serde(default)]
    pub rate_bps: u64,
    /// One-way propagation delay in microseconds.
    #[serde(default)]
    pub delay_us: u64,
    /// Drop-tail queue limit in bytes (IP bytes waiting for the transmitter).
    #[serde(default = "default_queue")]
    pub queue_bytes: u64,
    #[serde(default)]
    pub loss: Loss,
    /// Delivery opportunities in ms (mahimahi trace format, looped). When present it
    /// replaces `rate_bps`. Loaded from a file by the `airlink` binary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_ms: Option<Vec<u64>>,
    /// A mahimahi trace file to read into `trace_ms` (by `airlink`, which reads it
    /// before the emulator sees the parameters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_file: Option<std::path::PathBuf>,
}

fn default_queue() -> u64 {
    64 * 1024
}

impl Default for LinkParams {
    fn default() -> Self {
        Self {
            rate_bps: 0,
            delay_us: 0,
            queue_bytes: default_queue(),
            loss: Loss::None,
            trace_ms: None,
            trace_file: None,
        }
    }
}

impl LinkParams {
    /// Reads `trace_file` (if any) into `trace_ms`.
    pub fn load_trace_file(&mut self) -> Result<(), String> {
        if let Some(path) = self.trace_file.take() {
            let p = path.display();
            let text =
                std::fs::read_to_string(&path).map_err(|e| format!("trace file {p}: {e}"))?;
            self.trace_ms = Some(parse_trace(&text).map_err(|e| format!("trace file {p}: {e}"))?);
        }
        Ok(())
    }

    pub fn validate(&self) -> Result<(), String> {
        if let Some(f) = &self.trace_file {
            return Err(format!("trace file {} was not read", f.display()));
        }
        let prob = |name: &str, p: f64| {
            if (0.0..=1.0).contains(&p) {
                Ok(())
            } else {
                Err(format!("{name} must be a probability in [0, 1], got {p}"))
            }
        };
        match self.loss {
            Loss::None => {}
            Loss::Bernoulli { p } => prob("loss.p", p)?,
            Loss::GilbertElliott {
                p_gb,
                p_bg,
                loss_good,
                loss_bad,
            } => {
                prob("loss.p_gb", p_gb)?;
                prob("loss.p_bg", p_bg)?;
                prob("loss.loss_good", loss_good)?;
                prob("loss.loss_bad", loss_bad)?;
            }
        }
        if let Some(t) = &self.trace_ms {
            if t.is_empty() {
                return Err("trace has no delivery opportunities".into());
            }
            if t.windows(2).any(|w| w[1] < w[0]) {
                return Err("trace timestamps must not decrease".into());
            }
            if *t.last().unwrap() == 0 {
                return Err("trace must end after 0 ms (its last line is its period)".into());
            }
        }
        if self.queue_bytes < 1500 {
            return Err(format!(
                "queue_bytes must hold at least one 1500-byte packet, got {}",
                self.queue_bytes
            ));
        }
        Ok(())
    }
}

/// Parses a mahimahi trace: one integer millisecond timestamp per line, each line one
/// 1500-byte delivery opportunity; the trace repeats with period = last timestamp.
pub fn parse_trace(text: &str) -> Result<Vec<u64>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        out.push(
            line.parse::<u64>().map_err(|_| {
                format!("trace line {}: {line:?} is not a millisecond count", i + 1)
            })?,
        );
    }
    Ok(out)
}

/// Per-direction counters. Bytes are IP bytes (frame minus Ethernet header).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    pub pkts_in: u64,
    pub bytes_in: u64,
    pub pkts_out: u64,
    pub bytes_out: u64,
    /// Dropped by the random loss model.
    pub drop_loss: u64,
    /// Dropped because the queue was full (drop-tail).
    pub drop_queue: u64,
    /// Dropped because the MH left the cell while they were queued or in flight.
    pub drop_flush: u64,
    /// Dropped because the MH was not in this cell when they were sent.
    pub drop_no_cell: u64,
    /// Delivered at least [`LATE_NS`] after their time: the emulator woke up late (a
    /// busy machine), so the link was slower than configured.
    #[serde(default)]
    pub late: u64,
    /// The latest delivery after its time, µs.
    #[serde(default)]
    pub max_late_us: u64,
}

/// How late a delivery must be to count as [`Counters::late`].
pub const LATE_NS: u64 = 2_000_000;

#[derive(Debug)]
struct Frame {
    /// When the last bit leaves the transmitter (virtual clock).
    depart_ns: u64,
    /// When it reaches the far end.
    deliver_ns: u64,
    /// Decided by the loss model at enqueue; a lost frame still occupies the link.
    lost: bool,
    data: Vec<u8>,
}

#[derive(Debug)]
struct TraceState {
    /// Frames waiting for delivery opportunities, with bytes still to send of the head.
    waiting: VecDeque<Frame>,
    head_left: u64,
    waiting_bytes: u64,
    /// Index of the next opportunity (counting across loops).
    next_opp: u64,
}

/// One direction of a link.
#[derive(Debug)]
pub struct LinkDir {
    params: LinkParams,
    rng: SplitMix64,
    ge_bad: bool,
    /// Virtual time when the transmitter is free again (rate mode).
    next_free_ns: u64,
    /// Frames that have been accepted, in order of delivery.
    in_flight: VecDeque<Frame>,
    trace: Option<TraceState>,
    /// Time origin of the trace.
    epoch_ns: u64,
    pub counters: Counters,
}

fn ip_len(frame: &[u8]) -> u64 {
    frame.len().saturating_sub(ETH_HEADER) as u64
}

impl LinkDir {
    pub fn new(params: LinkParams, seed: u64, epoch_ns: u64) -> Self {
        let mut l = Self {
            params: LinkParams::default(),
            rng: SplitMix64::new(seed),
            ge_bad: false,
            next_free_ns: 0,
            in_flight: VecDeque::new(),
            trace: None,
            epoch_ns,
            counters: Counters::default(),
        };
        l.set_params(params);
        l
    }

    pub fn params(&self) -> &LinkParams {
        &self.params
    }

    /// Changes the parameters; queued frames keep the times they were given.
    pub fn set_params(&mut self, params: LinkParams) {
        let has_trace = params.trace_ms.is_some();
        if has_trace && self.trace.is_none() {
            self.trace = Some(TraceState {
                waiting: VecDeque::new(),
                head_left: 0,
                waiting_bytes: 0,
                next_opp: 0,
            });
        } else if !has_trace {
            if let Some(t) = self.trace.take() {
                // Frames still waiting for opportunities are lost with the trace.
                self.counters.drop_flush += t.waiting.len() as u64;
            }
        }
        self.params = params;
    }

    fn lose(&mut self) -> bool {
        match self.params.loss {
            Loss::None => false,
            Loss::Bernoulli { p } => self.rng.chance(p),
            Loss::GilbertElliott {
                p_gb,
                p_bg,
                loss_good,
                loss_bad,
            } => {
                // Transition first, then draw the loss in the new state.
                let flip = if self.ge_bad { p_bg } else { p_gb };
                if self.rng.chance(flip) {
                    self.ge_bad = !self.ge_bad;
                }
                self.rng
                    .chance(if self.ge_bad { loss_bad } else { loss_good })
            }
        }
    }

    fn ser_ns(&self, bytes: u64) -> u64 {
        if self.params.rate_bps == 0 {
            0
        } else {
            // Round up so a long run of frames never runs faster than the rate.
            (bytes * 8 * 1_000_000_000).div_ceil(self.params.rate_bps)
        }
    }

    /// Bytes waiting for the transmitter at `now` (fluid view of the rate-mode queue).
    fn backlog_bytes(&self, now: u64) -> u64 {
        if let Some(t) = &self.trace {
            return t.waiting_bytes;
        }
        if self.params.rate_bps == 0 || self.next_free_ns <= now {
            return 0;
        }
        ((self.next_free_ns - now) as u128 * self.params.rate_bps as u128 / 8_000_000_000) as u64
    }

    /// Offers a frame to the link at time `now`.
    pub fn offer(&mut self, now: u64, data: Vec<u8>) {
        let size = ip_len(&data);
        self.counters.pkts_in += 1;
        self.counters.bytes_in += size;
        if self.backlog_bytes(now) + size > self.params.queue_bytes {
            self.counters.drop_queue += 1;
            return;
        }
        let lost = self.lose();
        if lost {
            self.counters.drop_loss += 1;
        }
        let delay = self.params.delay_us * 1000;
        if let Some(t) = &mut self.trace {
            if t.waiting.is_empty() {
                t.head_left = size.max(1);
                // Opportunities that passed while the queue was empty are wasted.
                t.next_opp = first_opp_at_or_after(
                    self.params.trace_ms.as_ref().unwrap(),
                    self.epoch_ns,
                    now,
                );
            }
            t.waiting_bytes += size;
            t.waiting.push_back(Frame {
                depart_ns: 0,
                deliver_ns: 0,
                lost,
                data,
            });
            return;
        }
        let start = self.next_free_ns.max(now);
        let depart = start + self.ser_ns(size);
        self.next_free_ns = depart;
        self.in_flight.push_back(Frame {
            depart_ns: depart,
            deliver_ns: depart + delay,
            lost,
            data,
        });
    }

    /// Runs trace opportunities up to `now`, moving frames from waiting to in flight.
    fn run_trace(&mut self, now: u64) {
        let Some(t) = &mut self.trace else { return };
        let trace = self.params.trace_ms.as_ref().unwrap();
        let delay = self.params.delay_us * 1000;
        while !t.waiting.is_empty() {
            let at = opp_time(trace, self.epoch_ns, t.next_opp);
            if at > now {
                break;
            }
            t.next_opp += 1;
            let mut credit = TRACE_MTU;
            while credit > 0 {
                if t.head_left > credit {
                    t.head_left -= credit;
                    break;
                }
                credit -= t.head_left;
                let mut f = t.waiting.pop_front().unwrap();
                t.waiting_bytes -= ip_len(&f.data);
                f.depart_ns = at;
                f.deliver_ns = at + delay;
                self.in_flight.push_back(f);
                match t.waiting.front() {
                    Some(n) => t.head_left = ip_len(&n.data).max(1),
                    None => break,
                }
            }
        }
    }

    /// Moves time to `now` and appends the frames delivered by then to `out`.
    pub fn advance(&mut self, now: u64, out: &mut Vec<Vec<u8>>) {
        self.run_trace(now);
        while let Some(f) = self.in_flight.front() {
            if f.deliver_ns > now {
                break;
            }
            let f = self.in_flight.pop_front().unwrap();
            if !f.lost {
                let late = now - f.deliver_ns;
                self.counters.late += u64::from(late >= LATE_NS);
                self.counters.max_late_us = self.counters.max_late_us.max(late / 1000);
                self.counters.pkts_out += 1;
                self.counters.bytes_out += ip_len(&f.data);
                out.push(f.data);
            }
        }
    }

    /// The next time `advance` has work to do.
    pub fn next_event(&self) -> Option<u64> {
        let flight = self.in_flight.front().map(|f| f.deliver_ns);
        let opp = self.trace.as_ref().and_then(|t| {
            (!t.waiting.is_empty()).then(|| {
                opp_time(
                    self.params.trace_ms.as_ref().unwrap(),
                    self.epoch_ns,
                    t.next_opp,
                )
            })
        });
        match (flight, opp) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Drops everything queued or in flight (the MH left the cell).
    pub fn flush(&mut self, now: u64) {
        let mut n = self.in_flight.iter().filter(|f| !f.lost).count() as u64;
        self.in_flight.clear();
        if let Some(t) = &mut self.trace {
            n += t.waiting.len() as u64;
            t.waiting.clear();
            t.waiting_bytes = 0;
        }
        self.counters.drop_flush += n;
        self.next_free_ns = self.next_free_ns.min(now);
    }

    /// Counts a frame that could not enter this link because the MH is not in the cell.
    pub fn count_no_cell(&mut self, frame: &[u8]) {
        self.counters.pkts_in += 1;
        self.counters.bytes_in += ip_len(frame);
        self.counters.drop_no_cell += 1;
    }

    /// Frames accepted but not yet delivered (for tests and status).
    pub fn queued_frames(&self) -> usize {
        self.in_flight.len() + self.trace.as_ref().map_or(0, |t| t.waiting.len())
    }

    #[cfg(test)]
    fn in_flight_depart(&self) -> Vec<u64> {
        self.in_flight.iter().map(|f| f.depart_ns).collect()
    }
}

fn opp_time(trace: &[u64], epoch_ns: u64, idx: u64) -> u64 {
    let n = trace.len() as u64;
    let period_ms = *trace.last().unwrap();
    let loop_no = idx / n;
    epoch_ns + (loop_no * period_ms + trace[(idx % n) as usize]) * 1_000_000
}

fn first_opp_at_or_after(trace: &[u64], epoch_ns: u64, now: u64) -> u64 {
    let n = trace.len() as u64;
    let period_ns = *trace.last().unwrap() * 1_000_000;
    let since = now.saturating_sub(epoch_ns);
    let loop_no = since / period_ns;
    let mut idx = loop_no * n;
    while opp_time(trace, epoch_ns, idx) < now {
        idx += 1;
    }
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(ip_bytes: usize) -> Vec<u8> {
        vec![0u8; ip_bytes + ETH_HEADER]
    }

    fn drain(l: &mut LinkDir, until: u64) -> Vec<(u64, usize)> {
        // Step in 10 µs increments, recording delivery times.
        let mut got = Vec::new();
        let mut t = 0;
        while t <= until {
            let mut out = Vec::new();
            l.advance(t, &mut out);
            got.extend(out.into_iter().map(|f| (t, f.len())));
            t += 10_000;
        }
        got
    }

    #[test]
    fn rate_and_delay() {
        // 2 Mbit/s: a 1500-byte packet takes 6 ms; delay 10 ms.
        let p = LinkParams {
            rate_bps: 2_000_000,
            delay_us: 10_000,
            queue_bytes: 100_000,
            ..Default::default()
        };
        let mut l = LinkDir::new(p, 1, 0);
        for _ in 0..3 {
            l.offer(0, frame(1500));
        }
        assert_eq!(
            l.in_flight_depart(),
            vec![6_000_000, 12_000_000, 18_000_000]
        );
        let got = drain(&mut l, 30_000_000);
        let times: Vec<u64> = got.iter().map(|g| g.0).collect();
        assert_eq!(times, vec![16_000_000, 22_000_000, 28_000_000]);
    }

    #[test]
    fn deliveries_after_their_time_are_counted_late() {
        // 2 Mbit/s, 10 ms: the frames are due at 16 and 22 ms.
        let p = LinkParams {
            rate_bps: 2_000_000,
            delay_us: 10_000,
            queue_bytes: 100_000,
            ..Default::default()
        };
        let mut l = LinkDir::new(p, 1, 0);
        l.offer(0, frame(1500));
        l.offer(0, frame(1500));
        let mut out = Vec::new();
        // On time within 1 ms: not late.
        l.advance(16_900_000, &mut out);
        assert_eq!(
            (out.len(), l.counters.late, l.counters.max_late_us),
            (1, 0, 900)
        );
        // Woken 3 ms after the second one's time.
        l.advance(25_000_000, &mut out);
        assert_eq!(
            (out.len(), l.counters.late, l.counters.max_late_us),
            (2, 1, 3000)
        );
    }

    #[test]
    fn drop_tail_counts_queue_drops() {
        let p = LinkParams {
            rate_bps: 1_000_000,
            queue_bytes: 3000,
            ..Default::default()
        };
        let mut l = LinkDir::new(p, 1, 0);
        for _ in 0..10 {
            l.offer(0, frame(1000));
        }
        // Backlog grows by 1000 per frame; the 4th would exceed 3000 bytes.
        assert_eq!(l.counters.drop_queue, 7);
        assert_eq!(l.queued_frames(), 3);
    }

    #[test]
    fn bernoulli_is_seeded() {
        let p = LinkParams {
            loss: Loss::Bernoulli { p: 0.1 },
            queue_bytes: u64::MAX / 4,
            ..Default::default()
        };
        let run = |seed| {
            let mut l = LinkDir::new(p.clone(), seed, 0);
            for i in 0..10_000 {
                l.offer(i, frame(100));
            }
            l.counters.drop_loss
        };
        assert_eq!(run(5), run(5));
        assert_ne!(run(5), run(6));
        let d = run(5) as f64 / 10_000.0;
        assert!((d - 0.1).abs() < 0.01, "{d}");
    }

    #[test]
    fn gilbert_elliott_mean_loss() {
        // Stationary P(bad) = p_gb / (p_gb + p_bg) = 0.01/0.11; all bad packets lost.
        let p = LinkParams {
            loss: Loss::GilbertElliott {
                p_gb: 0.01,
                p_bg: 0.1,
                loss_good: 0.0,
                loss_bad: 1.0,
            },
            queue_bytes: u64::MAX / 4,
            ..Default::default()
        };
        let mut l = LinkDir::new(p, 9, 0);
        let n = 200_000;
        for i in 0..n {
            l.offer(i, frame(100));
        }
        let d = l.counters.drop_loss as f64 / n as f64;
        assert!((d - 0.0909).abs() < 0.01, "{d}");
    }

    #[test]
    fn trace_delivers_at_opportunities() {
        // Opportunities at 5 ms and 10 ms, repeating every 10 ms.
        let p = LinkParams {
            trace_ms: Some(vec![5, 10]),
            delay_us: 1000,
            ..Default::default()
        };
        let mut l = LinkDir::new(p, 1, 0);
        for _ in 0..3 {
            l.offer(0, frame(1500));
        }
        let got = drain(&mut l, 30_000_000);
        let times: Vec<u64> = got.iter().map(|g| g.0).collect();
        assert_eq!(times, vec![6_000_000, 11_000_000, 16_000_000]);
    }

    #[test]
    fn trace_packs_small_packets_into_one_opportunity() {
        let p = LinkParams {
            trace_ms: Some(vec![10]),
            ..Default::default()
        };
        let mut l = LinkDir::new(p, 1, 0);
        for _ in 0..3 {
            l.offer(0, frame(500));
        }
        let got = drain(&mut l, 10_000_000);
        assert_eq!(got.len(), 3);
    }

    #[test]
    fn flush_drops_everything() {
        let p = LinkParams {
            rate_bps: 1_000_000,
            delay_us: 50_000,
            ..Default::default()
        };
        let mut l = LinkDir::new(p, 1, 0);
        for _ in 0..5 {
            l.offer(0, frame(1000));
        }
        l.flush(1);
        assert_eq!(l.counters.drop_flush, 5);
        assert!(l.next_event().is_none());
        // The transmitter is free again right away.
        l.offer(2, frame(1000));
        assert_eq!(l.in_flight_depart(), vec![8_000_002]);
    }

    #[test]
    fn params_validate() {
        let mut p = LinkParams {
            loss: Loss::Bernoulli { p: 1.5 },
            ..Default::default()
        };
        assert!(p.validate().unwrap_err().contains("loss.p"));
        p.loss = Loss::None;
        p.trace_ms = Some(vec![]);
        assert!(p.validate().is_err());
        assert_eq!(parse_trace("1\n2\n\n3\n").unwrap(), vec![1, 2, 3]);
        assert!(parse_trace("1\nx\n").unwrap_err().contains("line 2"));
    }
}
