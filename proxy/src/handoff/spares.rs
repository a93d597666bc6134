//! Channels to the peers opened ahead of need (`[handoff] keep_channels`): a handoff
//! starts on an authenticated channel that is already up instead of waiting for TCP's
//! and TLS's handshakes on its path. One is kept per configured peer and replaced in
//! the background after it is used, when the peer closes it, and before the peer's
//! idle limit ([`IDLE_LIMIT`], enforced in `old_side`) would close it.
//!
//! A kept channel can be dead without our knowing (the peer's FIN was lost, its host
//! rebooted): the new side then retries once on a new channel (`new_side`), so a
//! stale channel costs a handoff one round trip, never its outcome.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tracing::debug;

use super::channel::{Channel, ChannelError, HELLO_TIMEOUT};
use super::Handoffs;
use crate::daemon::Daemon;

/// How long a peer waits for the first message on an authenticated channel.
pub const IDLE_LIMIT: Duration = Duration::from_secs(90);
/// A kept channel is replaced after this long: well inside the peer's idle limit.
const KEEP_FOR: Duration = Duration::from_secs(60);
/// After a failed attempt, the next one to that peer.
const RETRY_AFTER: Duration = Duration::from_secs(5);
/// A used channel is replaced this long after, off the handoff's path (its TLS
/// handshake would take a core from the handoff under way).
const REFILL_AFTER: Duration = Duration::from_millis(100);

/// The kept channels, by peer id.
#[derive(Default)]
pub struct Spares {
    kept: Mutex<HashMap<String, (Channel, Instant)>>,
    taken: Notify,
}

impl Spares {
    /// The kept channel to `peer` at `addr`: `Ok(None)` if none is kept, `Err` if the
    /// kept one is closed or too old (dropped).
    fn take(&self, peer: &str, addr: SocketAddr) -> Result<Option<Channel>, ()> {
        let got = self.kept.lock().unwrap().remove(peer);
        let Some((ch, at)) = got else { return Ok(None) };
        self.taken.notify_one();
        if ch.addr() == addr && at.elapsed() < KEEP_FOR && ch.alive() {
            Ok(Some(ch))
        } else {
            Err(())
        }
    }

    /// True if `peer` needs a new channel: none kept, or the kept one is old or closed.
    fn wanted(&self, peer: &str) -> bool {
        let k = self.kept.lock().unwrap();
        k.get(peer)
            .is_none_or(|(ch, at)| at.elapsed() >= KEEP_FOR || !ch.alive())
    }

    fn put(&self, peer: &str, ch: Channel) {
        let old = self
            .kept
            .lock()
            .unwrap()
            .insert(peer.to_string(), (ch, Instant::now()));
        // Dropped outside the lock: the peer reads its end.
        drop(old);
    }
}

/// A channel to `peer` at `addr`: the kept one if it is open, else a new one. The
/// flag says it was kept (it may still turn out dead: retry once on a new one).
pub async fn open(
    d: &Daemon,
    h: &Handoffs,
    peer: &str,
    addr: SocketAddr,
) -> Result<(Channel, bool), ChannelError> {
    let st = &d.sessions.stats;
    match h.spares.take(peer, addr) {
        Ok(Some(ch)) => {
            st.channels_kept_used.fetch_add(1, Ordering::Relaxed);
            return Ok((ch, true));
        }
        Ok(None) => {}
        Err(()) => {
            st.channels_kept_stale.fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok((Channel::connect(h, peer, addr).await?, false))
}

/// Keeps a channel open to every configured peer, for as long as msrd runs.
pub async fn keep(d: Arc<Daemon>) {
    let h = d.handoff.as_ref().expect("handoff on");
    let mut retry_at: HashMap<String, Instant> = HashMap::new();
    loop {
        for p in &h.cfg.peers {
            if !h.spares.wanted(&p.id) || retry_at.get(&p.id).is_some_and(|t| Instant::now() < *t) {
                continue;
            }
            match tokio::time::timeout(HELLO_TIMEOUT, Channel::connect(h, &p.id, p.address)).await {
                Ok(Ok(ch)) => {
                    retry_at.remove(&p.id);
                    h.spares.put(&p.id, ch);
                }
                Ok(Err(e)) => {
                    debug!(peer = %p.id, addr = %p.address, error = %e, "no channel kept to the peer");
                    retry_at.insert(p.id.clone(), Instant::now() + RETRY_AFTER);
                }
                Err(_) => {
                    debug!(peer = %p.id, addr = %p.address, "no channel kept to the peer: timed out");
                    retry_at.insert(p.id.clone(), Instant::now() + RETRY_AFTER);
                }
            }
        }
        tokio::select! {
            _ = h.spares.taken.notified() => tokio::time::sleep(REFILL_AFTER).await,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}
