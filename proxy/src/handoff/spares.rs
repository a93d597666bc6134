//! Channels to the peers opened ahead of need (`[handoff] keep_channels`): a handoff
//! starts on an authenticated channel that is already up instead of waiting for TCP's
//! and TLS's handshakes on its path. One is kept per configured peer and replaced in
//! the background after it is used, when the peer closes it, and before the peer's
//! idle limit ([`IDLE_LIMIT`], enforced in `old_side`) would close it.
//!
//! A kept channel can be dead without our knowing (the peer's FIN was lost, its host
//! rebooted): [`ask`] then retries once on a new channel, so a stale channel costs a
//! handoff one round trip, never its outcome.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use itcp_proto::channel::Message;
use tokio::sync::Notify;
use tracing::{debug, info, warn};

use super::channel::{Channel, ChannelError, HELLO_TIMEOUT};
use super::Handoffs;
use crate::daemon::Daemon;

/// How long a peer waits for the first message on an authenticated channel.
pub const IDLE_LIMIT: Duration = Duration::from_secs(90);
/// A kept channel is replaced after this long: well inside the peer's idle limit.
const KEEP_FOR: Duration = Duration::from_secs(60);
/// After failed attempts, the next one to that peer: from the first delay, doubling up
/// to the last (peers often start a moment after us).
const RETRY_FIRST: Duration = Duration::from_millis(250);
const RETRY_MAX: Duration = Duration::from_secs(5);
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
/// flag says it was kept.
async fn open(
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

/// Sends `msg`, a handoff's first message, to `peer` and waits for the answer: on the
/// kept channel if there is one, and once more on a new channel if that one was dead
/// (its close never reached us, so the peer never read the request).
pub async fn ask(
    d: &Daemon,
    h: &Handoffs,
    peer: &str,
    addr: SocketAddr,
    msg: &Message,
) -> Result<(Channel, Message), ChannelError> {
    async fn once(mut ch: Channel, msg: &Message) -> Result<(Channel, Message), ChannelError> {
        ch.send(msg).await?;
        let answer = ch.recv().await?;
        Ok((ch, answer))
    }
    let (ch, kept) = open(d, h, peer, addr).await?;
    match once(ch, msg).await {
        Err(ChannelError::Closed | ChannelError::Io(_)) if kept => {
            let st = &d.sessions.stats;
            st.channels_kept_stale.fetch_add(1, Ordering::Relaxed);
            debug!(%peer, "kept channel dead: asking on a new one");
            once(Channel::connect(h, peer, addr).await?, msg).await
        }
        r => r,
    }
}

/// Keeps a channel open to every configured peer, for as long as msrd runs.
pub async fn keep(d: Arc<Daemon>) {
    let h = d.handoff.as_ref().expect("handoff on");
    // Per peer that failed: when to try again, and the delay after that.
    let mut retry: HashMap<String, (Instant, Duration)> = HashMap::new();
    // Peers we could not reach: told once when it starts and once when it ends.
    let mut down: HashSet<String> = HashSet::new();
    loop {
        for p in &h.cfg.peers {
            if !h.spares.wanted(&p.id) || retry.get(&p.id).is_some_and(|r| Instant::now() < r.0) {
                continue;
            }
            let r = tokio::time::timeout(HELLO_TIMEOUT, Channel::connect(h, &p.id, p.address));
            let why = match r.await {
                Ok(Ok(ch)) => {
                    retry.remove(&p.id);
                    h.spares.put(&p.id, ch);
                    if down.remove(&p.id) {
                        info!(peer = %p.id, addr = %p.address, "handoff channel to the peer up again");
                    }
                    continue;
                }
                Ok(Err(e)) => e.to_string(),
                Err(_) => "no answer in time".to_string(),
            };
            let next = retry.get(&p.id).map_or(RETRY_FIRST, |r| r.1);
            retry.insert(
                p.id.clone(),
                (Instant::now() + next, (next * 2).min(RETRY_MAX)),
            );
            // Told once it has failed for a while (~2 s): not for a peer that starts a
            // moment after us.
            if next >= Duration::from_secs(1) && down.insert(p.id.clone()) {
                // A handoff with it tries a connection of its own, and may fail the same way.
                warn!(peer = %p.id, addr = %p.address, error = %why, "cannot open a handoff channel to the peer (retrying, at most every 5 s)");
            } else {
                debug!(peer = %p.id, error = %why, "no handoff channel to the peer yet");
            }
        }
        tokio::select! {
            _ = h.spares.taken.notified() => tokio::time::sleep(REFILL_AFTER).await,
            _ = tokio::time::sleep(RETRY_FIRST) => {}
        }
    }
}
