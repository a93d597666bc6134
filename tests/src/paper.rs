//! `itcp-lab bench paper`: the I-TCP paper's experiments (seed 004 §4, Tables 1–2) on
//! the emulated network, regular TCP against I-TCP, plus the scenarios of seeds 000
//! (fast → slow cell) and 003 (eager vs lazy movement detection) and a sensitivity
//! sweep. Writes `docs/results.md` and SVG plots under `docs/results/`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::emu::{AssocEvent, LinkParams};
use crate::lab;
use crate::report::{median, COLUMNS, PAPER_ITCP, PAPER_REGULAR};
use crate::scenario::{self, Cells, Detection, Mode, Net, Outcome, Run, Traffic};
use crate::svg::{Marker, Plot, Series};
use itcp_mh::mobility::Policy;

/// Goodput ideal of a 2 Mbit/s cell (IP and TCP headers with timestamps, 1500-byte
/// packets), KB/s of 1024 bytes, as measured by the foundation's emulator test.
pub const CELL_IDEAL_KBPS: f64 = 1.93e6 / 8.0 / 1024.0;

/// The table variants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Variant {
    /// 16 KB buffers at FH and MH, reno at the FH: the paper's setting.
    Era,
    /// As `Era`, and msrd's sockets at 16 KB too: no endpoint of either half may keep
    /// more than the paper's window, so the ratio shows what the split alone gives.
    Strict,
    /// The kernel's default congestion control and autotuned buffers.
    Modern,
    /// Autotuned buffers, cubic at the FH and MH (loss-based, where the default here
    /// is bbr).
    Cubic,
}

/// msrd's sockets at 16 KB each way, for [`Variant::Strict`].
const MSRD_16K: &str = "[wireless]\nsend_buffer = 16384\nrecv_buffer = 16384\n\
[fixed]\nsend_buffer = 16384\nrecv_buffer = 16384\n";

impl Variant {
    /// As `--variants` names them.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Era => "era",
            Variant::Strict => "strict",
            Variant::Modern => "modern",
            Variant::Cubic => "cubic",
        }
    }

    pub fn parse(s: &str) -> Option<Variant> {
        [
            Variant::Era,
            Variant::Strict,
            Variant::Modern,
            Variant::Cubic,
        ]
        .into_iter()
        .find(|v| v.name() == s)
    }

    fn label(self) -> &'static str {
        match self {
            Variant::Era => "16 KB window, reno at the FH (era-faithful)",
            Variant::Strict => {
                "16 KB window at every endpoint, msrd's sockets included; reno at the FH (strict era)"
            }
            Variant::Modern => "kernel defaults: autotuned buffers, default congestion control",
            Variant::Cubic => "autotuned buffers, cubic at the FH and MH",
        }
    }

    /// What the variant adds to msrd's configuration in the I-TCP runs.
    fn msrd_extra(self) -> &'static str {
        match self {
            Variant::Strict => MSRD_16K,
            _ => "",
        }
    }

    /// The transfer for this variant; the MH opens it with network detection.
    fn traffic(self, bytes: u64, d: Detection) -> Traffic {
        let mh_opens = d.mh_opens();
        match self {
            Variant::Era | Variant::Strict => Traffic {
                bytes,
                buf: Some(16 * 1024),
                cc: Some("reno".into()),
                mh_opens,
            },
            Variant::Modern => Traffic {
                bytes,
                buf: None,
                cc: None,
                mh_opens,
            },
            Variant::Cubic => Traffic {
                bytes,
                buf: None,
                cc: Some("cubic".into()),
                mh_opens,
            },
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct PaperOpts {
    pub seeds: u64,
    /// Transfer size factor (1.0: 4 MB LAN, 2 MB WAN as in the paper).
    pub scale: f64,
    /// Runs at a time (each on its own lab).
    pub parallel: usize,
    pub variants: Vec<Variant>,
    pub nets: Vec<Net>,
    pub other_seeds: bool,
    pub sweep: bool,
    /// msrd settings for the I-TCP runs (appended to every msrd config).
    pub msrd_extra: String,
    /// How the MH notices a move, in both modes (beacons: the paper's).
    pub detection: Detection,
    /// Where docs/results.md and docs/results/*.svg go.
    pub out: PathBuf,
    /// Render the report from an earlier run's `results/runs.json` instead of running
    /// (the other options must describe that run).
    pub from_runs: Option<PathBuf>,
}

/// One run to do.
#[derive(Debug, Clone)]
struct Job {
    key: String,
    run: Run,
    /// Per-cell link overrides (cell number, parameters), applied after the lab is up.
    cell_links: Vec<(usize, LinkParams)>,
}

type Results = BTreeMap<String, Result<Outcome, String>>;

/// Regular TCP and I-TCP as `o` says (detection, msrd settings), with `policy` and
/// extra agent arguments.
fn modes(o: &PaperOpts, policy: Policy, agent: &[&str]) -> [Mode; 2] {
    o.detection.modes(policy, &o.msrd_extra, agent)
}

/// Runs the jobs, `parallel` at a time, reporting progress.
fn run_all(jobs: Vec<Job>, parallel: usize, progress: &(dyn Fn(&str) + Sync)) -> Results {
    let total = jobs.len();
    let queue = Arc::new(Mutex::new(jobs));
    let out = Arc::new(Mutex::new(Results::new()));
    std::thread::scope(|sc| {
        for _ in 0..parallel.max(1) {
            let (queue, out) = (queue.clone(), out.clone());
            sc.spawn(move || loop {
                let Some(job) = queue.lock().unwrap().pop() else {
                    return;
                };
                let t0 = std::time::Instant::now();
                let r = scenario::run_with(&job.run, &job.cell_links).map_err(|e| e.to_string());
                let line = match &r {
                    Ok(o) => format!(
                        "{}: {:.1} KB/s{}",
                        job.key,
                        o.kbytes_per_s(),
                        if o.recv.ok {
                            ""
                        } else {
                            " (FAILED verification)"
                        }
                    ),
                    Err(e) => format!("{}: error {e}", job.key),
                };
                let mut o = out.lock().unwrap();
                o.insert(job.key, r);
                progress(&format!(
                    "[{}/{total}] {line} ({:.0} s)",
                    o.len(),
                    t0.elapsed().as_secs_f64()
                ));
            });
        }
    });
    Arc::try_unwrap(out).unwrap().into_inner().unwrap()
}

fn key(v: Variant, net: &str, col: usize, mode: &str, seed: u64) -> String {
    format!("{v:?}/{net}/{col}/{mode}/{seed}")
}

fn mode_name(m: &Mode) -> &'static str {
    if m.is_itcp() {
        "itcp"
    } else {
        "regular"
    }
}

fn matrix_jobs(o: &PaperOpts) -> Vec<Job> {
    let mut jobs = Vec::new();
    for &v in &o.variants {
        for net in &o.nets {
            let mb = if net.name == "LAN" { 4.0 } else { 2.0 };
            let bytes = (mb * 1_048_576.0 * o.scale) as u64;
            for (col, cells) in Cells::paper_columns().into_iter().enumerate() {
                let msrd = format!("{}{}", o.msrd_extra, v.msrd_extra());
                for mode in o.detection.modes(Policy::Eager, &msrd, &[]) {
                    for seed in 1..=o.seeds {
                        jobs.push(Job {
                            key: key(v, &net.name, col, mode_name(&mode), seed),
                            run: Run {
                                net: net.clone(),
                                cells: cells.clone(),
                                mode: mode.clone(),
                                traffic: v.traffic(bytes, o.detection),
                                seed,
                                msrs: 2,
                                timeout: Duration::from_secs(900),
                            },
                            cell_links: vec![],
                        });
                    }
                }
            }
        }
    }
    jobs
}

/// Samples of one cell of a table.
fn samples<'a>(
    res: &'a Results,
    v: Variant,
    net: &str,
    col: usize,
    mode: &str,
) -> Vec<&'a Outcome> {
    res.iter()
        .filter(|(k, _)| k.starts_with(&format!("{v:?}/{net}/{col}/{mode}/")))
        .filter_map(|(_, r)| r.as_ref().ok())
        .collect()
}

fn kbps(os: &[&Outcome]) -> Vec<f64> {
    os.iter().map(|o| o.kbytes_per_s()).collect()
}

fn cell(v: &[f64]) -> String {
    if v.is_empty() {
        return "–".into();
    }
    let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    if v.len() == 1 {
        format!("{:.2}", v[0])
    } else {
        format!("{:.2} [{lo:.2}–{hi:.2}]", median(v))
    }
}

fn med(v: &[f64]) -> f64 {
    if v.is_empty() {
        f64::NAN
    } else {
        median(v)
    }
}

/// Markdown of one (variant, network) table, its ratio line and the target checks.
struct TableOut {
    md: String,
    ratios: [f64; 4],
    /// I-TCP's median goodput over the availability bound, per column.
    of_bound: [f64; 4],
    checks: Vec<String>,
}

fn table(res: &Results, v: Variant, net: &str) -> TableOut {
    let paper = |rows: &crate::report::PaperRows| if net == "LAN" { rows.lan } else { rows.wan };
    let (pr, pi) = (paper(&PAPER_REGULAR), paper(&PAPER_ITCP));
    let mut md = format!(
        "| {net} | {} |\n|---|---|---|---|---|\n",
        COLUMNS.join(" | ")
    );
    let mut rows: Vec<(String, Vec<String>)> = vec![
        ("regular TCP (ours)".into(), vec![]),
        ("I-TCP (ours)".into(), vec![]),
        ("**I-TCP / regular (ours)**".into(), vec![]),
        ("regular TCP (paper)".into(), vec![]),
        ("I-TCP (paper)".into(), vec![]),
        ("I-TCP / regular (paper)".into(), vec![]),
        ("MH had a cell (ours)".into(), vec![]),
        ("I-TCP / availability bound".into(), vec![]),
        ("FH RTOs per move: regular TCP (ours)".into(), vec![]),
        ("FH RTOs per move: I-TCP (ours)".into(), vec![]),
        (
            "I-TCP short of the ideal, s per run: blackout + detection + handoff + rest".into(),
            vec![],
        ),
        (
            "FH's segments dropped by the fixed link's queue per run: regular / I-TCP".into(),
            vec![],
        ),
    ];
    let mut ratios = [f64::NAN; 4];
    let mut of_bounds = [f64::NAN; 4];
    let mut checks = Vec::new();
    let nomove_itcp = med(&kbps(&samples(res, v, net, 0, "itcp")));
    for col in 0..4 {
        let r = samples(res, v, net, col, "regular");
        let i = samples(res, v, net, col, "itcp");
        let (rv, iv) = (kbps(&r), kbps(&i));
        let ratio = med(&iv) / med(&rv);
        ratios[col] = ratio;
        let cov = med(&i.iter().map(|o| o.coverage).collect::<Vec<_>>());
        let bound = CELL_IDEAL_KBPS * cov;
        let of_bound = med(&iv) / bound;
        of_bounds[col] = of_bound;
        let paper_ratio = pi[col] / pr[col];
        rows[0].1.push(cell(&rv));
        rows[1].1.push(cell(&iv));
        rows[2].1.push(format!("**{ratio:.2}**"));
        rows[3].1.push(format!("{:.2}", pr[col]));
        rows[4].1.push(format!("{:.2}", pi[col]));
        rows[5].1.push(format!("{paper_ratio:.2}"));
        rows[6].1.push(format!("{:.1} %", cov * 100.0));
        let near_bound = of_bound >= 0.95;
        rows[7].1.push(format!(
            "{:.1} %{}",
            of_bound * 100.0,
            if near_bound { " †" } else { "" }
        ));
        rows[8].1.push(rtos_per_move(&r, |o| o.registrations.len()));
        rows[9].1.push(rtos_per_move(&i, |o| o.handoffs.len()));
        rows[10].1.push(shortfall_cell(&i));
        rows[11]
            .1
            .push(format!("{} / {}", fixed_drops(&r), fixed_drops(&i)));
        // Targets (issue 5).
        let beat = ratio >= paper_ratio - 0.005;
        checks.push(format!(
            "{net} {}: ratio {ratio:.2} vs paper {paper_ratio:.2}: {}",
            COLUMNS[col],
            if beat {
                "met".to_string()
            } else if near_bound {
                format!("below the paper's ratio, but I-TCP is within 5 % of the availability bound ({:.1} %)", of_bound * 100.0)
            } else {
                "NOT met".to_string()
            }
        ));
        if col > 0 {
            let need = if col == 1 { 0.98 } else { 0.90 };
            let base = if col == 1 {
                nomove_itcp
            } else {
                nomove_itcp * cov
            };
            let got = med(&iv) / base;
            checks.push(format!(
                "{net} {}: I-TCP {:.2} KB/s = {:.1} % of {} ({base:.2} KB/s), target ≥ {:.0} %: {}",
                COLUMNS[col],
                med(&iv),
                got * 100.0,
                if col == 1 {
                    "no-moves"
                } else {
                    "no-moves × coverage"
                },
                need * 100.0,
                if got >= need { "met" } else { "NOT met" }
            ));
        }
        let bad: Vec<String> = i
            .iter()
            .filter(|o| !o.recv.ok || o.rsts.is_some_and(|(a, b, c, d)| a + b + c + d > 0))
            .map(|o| format!("seed {}: ok={} rsts={:?}", o.seed, o.recv.ok, o.rsts))
            .collect();
        if !bad.is_empty() {
            checks.push(format!(
                "{net} {}: I-TCP runs not clean: {}",
                COLUMNS[col],
                bad.join("; ")
            ));
        }
    }
    for (name, cells) in rows {
        let _ = writeln!(md, "| {name} | {} |", cells.join(" | "));
    }
    TableOut {
        md,
        ratios,
        of_bound: of_bounds,
        checks,
    }
}

/// Where one I-TCP run fell short of the cell's ideal goodput, in seconds of its
/// transfer (the time its bytes would have taken less at the ideal rate).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Shortfall {
    total: f64,
    /// Without a cell: the link's blackout (what the availability bound leaves out).
    blackout: f64,
    /// From entering a cell with no other to the new MSR's greeting (agent) or its
    /// detection of the MH (network): the move not noticed yet, no path for the bytes.
    detection: f64,
    /// From the greeting or detection to the moved connection's resumption.
    handoff: f64,
}

impl Shortfall {
    /// The rest: the TCPs resuming after the move, loss repair, the connection's start.
    fn rest(&self) -> f64 {
        self.total - self.blackout - self.detection - self.handoff
    }
}

/// The instants (CLOCK_MONOTONIC ns) the MH entered a cell it was not in, and whether
/// it still had another cell then (an overlap: the old path still carries bytes).
fn arrivals(events: &[AssocEvent]) -> Vec<(u64, bool)> {
    events
        .windows(2)
        .filter(|w| w[1].cells.iter().any(|c| !w[0].cells.contains(c)))
        .map(|w| {
            let kept = w[1].cells.iter().any(|c| w[0].cells.contains(c));
            (w[1].t_ns, kept)
        })
        .collect()
}

/// Seconds of detection and of handoff over the arrivals (wall µs, whether the MH kept
/// another cell) given the new MSRs' handoffs (greeting, resumed; wall µs): each arrival
/// is charged with the first handoff greeted after it (1 ms of clock slack) and before
/// the next; detection only when the MH had no other cell.
fn charge(arr: &[(i64, bool)], moved: &[(i64, i64)]) -> (f64, f64) {
    let (mut detection, mut handoff) = (0.0, 0.0);
    for (n, &(at, kept)) in arr.iter().enumerate() {
        let until = arr.get(n + 1).map_or(i64::MAX, |&(t, _)| t);
        let Some(&(g, resumed)) = moved
            .iter()
            .filter(|&&(g, _)| g >= at - 1000 && g < until)
            .min_by_key(|&&(g, _)| g)
        else {
            continue;
        };
        if !kept {
            detection += (g - at).max(0) as f64 / 1e6;
        }
        handoff += (resumed - g).max(0) as f64 / 1e6;
    }
    (detection, handoff)
}

fn shortfall(o: &Outcome) -> Shortfall {
    let d = o.recv.duration_s;
    let total = d - o.recv.bytes as f64 / 1024.0 / CELL_IDEAL_KBPS;
    let blackout = (1.0 - o.coverage) * d;
    let off = o
        .wall_minus_mono_us
        .unwrap_or_else(scenario::wall_minus_mono_us);
    let wall_us = |mono_ns: u64| (mono_ns / 1000) as i64 + off;
    let (t0, t1) = (o.recv.t0_mono_ns, o.recv.t0_mono_ns + (d * 1e9) as u64);
    let arr: Vec<(i64, bool)> = arrivals(&o.events)
        .into_iter()
        .filter(|&(t, _)| t >= t0 && t < t1)
        .map(|(t, kept)| (wall_us(t), kept))
        .collect();
    let moved: Vec<(i64, i64)> = o
        .handoffs
        .iter()
        .filter_map(|h| Some((h.phases.greeting? as i64, h.phases.resumed? as i64)))
        .collect();
    let (detection, handoff) = charge(&arr, &moved);
    Shortfall {
        total,
        blackout,
        detection,
        handoff,
    }
}

/// The FH's segments the fixed link's drop-tail queue dropped (the `wan` link's down
/// direction, FH → GW), median over the runs: I-TCP's larger window lets the FH's slow
/// start outgrow that queue, where regular TCP is held to the MH's window.
fn fixed_drops(os: &[&Outcome]) -> String {
    drops_median(os.iter().map(|o| &o.counters))
}

fn drops_median<'a>(
    runs: impl Iterator<Item = &'a BTreeMap<String, crate::emu::LinkCounters>>,
) -> String {
    let v: Vec<f64> = runs
        .filter_map(|c| c.get("wan"))
        .map(|c| c.down.drop_queue as f64)
        .collect();
    if v.is_empty() {
        return "–".into();
    }
    format!("{:.0}", med(&v))
}

/// Mean shortfall over the runs, as "total = blackout + detection + handoff + rest".
fn shortfall_cell(os: &[&Outcome]) -> String {
    if os.is_empty() {
        return "–".into();
    }
    let all: Vec<Shortfall> = os.iter().map(|o| shortfall(o)).collect();
    let mean = |f: &dyn Fn(&Shortfall) -> f64| all.iter().map(f).sum::<f64>() / all.len() as f64;
    format!(
        "{:.2} = {:.2} + {:.3} + {:.3} + {:.2}",
        mean(&|s| s.total),
        mean(&|s| s.blackout),
        mean(&|s| s.detection),
        mean(&|s| s.handoff),
        mean(&|s| s.rest())
    )
}

/// The FH's retransmission timeouts (its sender's `tcpi_total_rto`) over all runs,
/// per move (`moves` of a run: the baseline's reroutes, I-TCP's handoffs), with the
/// totals; "–" without moves.
fn rtos_per_move(os: &[&Outcome], moves: impl Fn(&Outcome) -> usize) -> String {
    let n: usize = os.iter().map(|o| moves(o)).sum();
    let rtos: u64 = os
        .iter()
        .filter_map(|o| o.send.as_ref()?.tcp_info.as_ref())
        .map(|t| u64::from(t.total_rto))
        .sum();
    if n == 0 {
        return format!("– ({rtos} in all)");
    }
    format!("{:.2} ({rtos} / {n})", rtos as f64 / n as f64)
}

/// Goodput over time of one run (100 ms bins, KB/s) with the time axis from t0.
fn series(o: &Outcome, name: &str, color: &str) -> Series {
    let bin = o.recv.bin_s;
    Series {
        name: name.into(),
        color: color.into(),
        points: o
            .recv
            .timeline_bytes
            .iter()
            .enumerate()
            .map(|(i, b)| (i as f64 * bin, *b as f64 / bin / 1024.0))
            .collect(),
    }
}

/// Spans without a cell, relative to `t0` (ns), in s.
fn gaps(o: &Outcome) -> Vec<(f64, f64)> {
    let t0 = o.recv.t0_mono_ns as f64;
    let mut v = Vec::new();
    for (i, e) in o.events.iter().enumerate() {
        if e.cells.is_empty() {
            let end = o.events.get(i + 1).map_or(e.t_ns, |n| n.t_ns);
            v.push(((e.t_ns as f64 - t0) / 1e9, (end as f64 - t0) / 1e9));
        }
    }
    v
}

/// Cell changes (s from t0) where the set of cells changed to a new one.
fn moves(o: &Outcome) -> Vec<f64> {
    let t0 = o.recv.t0_mono_ns as f64;
    o.events
        .iter()
        .skip(1)
        .map(|e| (e.t_ns as f64 - t0) / 1e9)
        .filter(|t| *t > 0.0 && *t < o.recv.duration_s)
        .collect()
}

fn write_plot(dir: &Path, name: &str, p: &Plot) -> io::Result<String> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join(name), p.render())?;
    Ok(format!("results/{name}"))
}

fn plots(res: &Results, o: &PaperOpts, v: Variant, net: &str) -> io::Result<String> {
    let mut md = String::new();
    for col in 1..4 {
        let r = samples(res, v, net, col, "regular");
        let i = samples(res, v, net, col, "itcp");
        let (Some(r), Some(i)) = (r.first(), i.first()) else {
            continue;
        };
        let p = Plot {
            title: format!(
                "{net}, {} (seed {}): goodput at the MH, 100 ms bins",
                COLUMNS[col], i.seed
            ),
            x_label: "seconds since the connection opened".into(),
            y_label: "KB/s".into(),
            series: vec![
                series(i, "I-TCP", "#c0392b"),
                series(r, "regular TCP", "#2c3e50"),
            ],
            markers: moves(i)
                .into_iter()
                .map(|x| Marker {
                    x,
                    color: "#7f8c8d".into(),
                })
                .collect(),
            spans: gaps(i),
            y_max: Some(CELL_IDEAL_KBPS * 1.3),
        };
        let name = format!(
            "{}-{}-{}.svg",
            format!("{v:?}").to_lowercase(),
            net.to_lowercase(),
            ["nomoves", "overlapped", "gap0", "gap1"][col]
        );
        let path = write_plot(&o.out.join("results"), &name, &p)?;
        let _ = writeln!(md, "![{net} {}]({path})\n", COLUMNS[col]);
    }
    Ok(md)
}

/// Seed 000 (Ronquist): fast cell → slow cell (64 kbit/s, 300 ms one-way) → fast.
fn seed000_jobs(o: &PaperOpts) -> Vec<Job> {
    let slow = LinkParams {
        queue_bytes: 16_000,
        ..lab::link(64_000, 300.0, 0.0)
    };
    let mut jobs = Vec::new();
    for mode in modes(o, Policy::Eager, &[]) {
        for seed in 1..=o.seeds.min(3) {
            jobs.push(Job {
                key: format!("s000/{}/{seed}", mode_name(&mode)),
                run: Run {
                    net: Net::lan(),
                    cells: Cells::NonOverlapped {
                        period_s: 4.0,
                        gap_s: 0.0,
                    },
                    mode: mode.clone(),
                    traffic: Variant::Era.traffic((1_500_000.0 * o.scale) as u64, o.detection),
                    seed,
                    msrs: 2,
                    timeout: Duration::from_secs(900),
                },
                cell_links: vec![(2, slow.clone())],
            });
        }
    }
    jobs
}

/// Seed 003 (Fikouras): eager vs lazy movement detection, beacon 1 s, lifetime 3 s.
fn seed003_jobs(o: &PaperOpts) -> Vec<Job> {
    let mut jobs = Vec::new();
    for (pname, policy, agent) in [
        ("eager", Policy::Eager, "eager"),
        ("lazy", Policy::Lazy, "lazy"),
    ] {
        for mode in modes(o, policy, &["--policy", agent]) {
            for seed in 1..=o.seeds.min(3) {
                jobs.push(Job {
                    key: format!("s003/{pname}/{}/{seed}", mode_name(&mode)),
                    run: Run {
                        net: Net::lan(),
                        cells: Cells::NonOverlapped {
                            period_s: 10.0,
                            gap_s: 0.0,
                        },
                        mode: mode.clone(),
                        traffic: Variant::Era
                            .traffic((4.0 * 1_048_576.0 * o.scale) as u64, o.detection),
                        seed,
                        msrs: 2,
                        timeout: Duration::from_secs(900),
                    },
                    cell_links: vec![],
                });
            }
        }
    }
    jobs
}

/// The sweep: one factor at a time around WAN, non-overlapped 0 s, period 8 s.
fn sweep_points() -> Vec<(String, Net, Cells)> {
    let base = |loss: f64, delay: f64| {
        let mut n = Net::wan();
        n.wan = LinkParams {
            queue_bytes: n.wan.queue_bytes,
            ..lab::link(10_000_000, delay, 0.0)
        };
        n.cell = LinkParams {
            queue_bytes: n.cell.queue_bytes,
            ..lab::link(2_000_000, 2.0, loss)
        };
        n
    };
    let cells = |p: f64| Cells::NonOverlapped {
        period_s: p,
        gap_s: 0.0,
    };
    let mut v = Vec::new();
    for loss in [0.0, 0.01, 0.03] {
        v.push((
            format!("loss {:.0} %", loss * 100.0),
            base(loss, 100.0),
            cells(8.0),
        ));
    }
    for d in [20.0, 250.0] {
        v.push((format!("WAN delay {d:.0} ms"), base(0.01, d), cells(8.0)));
    }
    for p in [4.0, 16.0] {
        v.push((format!("move period {p:.0} s"), base(0.01, 100.0), cells(p)));
    }
    v
}

fn sweep_jobs(o: &PaperOpts) -> Vec<Job> {
    let mut jobs = Vec::new();
    for (label, net, cells) in sweep_points() {
        for mode in modes(o, Policy::Eager, &[]) {
            jobs.push(Job {
                key: format!("sweep/{label}/{}", mode_name(&mode)),
                run: Run {
                    net: net.clone(),
                    cells: cells.clone(),
                    mode,
                    traffic: Variant::Era
                        .traffic((2.0 * 1_048_576.0 * o.scale) as u64, o.detection),
                    seed: 1,
                    msrs: 2,
                    timeout: Duration::from_secs(900),
                },
                cell_links: vec![],
            });
        }
    }
    jobs
}

fn get<'a>(res: &'a Results, prefix: &str) -> Vec<&'a Outcome> {
    res.iter()
        .filter(|(k, _)| k.starts_with(prefix))
        .filter_map(|(_, r)| r.as_ref().ok())
        .collect()
}

/// Time from the move to the slow cell until the first 1 s window at ≥ 80 % of the slow
/// link's ideal, and the sender's retransmission count (tcp_info).
fn s000_row(os: &[&Outcome], mode: &str) -> String {
    let slow_kbps = 64_000.0 / 8.0 / 1024.0 * 0.93;
    let mut stalls = Vec::new();
    let mut ramp = Vec::new();
    let mut retrans = Vec::new();
    for o in os {
        stalls.push(o.recv.longest_stall_s);
        let mv = moves(o);
        if let Some(&t) = mv.first() {
            let bin = o.recv.bin_s;
            let tl = &o.recv.timeline_bytes;
            let per_s = (1.0 / bin) as usize;
            // Bytes of the fast cell may still trickle in right after the move: the
            // slow cell's use starts after the first empty bin following the move.
            let mut i = (t / bin) as usize;
            while i < tl.len() && tl[i] != 0 {
                i += 1;
            }
            let hit = (i..tl.len().saturating_sub(per_s))
                .find(|&j| tl[j..j + per_s].iter().sum::<u64>() as f64 / 1024.0 >= 0.8 * slow_kbps);
            if let Some(j) = hit {
                ramp.push(j as f64 * bin - t);
            }
        }
        if let Some(ti) = o.send.as_ref().and_then(|s| s.tcp_info.as_ref()) {
            retrans.push(ti.total_retrans as f64);
        }
    }
    format!(
        "| {mode} | {} | {} | {} | {} |",
        cell(&os.iter().map(|o| o.kbytes_per_s()).collect::<Vec<_>>()),
        cell(&stalls),
        if ramp.is_empty() {
            "–".into()
        } else {
            cell(&ramp)
        },
        if retrans.is_empty() {
            "–".into()
        } else {
            cell(&retrans)
        }
    )
}

/// The outcomes an earlier run saved (`results/runs.json`); a run that had failed
/// comes back as an error.
fn load_runs(path: &Path) -> io::Result<Results> {
    let raw: BTreeMap<String, Option<Outcome>> = serde_json::from_slice(&std::fs::read(path)?)
        .map_err(|e| io::Error::other(format!("{}: {e}", path.display())))?;
    Ok(raw
        .into_iter()
        .map(|(k, o)| (k, o.ok_or_else(|| "failed in the saved run".to_string())))
        .collect())
}

/// Runs everything and writes the report; returns its text.
pub fn run(o: &PaperOpts, progress: &(dyn Fn(&str) + Sync)) -> io::Result<String> {
    let mut jobs = matrix_jobs(o);
    if o.other_seeds {
        jobs.extend(seed000_jobs(o));
        jobs.extend(seed003_jobs(o));
    }
    if o.sweep {
        jobs.extend(sweep_jobs(o));
    }
    // Longest first (WAN regular TCP), so the parallel tail is short.
    jobs.reverse();
    let t0 = std::time::Instant::now();
    let res = match &o.from_runs {
        Some(path) => load_runs(path)?,
        None => run_all(jobs, o.parallel, progress),
    };
    let mut md =
        String::from("# Results: the I-TCP paper's experiments on the emulated network\n\n");
    let _ = writeln!(
        md,
        "Regenerated by `itcp-lab bench paper` ({} seed(s), scale {}, {} runs at a time; {}). \
         Every number below comes from that run; nothing is typed in by hand except the paper's own numbers.\n",
        o.seeds,
        o.scale,
        o.parallel,
        match &o.from_runs {
            Some(p) => format!("rendered from the runs saved in {}", p.display()),
            None => format!("{:.0} min", t0.elapsed().as_secs_f64() / 60.0),
        }
    );
    md += "## Setup\n\n\
        * Network (seed 004 §4): FH ─ GW 10 Mbit/s, 1 ms (LAN) or 100 ms (WAN) one-way; wireless cells 2 Mbit/s each way, 2 ms one-way, 1 % random loss per direction; drop-tail queues of 75 000 bytes. Emulated by `airlink` on real kernels in network namespaces.\n\
        * Moves: every 8 s; overlapped cells share 2 s; non-overlapped cells leave 0 s or 1 s without a cell. MSRs beacon every 1 s; the MH moves on the first beacon of a new MSR (eager), so it may take up to a second more to hear it, as in the paper. Each MSR beacons at a seeded phase of the wall clock and the moves start on a whole second, so both modes wait equally long for the same seed.\n\
        * Regular TCP: the MSRs are plain routers; when the MH hears a new MSR its agent moves the GW's route and the MH's gateway (Mobile-IP-like rerouting, no registration delay).\n\
        * I-TCP: msrd on both MSRs with handoffs; the MH's mobility agent (`itcp-mh-agent`) greets the new MSR, which fetches the connection with TCP_REPAIR.\n\
        * Traffic: the FH sends 4 MB (LAN) or 2 MB (WAN) to the MH; goodput is measured at the MH by `ttcp`, which verifies every byte. KB = 1024 bytes.\n";
    match o.detection {
        Detection::Beacon => {}
        Detection::Solicit => md += "* Detection: link-up solicitation in both modes: when the MH's carrier comes up in a cell (the emulator turns it on at each association, and drops it for an instant on a move straight from one cell into another), its agent asks for a beacon and the MSRs answer at once, instead of the wait for the next periodic beacon.\n",
        Detection::Network => md += "* Detection: network detection for I-TCP. The MH runs nothing of ours: a plain `ttcp` opens the connection to the FH, msrd splits it in transparent mode, every cell answers for the gateway with one shared MAC and detects the MH from its first frame (`detect = \"network\"`); the MH's OS probes its gateway with an ARP request at each carrier-up (RFC 4436; the lab runs `arping`). Regular TCP has no MSR to detect for it: its agent solicits at link-up. The MH opens the connection in both modes.\n",
    }
    let _ = writeln!(
        md,
        "* msrd settings for these tables: {}\n",
        if o.msrd_extra.trim().is_empty() {
            "msrd's defaults (no extra configuration)".to_string()
        } else {
            format!("`{}`", o.msrd_extra.replace('\n', "; "))
        }
    );
    let mut all_checks = Vec::new();
    let mut ratio_lines = Vec::new();
    let mut bound_lines = Vec::new();
    for &v in &o.variants {
        let _ = writeln!(md, "## Tables 1–2: {}\n", v.label());
        md += "Goodput at the MH in KB/s, median [min–max] over the seeds. † marks I-TCP within 5 % of the availability bound (the cell's goodput ideal × the fraction of time the MH had a cell). \
            The second-to-last row says where I-TCP's time went short of the ideal, in seconds per run (mean over the seeds): the transfer's time less the time its bytes take at the cell's ideal rate, split into the blackout (no cell), detection (from entering a cell with no other to the new MSR's greeting or network detection), the handoff (greeting to the moved connection's resumption) and the rest (the TCPs resuming after the move, loss repair, the connection's start). The last row counts the FH's segments that the fixed link's drop-tail queue (FH → GW) dropped, median per run: I-TCP's window lets the FH's slow start outgrow that queue, and the FH repairs the loss over a fixed-side round trip while the cell waits for the hole.\n\n";
        for net in &o.nets {
            let t = table(&res, v, &net.name);
            md += &t.md;
            md += "\n";
            if v == o.variants[0] {
                bound_lines.push(format!(
                    "bound {} {}: {}",
                    net.name,
                    o.detection.name(),
                    t.of_bound
                        .iter()
                        .map(|r| format!("{:.1}", r * 100.0))
                        .collect::<Vec<_>>()
                        .join(" / ")
                ));
                ratio_lines.push(format!(
                    "ratios {}: {}",
                    net.name,
                    t.ratios
                        .iter()
                        .map(|r| format!("{r:.2}"))
                        .collect::<Vec<_>>()
                        .join(" / ")
                ));
            }
            all_checks.extend(t.checks.into_iter().map(|c| format!("{v:?}: {c}")));
            md += &plots(&res, o, v, &net.name)?;
        }
    }
    md += "## Ratios (first table variant; I-TCP / regular TCP, medians, the paper's column order)\n\n```\n";
    for l in &ratio_lines {
        md += l;
        md += "\n";
    }
    md += "```\n\n";
    md += "## I-TCP against the availability bound (first table variant; I-TCP goodput as a percentage of the bound, the paper's column order; detection mode as run)\n\n```\n";
    for l in &bound_lines {
        md += l;
        md += "\n";
    }
    md += "```\n\n";
    md += "## Targets\n\n";
    for c in &all_checks {
        let _ = writeln!(md, "* {c}");
    }
    md += "\n";
    if o.other_seeds {
        md += "## Seed 000: a handoff from a fast cell to a slow one\n\n\
            Cell 1: 2 Mbit/s, 2 ms; cell 2: 64 kbit/s, 300 ms one-way; the MH moves every 4 s with no gap (fast → slow at 4 s), LAN, 16 KB window, reno. \
            Stall: the longest time without bytes at the MH; ramp: from the move until a one-second window (starting after the fast cell's last bytes) carries ≥ 80 % of the slow link's ideal; retransmissions: the FH's (regular TCP: end to end; I-TCP: the fixed side only).\n\n\
            | mode | goodput KB/s | longest stall s | ramp s | FH retransmissions |\n|---|---|---|---|---|\n";
        for m in ["regular", "itcp"] {
            let os = get(&res, &format!("s000/{m}/"));
            md += &s000_row(&os, if m == "itcp" { "I-TCP" } else { "regular TCP" });
            md += "\n";
        }
        md += "\n## Seed 003: eager vs lazy movement detection\n\n\
            Beacons every 1 s, lifetime 3 s; non-overlapped cells with no gap, moves every 10 s, LAN, 16 KB window, reno. \
            Stall: the longest time without bytes at the MH.\n\n\
            | detection | mode | goodput KB/s | longest stall s |\n|---|---|---|---|\n";
        for p in ["eager", "lazy"] {
            for m in ["regular", "itcp"] {
                let os = get(&res, &format!("s003/{p}/{m}/"));
                let _ = writeln!(
                    md,
                    "| {p} | {} | {} | {} |",
                    if m == "itcp" { "I-TCP" } else { "regular TCP" },
                    cell(&os.iter().map(|o| o.kbytes_per_s()).collect::<Vec<_>>()),
                    cell(
                        &os.iter()
                            .map(|o| o.recv.longest_stall_s)
                            .collect::<Vec<_>>()
                    )
                );
            }
        }
        md += "\n";
    }
    if o.sweep {
        md += "## Sensitivity sweep\n\nOne factor at a time around: WAN, non-overlapped cells with no gap, moves every 8 s, 1 % loss, 100 ms WAN delay; 2 MB, 16 KB window, reno; one seed.\n\n\
            | point | regular TCP KB/s | I-TCP KB/s | I-TCP / regular |\n|---|---|---|---|\n";
        let mut pts = Vec::new();
        for (i, (label, _, _)) in sweep_points().into_iter().enumerate() {
            let r = get(&res, &format!("sweep/{label}/regular"));
            let it = get(&res, &format!("sweep/{label}/itcp"));
            let (a, b) = (med(&kbps(&r)), med(&kbps(&it)));
            let _ = writeln!(md, "| {label} | {a:.2} | {b:.2} | {:.2} |", b / a);
            pts.push((i as f64 + 1.0, b / a));
        }
        let p = Plot {
            title: "I-TCP / regular TCP per sweep point (1–3 loss 0/1/3 %, 4–5 delay 20/250 ms, 6–7 period 4/16 s)".into(),
            x_label: "sweep point".into(),
            y_label: "ratio".into(),
            series: vec![Series {
                name: "I-TCP / regular".into(),
                color: "#c0392b".into(),
                points: pts,
            }],
            markers: vec![],
            spans: vec![],
            y_max: None,
        };
        let path = write_plot(&o.out.join("results"), "sweep.svg", &p)?;
        let _ = writeln!(md, "\n![sweep]({path})\n");
    }
    let failed: Vec<String> = res
        .iter()
        .filter_map(|(k, r)| match r {
            Err(e) => Some(format!("{k}: {e}")),
            Ok(o) if !o.recv.ok => Some(format!("{k}: verification failed: {:?}", o.recv.error)),
            _ => None,
        })
        .collect();
    md += "## Runs that failed\n\n";
    if failed.is_empty() {
        md += "None: every transfer completed and was verified byte for byte.\n";
    } else {
        for f in &failed {
            let _ = writeln!(md, "* {f}");
        }
    }
    std::fs::create_dir_all(&o.out)?;
    std::fs::write(o.out.join("results.md"), &md)?;
    let raw: BTreeMap<&String, Option<&Outcome>> =
        res.iter().map(|(k, r)| (k, r.as_ref().ok())).collect();
    std::fs::write(
        o.out.join("results").join("runs.json"),
        serde_json::to_vec(&raw).map_err(io::Error::other)?,
    )?;
    let mut summary = ratio_lines.join("\n");
    summary += "\n";
    for c in all_checks {
        summary += &c;
        summary += "\n";
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrivals_are_new_cells_and_say_whether_another_was_kept() {
        let ev = |t: u64, c: &[usize]| AssocEvent {
            t_ns: t,
            cells: c.to_vec(),
        };
        let events = [
            ev(0, &[1]),
            ev(10, &[1, 2]), // overlap: 2 is new, 1 kept
            ev(20, &[2]),    // leaving the overlap: nothing new
            ev(30, &[1]),    // straight into 1
            ev(40, &[]),
            ev(50, &[2]), // after a blackout
        ];
        assert_eq!(arrivals(&events), [(10, true), (30, false), (50, false)]);
    }

    #[test]
    fn each_arrival_is_charged_with_the_first_handoff_after_it() {
        // Arrivals at 1 s (overlap), 5 s and 9 s (no other cell), wall µs.
        let arr = [(1_000_000, true), (5_000_000, false), (9_000_000, false)];
        let moved = [
            (1_500_000, 1_520_000), // overlap: handoff only
            (4_999_500, 5_030_000), // greeted 0.5 ms before the arrival: clock slack
            (5_200_000, 5_300_000), // a second handoff in the same cell: not charged
            (9_040_000, 9_050_000),
        ];
        let (d, h) = charge(&arr, &moved);
        assert!((d - 0.040).abs() < 1e-9, "{d}");
        assert!((h - (0.020 + 0.0305 + 0.010)).abs() < 1e-9, "{h}");
        // No handoff after an arrival: nothing charged.
        assert_eq!(charge(&arr[2..], &moved[..2]), (0.0, 0.0));
    }

    #[test]
    fn fixed_drops_are_the_fh_to_gw_queue_drops_median() {
        let run = |down: u64, up: u64| {
            let mut l = crate::emu::LinkCounters::default();
            l.down.drop_queue = down;
            l.up.drop_queue = up;
            l.down.drop_loss = 99;
            BTreeMap::from([("wan".to_string(), l), ("cell1".to_string(), l)])
        };
        let runs = [run(134, 5), run(0, 0), run(71, 2)];
        assert_eq!(drops_median(runs.iter()), "71");
        assert_eq!(drops_median(std::iter::empty()), "–");
    }
}
