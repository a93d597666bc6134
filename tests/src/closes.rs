//! Which RSTs a host sent after its own clean close, read from a capture of its FINs
//! and RSTs (tcpdump `-i any -nn -tt -S -l` text).
//!
//! A passive closer keeps no TIME_WAIT: once its FIN is acknowledged its socket is
//! gone, and a late duplicate of that acknowledgement is answered with a reply RST
//! (flags `[R]`, sequence number = its FIN's + 1). It happens when the closer re-sends
//! its FIN (a tail-loss probe) because the ACK of the first was late — on a loaded
//! machine, the emulated link or a peer's kernel late by a few ms — and the peer, in
//! TIME_WAIT, ACKs both. Plain kernel TCP, with no byte at stake: the host had the
//! peer's FIN and the peer had acknowledged the host's, so both directions were
//! complete. The tests' RST counters count them apart, and only those: an RST with
//! ACK (an abort), one whose sequence number is not the FIN's + 1, or one on a flow
//! whose peer had not sent its FIN still counts.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;

/// One FIN or RST segment of the capture.
#[derive(Debug, Clone, PartialEq)]
pub struct Seg {
    /// The interface it was captured on (`-i any` may show a packet on two).
    pub iface: String,
    /// Sent by the capturing host (`Out`), else received.
    pub sent: bool,
    pub src: SocketAddr,
    pub dst: SocketAddr,
    /// tcpdump's flags, e.g. `F.`, `R`, `R.`.
    pub flags: String,
    /// The sequence number after the segment's data: a FIN's own sequence number.
    pub seq_end: u32,
}

fn endpoint(s: &str) -> Option<SocketAddr> {
    let (ip, port) = s.trim_end_matches([':', ',']).rsplit_once('.')?;
    Some(SocketAddr::new(ip.parse().ok()?, port.parse().ok()?))
}

/// Parses one line of `tcpdump -i any -nn -tt -S`:
/// `TS IFACE Out IP A.B.C.D.P > E.F.G.H.Q: Flags [F.], seq X[:Y], ack …`.
pub fn parse_line(line: &str) -> Option<Seg> {
    let w: Vec<&str> = line.split_whitespace().collect();
    let dir = w.iter().position(|t| *t == "In" || *t == "Out")?;
    let f = w.get(dir + 1..)?;
    if f.len() < 7 || !(f[0] == "IP" || f[0] == "IP6") || f[2] != ">" || f[4] != "Flags" {
        return None;
    }
    let flags = f[5]
        .strip_prefix('[')?
        .trim_end_matches(',')
        .strip_suffix(']')?;
    let seq = f.iter().position(|t| *t == "seq")?;
    let seq = f.get(seq + 1)?.trim_end_matches(',');
    let seq_end = seq.rsplit(':').next()?.parse().ok()?;
    Some(Seg {
        iface: w.get(dir.checked_sub(1)?)?.to_string(),
        sent: w[dir] == "Out",
        src: endpoint(f[1])?,
        dst: endpoint(f[3])?,
        flags: flags.to_string(),
        seq_end,
    })
}

/// How many RSTs the capturing host sent after its own clean close; `segs` in capture
/// order. See the module's comment. Each is counted (a peer's two late ACKs draw two),
/// on the interface that saw most of them: `-i any` may show each on two.
pub fn rsts_after_clean_close(segs: &[Seg]) -> usize {
    // Per flow (local, remote): the sequence number after our FIN, and whether the
    // peer's FIN came.
    let mut ours: HashMap<(SocketAddr, SocketAddr), u32> = HashMap::new();
    let mut theirs: HashSet<(SocketAddr, SocketAddr)> = HashSet::new();
    let mut benign: HashMap<&str, usize> = HashMap::new();
    for s in segs {
        let flow = if s.sent {
            (s.src, s.dst)
        } else {
            (s.dst, s.src)
        };
        if s.flags.contains('R') {
            let reply = s.flags == "R";
            if s.sent && reply && theirs.contains(&flow) && ours.get(&flow) == Some(&s.seq_end) {
                *benign.entry(&s.iface).or_default() += 1;
            }
        } else if s.flags.contains('F') {
            if s.sent {
                ours.insert(flow, s.seq_end.wrapping_add(1));
            } else {
                theirs.insert(flow);
            }
        }
    }
    benign.into_values().max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The FIN/RST lines of a flow of the gap variant of the short-connections test
    /// that failed (stop 35): the FH's FIN, re-sent 8.7 ms later, both ACKed by msrd's
    /// socket in TIME_WAIT; the second ACK drew the RST.
    const FAILED: &str = "\
1795797901.289073 ifb0  In  IP 10.2.0.100.56788 > 10.0.0.1.5006: Flags [F.], seq 1030427317, ack 682668859, win 63, length 0
1795797901.289148 ifb0  Out IP 10.0.0.1.5006 > 10.2.0.100.56788: Flags [F.], seq 682671859, ack 1030427318, win 70, length 0
1795797901.297855 ifb0  Out IP 10.0.0.1.5006 > 10.2.0.100.56788: Flags [F.], seq 682671859, ack 1030427318, win 70, length 0
1795797901.300088 ifb0  Out IP 10.0.0.1.5006 > 10.2.0.100.56788: Flags [R], seq 682671860, win 0, length 0
";

    fn segs(text: &str) -> Vec<Seg> {
        text.lines().filter_map(parse_line).collect()
    }

    #[test]
    fn parses_fins_with_and_without_data_and_ipv6() {
        let s = parse_line("1.5 lan0  Out IP6 fd00::1.5006 > fd00:2::100.4000: Flags [FP.], seq 100:200, ack 7, win 5, length 100").unwrap();
        assert!(s.sent);
        assert_eq!(s.src, "[fd00::1]:5006".parse().unwrap());
        assert_eq!(s.dst, "[fd00:2::100]:4000".parse().unwrap());
        assert_eq!((s.flags.as_str(), s.seq_end), ("FP.", 200));
        let s = segs(FAILED);
        assert_eq!(s.len(), 4);
        assert_eq!((s[0].sent, s[0].seq_end), (false, 1030427317));
        assert_eq!((s[3].flags.as_str(), s[3].seq_end), ("R", 682671860));
        assert!(parse_line("tcpdump: listening on any").is_none());
    }

    #[test]
    fn a_reply_to_a_late_ack_of_our_fin_after_the_peers_fin_is_after_a_clean_close() {
        assert_eq!(rsts_after_clean_close(&segs(FAILED)), 1);
    }

    #[test]
    fn other_rsts_still_count() {
        let lines: Vec<&str> = FAILED.lines().collect();
        // The peer had not sent its FIN: bytes could still be on their way to us.
        assert_eq!(rsts_after_clean_close(&segs(&lines[1..].join("\n"))), 0);
        // An abort (RST with ACK), a reply RST at another sequence number, one
        // received instead of sent.
        for (from, to) in [
            ("Flags [R], seq 682671860", "Flags [R.], seq 682671860"),
            ("Flags [R], seq 682671860", "Flags [R], seq 682671859"),
            (
                "Out IP 10.0.0.1.5006 > 10.2.0.100.56788: Flags [R]",
                "In  IP 10.2.0.100.56788 > 10.0.0.1.5006: Flags [R]",
            ),
        ] {
            let text = FAILED.replace(from, to);
            assert_ne!(text, FAILED);
            assert_eq!(rsts_after_clean_close(&segs(&text)), 0, "{to}");
        }
        // The same RST on two interfaces of `-i any` is one.
        let twice = format!("{FAILED}{}\n", lines[3].replace("ifb0", "wan0"));
        assert_eq!(rsts_after_clean_close(&segs(&twice)), 1);
    }

    /// Two late duplicate ACKs of the FH's FIN drew two RSTs, 1.5 ms apart (the
    /// IPv6 short-connections test, stop 40): both after a clean close. Counted as one
    /// before, so the test saw one RST too many.
    #[test]
    fn each_reply_to_a_late_ack_after_a_clean_close_counts() {
        let later = FAILED
            .lines()
            .nth(3)
            .unwrap()
            .replace("1795797901.300088", "1795797901.301571");
        let two = format!("{FAILED}{later}\n");
        assert_eq!(rsts_after_clean_close(&segs(&two)), 2);
    }
}
