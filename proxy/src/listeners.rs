//! Passive opens: listeners the MSR keeps on the MHs' behalf (LISTEN), each with a queue
//! of fixed-side connections waiting for the MH's ACCEPTs.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};

use itcp_config::TcpTuning;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::fixed;

/// Connections the kernel accepted that no ACCEPT has taken yet, per listener.
const BACKLOG: usize = 128;

/// A fixed-side connection accepted for an MH, and the FH it comes from.
pub type Queued = (TcpStream, SocketAddr);

/// One listener on an MH's address.
pub struct MhListener {
    pub addr: SocketAddr,
    queue: tokio::sync::Mutex<mpsc::Receiver<Queued>>,
    /// Dropped when the listener is removed: with the accept task's copy gone too,
    /// waiting ACCEPTs get None.
    tx: Mutex<Option<mpsc::Sender<Queued>>>,
    /// The listening socket (the accept task works on a duplicate): an upgrade hands
    /// it over, or restarts the task on it.
    fd: OwnedFd,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl MhListener {
    /// The next fixed-side connection, or None once the listener is closed.
    pub async fn next(&self) -> Option<Queued> {
        self.queue.lock().await.recv().await
    }

    /// The listening socket.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    fn start(&self) -> io::Result<()> {
        let Some(tx) = self.tx.lock().unwrap().clone() else {
            return Ok(()); // removed
        };
        let std = std::net::TcpListener::from(self.fd.try_clone()?);
        std.set_nonblocking(true)?;
        let l = TcpListener::from_std(std)?;
        // Cancel-safe at each await (an upgrade stops this task): a connection is
        // taken from the kernel only once there is room for it in the queue.
        let task = tokio::spawn(async move {
            while let Ok(permit) = tx.reserve().await {
                match l.accept().await {
                    Ok(c) => permit.send(c),
                    Err(_) => break,
                }
            }
        });
        if let Some(old) = self.task.lock().unwrap().replace(task) {
            old.abort();
        }
        Ok(())
    }

    /// Stops accepting (connections wait in the kernel's backlog).
    async fn stop(&self) {
        let t = self.task.lock().unwrap().take();
        if let Some(t) = t {
            t.abort();
            let _ = t.await;
        }
    }
}

impl Drop for MhListener {
    fn drop(&mut self) {
        if let Some(t) = self.task.get_mut().unwrap().take() {
            t.abort();
        }
    }
}

/// Why an ACCEPT cannot be served.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    NoSuchListener,
    NotOwner,
}

#[derive(Default)]
pub struct Listeners {
    map: Mutex<HashMap<SocketAddr, Arc<MhListener>>>,
}

impl Listeners {
    /// Starts listening on `addr` (the MH's address; port 0 picks one) for MH `owner`.
    pub fn listen(&self, addr: SocketAddr, tuning: &TcpTuning) -> io::Result<Arc<MhListener>> {
        let l = fixed::listen_as(addr, tuning, BACKLOG as u32)?;
        let addr = l.local_addr()?;
        let ml = self.insert(addr, OwnedFd::from(l.into_std()?), Vec::new())?;
        ml.start()?;
        Ok(ml)
    }

    fn insert(
        &self,
        addr: SocketAddr,
        fd: OwnedFd,
        queued: Vec<Queued>,
    ) -> io::Result<Arc<MhListener>> {
        let (tx, rx) = mpsc::channel(BACKLOG.max(queued.len()));
        for q in queued {
            tx.try_send(q)
                .map_err(|_| io::Error::other("listener queue full"))?;
        }
        let ml = Arc::new(MhListener {
            addr,
            queue: tokio::sync::Mutex::new(rx),
            tx: Mutex::new(Some(tx)),
            fd,
            task: Mutex::new(None),
        });
        self.map.lock().unwrap().insert(addr, ml.clone());
        Ok(ml)
    }

    /// Takes over a listening socket and its queue from an older msrd (upgrade). It
    /// does not accept until [`Listeners::start_all`].
    pub fn adopt(&self, addr: SocketAddr, fd: OwnedFd, queued: Vec<Queued>) -> io::Result<()> {
        self.insert(addr, fd, queued).map(drop)
    }

    /// Every listener (upgrade).
    pub fn all(&self) -> Vec<Arc<MhListener>> {
        self.map.lock().unwrap().values().cloned().collect()
    }

    /// Stops every listener's accept task (upgrade): new connections wait in the
    /// kernel's backlog, which travels with the socket.
    pub async fn stop_all(&self) {
        for l in self.all() {
            l.stop().await;
        }
    }

    /// (Re)starts the accept task of every listener that has none.
    pub fn start_all(&self) {
        for l in self.all() {
            if l.task.lock().unwrap().is_none() {
                if let Err(e) = l.start() {
                    tracing::warn!(addr = %l.addr, error = %e, "MH listener not restarted");
                }
            }
        }
    }

    /// Takes the accepted connections no ACCEPT took yet out of a stopped listener's
    /// queue (upgrade); [`Listeners::requeue`] puts them back.
    pub async fn take_queued(&self, l: &MhListener) -> Vec<Queued> {
        let mut q = l.queue.lock().await;
        let mut out = Vec::new();
        while let Ok(c) = q.try_recv() {
            out.push(c);
        }
        out
    }

    /// Puts connections back at the front of a listener's queue (an upgrade that failed).
    pub async fn requeue(&self, l: &MhListener, queued: Vec<Queued>) {
        // The queue is empty (taken by take_queued, and the accept task is stopped).
        let _q = l.queue.lock().await;
        let tx = l.tx.lock().unwrap().clone();
        for c in queued {
            if tx.as_ref().is_none_or(|tx| tx.try_send(c).is_err()) {
                tracing::warn!(addr = %l.addr, "MH listener queue full: connection dropped");
            }
        }
    }

    /// The listener an ACCEPT from MH `owner` for `port` refers to.
    pub fn get(&self, owner: IpAddr, addr: SocketAddr) -> Result<Arc<MhListener>, Lookup> {
        let map = self.map.lock().unwrap();
        if let Some(l) = map.get(&addr) {
            return if addr.ip() == owner {
                Ok(l.clone())
            } else {
                Err(Lookup::NotOwner)
            };
        }
        // ACCEPT names a port of the MH; the address in it may be all-zero.
        map.iter()
            .find(|(a, _)| a.port() == addr.port() && a.ip() == owner)
            .map(|(_, l)| l.clone())
            .ok_or(Lookup::NoSuchListener)
    }

    /// Closes a listener: no new connections; ACCEPTs waiting on it get None.
    pub fn remove(&self, addr: SocketAddr) {
        let Some(l) = self.map.lock().unwrap().remove(&addr) else {
            return;
        };
        l.tx.lock().unwrap().take();
        let task = l.task.lock().unwrap().take();
        if let Some(t) = task {
            t.abort();
        }
    }

    pub fn len(&self) -> usize {
        self.map.lock().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    // Listeners are transparent sockets (IP_TRANSPARENT): root or CAP_NET_ADMIN.
    fn can_listen() -> bool {
        nix::unistd::geteuid().is_root()
    }

    #[tokio::test]
    async fn removing_a_listener_ends_waiting_accepts() {
        if !can_listen() {
            return;
        }
        let ls = Listeners::default();
        let l = ls
            .listen("127.0.0.1:0".parse().unwrap(), &TcpTuning::default())
            .unwrap();
        let waiting = tokio::spawn({
            let l = l.clone();
            async move { l.next().await.is_none() }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        ls.remove(l.addr);
        let ended = tokio::time::timeout(Duration::from_secs(2), waiting).await;
        assert!(ended.unwrap().unwrap(), "the ACCEPT got None");
    }

    #[tokio::test]
    async fn a_stopped_listener_keeps_its_connections_and_hands_them_over() {
        if !can_listen() {
            return;
        }
        let ls = Listeners::default();
        let l = ls
            .listen("127.0.0.1:0".parse().unwrap(), &TcpTuning::default())
            .unwrap();
        let _a = TcpStream::connect(l.addr).await.unwrap();
        // Accepted into the queue by the task; the next one waits in the backlog.
        tokio::time::sleep(Duration::from_millis(50)).await;
        ls.stop_all().await;
        let _b = TcpStream::connect(l.addr).await.unwrap();
        let queued = ls.take_queued(&l).await;
        assert_eq!(queued.len(), 1);
        // A failed upgrade puts it back; a restarted task accepts the other.
        ls.requeue(&l, queued).await;
        ls.start_all();
        for _ in 0..2 {
            let c = tokio::time::timeout(Duration::from_secs(2), l.next()).await;
            assert!(c.unwrap().is_some());
        }
        // What a new msrd adopts (its own copy of the socket, a queued connection)
        // accepts only once started.
        let c = TcpStream::connect(l.addr).await.unwrap();
        let fd = l.fd().try_clone_to_owned().unwrap();
        ls.remove(l.addr);
        let other = Listeners::default();
        let peer = c.local_addr().unwrap();
        let q = TcpStream::connect(l.addr).await.unwrap();
        other.adopt(l.addr, fd, vec![(q, peer)]).unwrap();
        let m = other.get(l.addr.ip(), l.addr).unwrap();
        assert_eq!(m.next().await.unwrap().1, peer, "the queued one first");
        let none = tokio::time::timeout(Duration::from_millis(100), m.next()).await;
        assert!(none.is_err(), "not accepting before start_all");
        other.start_all();
        let c2 = tokio::time::timeout(Duration::from_secs(2), m.next()).await;
        assert!(
            c2.unwrap().is_some(),
            "the backlog's connection after start_all"
        );
    }
}
