//! The flows of each MH that closed here lately. Their TIME_WAIT and closing states
//! stay in this MSR's kernel, so after a handoff their stray segments (a retransmitted
//! FIN, a last ACK) reach the new MSR, which would answer them with RST (or forward
//! them to a host that does). The old MSR hands these flows over with the images and
//! the new MSR drops their segments silently for what is left of the window.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use itcp_proto::channel::ClosedFlow;

/// Flows kept per MH at most (the oldest go first).
const PER_MH: usize = 4096;

/// When a flow closed, the MH's end, the other end.
type Closed = (Instant, SocketAddr, SocketAddr);

#[derive(Default)]
pub struct Strays {
    map: Mutex<HashMap<IpAddr, VecDeque<Closed>>>,
    /// Records since the last sweep of MHs gone quiet.
    since_prune: std::sync::atomic::AtomicU64,
}

impl Strays {
    /// Records flows of `mh` that just closed: each the MH's end and the other end.
    pub fn closed(&self, mh: IpAddr, flows: &[(SocketAddr, SocketAddr)], window: Duration) {
        if window.is_zero() || flows.is_empty() {
            return;
        }
        use std::sync::atomic::Ordering;
        if self.since_prune.fetch_add(1, Ordering::Relaxed) >= 4096 {
            self.since_prune.store(0, Ordering::Relaxed);
            self.prune(window);
        }
        let now = Instant::now();
        let mut m = self.map.lock().unwrap();
        let q = m.entry(mh).or_default();
        while q
            .front()
            .is_some_and(|(t, ..)| now.duration_since(*t) > window)
        {
            q.pop_front();
        }
        for &(a, z) in flows {
            if q.len() >= PER_MH {
                q.pop_front();
            }
            q.push_back((now, a, z));
        }
    }

    /// Keeps flows of `mh` that closed at another MSR (received with its images, less
    /// those of live connections: see [`to_drop`]), each as old as it was there: they
    /// go on with the MH's next handoff while their window lasts, so the MSR after
    /// this one drops their strays too (the first MSR's socket may still re-send its
    /// FIN, and the FH's answer goes wherever the MH is).
    pub fn adopt(&self, mh: IpAddr, flows: &[ClosedFlow], window: Duration) {
        let now = Instant::now();
        let mut m = self.map.lock().unwrap();
        let q = m.entry(mh).or_default();
        for f in flows
            .iter()
            .filter(|f| f.age_ms < window.as_millis() as u64)
        {
            let Some(t) = now.checked_sub(Duration::from_millis(f.age_ms)) else {
                continue;
            };
            if !q.iter().any(|&(_, a, z)| (a, z) == (f.mh, f.peer)) {
                q.push_back((t, f.mh, f.peer));
            }
        }
        // Oldest first, as `closed` keeps them; the oldest go when the share is full.
        q.make_contiguous().sort_by_key(|&(t, ..)| t);
        while q.len() > PER_MH {
            q.pop_front();
        }
    }

    /// Takes the flows of `mh` still within `window` (the MH is leaving).
    pub fn take(&self, mh: IpAddr, window: Duration) -> Vec<ClosedFlow> {
        let now = Instant::now();
        let q = self.map.lock().unwrap().remove(&mh).unwrap_or_default();
        q.into_iter()
            .map(|(t, mh, peer)| (now.duration_since(t), mh, peer))
            .filter(|(age, ..)| *age < window)
            .map(|(age, mh, peer)| ClosedFlow {
                mh,
                peer,
                age_ms: age.as_millis() as u64,
            })
            .collect()
    }

    /// Drops the records of MHs with nothing recent (called now and then).
    pub fn prune(&self, window: Duration) {
        let now = Instant::now();
        self.map.lock().unwrap().retain(|_, q| {
            q.back()
                .is_some_and(|(t, ..)| now.duration_since(*t) < window)
        });
    }
}

/// Of the closed flows received with an MH's images, those the new MSR drops, each
/// once with the rest of its window. Not the flows of `live` connections (restored
/// here, or opened here meanwhile): the MH's kernel reuses ports, and a new
/// connection on a closed one's 4-tuple would lose its own segments (soak, seed 29).
pub fn to_drop(
    flows: &[ClosedFlow],
    window: Duration,
    live: &HashSet<(SocketAddr, SocketAddr)>,
) -> Vec<ClosedFlow> {
    let mut youngest: HashMap<(SocketAddr, SocketAddr), u64> = HashMap::new();
    for f in flows.iter().filter(|f| !live.contains(&(f.mh, f.peer))) {
        if Duration::from_millis(f.age_ms) < window {
            let age = youngest.entry((f.mh, f.peer)).or_insert(f.age_ms);
            *age = (*age).min(f.age_ms);
        }
    }
    let mut v: Vec<_> = youngest
        .into_iter()
        .map(|((mh, peer), age_ms)| ClosedFlow { mh, peer, age_ms })
        .collect();
    v.sort_by_key(|f| std::cmp::Reverse(f.age_ms));
    v
}

/// For the nftables set: each flow with what is left of its window.
pub fn timed(flows: &[ClosedFlow], window: Duration) -> Vec<(SocketAddr, SocketAddr, Duration)> {
    flows
        .iter()
        .filter_map(|f| {
            let left = window.checked_sub(Duration::from_millis(f.age_ms))?;
            (!left.is_zero()).then_some((f.mh, f.peer, left))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flows_are_kept_per_mh_within_the_window() {
        let s = Strays::default();
        let mh: IpAddr = "10.2.0.100".parse().unwrap();
        let a: SocketAddr = "10.2.0.100:40000".parse().unwrap();
        let z: SocketAddr = "10.0.0.1:80".parse().unwrap();
        s.closed(mh, &[(a, z)], Duration::from_secs(60));
        s.closed(mh, &[(a, z)], Duration::ZERO);
        let got = s.take(mh, Duration::from_secs(60));
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].mh, got[0].peer), (a, z));
        assert!(s.take(mh, Duration::from_secs(60)).is_empty(), "taken");
        let d = timed(&got, Duration::from_secs(60));
        assert!(d[0].2 <= Duration::from_secs(60) && d[0].2 > Duration::from_secs(59));
        let old = ClosedFlow {
            mh: a,
            peer: z,
            age_ms: 61_000,
        };
        assert!(to_drop(&[old], Duration::from_secs(60), &HashSet::new()).is_empty());
    }

    #[test]
    fn flows_of_live_connections_are_not_dropped_and_each_is_dropped_once() {
        let z: SocketAddr = "10.0.0.1:80".parse().unwrap();
        let a: SocketAddr = "10.2.0.100:40000".parse().unwrap();
        let b: SocketAddr = "10.2.0.100:40001".parse().unwrap();
        let came = |p, age_ms| ClosedFlow {
            mh: p,
            peer: z,
            age_ms,
        };
        // `a` closed twice (its port reused), `b` closed and reused by a live one.
        let flows = [came(a, 30_000), came(b, 5_000), came(a, 2_000)];
        let live = HashSet::from([(b, z)]);
        let d = to_drop(&flows, Duration::from_secs(60), &live);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(
            (d[0].mh, d[0].age_ms),
            (a, 2_000),
            "the youngest close counts"
        );
    }

    #[test]
    fn adopted_flows_go_on_with_their_age() {
        let s = Strays::default();
        let mh: IpAddr = "10.2.0.100".parse().unwrap();
        let a: SocketAddr = "10.2.0.100:40000".parse().unwrap();
        let b: SocketAddr = "10.2.0.100:40001".parse().unwrap();
        let z: SocketAddr = "10.0.0.1:80".parse().unwrap();
        let w = Duration::from_secs(60);
        s.closed(mh, &[(b, z)], w);
        let came = |p, age_ms| ClosedFlow {
            mh: p,
            peer: z,
            age_ms,
        };
        // One closed 10 s ago elsewhere, one past the window, one twice.
        s.adopt(mh, &[came(a, 10_000), came(a, 10_000), came(b, 61_000)], w);
        let got = s.take(mh, w);
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0].mh, a, "oldest first");
        assert!((10_000..11_000).contains(&got[0].age_ms), "{got:?}");
        assert_eq!(got[1].mh, b);
    }

    #[test]
    fn an_mh_keeps_at_most_its_share() {
        let s = Strays::default();
        let mh: IpAddr = "10.2.0.100".parse().unwrap();
        let z: SocketAddr = "10.0.0.1:80".parse().unwrap();
        for p in 0..(PER_MH as u16 + 10) {
            s.closed(mh, &[(SocketAddr::new(mh, p), z)], Duration::from_secs(60));
        }
        let got = s.take(mh, Duration::from_secs(60));
        assert_eq!(got.len(), PER_MH);
        assert_eq!(got[0].mh.port(), 10, "the oldest went first");
    }
}
