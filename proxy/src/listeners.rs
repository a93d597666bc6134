//! Passive opens: listeners the MSR keeps on the MHs' behalf (LISTEN), each with a queue
//! of fixed-side connections waiting for the MH's ACCEPTs.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use itcp_config::TcpTuning;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::fixed;

/// Connections the kernel accepted that no ACCEPT has taken yet, per listener.
const BACKLOG: usize = 128;

/// One listener on an MH's address.
pub struct MhListener {
    pub addr: SocketAddr,
    queue: tokio::sync::Mutex<mpsc::Receiver<(TcpStream, SocketAddr)>>,
    task: JoinHandle<()>,
}

impl MhListener {
    /// The next fixed-side connection, or None once the listener is closed.
    pub async fn next(&self) -> Option<(TcpStream, SocketAddr)> {
        self.queue.lock().await.recv().await
    }
}

impl Drop for MhListener {
    fn drop(&mut self) {
        self.task.abort();
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
        let (tx, rx) = mpsc::channel(BACKLOG);
        let task = tokio::spawn(async move {
            while let Ok(c) = l.accept().await {
                if tx.send(c).await.is_err() {
                    break;
                }
            }
        });
        let ml = Arc::new(MhListener {
            addr,
            queue: tokio::sync::Mutex::new(rx),
            task,
        });
        self.map.lock().unwrap().insert(addr, ml.clone());
        Ok(ml)
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
        if let Some(l) = self.map.lock().unwrap().remove(&addr) {
            l.task.abort();
        }
    }

    pub fn len(&self) -> usize {
        self.map.lock().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
