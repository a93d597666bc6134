//! Connections in setup, as a handoff sees them: none may be caught between MSRs.
//!
//! A connection in setup waits either for the MH (a request handshake waiting for its
//! next message, or an intercepted connection whose fixed side is not started yet) or
//! for the fixed side (a name resolving, a connect in flight). The first kind is
//! frozen in place and moved like any relay: a handshake travels as its
//! [`Transcript`] and is replayed where it resumes. The second kind needs nothing from
//! the MH, so a handoff waits for it to finish ([`Inflight::settle`]) and then moves
//! the relay it became.

use std::collections::HashMap;
use std::net::IpAddr;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::relay::Pending;

#[derive(Default)]
struct Entry {
    /// Connections of the MH whose fixed side is being set up.
    connecting: usize,
    /// Connections of the MH accepted but not yet in the session table.
    arriving: usize,
    /// A handoff is freezing the MH: no new fixed-side setup may start.
    freezing: bool,
}

impl Entry {
    fn busy(&self) -> usize {
        self.connecting + self.arriving
    }
}

/// Per MH: fixed-side setups in flight, connections accepted but not yet in the
/// session table, and whether a handoff is freezing it.
#[derive(Default)]
pub struct Inflight {
    map: Mutex<HashMap<IpAddr, Entry>>,
    /// Bumped on every change, so that waiters re-check.
    changed: watch::Sender<u64>,
    /// msrd's accepting sockets: a connection whose handshake completed before a
    /// handoff's hold may still wait in their accept queues.
    listeners: Mutex<Vec<RawFd>>,
    /// Every MH is freezing (an upgrade hands the whole process over). Written under
    /// the map's lock, so that no `begin` slips between the flag and the count.
    all: std::sync::atomic::AtomicBool,
}

/// A connection accepted and not yet in the session table (a handoff waits for it).
pub struct Arriving {
    inflight: Arc<Inflight>,
    mh: IpAddr,
}

impl Drop for Arriving {
    fn drop(&mut self) {
        self.inflight.end(self.mh, |e| e.arriving -= 1);
    }
}

/// One fixed-side setup in flight; ends when dropped (once its relay is in the
/// session table, or it failed).
pub struct Connecting {
    inflight: Arc<Inflight>,
    mh: IpAddr,
}

impl Drop for Connecting {
    fn drop(&mut self) {
        self.inflight.end(self.mh, |e| e.connecting -= 1);
    }
}

impl Inflight {
    fn end(&self, mh: IpAddr, f: impl FnOnce(&mut Entry)) {
        let mut m = self.map.lock().unwrap();
        if let Some(e) = m.get_mut(&mh) {
            f(e);
            if e.busy() == 0 && !e.freezing {
                m.remove(&mh);
            }
        }
        drop(m);
        self.changed.send_modify(|g| *g += 1);
    }

    /// Registers an accepting socket (see [`Inflight::settle`]).
    pub fn add_listener(&self, fd: RawFd) {
        self.listeners.lock().unwrap().push(fd);
    }

    /// The accepting socket is about to close.
    pub fn remove_listener(&self, fd: RawFd) {
        self.listeners.lock().unwrap().retain(|&x| x != fd);
    }

    /// Counts a connection of `mh` just accepted, until it is in the session table.
    pub fn arriving(self: &Arc<Self>, mh: IpAddr) -> Arriving {
        self.map.lock().unwrap().entry(mh).or_default().arriving += 1;
        Arriving {
            inflight: self.clone(),
            mh,
        }
    }

    /// Connections waiting in the accept queues (of every MH: the kernel does not say
    /// whose).
    fn backlog(&self) -> u32 {
        let fds = self.listeners.lock().unwrap();
        fds.iter()
            .map(|&fd| crate::sockopt::accept_backlog(fd).unwrap_or(0))
            .sum()
    }
    /// Connections of `mh` in setup here: accepted and not yet in the session table,
    /// or with their fixed side in flight (and, since the kernel does not say whose,
    /// one more if any connection waits in the accept queues).
    pub fn pending(&self, mh: IpAddr) -> usize {
        let busy = self.map.lock().unwrap().get(&mh).map_or(0, Entry::busy);
        busy + usize::from(self.backlog() > 0)
    }

    /// Starts a fixed-side setup for `mh`, unless a handoff is freezing it (then the
    /// connection must stay frozen in setup: see [`Inflight::wait`]).
    pub fn begin(self: &Arc<Self>, mh: IpAddr) -> Option<Connecting> {
        let mut m = self.map.lock().unwrap();
        let e = m.entry(mh).or_default();
        if e.freezing || self.all.load(std::sync::atomic::Ordering::SeqCst) {
            return None;
        }
        e.connecting += 1;
        Some(Connecting {
            inflight: self.clone(),
            mh,
        })
    }

    /// Marks `mh` as freezing and waits (at most `bound`) until none of its
    /// connections is in the accept queues or on its way to the session table, and
    /// none of its fixed-side setups is in flight. Returns how many still are.
    pub async fn settle(&self, mh: IpAddr, bound: Duration) -> usize {
        self.map.lock().unwrap().entry(mh).or_default().freezing = true;
        let mut rx = self.changed.subscribe();
        // Accept queues only drain now (the MH's new SYNs are dropped since the
        // handoff began), and msrd takes from them at once; the kernel signals no
        // event for an empty queue, so it is polled.
        let queues = tokio::time::Instant::now() + bound.min(Duration::from_millis(50));
        while self.backlog() > 0 && tokio::time::Instant::now() < queues {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let left = || self.map.lock().unwrap().get(&mh).map_or(0, Entry::busy);
        Self::wait_idle(&mut rx, bound, left).await
    }

    /// Waits (at most `bound`) until `left()` is 0, re-checking at every change;
    /// returns what is left. `rx` must be subscribed before the first check.
    async fn wait_idle(
        rx: &mut watch::Receiver<u64>,
        bound: Duration,
        left: impl Fn() -> usize,
    ) -> usize {
        let _ = tokio::time::timeout(bound, async {
            while left() > 0 {
                if rx.changed().await.is_err() {
                    return;
                }
            }
        })
        .await;
        left()
    }

    /// The handoff of `mh` is over (moved or rolled back).
    pub fn thaw(&self, mh: IpAddr) {
        let mut m = self.map.lock().unwrap();
        if let Some(e) = m.get_mut(&mh) {
            e.freezing = false;
            if e.busy() == 0 {
                m.remove(&mh);
            }
        }
        drop(m);
        self.changed.send_modify(|g| *g += 1);
    }

    pub fn freezing(&self, mh: IpAddr) -> bool {
        self.all.load(std::sync::atomic::Ordering::SeqCst)
            || self
                .map
                .lock()
                .unwrap()
                .get(&mh)
                .is_some_and(|e| e.freezing)
    }

    /// [`Inflight::settle`] for every MH at once (an upgrade): returns how many
    /// connections are still being set up after `bound`.
    pub async fn settle_all(&self, bound: Duration) -> usize {
        {
            let _m = self.map.lock().unwrap();
            self.all.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        let mut rx = self.changed.subscribe();
        let left = || self.map.lock().unwrap().values().map(Entry::busy).sum();
        Self::wait_idle(&mut rx, bound, left).await
    }

    /// The upgrade is over (it failed: this process serves on).
    pub fn thaw_all(&self) {
        self.all.store(false, std::sync::atomic::Ordering::SeqCst);
        self.changed.send_modify(|g| *g += 1);
    }

    /// Waits, for a connection in setup of `mh`, until it is paused for the handoff
    /// (true) or the handoff is over without it (false).
    pub async fn wait(&self, mh: IpAddr, pause: &mut watch::Receiver<bool>) -> bool {
        let mut rx = self.changed.subscribe();
        loop {
            if *pause.borrow_and_update() {
                return true;
            }
            if !self.freezing(mh) {
                return false;
            }
            tokio::select! {
                r = pause.changed() => if r.is_err() { return false },
                r = rx.changed() => if r.is_err() { return false },
            }
        }
    }
}

/// A request handshake so far: every byte read from the MH and written to it. Parsing
/// is deterministic, so replaying the bytes read gives the same messages and replies;
/// where a handshake resumes (after a handoff, or a rollback), replies that were
/// already sent are checked and skipped, not sent twice.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Transcript {
    /// Everything read from the MH.
    pub read: Vec<u8>,
    /// Bytes of `read` already parsed.
    pos: usize,
    /// Everything written to the MH (in this run).
    pub written: Vec<u8>,
    /// What an earlier run had written: not sent again.
    sent_before: Vec<u8>,
    /// The secret of the key share sent (method `0x80`), kept so a replay sends the
    /// same share.
    pub kx: Option<[u8; 32]>,
}

impl Transcript {
    /// A transcript to replay: the bytes an earlier run read and wrote.
    pub fn resume(read: Vec<u8>, written: Vec<u8>, kx: Option<[u8; 32]>) -> Transcript {
        Transcript {
            read,
            pos: 0,
            written: Vec::new(),
            sent_before: written,
            kx,
        }
    }

    /// Bytes read but not parsed yet (after the request: the stream's first bytes).
    pub fn unparsed(&self) -> &[u8] {
        &self.read[self.pos..]
    }

    /// Records that `n` unparsed bytes were taken by a message.
    pub fn consume(&mut self, n: usize) {
        self.pos = (self.pos + n).min(self.read.len());
    }

    /// Records bytes read from the MH.
    pub fn received(&mut self, b: &[u8]) {
        self.read.extend_from_slice(b);
    }

    /// Records a reply; returns the part of it still to be sent (none if an earlier
    /// run sent it). An error if a replay would send something else than was sent.
    pub fn reply<'a>(&mut self, b: &'a [u8]) -> Result<&'a [u8], String> {
        let at = self.written.len();
        self.written.extend_from_slice(b);
        let done = self.sent_before.len().saturating_sub(at).min(b.len());
        if done > 0 && b[..done] != self.sent_before[at..at + done] {
            return Err(format!(
                "replayed handshake diverged at reply byte {at}: a handoff moved an \
                 inconsistent transcript"
            ));
        }
        Ok(&b[done..])
    }

    /// The transcript a frozen handshake carries: all read, all ever written, and
    /// the key share's secret.
    pub fn into_pending(self) -> Pending {
        let written = if self.sent_before.len() > self.written.len() {
            self.sent_before
        } else {
            self.written
        };
        Pending {
            up: self.read,
            down: written,
            kx: self.kx,
        }
    }

    /// A transcript to replay from what a frozen handshake carried.
    pub fn from_pending(p: Pending) -> Transcript {
        Transcript::resume(p.up, p.down, p.kx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replay_skips_what_was_sent_and_sends_the_rest() {
        let mut t = Transcript::default();
        t.received(b"\x05\x01\x00");
        t.consume(3);
        assert_eq!(t.reply(b"\x05\x00").unwrap(), b"\x05\x00");
        t.received(b"\x05\x01");
        t.kx = Some([7; 32]);
        let mut r = Transcript::from_pending(t.into_pending());
        assert_eq!(r.kx, Some([7; 32]), "the key share's secret travels");
        assert_eq!(r.unparsed(), b"\x05\x01\x00\x05\x01");
        r.consume(3);
        assert_eq!(
            r.reply(b"\x05\x00").unwrap(),
            b"",
            "sent before the handoff"
        );
        assert_eq!(r.unparsed(), b"\x05\x01");
        assert_eq!(r.reply(b"\x05\x00\x00").unwrap(), b"\x05\x00\x00");
        // Frozen again: everything written in both runs is carried.
        assert_eq!(r.into_pending().down, b"\x05\x00\x05\x00\x00");
    }

    #[test]
    fn a_replay_that_diverges_is_an_error() {
        let mut r = Transcript::resume(vec![], b"\x05\x00".to_vec(), None);
        assert!(r.reply(b"\x05\xff").is_err());
        let mut r = Transcript::resume(vec![], b"\x05\x00".to_vec(), None);
        assert_eq!(r.reply(b"\x05").unwrap(), b"");
        assert_eq!(r.reply(b"\x00\x01").unwrap(), b"\x01");
        // Nothing sent before: every reply goes out whole.
        let mut t = Transcript::default();
        assert_eq!(t.reply(b"\x05\x00").unwrap(), b"\x05\x00");
        assert_eq!(t.reply(b"\x00").unwrap(), b"\x00");
    }

    #[tokio::test]
    async fn settle_waits_for_connects_and_blocks_new_ones() {
        let inf = Arc::new(Inflight::default());
        let mh: IpAddr = "10.2.0.100".parse().unwrap();
        let other: IpAddr = "10.2.0.101".parse().unwrap();
        let c = inf.begin(mh).unwrap();
        let a = inf.arriving(mh);
        let _o = inf.begin(other).unwrap();
        let inf2 = inf.clone();
        let t = tokio::spawn(async move { inf2.settle(mh, Duration::from_secs(5)).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(inf.freezing(mh) && !inf.freezing(other));
        assert!(inf.begin(mh).is_none(), "frozen: no new connect");
        assert!(!t.is_finished());
        drop(c);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !t.is_finished(),
            "a connection is still on its way to the table"
        );
        drop(a);
        assert_eq!(t.await.unwrap(), 0);
        // A connection in setup waits for the pause or the thaw.
        let (tx, mut rx) = watch::channel(false);
        let inf3 = inf.clone();
        let w = tokio::spawn(async move { inf3.wait(mh, &mut rx).await });
        tokio::time::sleep(Duration::from_millis(10)).await;
        tx.send_replace(true);
        assert!(w.await.unwrap());
        let (_tx, mut rx) = watch::channel(false);
        let inf4 = inf.clone();
        let w = tokio::spawn(async move { inf4.wait(mh, &mut rx).await });
        tokio::time::sleep(Duration::from_millis(10)).await;
        inf.thaw(mh);
        assert!(!w.await.unwrap());
        assert!(inf.begin(mh).is_some());
    }

    #[tokio::test]
    async fn settle_gives_up_at_its_bound() {
        let inf = Arc::new(Inflight::default());
        let mh: IpAddr = "10.2.0.100".parse().unwrap();
        let _c = inf.begin(mh).unwrap();
        assert_eq!(inf.settle(mh, Duration::from_millis(30)).await, 1);
        inf.thaw(mh);
        assert!(!inf.freezing(mh));
    }
}
