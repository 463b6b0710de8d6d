//! `qgate-lab demo`: the pipeline, or clients straight to a server, on a simulated network.

use std::time::Duration;

use crate::demo::transport as demo;
use clap::Args;
use qgate_netsim::LossModel;

use qgate::{dflt, usage, Failure};

use super::config::LabConfig;

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// The earlier demo instead: HTTP/3 clients straight to a server through a router (the
    /// [demo] table and the flags below marked "direct" apply to it).
    #[arg(long)]
    direct: bool,
    /// Gateway demo: devices [default: 10].
    #[arg(long)]
    devices: Option<usize>,
    /// Gateway demo: seconds of traffic [default: 10].
    #[arg(long)]
    duration: Option<u64>,
    #[arg(long, help = dflt(
        "Gateway demo: completion, adaptive, adaptive-packets, round-robin or single",
        qgate_forward::scheduler::DEFAULT_SCHEDULER))]
    scheduler: Option<String>,
    /// Gateway demo: run in virtual time (no live view; finishes at once).
    #[arg(long = "virtual")]
    virtual_time: bool,
    /// Direct: number of HTTP/3 clients [default: 8].
    #[arg(long)]
    clients: Option<usize>,
    /// Direct: requests per client [default: 50].
    #[arg(long)]
    requests: Option<usize>,
    /// Body bytes per request [default: 1024].
    #[arg(long)]
    body_bytes: Option<usize>,
    /// Milliseconds between a client's requests [default: 20].
    #[arg(long)]
    interval_ms: Option<u64>,
    /// Backbone (router → server) rate in Mbit/s [default: 50].
    #[arg(long)]
    backbone_mbps: Option<f64>,
    /// Backbone one-way delay in ms [default: 20].
    #[arg(long)]
    backbone_delay_ms: Option<f64>,
    /// Random loss on the backbone, both ways, as a fraction (0.01 = 1 %) [default: 0].
    #[arg(long)]
    loss: Option<f64>,
    /// Queue discipline on the backbone, both ways, e.g. `pie`, `codel:target_ms=3`,
    /// `fq-codel:quantum=300`, `pid-delay:target_ms=10` [default: droptail:packets=1000].
    #[arg(long, value_name = "SPEC")]
    backbone_queue: Option<qgate_aqm::DisciplineSpec>,
    /// Seed for every random choice [default: 1].
    #[arg(long)]
    seed: Option<u64>,
    /// Direct: run in real time instead of virtual time.
    #[arg(long)]
    real_time: bool,
}

pub fn demo(a: DemoArgs, cfg: &LabConfig) -> Result<(), Failure> {
    cfg.demo.validate().map_err(usage)?;
    if !a.direct {
        return gateway_demo(a);
    }
    let mut c = cfg.demo.clone();
    c.transport = cfg.transport.clone();
    if let Some(v) = a.clients {
        c.clients = v;
    }
    if let Some(v) = a.requests {
        c.requests = v;
    }
    if let Some(v) = a.body_bytes {
        c.body_bytes = v;
    }
    if let Some(v) = a.interval_ms {
        c.interval_ms = v;
    }
    if let Some(v) = a.seed {
        c.seed = v;
    }
    if let Some(mbps) = a.backbone_mbps {
        if !(mbps.is_finite() && mbps > 0.0) {
            return Err(usage("--backbone-mbps must be a positive number"));
        }
        c.backbone.rate_bps = Some((mbps * 1e6) as u64);
    }
    if let Some(ms) = a.backbone_delay_ms {
        c.backbone.delay = qgate_netsim::delay_from_ms(ms)
            .map_err(|e| usage(format!("--backbone-delay-ms: {e}")))?;
    }
    if let Some(q) = a.backbone_queue {
        c.backbone.queue = q;
    }
    if let Some(p) = a.loss {
        c.backbone.loss = LossModel::Bernoulli { p };
    }
    c.validate().map_err(usage)?;
    let wall = std::time::Instant::now();
    let report = if a.real_time {
        qgate::runtime().block_on(demo::run(c))
    } else {
        crate::virtual_time(demo::run(c))
    }
    .map_err(|e| anyhow::anyhow!("demo failed: {e}"))?;
    println!("{report}");
    let wall = wall.elapsed().as_secs_f64();
    println!(
        "  ran in                {:.2} s wall clock ({})",
        wall,
        if a.real_time {
            "real time".to_string()
        } else {
            format!(
                "virtual time, {:.0}× faster than real",
                report.virtual_secs / wall
            )
        }
    );
    if report.failed > 0 {
        return Err(anyhow::anyhow!("{} requests failed", report.failed).into());
    }
    Ok(())
}

fn gateway_demo(a: DemoArgs) -> Result<(), Failure> {
    use crate::demo::gateway::{self as gwdemo, GatewayDemo};
    let mut c = GatewayDemo::default();
    if let Some(n) = a.devices {
        if !(1..=500).contains(&n) {
            return Err(usage("--devices must be 1..=500"));
        }
        c.devices = n;
    }
    if let Some(d) = a.duration {
        if !(2..=3600).contains(&d) {
            return Err(usage("--duration must be 2..=3600 seconds"));
        }
        c.duration = Duration::from_secs(d);
    }
    if let Some(name) = a.scheduler.as_deref() {
        c.scheduler = qgate_forward::scheduler::by_name(name)
            .map_err(usage)?
            .name();
    }
    if let Some(p) = a.loss {
        if !(0.0..=0.5).contains(&p) {
            return Err(usage("--loss must be in [0, 0.5]"));
        }
        c.loss = p;
    }
    if let Some(s) = a.seed {
        c.seed = s;
    }
    println!(
        "qgate-lab demo — {} devices → gateway (3 backhaul paths: 100/75/50 Mbit/s, 10/20/30 ms) → server → broker (AMQP over QUIC) → consumer, scheduler {}, {} s{}",
        c.devices,
        c.scheduler,
        c.duration.as_secs(),
        if a.virtual_time { " of virtual time" } else { " in real time" }
    );
    let tty = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let live = a.virtual_time.then_some(()).is_none();
    let view = move |v: String| {
        if live {
            if tty {
                print!("\x1b[2J\x1b[H");
            }
            println!("{v}");
        }
    };
    let out = if a.virtual_time {
        crate::virtual_time(gwdemo::run(c, view))
    } else {
        qgate::runtime().block_on(gwdemo::run(c, view))
    };
    println!("\nsummary\n{}", out.summary());
    if out.failed > 0 {
        return Err(anyhow::anyhow!("{} requests failed", out.failed).into());
    }
    if !out.pipeline.adds_up() {
        return Err(anyhow::anyhow!("the pipeline's counts do not add up").into());
    }
    Ok(())
}
