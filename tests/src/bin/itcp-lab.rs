//! `itcp-lab`: the testbed's command line.
//!
//! ```text
//! itcp-lab demo [--seed S]                  the README's main job
//! itcp-lab bench baseline [options]         the paper's regular-TCP columns, as a table
//! itcp-lab up [--msrs N]                    build a lab and keep it until Ctrl-C
//! itcp-lab ctl --control SOCKET JSON        one request to a running airlink
//! itcp-lab cleanup [--all]                  remove labs left by killed runs
//! ```

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::process::ExitCode;
use std::time::Duration;

use itcp_testbed::baseline::MobileIpOpts;
use itcp_testbed::lab::{self, Host, Lab, LabConfig};
use itcp_testbed::report::{self, Table};
use itcp_testbed::scenario::{self, Cells, Mode, Net, Run, Traffic};

const USAGE: &str = "\
usage:
  itcp-lab demo [--seed S]
      Builds the emulated network (FH, GW, 2 MSRs, MH), sends a stream from the FH
      to the MH while it moves between the cells, and prints what happened.
  itcp-lab bench baseline [--seeds N] [--nets lan,wan] [--scale F] [--buf BYTES|auto]
                          [--cc NAME|default] [--json FILE]
      Regular TCP (plain routers + Mobile-IP-like rerouting) in the paper's four
      cell configurations. Defaults: 1 seed, both nets, 4 MB (LAN) / 2 MB (WAN)
      scaled by F=1, 16 KiB buffers, reno.
  itcp-lab bench nomoves [--seeds N] [--nets lan,wan] [--scale F] [--wireless 'TOML']
      The paper's no-moves column: regular TCP vs I-TCP (msrd on the MSRs) with the
      paper's parameters. --wireless is appended to msrd's config, e.g.
      '[wireless]\ncongestion_control = \"cubic\"'.
  itcp-lab bench relay [--seconds S] [--rounds N] [--json FILE]
      Relay engine on an un-emulated veth path FH → MSR → MH: msrd vs HAProxy with
      splice vs socat vs direct kernel forwarding (iperf3 bulk, ttcp rr latency).
  itcp-lab bench paper [--seeds 5] [--scale 1] [--parallel 2] [--variants era,modern]
                       [--nets lan,wan] [--others yes|no] [--sweep yes|no] [--msrd 'TOML']
                       [--out docs]
      the paper's Tables 1-2 (regular TCP vs I-TCP with handoffs), seeds 000/003
      scenarios, optional sweep; writes docs/results.md and docs/results/*.svg
  itcp-lab bench handoff [--conns 1,100,1000] [--moves N] [--gap yes|no]
      handoff latency (greeting → resumed) with empty and full queues, and the gap
      in bytes at the MH around one overlapped handoff
  itcp-lab bench conns [--count N] [--bytes B]
      N concurrent I-TCP connections (default 10000) through msrd, all held open,
      then B bytes (default 16384) echoed and verified on each; msrd's RSS and
      connection setup rate.
  itcp-lab bench churn [--total N] [--concurrency C]
      N short I-TCP connections (default 100000), C at a time (default 500); msrd
      must end with the fds and sessions it started with (no leaks).
  itcp-lab up [--msrs N] [--seed S]
      Builds a lab (no emulated impairments) and keeps it until Ctrl-C.
  itcp-lab echo --listen ADDR:PORT
      A tokio echo server for load benchmarks (used by bench conns).
  itcp-lab ctl --control SOCKET 'JSON'
      Sends one request to a running airlink and prints the reply.
  itcp-lab cleanup [--all]
      Removes namespaces of labs whose process is gone (--all: of every lab).";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args.first().map(String::as_str) {
        Some("demo") => demo(&args[1..]),
        Some("bench") if args.get(1).map(String::as_str) == Some("baseline") => {
            bench_baseline(&args[2..])
        }
        Some("bench") if args.get(1).map(String::as_str) == Some("relay") => {
            bench_relay(&args[2..])
        }
        Some("bench") if args.get(1).map(String::as_str) == Some("conns") => {
            bench_conns(&args[2..])
        }
        Some("bench") if args.get(1).map(String::as_str) == Some("churn") => {
            bench_churn(&args[2..])
        }
        Some("bench") if args.get(1).map(String::as_str) == Some("paper") => {
            bench_paper(&args[2..])
        }
        Some("bench") if args.get(1).map(String::as_str) == Some("handoff") => {
            bench_handoff(&args[2..])
        }
        Some("bench") if args.get(1).map(String::as_str) == Some("nomoves") => {
            bench_nomoves(&args[2..])
        }
        Some("up") => up(&args[1..]),
        Some("echo") => match args.get(1..3) {
            Some([f, a]) if f == "--listen" => a
                .parse()
                .map_err(|_| format!("--listen: {a:?} is not ADDR:PORT"))
                .and_then(|a| itcp_testbed::bench::echo_server(a).map_err(|e| e.to_string())),
            _ => Err(format!("echo needs --listen ADDR:PORT\n{USAGE}")),
        },
        Some("ctl") => ctl(&args[1..]),
        Some("cleanup") => {
            let all = args.iter().any(|a| a == "--all");
            let removed = lab::sweep(all);
            println!("removed {} lab(s) {}", removed.len(), removed.join(" "));
            Ok(())
        }
        Some("-h" | "--help") => {
            println!("{USAGE}");
            Ok(())
        }
        _ => Err(format!("expected a command\n{USAGE}")),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("itcp-lab: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `--flag value` pairs; unknown flags are errors.
fn flags(args: &[String], known: &[&str]) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if !known.contains(&a.as_str()) {
            return Err(format!("unknown option {a:?}\n{USAGE}"));
        }
        let v = it.next().ok_or_else(|| format!("{a} needs a value"))?;
        out.push((a.clone(), v.clone()));
    }
    Ok(out)
}

fn num<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
    v.parse()
        .map_err(|_| format!("{flag}: {v:?} is not a valid number"))
}

fn demo(args: &[String]) -> Result<(), String> {
    let mut seed = 1;
    for (f, v) in flags(args, &["--seed"])? {
        if f == "--seed" {
            seed = num(&f, &v)?;
        }
    }
    println!("I-TCP testbed demo: FH ── 10 Mbit/s, 1 ms ── GW ── LAN ── MSR1/MSR2 ~~ 2 Mbit/s cells, 2 ms, 1 % loss ~~ MH");
    println!("The FH sends 3 MiB to the MH (16 KiB buffers, reno) while the MH moves between");
    println!("the cells every 4 s with a 1 s blackout between them; MSRs beacon every 1 s.\n");
    let run = |mode: Mode| Run {
        net: Net::lan(),
        cells: Cells::NonOverlapped {
            period_s: 4.0,
            gap_s: 1.0,
        },
        mode,
        traffic: Traffic {
            bytes: 3 << 20,
            buf: Some(16 * 1024),
            cc: Some("reno".into()),
        },
        seed,
        msrs: 2,
        timeout: Duration::from_secs(300),
    };
    println!("== I-TCP: msrd on both MSRs splits the connection; the MH's agent greets the new");
    println!("   MSR, which fetches the connection (TCP_REPAIR) from the old one.");
    let itcp = scenario::run(&run(Mode::Itcp {
        msrd_extra: String::new(),
        agent: vec![],
    }))
    .map_err(|e| e.to_string())?;
    print!("{}", report::describe(&itcp));
    println!("\n== Regular TCP, same network and moves: plain routers, Mobile-IP-like rerouting.");
    let regular = scenario::run(&run(Mode::RegularTcp(MobileIpOpts::default())))
        .map_err(|e| e.to_string())?;
    print!("{}", report::describe(&regular));
    println!(
        "\nI-TCP {:.1} KB/s vs regular TCP {:.1} KB/s: ratio {:.2}",
        itcp.kbytes_per_s(),
        regular.kbytes_per_s(),
        itcp.kbytes_per_s() / regular.kbytes_per_s()
    );
    if !itcp.recv.ok || !regular.recv.ok {
        return Err("a transfer failed verification".into());
    }
    if itcp.rsts.is_some_and(|(a, b, c, d)| a + b + c + d > 0) {
        return Err("RSTs were seen during the I-TCP transfer".into());
    }
    Ok(())
}

fn bench_baseline(args: &[String]) -> Result<(), String> {
    let mut seeds = 1u64;
    let mut nets = vec![Net::lan(), Net::wan()];
    let mut scale = 1.0f64;
    let mut buf = Some(16 * 1024);
    let mut cc = Some("reno".to_string());
    let mut json_out = None;
    for (f, v) in flags(
        args,
        &["--seeds", "--nets", "--scale", "--buf", "--cc", "--json"],
    )? {
        match f.as_str() {
            "--seeds" => seeds = num(&f, &v)?,
            "--scale" => scale = num(&f, &v)?,
            "--buf" => {
                buf = if v == "auto" {
                    None
                } else {
                    Some(num(&f, &v)?)
                }
            }
            "--cc" => cc = if v == "default" { None } else { Some(v) },
            "--json" => json_out = Some(v),
            "--nets" => {
                nets = v
                    .split(',')
                    .map(|n| match n {
                        "lan" => Ok(Net::lan()),
                        "wan" => Ok(Net::wan()),
                        _ => Err(format!("--nets: unknown network {n:?} (lan, wan)")),
                    })
                    .collect::<Result<_, _>>()?
            }
            _ => unreachable!(),
        }
    }
    if seeds == 0 || scale.is_nan() || scale <= 0.0 {
        return Err("--seeds and --scale must be positive".into());
    }
    let mut table = Table::default();
    let mut all = Vec::new();
    for net in &nets {
        let mb = if net.name == "LAN" { 4.0 } else { 2.0 };
        let bytes = (mb * 1_048_576.0 * scale) as u64;
        for cells in Cells::paper_columns() {
            for seed in 1..=seeds {
                let run = Run {
                    net: net.clone(),
                    cells: cells.clone(),
                    mode: Mode::RegularTcp(MobileIpOpts::default()),
                    traffic: Traffic {
                        bytes,
                        buf,
                        cc: cc.clone(),
                    },
                    seed,
                    msrs: 2,
                    timeout: Duration::from_secs(1800),
                };
                let o = scenario::run(&run).map_err(|e| e.to_string())?;
                eprintln!(
                    "{} {:<18} seed {seed}: {:7.2} KB/s  longest stall {:5.2} s  {}",
                    net.name,
                    cells.label(),
                    o.kbytes_per_s(),
                    o.recv.longest_stall_s,
                    if o.recv.ok { "intact" } else { "FAILED" }
                );
                if !o.recv.ok {
                    return Err(format!(
                        "{} {} seed {seed}: {}",
                        net.name,
                        cells.label(),
                        o.recv.error.clone().unwrap_or_default()
                    ));
                }
                table.add(&net.name, &cells.label(), o.kbytes_per_s());
                all.push(o);
            }
        }
    }
    println!(
        "\nRegular TCP (baseline), goodput at the MH in KB/s, median [min–max] of {seeds} seed(s);"
    );
    println!(
        "buffers {}, FH congestion control {}, transfer {:.2} MB (LAN) / {:.2} MB (WAN)\n",
        buf.map_or("autotuned".into(), |b| format!("{b} B")),
        cc.as_deref().unwrap_or("kernel default"),
        4.0 * scale,
        2.0 * scale
    );
    print!("{}", table.render(&report::PAPER_REGULAR));
    if let Some(path) = json_out {
        std::fs::write(&path, serde_json::to_vec_pretty(&all).unwrap())
            .map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(())
}

fn bench_relay(args: &[String]) -> Result<(), String> {
    let (mut seconds, mut rounds, mut json_out) = (5u64, 3usize, None);
    for (f, v) in flags(args, &["--seconds", "--rounds", "--json"])? {
        match f.as_str() {
            "--seconds" => seconds = num(&f, &v)?,
            "--rounds" => rounds = num(&f, &v)?,
            _ => json_out = Some(v),
        }
    }
    if seconds == 0 || rounds == 0 {
        return Err("--seconds and --rounds must be positive".into());
    }
    let b = itcp_testbed::bench::relay(seconds, rounds, |l| eprintln!("{l}"))
        .map_err(|e| e.to_string())?;
    println!("{}", b.render());
    if let Some(path) = json_out {
        std::fs::write(&path, serde_json::to_vec_pretty(&b).unwrap())
            .map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(())
}

fn bench_conns(args: &[String]) -> Result<(), String> {
    let (mut count, mut bytes) = (10_000usize, 16_384usize);
    for (f, v) in flags(args, &["--count", "--bytes"])? {
        match f.as_str() {
            "--count" => count = num(&f, &v)?,
            _ => bytes = num(&f, &v)?,
        }
    }
    let b = itcp_testbed::bench::conns(count, bytes, |l| eprintln!("{l}"))
        .map_err(|e| e.to_string())?;
    println!("{}", serde_json::to_string_pretty(&b).unwrap());
    println!(
        "{}/{} connections established, {} intact; setup {:.0} conn/s; msrd RSS {} KiB idle, {} KiB with {} open ({:.1} MiB)",
        b.established,
        b.count,
        b.intact,
        b.setup_per_s,
        b.msrd_rss_kib_idle,
        b.msrd_rss_kib_peak,
        b.sessions_at_peak,
        b.msrd_rss_kib_peak as f64 / 1024.0
    );
    if b.intact != b.count {
        return Err(format!(
            "{} of {} connections did not complete intact",
            b.count - b.intact,
            b.count
        ));
    }
    Ok(())
}

fn bench_churn(args: &[String]) -> Result<(), String> {
    let (mut total, mut conc) = (100_000usize, 500usize);
    for (f, v) in flags(args, &["--total", "--concurrency"])? {
        match f.as_str() {
            "--total" => total = num(&f, &v)?,
            _ => conc = num(&f, &v)?,
        }
    }
    let b = itcp_testbed::bench::churn(total, conc.max(1), |l| eprintln!("{l}"))
        .map_err(|e| e.to_string())?;
    println!("{}", serde_json::to_string_pretty(&b).unwrap());
    println!(
        "{}/{} intact, {:.0} conn/s; msrd fds {} before, {} after; RSS {} KiB before, {} KiB after; {} sessions left",
        b.intact, b.total, b.per_s, b.msrd_fds_before, b.msrd_fds_after, b.msrd_rss_kib_before, b.msrd_rss_kib_after, b.sessions_after
    );
    // msrd keeps up to 256 empty pipes pooled for reuse (512 fds); more would be a leak.
    if b.intact != b.total || b.msrd_fds_after > b.msrd_fds_before + 512 || b.sessions_after != 0 {
        return Err("connections failed or msrd leaked fds/sessions".into());
    }
    Ok(())
}

fn bench_paper(args: &[String]) -> Result<(), String> {
    use itcp_testbed::paper::{self, PaperOpts, Variant};
    let mut o = PaperOpts {
        seeds: 5,
        scale: 1.0,
        parallel: 2,
        variants: vec![Variant::Era, Variant::Modern],
        nets: vec![Net::lan(), Net::wan()],
        other_seeds: true,
        sweep: false,
        msrd_extra: String::new(),
        out: "docs".into(),
    };
    for (f, v) in flags(
        args,
        &[
            "--seeds",
            "--scale",
            "--parallel",
            "--variants",
            "--nets",
            "--others",
            "--sweep",
            "--msrd",
            "--out",
        ],
    )? {
        match f.as_str() {
            "--seeds" => o.seeds = num(&f, &v)?,
            "--scale" => o.scale = num(&f, &v)?,
            "--parallel" => o.parallel = num(&f, &v)?,
            "--nets" => o.nets = parse_nets(&v)?,
            "--variants" => {
                o.variants = v
                    .split(',')
                    .map(|x| match x {
                        "era" => Ok(Variant::Era),
                        "modern" => Ok(Variant::Modern),
                        _ => Err(format!("--variants: {x:?} (era, modern)")),
                    })
                    .collect::<Result<_, _>>()?
            }
            "--others" => o.other_seeds = v != "no",
            "--sweep" => o.sweep = v != "no",
            "--msrd" => o.msrd_extra = v.replace("\\n", "\n"),
            _ => o.out = v.into(),
        }
    }
    if o.seeds == 0 || o.scale.is_nan() || o.scale <= 0.0 || o.variants.is_empty() {
        return Err("--seeds, --scale and --variants must be non-empty/positive".into());
    }
    let summary = paper::run(&o, &|l| eprintln!("{l}")).map_err(|e| e.to_string())?;
    print!("{summary}");
    println!("report written to {}", o.out.join("results.md").display());
    Ok(())
}

fn bench_handoff(args: &[String]) -> Result<(), String> {
    let mut conns = vec![1usize, 100, 1000];
    let mut moves = 6usize;
    let mut gap = true;
    for (f, v) in flags(args, &["--conns", "--moves", "--gap"])? {
        match f.as_str() {
            "--conns" => {
                conns = v
                    .split(',')
                    .map(|n| num::<usize>("--conns", n.trim()))
                    .collect::<Result<_, _>>()?
            }
            "--moves" => moves = num(&f, &v)?,
            _ => gap = v != "no",
        }
    }
    use itcp_testbed::handoff_bench;
    let mut rows = Vec::new();
    for &n in &conns {
        for full in [false, true] {
            eprintln!(
                "handoff latency: {n} connection(s), {} queues",
                if full { "full" } else { "empty" }
            );
            let r =
                handoff_bench::latency(n, full, moves, |l| eprintln!("  {l}")).map_err(|e| {
                    format!(
                        "{n} connections ({}): {e}",
                        if full { "full" } else { "empty" }
                    )
                })?;
            println!("{}", serde_json::to_string(&r).unwrap());
            rows.push(r);
        }
    }
    println!(
        "\nHandoff latency, greeting → resumed at the new MSR (median of the moves; min–max):"
    );
    println!(
        "{:>6}  {:<6}  {:>5}  {:>22}  {:>10}  {:>9}  {:>12}",
        "conns", "queues", "moves", "new MSR ms", "capture ms", "MH ms", "queued bytes"
    );
    for r in &rows {
        println!(
            "{:>6}  {:<6}  {:>5}  {:>8.2} ({:.2}–{:.2})  {:>10.2}  {:>9.2}  {:>12}",
            r.conns,
            if r.full { "full" } else { "empty" },
            r.moves,
            r.new_msr_ms.0,
            r.new_msr_ms.1,
            r.new_msr_ms.2,
            r.capture_ms,
            r.mh_ms,
            r.queued_bytes
        );
    }
    if gap {
        eprintln!("gap at the MH around one overlapped handoff (LAN profile, 2 MiB download)");
        let g = handoff_bench::gap(1).map_err(|e| e.to_string())?;
        println!("{}", serde_json::to_string(&g).unwrap());
        println!(
            "gap: longest stall {:.0} ms with a handoff vs {:.0} ms without; {} bytes in the second around the handoff vs {} in the median second; goodput {:.1} vs {:.1} KB/s",
            g.stall_with_move_ms,
            g.stall_without_move_ms,
            g.bytes_handoff_second,
            g.bytes_median_second,
            g.goodput_with_move_kbps,
            g.goodput_without_move_kbps
        );
    }
    Ok(())
}

fn parse_nets(v: &str) -> Result<Vec<Net>, String> {
    v.split(',')
        .map(|n| match n {
            "lan" => Ok(Net::lan()),
            "wan" => Ok(Net::wan()),
            _ => Err(format!("--nets: unknown network {n:?} (lan, wan)")),
        })
        .collect()
}

fn bench_nomoves(args: &[String]) -> Result<(), String> {
    let mut seeds = 1u64;
    let mut nets = vec![Net::lan(), Net::wan()];
    let mut scale = 1.0f64;
    let mut wireless = String::new();
    for (f, v) in flags(args, &["--seeds", "--nets", "--scale", "--wireless"])? {
        match f.as_str() {
            "--seeds" => seeds = num(&f, &v)?,
            "--scale" => scale = num(&f, &v)?,
            "--nets" => nets = parse_nets(&v)?,
            _ => wireless = v,
        }
    }
    if seeds == 0 || scale.is_nan() || scale <= 0.0 {
        return Err("--seeds and --scale must be positive".into());
    }
    let modes = [
        Mode::RegularTcp(MobileIpOpts::default()),
        Mode::Itcp {
            msrd_extra: wireless.clone(),
            agent: vec![],
        },
    ];
    println!("No moves, goodput at the MH in KB/s: median [min–max] of {seeds} seed(s); 16 KiB buffers, reno at the FH");
    if !wireless.is_empty() {
        println!("msrd extra config: {}", wireless.replace('\n', "; "));
    }
    println!("\n| network | regular TCP | I-TCP | I-TCP / regular | paper regular | paper I-TCP | paper ratio |");
    println!("|---|---|---|---|---|---|---|");
    for net in &nets {
        let mb = if net.name == "LAN" { 4.0 } else { 2.0 };
        let bytes = (mb * 1_048_576.0 * scale) as u64;
        let mut res: Vec<Vec<f64>> = vec![Vec::new(), Vec::new()];
        for seed in 1..=seeds {
            for (i, mode) in modes.iter().enumerate() {
                let o = scenario::run(&Run {
                    net: net.clone(),
                    cells: Cells::NoMoves,
                    mode: mode.clone(),
                    traffic: Traffic {
                        bytes,
                        buf: Some(16 * 1024),
                        cc: Some("reno".into()),
                    },
                    seed,
                    msrs: 2,
                    timeout: Duration::from_secs(1800),
                })
                .map_err(|e| e.to_string())?;
                eprintln!(
                    "{} {:<12} seed {seed}: {:7.2} KB/s  {}",
                    net.name,
                    mode.label(),
                    o.kbytes_per_s(),
                    if o.recv.ok { "intact" } else { "FAILED" }
                );
                if !o.recv.ok {
                    return Err(format!(
                        "{} {} seed {seed}: {}",
                        net.name,
                        mode.label(),
                        o.recv.error.unwrap_or_default()
                    ));
                }
                res[i].push(o.kbytes_per_s());
            }
        }
        let cell = |v: &[f64]| {
            let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
            let hi = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            format!("{:.2} [{lo:.2}–{hi:.2}]", report::median(v))
        };
        let (pr, pi) = if net.name == "LAN" {
            (report::PAPER_REGULAR.lan[0], report::PAPER_ITCP.lan[0])
        } else {
            (report::PAPER_REGULAR.wan[0], report::PAPER_ITCP.wan[0])
        };
        println!(
            "| {} | {} | {} | {:.2} | {pr:.2} | {pi:.2} | {:.2} |",
            net.name,
            cell(&res[0]),
            cell(&res[1]),
            report::median(&res[1]) / report::median(&res[0]),
            pi / pr
        );
    }
    Ok(())
}

fn up(args: &[String]) -> Result<(), String> {
    let mut cfg = LabConfig::default();
    for (f, v) in flags(args, &["--msrs", "--seed"])? {
        match f.as_str() {
            "--msrs" => cfg.msrs = num(&f, &v)?,
            _ => cfg.seed = num(&f, &v)?,
        }
    }
    let lab = Lab::new(cfg).map_err(|e| e.to_string())?;
    println!("lab {} is up; namespaces:", lab.id);
    for h in [Host::Fh, Host::Gw]
        .into_iter()
        .chain((1..=lab.msrs()).map(Host::Msr))
        .chain([Host::Mh])
    {
        println!("  {:?}\t{}", h, lab.ns(h));
    }
    println!("emulator control: {}", lab.control_path().display());
    println!("e.g.  ip netns exec {} bash", lab.ns(Host::Mh));
    println!(
        "      itcp-lab ctl --control {} '{{\"op\":\"status\"}}'",
        lab.control_path().display()
    );
    println!("Ctrl-C tears it down.");
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

fn ctl(args: &[String]) -> Result<(), String> {
    let (Some(flag), Some(path), Some(req)) = (args.first(), args.get(1), args.get(2)) else {
        return Err(format!("ctl needs --control SOCKET 'JSON'\n{USAGE}"));
    };
    if flag != "--control" {
        return Err(format!("ctl needs --control SOCKET 'JSON'\n{USAGE}"));
    }
    let mut s = UnixStream::connect(path).map_err(|e| format!("{path}: {e}"))?;
    s.write_all(format!("{}\n", req.trim()).as_bytes())
        .map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(&s)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    print!("{line}");
    Ok(())
}
