//! `qgate-lab bench`: the system benchmarks.

use clap::Subcommand;
use qgate::{usage, Failure};

use crate::bench::pipeline::PipelineConfig;
use crate::bench::transport::{self as bench, LoopbackConfig, SimSpeedConfig};

/// Spawn `qgate gateway` as its own process, register `n` idle devices with it, and report its
/// resident memory per device.
fn memory_bench(n: usize) -> Result<(), Failure> {
    use std::io::BufRead;

    let pki =
        qgate_transport::DevPki::load_or_create(&qgate::default_dev_pki_dir()).map_err(usage)?;
    let rt = qgate::runtime();
    let server = rt
        .block_on(async {
            qgate_server::Server::builder()
                .socket(qgate_transport::Socket::bind_udp(
                    "127.0.0.1:0".parse().expect("addr"),
                )?)
                .identity(&pki.server)
                .start()
        })
        .map_err(|e| anyhow::anyhow!("starting the ingest server: {e}"))?;
    let server_addr = server.addr();
    let mut child = std::process::Command::new(super::product_exe()?)
        .args([
            "gateway",
            "--listen",
            "127.0.0.1:0",
            "--server",
            &server_addr.to_string(),
            "--path",
            "127.0.0.2:0",
            "--max-devices",
            &(n + 10).to_string(),
            // Every device comes from 127.0.0.1.
            "--max-sessions-per-address",
            &(n + 10).to_string(),
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| anyhow::anyhow!("starting qgate gateway: {e}"))?;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("piped"))
        .read_line(&mut line)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let port = line
        .split(':')
        .nth(1)
        .and_then(|x| x.split(' ').next())
        .unwrap_or("")
        .to_string();
    let gw: std::net::SocketAddr = format!("127.0.0.1:{port}")
        .parse()
        .map_err(|_| anyhow::anyhow!("gateway did not report its port: {line}"))?;
    std::thread::sleep(std::time::Duration::from_secs(1));
    let before = crate::bench::gateway::rss_bytes(child.id()).unwrap_or(0);
    eprintln!("memory: registering {n} idle devices…");
    let devices = rt.block_on(crate::bench::gateway::idle_devices(gw, &pki.trust(), n));
    std::thread::sleep(std::time::Duration::from_secs(2));
    let after = crate::bench::gateway::rss_bytes(child.id()).unwrap_or(0);
    let _ = child.kill();
    let _ = child.wait();
    drop(devices);
    println!(
        "memory            {} idle registered devices: gateway RSS {:.1} → {:.1} MiB, {:.1} KiB per device",
        n,
        before as f64 / 1048576.0,
        after as f64 / 1048576.0,
        after.saturating_sub(before) as f64 / 1024.0 / n as f64
    );
    Ok(())
}

#[derive(Subcommand, Debug)]
pub enum Bench {
    /// Simulator speed: virtual seconds per wall second for one bulk QUIC flow.
    Sim {
        /// Virtual seconds per repeat.
        #[arg(long, default_value_t = 60.0)]
        seconds: f64,
        /// Link rate in Mbit/s.
        #[arg(long, default_value_t = 10.0)]
        mbps: f64,
        /// Repeats.
        #[arg(long, default_value_t = 5)]
        repeats: usize,
    },
    /// The gateway on loopback UDP: requests/s and added latency against going to the server
    /// directly (alternating), and memory per idle registered device.
    Gateway {
        /// Concurrent devices, each sending one request after another.
        #[arg(long, default_value_t = 100)]
        devices: usize,
        /// Bytes per request.
        #[arg(long, default_value_t = 1024)]
        body: usize,
        /// Seconds per measurement.
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        /// Alternating (gateway, direct) pairs.
        #[arg(long, default_value_t = 3)]
        repeats: usize,
        /// Idle registered devices for the memory measurement (0 skips it).
        #[arg(long, default_value_t = 10_000)]
        memory_devices: usize,
        /// Offered load, requests/s over all devices, of the added-latency measurement below
        /// saturation (0 skips it).
        #[arg(long, default_value_t = 2000.0)]
        paced_rate: f64,
        /// Also measure a second gateway whose backhaul paths' egress is shaped, e.g.
        /// 'rate=1gbit,queue=pid-delay', taking turns with the unshaped one: the cost of shaping
        /// as a ratio of CPU per forwarded request in the same run.
        #[arg(long, value_name = "SPEC")]
        shape: Option<String>,
        /// Also measure the gateway while its admin port is read once a second (metrics over
        /// HTTP and the dashboard's reads): the admin port's cost.
        #[arg(long)]
        scrape: bool,
        /// Also measure a second gateway that sends every record to the server alone, taking
        /// turns with the one that batches (`[gateway] batch_max_record`, decision G23): what batching
        /// saves, in the same run.
        #[arg(long)]
        unbatched: bool,
    },
    /// AMQP broker throughput on loopback, 100-byte messages: 1→1 and 10→10, pre-settled and
    /// unsettled, QUIC and TCP, plus durable (interleaved repeats, one run).
    Amqp {
        /// Messages per run (split over the producers).
        #[arg(long, default_value_t = 200_000)]
        messages: u64,
        /// Repeats of every configuration.
        #[arg(long, default_value_t = 3)]
        repeats: usize,
        /// Also run the TCP cases against an embedded Apache Artemis 2.44 built from this
        /// directory with Maven (tools/artemis in the repository) and report our/Artemis ratios.
        #[arg(long, value_name = "DIR")]
        artemis: Option<std::path::PathBuf>,
    },
    /// The whole pipeline on loopback: devices → gateway → server → our broker (durable) → one
    /// consumer, records/s and device-to-consumer latency, against the same stack with a
    /// count-only server (alternating); checks every answered record arrives exactly once.
    Pipeline {
        /// Devices, each sending one record after another.
        #[arg(long, default_value_t = PipelineConfig::default().devices)]
        devices: usize,
        /// Bytes per record (at least 16).
        #[arg(long, default_value_t = PipelineConfig::default().body)]
        body: usize,
        /// Seconds of sending per measurement.
        #[arg(long, default_value_t = PipelineConfig::default().secs)]
        seconds: f64,
        /// Alternating (queue, count-only) pairs.
        #[arg(long, default_value_t = PipelineConfig::default().repeats)]
        repeats: usize,
        /// Keep the broker's queue in memory instead of its durable store.
        #[arg(long)]
        memory: bool,
        /// How the server and the consumer reach the broker: quic or tcp (plain, loopback).
        #[arg(long, default_value = "quic", value_name = "SCHEME")]
        transport: qgate_amqp::transport::Scheme,
    },
    /// The gateway's spool: records/s it takes (each answered once synced to disk) beside
    /// records/s posted straight to a local ingest server, alternating; and resident memory
    /// with the spool empty, holding --fill-mib, and reopened full.
    Spool {
        /// Concurrent writers.
        #[arg(long, default_value_t = crate::bench::spool::SpoolBenchConfig::default().writers)]
        writers: usize,
        /// Bytes per record.
        #[arg(long, default_value_t = crate::bench::spool::SpoolBenchConfig::default().body)]
        body: usize,
        /// Seconds per measurement.
        #[arg(long, default_value_t = crate::bench::spool::SpoolBenchConfig::default().secs)]
        seconds: f64,
        /// Alternating (spool, direct) pairs.
        #[arg(long, default_value_t = crate::bench::spool::SpoolBenchConfig::default().repeats)]
        repeats: usize,
        /// MiB to spool for the memory measurement (0 skips it).
        #[arg(long, default_value_t = crate::bench::spool::SpoolBenchConfig::default().fill_mib)]
        fill_mib: u64,
    },
    /// QUIC bulk throughput on loopback UDP: qgate-transport against plain quinn, alternating.
    Loopback {
        /// MiB per transfer.
        #[arg(long, default_value_t = 256)]
        mebibytes: u64,
        /// Transfers per side.
        #[arg(long, default_value_t = 5)]
        repeats: usize,
    },
}

pub fn bench(which: Bench) -> Result<(), Failure> {
    match which {
        Bench::Spool {
            writers,
            body,
            seconds,
            repeats,
            fill_mib,
        } => {
            if writers == 0 || repeats == 0 || !(seconds.is_finite() && seconds > 0.0) {
                return Err(usage("--writers, --repeats and --seconds must be positive"));
            }
            eprintln!(
                "bench spool: {writers} writers × {body} B records, {seconds} s per measurement, {repeats} pairs (spool, direct to a local server){}",
                if fill_mib > 0 { format!("; then {fill_mib} MiB spooled for memory") } else { String::new() }
            );
            let cfg = crate::bench::spool::SpoolBenchConfig {
                writers,
                body,
                secs: seconds,
                repeats,
                fill_mib,
            };
            let r = crate::bench::spool::run(cfg, |m| eprintln!("  {m}"));
            println!("spooled           {:.0} records/s", r.spool_rps());
            println!("direct to server  {:.0} records/s", r.direct_rps());
            println!("spooled / direct  {:.2}", r.ratio());
            if let Some((empty, full, reopened)) = r.rss {
                let mib = |b: u64| b as f64 / 1048576.0;
                println!(
                    "memory            RSS {:.1} MiB empty, {:.1} MiB holding {fill_mib} MiB ({:+.1} %), {:.1} MiB reopened full",
                    mib(empty),
                    mib(full),
                    (full as f64 / empty.max(1) as f64 - 1.0) * 100.0,
                    mib(reopened)
                );
            }
        }
        Bench::Pipeline {
            devices,
            body,
            seconds,
            repeats,
            memory,
            transport,
        } => {
            if devices == 0
                || repeats == 0
                || !(seconds.is_finite() && seconds > 0.0)
                || !(16..=1 << 20).contains(&body)
            {
                return Err(usage(
                    "--devices, --repeats and --seconds must be positive, --body 16 B to 1 MiB",
                ));
            }
            let durable = !memory;
            eprintln!(
                "bench pipeline: {devices} devices × {body} B records → gateway (2 paths) → server → broker ({}, over {transport}) → 1 consumer, {seconds} s per measurement, {repeats} pairs",
                if durable { "durable" } else { "in memory" }
            );
            let cfg = PipelineConfig {
                devices,
                body,
                secs: seconds,
                repeats,
                durable,
                scheme: transport,
            };
            let r = crate::bench::pipeline::run(cfg, |i| eprintln!("  pair {i}/{repeats} done"));
            println!("into the broker   {:.0} records/s", r.queue_rps());
            println!("count-only server {:.0} records/s", r.count_rps());
            println!("ratio             {:.3} (per pair)", r.ratio());
            for (q, c) in r.queue.iter().zip(&r.count_only) {
                println!(
                    "  pair: broker {:.0}/s, answer p50 {:.2} / p99 {:.2} ms, device→consumer p50 {:.2} / p99 {:.2} ms, {} answered, {} received ({} distinct ids, {} missing); count-only {:.0}/s, p50 {:.2} / p99 {:.2} ms",
                    q.rps, q.answer_p50_ms, q.answer_p99_ms, q.consumer_p50_ms, q.consumer_p99_ms,
                    q.answered, q.consumed, q.distinct, q.missing, c.rps, c.answer_p50_ms, c.answer_p99_ms
                );
            }
            println!(
                "exactly once      {}",
                if r.exactly_once() {
                    "yes: every answered record received, each request id once"
                } else {
                    "NO"
                }
            );
            if !r.exactly_once() {
                return Err(anyhow::anyhow!("records were lost or duplicated").into());
            }
        }
        Bench::Sim {
            seconds,
            mbps,
            repeats,
        } => {
            if !(seconds > 0.0 && mbps > 0.0 && repeats > 0) {
                return Err(usage("--seconds, --mbps and --repeats must be positive"));
            }
            let cfg = SimSpeedConfig {
                virtual_secs: seconds,
                rate_bps: (mbps * 1e6) as u64,
                repeats,
                ..Default::default()
            };
            eprintln!(
                "bench sim: one bulk QUIC flow, {mbps} Mbit/s / {:?} one-way, {seconds} virtual s × {repeats}",
                cfg.delay
            );
            let r = bench::sim_speed(cfg, |i| eprintln!("  repeat {i}/{repeats} done"));
            println!("simulator speed   {:.1} virtual s per wall s", r.speedup);
            println!("wall time         {:.2} s per repeat", r.wall_secs);
            println!("flow goodput      {:.2} Mbit/s", r.goodput_mbps);
        }
        Bench::Gateway {
            devices,
            body,
            seconds,
            repeats,
            memory_devices,
            paced_rate,
            shape,
            scrape,
            unbatched,
        } => {
            let shape = shape
                .map(|spec| {
                    qgate_link::ChangeSpec::Text(spec.clone())
                        .params()
                        .and_then(|p| qgate_transport::shaped::validate_shape(&p).map(|()| p))
                        .map_err(|e| usage(format!("--shape '{spec}': {e}")))
                })
                .transpose()?;
            if devices == 0
                || repeats == 0
                || !seconds.is_finite()
                || seconds <= 0.0
                || body > 1 << 20
                || !(paced_rate.is_finite() && paced_rate >= 0.0)
            {
                return Err(usage(
                    "--devices, --repeats and --seconds must be positive, --body at most 1 MiB, \
                     --paced-rate a number ≥ 0",
                ));
            }
            eprintln!("bench gateway: {devices} devices × {body} B requests, {seconds} s per measurement, {repeats} pairs");
            let cfg = crate::bench::gateway::BenchConfig {
                devices,
                body,
                secs: seconds,
                repeats,
                paced_rps: paced_rate,
                shape,
                scrape,
                unbatched,
            };
            let r = crate::bench::gateway::run(cfg, |i| eprintln!("  pair {i}/{repeats} done"));
            println!("closed loop (each device sends when its last request is answered):");
            println!("via gateway       {:.0} requests/s", r.gateway_rps());
            println!("direct            {:.0} requests/s", r.direct_rps());
            println!(
                "added p50         {:.3} ms (queueing at saturation)",
                r.added_p50_ms()
            );
            let pairs = |via: &[crate::bench::gateway::Load],
                         direct: &[crate::bench::gateway::Load]| {
                for (g, d) in via.iter().zip(direct) {
                    println!(
                        "  pair: gateway p50 {:.3} / p99 {:.3} ms; direct p50 {:.3} / p99 {:.3} ms",
                        g.p50_ms, g.p99_ms, d.p50_ms, d.p99_ms
                    );
                }
            };
            pairs(&r.via_gateway, &r.direct);
            if scrape {
                println!(
                    "scraped each 1 s  {:.0} requests/s; ratio to unscraped {:.3} (per repeat; goal ≥ 0.98)",
                    crate::bench::gateway::rps(&r.via_gateway_scraped),
                    r.scraped_ratio()
                );
            }
            let cpu = r.gateway_cpu_us_per_req();
            println!(
                "gateway CPU       {cpu:.1} µs per forwarded request (process CPU per request via \
                 gateway minus direct): {:.0} requests/s per core of CPU",
                1e6 / cpu.mean
            );
            let (batches, batched) = r.batches;
            println!(
                "backhaul batches  {batches} carrying {batched} records ({:.1} a batch)",
                batched as f64 / batches.max(1) as f64
            );
            if !r.via_gateway_unbatched.is_empty() {
                println!(
                    "unbatched gateway {:.0} requests/s, {:.1} µs CPU per forwarded request; \
                     batching ÷ not {:.3} requests/s (per pair)",
                    crate::bench::gateway::rps(&r.via_gateway_unbatched),
                    r.unbatched_cpu_us_per_req(),
                    r.batched_rps_ratio()
                );
            }
            if !r.via_gateway_shaped.is_empty() {
                println!(
                    "shaped gateway    {:.0} requests/s, {:.1} µs CPU per forwarded request; \
                     ratio to unshaped {:.3} (per pair; goal ≤ 1.05)",
                    crate::bench::gateway::rps(&r.via_gateway_shaped),
                    r.shaped_cpu_us_per_req(),
                    r.shaped_cpu_ratio()
                );
            }
            if paced_rate > 0.0 {
                println!("offered load {paced_rate} requests/s over {devices} devices:");
                println!("added p50         {:.3} ms", r.added_p50_paced_ms());
                pairs(&r.via_gateway_paced, &r.direct_paced);
            }
            if memory_devices > 0 {
                memory_bench(memory_devices)?;
            }
        }
        Bench::Amqp {
            messages,
            repeats,
            artemis,
        } => {
            if messages < 10 || repeats == 0 {
                return Err(usage(
                    "--messages must be at least 10 and --repeats positive",
                ));
            }
            let mut cases = crate::bench::amqp::default_cases();
            let artemis = match artemis {
                Some(dir) => {
                    cases.extend(crate::bench::amqp::artemis_cases());
                    {
                        eprintln!(
                            "bench amqp: building and starting Artemis from {}",
                            dir.display()
                        );
                        Some(qgate_amqp::artemis::start(&dir).map_err(anyhow::Error::msg)?)
                    }
                }
                None => None,
            };
            eprintln!(
                "bench amqp: {} configurations × {repeats}, {messages} messages of 100 B per run",
                cases.len()
            );
            let addr = artemis.as_ref().map(|a| a.addr);
            let r = crate::bench::amqp::run(&cases, messages, repeats, addr, |i, n| {
                eprintln!("  run {i}/{n} done")
            });
            for c in &r {
                let twin = crate::bench::amqp::Case {
                    artemis: true,
                    ..c.case
                };
                let ratio = r
                    .iter()
                    .find(|o| !c.case.artemis && o.case == twin)
                    .map(|o| {
                        format!(
                            "  (qgate/Artemis {:.2})",
                            c.summary().mean / o.summary().mean
                        )
                    })
                    .unwrap_or_default();
                println!("{:<40} {:.0} msg/s{ratio}", c.case.to_string(), c.summary());
            }
            drop(artemis);
        }
        Bench::Loopback { mebibytes, repeats } => {
            if mebibytes == 0 || repeats == 0 {
                return Err(usage("--mebibytes and --repeats must be positive"));
            }
            eprintln!("bench loopback: {mebibytes} MiB per transfer, {repeats} transfers per side, alternating");
            let r = bench::loopback(
                LoopbackConfig {
                    bytes: mebibytes * 1024 * 1024,
                    repeats,
                },
                |i| eprintln!("  pair {i}/{repeats} done"),
            );
            println!("qgate-transport   {:.3} Gbit/s", r.qgate_gbps);
            println!("plain quinn       {:.3} Gbit/s", r.quinn_gbps);
            println!("ratio             {:.3}", r.ratio());
        }
    }
    Ok(())
}
