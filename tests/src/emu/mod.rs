//! The sans-IO core of the `airlink` link emulator.
//!
//! An [`Emulator`] owns every emulated link of a lab: point-to-point *wires* (the WAN
//! between FH and GW) and the *air* (one cell per MSR, and the MH). Frames come in with
//! [`Emulator::ingress`] tagged by port, go out of [`Emulator::advance`] tagged by port,
//! and [`Emulator::next_event`] says when to call `advance` again. Control requests (the
//! JSON lines of the control socket, [`Request`]) are applied by [`Emulator::handle`],
//! which answers a typed [`Reply`]; the lab reads the same types. No sockets,
//! devices or clocks in here: the `airlink` binary supplies those.
//!
//! Air semantics: frames from an MSR's cell port reach the MH only while the MH is in
//! that cell. Frames from the MH go to the cell whose MAC they are addressed to (the MH
//! picks its MSR through its neighbour entry for the shared gateway address, as it would
//! on a real anycast gateway), broadcast frames to every cell the MH is in. Leaving a
//! cell flushes that cell's queues in both directions.
//!
//! Several MHs: [`AirSpec::mhs`] adds MH 2, 3, … Each MH has its own pair of links in
//! every cell (`cell<k>` for MH 1, as with one MH; `cell<k>.mh<j>` for MH j), its own
//! association and its own flushes. A frame from a cell goes to the MH whose MAC it is
//! addressed to (broadcast: to every MH in the cell). Cells do not share capacity
//! between MHs: each MH sees the cell's rate on its own links.
//!
//! Carrier: an MH's port has carrier while the MH is in at least one cell and none
//! while it is in no cell, as a wireless NIC reports association to its host. A move
//! straight from one cell into another (no overlap, no gap) is a disassociation and a
//! new association: the carrier drops and comes back at once (one more carrier-up). The
//! emulator only records the changes ([`Emulator::take_carrier_changes`]); the binary
//! sets them on the MH's TAP device (TUNSETCARRIER), so the MH's kernel announces them
//! on rtnetlink (IFF_LOWER_UP) like any NIC's.

pub mod link;
pub mod schedule;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use link::{Counters, LinkDir, LinkParams, Loss};
pub use schedule::{Crossing, Running, Schedule};

use crate::rng::derive_seed;

/// One TAP device the emulator creates.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortSpec {
    /// Unique name, e.g. `fh.wan0`.
    pub name: String,
    /// Network namespace (as in `ip netns`) the device is created in.
    pub netns: String,
    pub ifname: String,
    /// MAC address to give the device (`02:…` locally administered). Required for cells.
    #[serde(default)]
    pub mac: Option<String>,
}

/// A point-to-point link between two ports. "down" is `down_from → down_to` (towards
/// the MH: FH → GW on the WAN).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WireSpec {
    pub name: String,
    pub down_from: String,
    pub down_to: String,
    pub down: LinkParams,
    pub up: LinkParams,
}

/// One MSR's cell: its port and the link in each direction.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CellSpec {
    pub port: String,
    /// MSR → MH.
    pub down: LinkParams,
    /// MH → MSR.
    pub up: LinkParams,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AirSpec {
    /// The MH's port (MH 1).
    pub mh: String,
    /// Ports of more MHs (MH 2, 3, …), each with a MAC of its own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mhs: Vec<String>,
    /// Cells in MSR order: `cells[0]` is cell 1 (MSR1).
    pub cells: Vec<CellSpec>,
    /// Cells the MH is in at start (1-based).
    #[serde(default)]
    pub initial: Vec<usize>,
}

/// Everything `airlink` needs at start.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    #[serde(default)]
    pub seed: u64,
    pub ports: Vec<PortSpec>,
    #[serde(default)]
    pub wires: Vec<WireSpec>,
    #[serde(default)]
    pub air: Option<AirSpec>,
}

impl Topology {
    /// Reads every link's `trace_file` into its `trace_ms`.
    pub fn load_trace_files(&mut self) -> Result<(), String> {
        for w in &mut self.wires {
            w.down.load_trace_file()?;
            w.up.load_trace_file()?;
        }
        if let Some(air) = &mut self.air {
            for c in &mut air.cells {
                c.down.load_trace_file()?;
                c.up.load_trace_file()?;
            }
        }
        Ok(())
    }
}

/// Which direction(s) of a link a request changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dir {
    Down,
    Up,
    Both,
}

/// A control request: one JSON object per line on the control socket.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Put the MH (MH 1, or MH `mh`, 1-based) in exactly these cells (empty:
    /// blackout). Stops a running schedule when it moves MH 1.
    Assoc {
        cells: Vec<usize>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mh: Option<usize>,
    },
    /// Drops everything queued or in flight in cell `cell` (every MH's links, both
    /// directions), as a reset access point would.
    Flush {
        cell: usize,
    },
    /// Replace the parameters of one direction or both of a link (`wan`, `cell1`, …).
    Link {
        link: String,
        dir: Dir,
        params: LinkParams,
    },
    /// Counters of every link, per direction.
    Counters,
    ResetCounters,
    /// Start a handoff schedule `start_in_s` from now (replaces a running one).
    Schedule {
        schedule: Schedule,
        #[serde(default)]
        start_in_s: f64,
    },
    StopSchedule,
    /// Association, association history, schedule, clock.
    Status,
}

impl Request {
    /// Parses one request line; the error says what was wrong, for the reply.
    pub fn parse(line: &str) -> Result<Request, String> {
        let line = line.trim();
        if line.is_empty() {
            return Err("empty request".into());
        }
        if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(line) {
            return Err(format!("request is not JSON: {e}"));
        }
        serde_json::from_str(line).map_err(|e| format!("bad request: {e}"))
    }

    /// Reads the `trace_file`s the request names into `trace_ms`.
    pub fn load_trace_files(&mut self) -> Result<(), String> {
        match self {
            Request::Link { params, .. } => params.load_trace_file(),
            _ => Ok(()),
        }
    }
}

/// One reply line: `ok` and the body, whose `reply` field says which it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    pub ok: bool,
    #[serde(flatten)]
    pub body: ReplyBody,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum ReplyBody {
    /// The cells the MH is in now.
    Assoc {
        cells: Vec<usize>,
    },
    /// Done, nothing to tell.
    Done,
    Counters(CountersReply),
    /// When the schedule starts (CLOCK_MONOTONIC ns).
    Schedule {
        start_ns: u64,
    },
    Status(StatusReply),
    Error {
        error: String,
    },
}

impl From<ReplyBody> for Reply {
    fn from(body: ReplyBody) -> Reply {
        Reply {
            ok: !matches!(body, ReplyBody::Error { .. }),
            body,
        }
    }
}

impl Reply {
    pub fn error(e: impl Into<String>) -> Reply {
        ReplyBody::Error { error: e.into() }.into()
    }

    /// The body, or the emulator's error.
    pub fn into_result(self) -> Result<ReplyBody, String> {
        match self.body {
            ReplyBody::Error { error } => Err(error),
            b if self.ok => Ok(b),
            _ => Err("refused".into()),
        }
    }
}

/// Both directions of one link.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkCounters {
    pub down: Counters,
    pub up: Counters,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CountersReply {
    pub now_ns: u64,
    /// By link name (`wan`, `cell1`, …).
    pub links: BTreeMap<String, LinkCounters>,
    /// Frames of the MH addressed to no cell's MAC.
    pub mh_unknown_dst: u64,
    /// Unicast frames from a cell addressed to no MH's MAC (only with several MHs).
    #[serde(default)]
    pub cell_unknown_dst: u64,
    /// Frames the devices refused (airlink's count; 0 from the bare emulator).
    #[serde(default)]
    pub write_errors: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleStatus {
    pub schedule: Schedule,
    pub start_ns: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkStatus {
    pub name: String,
    pub down: LinkParams,
    pub up: LinkParams,
    pub queued_down: usize,
    pub queued_up: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusReply {
    pub now_ns: u64,
    /// MH 1's cells and association history.
    pub cells: Vec<usize>,
    pub events: Vec<AssocEvent>,
    /// With several MHs: every MH's cells (MH order).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mhs: Vec<Vec<usize>>,
    pub schedule: Option<ScheduleStatus>,
    pub links: Vec<LinkStatus>,
}

/// An association change, as it happened on the emulator's clock (CLOCK_MONOTONIC ns).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AssocEvent {
    pub t_ns: u64,
    pub cells: Vec<usize>,
}

#[derive(Debug, Clone, Copy)]
enum Role {
    WireFrom(usize),
    WireTo(usize),
    /// MH j (0-based).
    Mh(usize),
    Cell(usize),
}

#[derive(Debug)]
struct Link {
    name: String,
    down: LinkDir,
    up: LinkDir,
    /// Port `down` frames are delivered to, and port `up` frames are delivered to.
    down_to: usize,
    up_to: usize,
}

/// The emulator state. See the module docs.
#[derive(Debug)]
pub struct Emulator {
    port_names: Vec<String>,
    roles: Vec<Role>,
    links: Vec<Link>,
    /// MAC of cell i (0-based).
    cells: Vec<[u8; 6]>,
    /// Link index of MH j's view of cell i: `air[j][i]`.
    air: Vec<Vec<usize>>,
    /// MAC of MH j (None: a lone MH without one).
    mh_macs: Vec<Option<[u8; 6]>>,
    /// Whether MH j is in cell i: `assoc[j][i]`.
    assoc: Vec<Vec<bool>>,
    /// When MH j last joined cell i (a sequence number, 0: never): unicast to a MAC
    /// that is no single cell's goes to the cell joined last.
    joined: Vec<Vec<u64>>,
    join_seq: u64,
    schedule: Option<Running>,
    /// MH 1's association history.
    events: Vec<AssocEvent>,
    /// Port of MH j.
    mh_ports: Vec<usize>,
    /// Carrier last reported for MH j's port (None: not reported yet).
    carrier: Vec<Option<bool>>,
    /// Carrier changes not yet taken by the binary: (port, carrier on).
    carrier_changes: Vec<(usize, bool)>,
    /// Unicast frames from an MH that never joined a cell, to no cell's MAC.
    pub mh_unknown_dst: u64,
    /// Unicast frames from a cell addressed to no MH (several MHs only).
    pub cell_unknown_dst: u64,
}

pub fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let parts: Vec<&str> = s.split(':').collect();
    let mut mac = [0u8; 6];
    if parts.len() != 6 {
        return Err(format!(
            "bad MAC address {s:?}: want six hex bytes like 02:00:00:00:01:01"
        ));
    }
    for (i, p) in parts.iter().enumerate() {
        mac[i] = u8::from_str_radix(p, 16).map_err(|_| format!("bad MAC address {s:?}"))?;
    }
    Ok(mac)
}

impl Emulator {
    pub fn new(topo: &Topology, now: u64) -> Result<Self, String> {
        let mut port_names: Vec<String> = Vec::new();
        for p in &topo.ports {
            if port_names.contains(&p.name) {
                return Err(format!("port {:?} is declared twice", p.name));
            }
            port_names.push(p.name.clone());
        }
        let port = |name: &str| {
            port_names
                .iter()
                .position(|n| n == name)
                .ok_or_else(|| format!("unknown port {name:?}"))
        };
        let mut roles: Vec<Option<Role>> = vec![None; port_names.len()];
        let mut claim = |idx: usize, role: Role| {
            if roles[idx].is_some() {
                return Err(format!("port {:?} is used by two links", port_names[idx]));
            }
            roles[idx] = Some(role);
            Ok(())
        };
        let mut links = Vec::new();
        let mut cells = Vec::new();
        let dir = |name: &str, d: &str, p: &LinkParams| -> Result<LinkDir, String> {
            p.validate().map_err(|e| format!("link {name} {d}: {e}"))?;
            Ok(LinkDir::new(
                p.clone(),
                derive_seed(topo.seed, &format!("{name}/{d}")),
                now,
            ))
        };
        for w in &topo.wires {
            let (a, b) = (port(&w.down_from)?, port(&w.down_to)?);
            let li = links.len();
            claim(a, Role::WireFrom(li))?;
            claim(b, Role::WireTo(li))?;
            links.push(Link {
                name: w.name.clone(),
                down: dir(&w.name, "down", &w.down)?,
                up: dir(&w.name, "up", &w.up)?,
                down_to: b,
                up_to: a,
            });
        }
        let mut assoc = Vec::new();
        let mut air_links = Vec::new();
        let mut mh_macs = Vec::new();
        let mut mh_ports = Vec::new();
        if let Some(air) = &topo.air {
            let mut cell_ports = Vec::new();
            for (i, c) in air.cells.iter().enumerate() {
                let cp = port(&c.port)?;
                claim(cp, Role::Cell(i))?;
                let mac = topo.ports[cp]
                    .mac
                    .as_deref()
                    .ok_or_else(|| format!("cell port {:?} needs a mac", c.port))
                    .and_then(parse_mac)?;
                cells.push(mac);
                cell_ports.push(cp);
            }
            let several = !air.mhs.is_empty();
            for (j, name) in std::iter::once(&air.mh).chain(&air.mhs).enumerate() {
                let mh = port(name)?;
                claim(mh, Role::Mh(j))?;
                mh_ports.push(mh);
                let mac = match topo.ports[mh].mac.as_deref() {
                    Some(m) => Some(parse_mac(m)?),
                    None if several => {
                        return Err(format!("MH port {name:?} needs a mac (several MHs)"))
                    }
                    None => None,
                };
                mh_macs.push(mac);
                let mut mine = Vec::new();
                for (i, c) in air.cells.iter().enumerate() {
                    let name = if j == 0 {
                        format!("cell{}", i + 1)
                    } else {
                        format!("cell{}.mh{}", i + 1, j + 1)
                    };
                    mine.push(links.len());
                    links.push(Link {
                        down: dir(&name, "down", &c.down)?,
                        up: dir(&name, "up", &c.up)?,
                        name,
                        down_to: mh,
                        up_to: cell_ports[i],
                    });
                }
                air_links.push(mine);
                assoc.push(vec![false; air.cells.len()]);
            }
        }
        let roles = roles
            .into_iter()
            .enumerate()
            .map(|(i, r)| r.ok_or_else(|| format!("port {:?} belongs to no link", port_names[i])))
            .collect::<Result<Vec<_>, _>>()?;
        let mut emu = Self {
            port_names,
            roles,
            links,
            cells,
            air: air_links,
            mh_macs,
            joined: assoc.iter().map(|a| vec![0; a.len()]).collect(),
            assoc,
            join_seq: 0,
            schedule: None,
            events: Vec::new(),
            carrier: vec![None; mh_ports.len()],
            mh_ports,
            carrier_changes: Vec::new(),
            mh_unknown_dst: 0,
            cell_unknown_dst: 0,
        };
        for j in 0..emu.assoc.len() {
            emu.set_assoc(now, j, &topo.air.as_ref().unwrap().initial)?;
        }
        Ok(emu)
    }

    pub fn port_names(&self) -> &[String] {
        &self.port_names
    }

    fn check_cells(&self, cells: &[usize]) -> Result<(), String> {
        if let Some(c) = cells.iter().find(|&&c| c == 0 || c > self.cells.len()) {
            return Err(format!(
                "cell {c} does not exist (cells are 1..={})",
                self.cells.len()
            ));
        }
        Ok(())
    }

    /// Puts MH `j` (0-based) in exactly `cells` (1-based); flushes cells it leaves.
    fn set_assoc(&mut self, now: u64, j: usize, cells: &[usize]) -> Result<(), String> {
        self.check_cells(cells)?;
        let was_in = self.assoc[j].iter().any(|&a| a);
        // A station that goes from its cells straight into others (a hard switch, no
        // cell in common) disassociates and associates again: a NIC drops its carrier
        // and raises it at once, which the MH sees as one more carrier-up.
        let switched = was_in
            && !cells.is_empty()
            && !cells
                .iter()
                .any(|&c| self.assoc[j].get(c - 1) == Some(&true));
        for i in 0..self.cells.len() {
            let inside = cells.contains(&(i + 1));
            if self.assoc[j][i] && !inside {
                let l = &mut self.links[self.air[j][i]];
                l.down.flush(now);
                l.up.flush(now);
            }
            if inside && !self.assoc[j][i] {
                self.join_seq += 1;
                self.joined[j][i] = self.join_seq;
            }
            self.assoc[j][i] = inside;
        }
        let on = self.assoc[j].iter().any(|&a| a);
        if switched && self.carrier[j] == Some(true) {
            self.carrier_changes.push((self.mh_ports[j], false));
            self.carrier_changes.push((self.mh_ports[j], true));
        } else if self.carrier[j] != Some(on) {
            self.carrier[j] = Some(on);
            self.carrier_changes.push((self.mh_ports[j], on));
        }
        if j == 0 {
            self.events.push(AssocEvent {
                t_ns: now,
                cells: self.current_cells(),
            });
        }
        Ok(())
    }

    /// Carrier changes of the MHs' ports since the last call, in order: (port, carrier
    /// on). The first call after [`Emulator::new`] reports every MH's initial carrier.
    /// Call it after [`Emulator::handle`] and [`Emulator::advance`] and apply the
    /// changes to the devices.
    pub fn take_carrier_changes(&mut self) -> Vec<(usize, bool)> {
        std::mem::take(&mut self.carrier_changes)
    }

    /// Whether MH `j`'s (0-based) port has carrier: it is in at least one cell.
    pub fn carrier(&self, j: usize) -> bool {
        self.carrier.get(j).copied().flatten().unwrap_or(false)
    }

    /// The cells MH 1 is in.
    pub fn current_cells(&self) -> Vec<usize> {
        self.cells_of(0)
    }

    /// The cells MH `j` (0-based) is in.
    pub fn cells_of(&self, j: usize) -> Vec<usize> {
        self.assoc.get(j).map_or(Vec::new(), |a| {
            (0..a.len()).filter(|&i| a[i]).map(|i| i + 1).collect()
        })
    }

    /// The MH a frame from a cell is for: by destination MAC; a lone MH gets every
    /// frame (as before there were several).
    fn mh_for(&self, frame: &[u8]) -> Option<usize> {
        if self.mh_macs.len() == 1 {
            return Some(0);
        }
        self.mh_macs
            .iter()
            .position(|m| m.is_some_and(|m| frame[..6] == m))
    }

    /// A frame arrived from `port` at `now`.
    pub fn ingress(&mut self, now: u64, port: usize, frame: Vec<u8>) {
        match self.roles[port] {
            Role::WireFrom(l) => self.links[l].down.offer(now, frame),
            Role::WireTo(l) => self.links[l].up.offer(now, frame),
            Role::Cell(i) => {
                if frame.len() < 6 {
                    return;
                }
                let to: Vec<usize> = if frame[0] & 1 == 1 {
                    (0..self.air.len()).collect()
                } else if let Some(j) = self.mh_for(&frame) {
                    vec![j]
                } else {
                    self.cell_unknown_dst += 1;
                    return;
                };
                let last = to.len().saturating_sub(1);
                let mut frame = Some(frame);
                for (n, j) in to.into_iter().enumerate() {
                    let f = if n == last {
                        frame.take().unwrap_or_default()
                    } else {
                        frame.clone().unwrap_or_default()
                    };
                    let l = &mut self.links[self.air[j][i]];
                    if self.assoc[j][i] {
                        l.down.offer(now, f);
                    } else {
                        l.down.count_no_cell(&f);
                    }
                }
            }
            Role::Mh(j) => {
                if frame.len() < 6 {
                    return;
                }
                for i in self.cells_for(j, &frame) {
                    let l = &mut self.links[self.air[j][i]];
                    if self.assoc[j][i] {
                        l.up.offer(now, frame.clone());
                    } else {
                        l.up.count_no_cell(&frame);
                    }
                }
            }
        }
    }

    /// The cells (0-based) a frame from MH `j` goes to: broadcast to every cell; unicast
    /// to the one cell whose MAC it is addressed to. Unicast to a MAC that is no single
    /// cell's (a gateway MAC every MSR shares, as with VRRP) goes to the cell the MH is
    /// in that it joined last, as a station sends only to the access point it associated
    /// with last.
    fn cells_for(&mut self, j: usize, frame: &[u8]) -> Vec<usize> {
        if frame[0] & 1 == 1 {
            return (0..self.cells.len()).collect();
        }
        let mut to = (0..self.cells.len()).filter(|&i| frame[..6] == self.cells[i]);
        if let (Some(i), None) = (to.next(), to.next()) {
            return vec![i];
        }
        // Among the cells the MH is in; out of every cell, the one it was in last.
        let key = |i: usize| (self.assoc[j][i], self.joined[j][i]);
        let last = (0..self.cells.len())
            .filter(|&i| self.joined[j][i] > 0)
            .max_by_key(|&i| key(i));
        match last {
            Some(i) => vec![i],
            None => {
                self.mh_unknown_dst += 1;
                Vec::new()
            }
        }
    }

    /// Moves time to `now`: applies due schedule changes and returns frames to deliver.
    pub fn advance(&mut self, now: u64, out: &mut Vec<(usize, Vec<u8>)>) {
        while let Some((t, cells)) = self.schedule.as_mut().and_then(|s| s.pop_due(now)) {
            // Use the scheduled instant, not the wake-up time, so the history is exact.
            self.set_assoc(t, 0, &cells)
                .expect("schedule cells were validated");
        }
        let mut buf = Vec::new();
        for l in &mut self.links {
            l.down.advance(now, &mut buf);
            out.extend(buf.drain(..).map(|f| (l.down_to, f)));
            l.up.advance(now, &mut buf);
            out.extend(buf.drain(..).map(|f| (l.up_to, f)));
        }
    }

    /// The earliest time `advance` has something to do.
    pub fn next_event(&mut self) -> Option<u64> {
        let sched = self.schedule.as_mut().and_then(|s| s.next_event());
        self.links
            .iter()
            .flat_map(|l| [l.down.next_event(), l.up.next_event()])
            .chain([sched])
            .flatten()
            .min()
    }

    fn link_mut(&mut self, name: &str) -> Result<&mut Link, String> {
        let known: Vec<String> = self.links.iter().map(|l| l.name.clone()).collect();
        self.links
            .iter_mut()
            .find(|l| l.name == name)
            .ok_or_else(|| format!("unknown link {name:?} (links: {})", known.join(", ")))
    }

    pub fn counters(&self) -> BTreeMap<String, LinkCounters> {
        self.links
            .iter()
            .map(|l| {
                (
                    l.name.clone(),
                    LinkCounters {
                        down: l.down.counters,
                        up: l.up.counters,
                    },
                )
            })
            .collect()
    }

    /// Applies a control request and returns the reply.
    pub fn handle(&mut self, now: u64, req: Request) -> Reply {
        match self.apply(now, req) {
            Ok(b) => b.into(),
            Err(e) => Reply::error(e),
        }
    }

    fn apply(&mut self, now: u64, req: Request) -> Result<ReplyBody, String> {
        Ok(match req {
            Request::Assoc { cells, mh } => {
                self.check_cells(&cells)?;
                let j = match mh {
                    None => 0,
                    Some(m) if m >= 1 && m <= self.air.len() => m - 1,
                    Some(m) => {
                        return Err(format!(
                            "MH {m} does not exist (MHs are 1..={})",
                            self.air.len()
                        ))
                    }
                };
                if self.air.is_empty() {
                    // No air: only "no cells" exists (check_cells refused the rest).
                    return Ok(ReplyBody::Assoc { cells: Vec::new() });
                }
                if j == 0 {
                    self.schedule = None;
                }
                self.set_assoc(now, j, &cells)?;
                ReplyBody::Assoc {
                    cells: self.cells_of(j),
                }
            }
            Request::Flush { cell } => {
                self.check_cells(&[cell])?;
                for j in 0..self.air.len() {
                    let l = &mut self.links[self.air[j][cell - 1]];
                    l.down.flush(now);
                    l.up.flush(now);
                }
                ReplyBody::Done
            }
            Request::Link { link, dir, params } => {
                params.validate().map_err(|e| format!("link {link}: {e}"))?;
                let l = self.link_mut(&link)?;
                if matches!(dir, Dir::Down | Dir::Both) {
                    l.down.set_params(params.clone());
                }
                if matches!(dir, Dir::Up | Dir::Both) {
                    l.up.set_params(params);
                }
                ReplyBody::Done
            }
            Request::Counters => ReplyBody::Counters(CountersReply {
                now_ns: now,
                links: self.counters(),
                mh_unknown_dst: self.mh_unknown_dst,
                cell_unknown_dst: self.cell_unknown_dst,
                write_errors: 0,
            }),
            Request::ResetCounters => {
                for l in &mut self.links {
                    l.down.counters = Counters::default();
                    l.up.counters = Counters::default();
                }
                self.mh_unknown_dst = 0;
                self.cell_unknown_dst = 0;
                ReplyBody::Done
            }
            Request::Schedule {
                schedule,
                start_in_s,
            } => {
                schedule.validate(self.cells.len())?;
                if start_in_s < 0.0 {
                    return Err(format!("start_in_s must be ≥ 0, got {start_in_s}"));
                }
                let start = now + schedule::secs_ns(start_in_s);
                self.set_assoc(now, 0, &schedule.initial())?;
                self.schedule = Some(Running::new(schedule, start));
                ReplyBody::Schedule { start_ns: start }
            }
            Request::StopSchedule => {
                self.schedule = None;
                ReplyBody::Done
            }
            Request::Status => ReplyBody::Status(StatusReply {
                now_ns: now,
                cells: self.current_cells(),
                events: self.events.clone(),
                mhs: if self.air.len() > 1 {
                    (0..self.air.len()).map(|j| self.cells_of(j)).collect()
                } else {
                    Vec::new()
                },
                schedule: self.schedule.as_ref().map(|s| ScheduleStatus {
                    schedule: s.schedule.clone(),
                    start_ns: s.start_ns,
                }),
                links: self
                    .links
                    .iter()
                    .map(|l| LinkStatus {
                        name: l.name.clone(),
                        down: l.down.params().clone(),
                        up: l.up.params().clone(),
                        queued_down: l.down.queued_frames(),
                        queued_up: l.up.queued_frames(),
                    })
                    .collect(),
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC1: [u8; 6] = [2, 0, 0, 0, 1, 1];
    const MAC2: [u8; 6] = [2, 0, 0, 0, 2, 1];

    fn topo() -> Topology {
        let port = |name: &str, mac: Option<&str>| PortSpec {
            name: name.into(),
            netns: "x".into(),
            ifname: "t".into(),
            mac: mac.map(Into::into),
        };
        let fast = LinkParams::default();
        Topology {
            seed: 1,
            ports: vec![
                port("fh", None),
                port("gw", None),
                port("msr1", Some("02:00:00:00:01:01")),
                port("msr2", Some("02:00:00:00:02:01")),
                port("mh", None),
            ],
            wires: vec![WireSpec {
                name: "wan".into(),
                down_from: "fh".into(),
                down_to: "gw".into(),
                down: fast.clone(),
                up: fast.clone(),
            }],
            air: Some(AirSpec {
                mh: "mh".into(),
                mhs: vec![],
                cells: vec![
                    CellSpec {
                        port: "msr1".into(),
                        down: fast.clone(),
                        up: fast.clone(),
                    },
                    CellSpec {
                        port: "msr2".into(),
                        down: fast.clone(),
                        up: fast,
                    },
                ],
                initial: vec![1],
            }),
        }
    }

    fn frame_to(dst: [u8; 6]) -> Vec<u8> {
        let mut f = dst.to_vec();
        f.resize(100, 0);
        f
    }

    fn step(e: &mut Emulator, now: u64) -> Vec<usize> {
        let mut out = Vec::new();
        e.advance(now, &mut out);
        out.into_iter().map(|(p, _)| p).collect()
    }

    #[test]
    fn wire_forwards_both_ways() {
        let mut e = Emulator::new(&topo(), 0).unwrap();
        e.ingress(0, 0, frame_to([0xff; 6]));
        e.ingress(0, 1, frame_to([0xff; 6]));
        let mut got = step(&mut e, 1);
        got.sort();
        assert_eq!(got, vec![0, 1]);
    }

    #[test]
    fn cell_traffic_reaches_mh_only_when_associated() {
        let mut e = Emulator::new(&topo(), 0).unwrap();
        e.ingress(0, 2, frame_to([0xff; 6])); // beacon from MSR1: MH is in cell 1
        e.ingress(0, 3, frame_to([0xff; 6])); // from MSR2: not in cell 2
        assert_eq!(step(&mut e, 1), vec![4]);
        let c = e.counters();
        assert_eq!(c["cell2"].down.drop_no_cell, 1);
    }

    #[test]
    fn mh_unicast_goes_to_the_addressed_cell_broadcast_to_all_joined() {
        let mut e = Emulator::new(&topo(), 0).unwrap();
        e.handle(
            0,
            Request::Assoc {
                cells: vec![1, 2],
                mh: None,
            },
        );
        e.ingress(0, 4, frame_to(MAC2));
        assert_eq!(step(&mut e, 1), vec![3]);
        e.ingress(1, 4, frame_to([0xff; 6]));
        let mut got = step(&mut e, 2);
        got.sort();
        assert_eq!(got, vec![2, 3]);
        let _ = MAC1;
    }

    #[test]
    fn mh_unicast_to_a_shared_gateway_mac_goes_to_the_cell_joined_last() {
        let vmac = [2, 0, 0x5e, 0, 1, 1];
        let assoc = |e: &mut Emulator, t: u64, cells: Vec<usize>| {
            e.handle(t, Request::Assoc { cells, mh: None });
        };
        let mut e = Emulator::new(&topo(), 0).unwrap();
        assoc(&mut e, 0, vec![1]);
        e.ingress(0, 4, frame_to(vmac));
        assert_eq!(step(&mut e, 1), vec![2]);
        // Overlap: the new cell takes the MH's unicast, never both cells.
        assoc(&mut e, 1, vec![1, 2]);
        e.ingress(1, 4, frame_to(vmac));
        assert_eq!(step(&mut e, 2), vec![3]);
        assoc(&mut e, 2, vec![1]);
        e.ingress(2, 4, frame_to(vmac));
        assert_eq!(step(&mut e, 3), vec![2]);
        // Out of every cell: lost in the air of the cell joined last.
        assoc(&mut e, 3, vec![]);
        e.ingress(3, 4, frame_to(vmac));
        assert!(step(&mut e, 4).is_empty());
        assert_eq!(e.mh_unknown_dst, 0);
        // Both cells configured with the same MAC: the same rule.
        let mut t = topo();
        let m = t.ports[3].mac.clone();
        t.ports[2].mac = m;
        let mut e = Emulator::new(&t, 0).unwrap();
        assoc(&mut e, 0, vec![2]);
        assoc(&mut e, 0, vec![2, 1]);
        e.ingress(0, 4, frame_to(MAC2));
        assert_eq!(step(&mut e, 1), vec![2]);
    }

    #[test]
    fn leaving_a_cell_flushes_its_queues() {
        let mut t = topo();
        t.air.as_mut().unwrap().cells[0].down.delay_us = 10_000;
        let mut e = Emulator::new(&t, 0).unwrap();
        e.ingress(0, 2, frame_to([0xff; 6]));
        e.handle(
            1,
            Request::Assoc {
                cells: vec![2],
                mh: None,
            },
        );
        assert!(step(&mut e, 20_000_000).is_empty());
        assert_eq!(e.counters()["cell1"].down.drop_flush, 1);
    }

    #[test]
    fn schedule_drives_association() {
        let mut e = Emulator::new(&topo(), 0).unwrap();
        let r = e.handle(
            0,
            Request::Schedule {
                schedule: Schedule {
                    cells: vec![1, 2],
                    period_s: 1.0,
                    crossing: Crossing::Gap { gap_s: 0.5 },
                    max_switches: Some(1),
                },
                start_in_s: 0.0,
            },
        );
        assert!(r.ok);
        assert_eq!(e.next_event(), Some(1_000_000_000));
        step(&mut e, 1_200_000_000);
        assert!(e.current_cells().is_empty());
        step(&mut e, 1_500_000_000);
        assert_eq!(e.current_cells(), vec![2]);
        assert_eq!(e.next_event(), None);
        let ReplyBody::Status(st) = e
            .handle(2_000_000_000, Request::Status)
            .into_result()
            .unwrap()
        else {
            panic!("not a status reply");
        };
        let ev = st.events;
        assert_eq!(
            ev.iter().map(|e| e.t_ns).collect::<Vec<_>>(),
            vec![0, 0, 1_000_000_000, 1_500_000_000]
        );
    }

    #[test]
    fn carrier_follows_association() {
        let mut e = Emulator::new(&topo(), 0).unwrap();
        // The MH (port 4) starts in cell 1: carrier on, reported once.
        assert_eq!(e.take_carrier_changes(), vec![(4, true)]);
        assert!(e.take_carrier_changes().is_empty());
        assert!(e.carrier(0));
        let assoc = |e: &mut Emulator, t: u64, cells: Vec<usize>| {
            assert!(e.handle(t, Request::Assoc { cells, mh: None }).ok);
        };
        // Moving into an overlap and out of it keeps the carrier: no change.
        assoc(&mut e, 1, vec![1, 2]);
        assoc(&mut e, 2, vec![2]);
        assoc(&mut e, 2, vec![2]);
        assert!(e.take_carrier_changes().is_empty());
        assert!(e.carrier(0));
        // Straight from one cell into another: disassociated and associated again.
        assoc(&mut e, 2, vec![1]);
        assert_eq!(e.take_carrier_changes(), vec![(4, false), (4, true)]);
        assert!(e.carrier(0));
        // Blackout: carrier off; back in a cell: on.
        assoc(&mut e, 3, vec![]);
        assert!(!e.carrier(0));
        assoc(&mut e, 4, vec![]);
        assoc(&mut e, 5, vec![1]);
        assert_eq!(e.take_carrier_changes(), vec![(4, false), (4, true)]);
        // A refused request changes nothing.
        assert!(
            !e.handle(
                6,
                Request::Assoc {
                    cells: vec![7],
                    mh: None
                }
            )
            .ok
        );
        assert!(e.take_carrier_changes().is_empty());
        // A schedule with gaps: off at each gap's start, on at its end.
        e.handle(
            10,
            Request::Schedule {
                schedule: Schedule {
                    cells: vec![1, 2],
                    period_s: 1.0,
                    crossing: Crossing::Gap { gap_s: 0.5 },
                    max_switches: Some(2),
                },
                start_in_s: 0.0,
            },
        );
        assert!(e.take_carrier_changes().is_empty());
        step(&mut e, 1_200_000_000);
        assert_eq!(e.take_carrier_changes(), vec![(4, false)]);
        step(&mut e, 1_600_000_000);
        assert_eq!(e.take_carrier_changes(), vec![(4, true)]);
        // Both edges of the second gap in one advance: both reported, in order.
        step(&mut e, 3_000_000_000);
        assert_eq!(e.take_carrier_changes(), vec![(4, false), (4, true)]);
    }

    #[test]
    fn every_mh_has_its_own_carrier_and_a_blackout_start_is_reported() {
        let mut t = two_mhs();
        t.air.as_mut().unwrap().initial = vec![];
        let mut e = Emulator::new(&t, 0).unwrap();
        assert_eq!(e.take_carrier_changes(), vec![(4, false), (5, false)]);
        assert!(
            e.handle(
                1,
                Request::Assoc {
                    cells: vec![2],
                    mh: Some(2)
                }
            )
            .ok
        );
        assert_eq!(e.take_carrier_changes(), vec![(5, true)]);
        assert!(!e.carrier(0) && e.carrier(1));
    }

    #[test]
    fn bad_requests_get_errors() {
        let mut e = Emulator::new(&topo(), 0).unwrap();
        let r = e.handle(
            0,
            Request::Assoc {
                cells: vec![3],
                mh: None,
            },
        );
        assert!(!r.ok);
        assert!(r.into_result().unwrap_err().contains("cell 3"));
        let r = e.handle(
            0,
            Request::Link {
                link: "nope".into(),
                dir: Dir::Both,
                params: LinkParams::default(),
            },
        );
        assert!(r.into_result().unwrap_err().contains("wan"));
        let bad: Result<Request, _> = serde_json::from_str(r#"{"op":"assoc","cell":[1]}"#);
        assert!(bad.is_err());
        assert!(Request::parse("{x").unwrap_err().contains("not JSON"));
        assert!(Request::parse(r#"{"op":"teleport"}"#)
            .unwrap_err()
            .contains("unknown variant"));
    }

    #[test]
    fn replies_round_trip_through_json() {
        let mut e = Emulator::new(&topo(), 0).unwrap();
        for req in [
            Request::Assoc {
                cells: vec![1],
                mh: None,
            },
            Request::Counters,
            Request::Status,
            Request::ResetCounters,
            Request::Assoc {
                cells: vec![9],
                mh: None,
            },
        ] {
            let r = e.handle(5, req);
            let line = serde_json::to_string(&r).unwrap();
            assert!(line.starts_with(&format!("{{\"ok\":{}", r.ok)), "{line}");
            let back: Reply = serde_json::from_str(&line).unwrap();
            assert_eq!(back, r);
        }
    }

    /// Two MHs (ports 4 and 5, MACs …:64 and …:65) in the two-cell topology.
    fn two_mhs() -> Topology {
        let mut t = topo();
        t.ports[4].mac = Some("02:00:00:00:00:64".into());
        t.ports.push(PortSpec {
            name: "mh2".into(),
            netns: "x".into(),
            ifname: "t".into(),
            mac: Some("02:00:00:00:00:65".into()),
        });
        t.air.as_mut().unwrap().mhs = vec!["mh2".into()];
        t
    }

    const MH1: [u8; 6] = [2, 0, 0, 0, 0, 0x64];
    const MH2: [u8; 6] = [2, 0, 0, 0, 0, 0x65];

    #[test]
    fn several_mhs_have_their_own_association_links_and_flushes() {
        let mut e = Emulator::new(&two_mhs(), 0).unwrap();
        // Both start in cell 1; MH 2 moves to cell 2 alone.
        let r = e.handle(
            0,
            Request::Assoc {
                cells: vec![2],
                mh: Some(2),
            },
        );
        assert_eq!(
            r.into_result().unwrap(),
            ReplyBody::Assoc { cells: vec![2] }
        );
        assert_eq!(e.current_cells(), vec![1]);
        // Unicast from a cell goes to the addressed MH only, if it is in that cell.
        e.ingress(0, 2, frame_to(MH1));
        e.ingress(0, 2, frame_to(MH2)); // MH 2 left cell 1
        e.ingress(0, 3, frame_to(MH2));
        let mut got = step(&mut e, 1);
        got.sort();
        assert_eq!(got, vec![4, 5]);
        assert_eq!(e.counters()["cell1.mh2"].down.drop_no_cell, 1);
        // Broadcast reaches every MH in the cell.
        e.ingress(1, 3, frame_to([0xff; 6]));
        assert_eq!(step(&mut e, 2), vec![5]);
        // Unicast to nobody is counted.
        e.ingress(2, 2, frame_to([2, 9, 9, 9, 9, 9]));
        assert!(step(&mut e, 3).is_empty());
        assert_eq!(e.cell_unknown_dst, 1);
        // MH 2's frames go to its own view of the cell it addresses.
        e.ingress(3, 5, frame_to(MAC2));
        assert_eq!(step(&mut e, 4), vec![3]);
        assert_eq!(e.counters()["cell2.mh2"].up.pkts_out, 1);
        // MH 2 leaving cell 2 flushes its links only.
        let mut t = two_mhs();
        t.air.as_mut().unwrap().cells[0].down.delay_us = 10_000;
        let mut e = Emulator::new(&t, 0).unwrap();
        e.ingress(0, 2, frame_to(MH1));
        e.ingress(0, 2, frame_to(MH2));
        e.handle(
            1,
            Request::Assoc {
                cells: vec![],
                mh: Some(2),
            },
        );
        assert_eq!(step(&mut e, 20_000_000), vec![4]);
        assert_eq!(e.counters()["cell1.mh2"].down.drop_flush, 1);
        assert_eq!(e.counters()["cell1"].down.drop_flush, 0);
        // Status lists every MH's cells; a bad MH is an error.
        let ReplyBody::Status(st) = e.handle(2, Request::Status).into_result().unwrap() else {
            panic!("not a status reply");
        };
        assert_eq!(st.mhs, vec![vec![1], vec![]]);
        let r = e.handle(
            3,
            Request::Assoc {
                cells: vec![1],
                mh: Some(3),
            },
        );
        assert!(r.into_result().unwrap_err().contains("MH 3"));
    }

    #[test]
    fn flushing_a_cell_drops_what_every_mh_has_queued_there() {
        let mut t = two_mhs();
        t.air.as_mut().unwrap().cells[0].down.delay_us = 10_000;
        t.air.as_mut().unwrap().cells[0].up.delay_us = 10_000;
        let mut e = Emulator::new(&t, 0).unwrap();
        e.ingress(0, 2, frame_to(MH1));
        e.ingress(0, 2, frame_to(MH2));
        e.ingress(0, 5, frame_to(MAC1));
        assert!(e.handle(1, Request::Flush { cell: 1 }).ok);
        assert!(step(&mut e, 20_000_000).is_empty());
        let c = e.counters();
        assert_eq!(c["cell1"].down.drop_flush, 1);
        assert_eq!(c["cell1.mh2"].down.drop_flush, 1);
        assert_eq!(c["cell1.mh2"].up.drop_flush, 1);
        // The MHs stay in the cell: new frames pass.
        e.ingress(30_000_000, 2, frame_to(MH1));
        assert_eq!(step(&mut e, 50_000_000), vec![4]);
        assert!(!e.handle(1, Request::Flush { cell: 3 }).ok);
    }

    #[test]
    fn several_mhs_need_macs() {
        let mut t = two_mhs();
        t.ports[5].mac = None;
        assert!(Emulator::new(&t, 0).unwrap_err().contains("needs a mac"));
    }

    #[test]
    fn topology_errors_are_named() {
        let mut t = topo();
        t.ports[2].mac = None;
        assert!(Emulator::new(&t, 0).unwrap_err().contains("needs a mac"));
        let mut t = topo();
        t.wires[0].down_to = "mh".into();
        assert!(Emulator::new(&t, 0).unwrap_err().contains("two links"));
    }
}
