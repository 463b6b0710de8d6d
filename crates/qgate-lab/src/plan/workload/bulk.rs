//! `kind = "bulk"`: one endless QUIC upload per source to a sink (paper 004's traffic), with
//! the queue of one link measured. Background work: it stops when the run's other workloads
//! have ended (or at the deadline when it is alone).
//!
//! Scalars (after the warm-up): `goodput_mbps` (all flows), `fairness` (Jain's index of the
//! flows' goodputs), `rtt_ms` (mean of the senders' smoothed RTTs); with `measure`:
//! `qdelay_ms`, `qdelay_std_ms`, `qdelay_p99_ms` (time in the queue), `utilisation` (bytes the
//! link delivered ÷ its capacity, second by second as the timeline changes it), `queue_drops`, `aqm_drops`, `random_losses`,
//! `delivered_packets`. Samples (one per flow): `flow_goodput_mbps`, `flow_rtt_ms`. Series: `goodput_mbps`, `rtt_ms`,
//! `qdelay_ms`.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use qgate_netsim::topology::LinkSpec;
use qgate_netsim::{Direction, LinkId, Network, World};
use qgate_transport::{client_config, connect, endpoint, server_config, Socket, TransportOptions};
use rand::Rng;

use super::{rng, secs, Clock, Measurements, Setup};
use crate::plan::spec::BulkLoad;
use crate::stats::Summary;

const ALPN: &[u8] = b"qgate-bulk";

pub(super) fn check(
    b: &BulkLoad,
    duration_s: f64,
    host: &dyn Fn(&str, &str) -> Result<(), String>,
    link: &dyn Fn(&str, &str) -> Result<(), String>,
) -> Result<(), String> {
    for h in &b.from {
        host("workloads.from", h)?;
    }
    host("workloads.sink", &b.sink)?;
    if b.sources > 0 {
        match &b.attach {
            Some(a) => host("workloads.attach", a)?,
            None => {
                return Err(format!(
                    "workload '{}': new 'sources' need 'attach' (the host they link to)",
                    b.name
                ))
            }
        }
    }
    for (key, v) in [("warmup_s", b.warmup_s), ("stagger_ms", b.stagger_ms)] {
        if !(0.0..=86_400_000.0).contains(&v) {
            return Err(format!("workload '{}': '{key}' must be ≥ 0", b.name));
        }
    }
    if b.start_s + b.warmup_s >= duration_s {
        return Err(format!(
            "workload '{}': 'start_s' + 'warmup_s' must end before the run does ({duration_s} s)",
            b.name
        ));
    }
    if b.from.contains(&b.sink) {
        return Err(format!(
            "workload '{}': '{}' is both a source ('from') and the sink",
            b.name, b.sink
        ));
    }
    if b.sources > 10_000 {
        return Err(format!("workload '{}': at most 10000 'sources'", b.name));
    }
    if b.sources + b.from.len() == 0 {
        return Err(format!(
            "workload '{}': no flows (give 'sources' or 'from')",
            b.name
        ));
    }
    if let Some(m) = &b.measure {
        link("workloads.measure", m)?;
    }
    let min = qgate_netsim::IPV4_UDP_OVERHEAD + 1200;
    if !(min..=65_535).contains(&b.packet_bytes) {
        return Err(format!(
            "workload '{}': 'packet_bytes' must be in {min}..=65535 (QUIC needs 1200-byte datagrams)",
            b.name
        ));
    }
    Ok(())
}

pub(crate) struct Prepared {
    spec: BulkLoad,
    net: Network,
    sources: Vec<quinn::Endpoint>,
    sink_addr: SocketAddr,
    server: quinn::Endpoint,
    ccfg: quinn::ClientConfig,
    index: HashMap<IpAddr, usize>,
    measure: Option<(LinkId, Direction)>,
    stagger: Vec<Duration>,
}

pub(super) fn prepare(b: &BulkLoad, world: &mut World, s: &Setup) -> Result<Prepared, String> {
    let net = world.net.clone();
    let opts = TransportOptions {
        max_udp_payload: Some((b.packet_bytes - qgate_netsim::IPV4_UDP_OVERHEAD) as u16),
        // Room for the largest BDP + buffer, so flow control never limits (as `lab aqm`).
        stream_receive_window: 16 << 20,
        receive_window: 32 << 20,
        send_window: 16 << 20,
        ..TransportOptions::default()
    };
    let sink = world.host(&b.sink).ok_or("no sink host")?;
    let sink_ip = world
        .address_of(sink)
        .ok_or_else(|| format!("sink '{}' has no link", b.sink))?;
    let sink_addr = SocketAddr::new(sink_ip, 4433 + s.index as u16);
    let server = endpoint(
        Socket::from(net.bind(sink, sink_addr).map_err(|e| e.to_string())?),
        Some(server_config(&s.pki.server, &[ALPN], &opts).map_err(|e| e.to_string())?),
        Some(s.seed),
    )
    .map_err(|e| e.to_string())?;
    let mut hosts = Vec::new();
    for h in &b.from {
        let id = world.host(h).ok_or("no source host")?;
        let ip = world
            .address_of(id)
            .ok_or_else(|| format!("source '{h}' has no link"))?;
        hosts.push((id, ip));
    }
    for i in 0..b.sources {
        let name = format!("{}.src{i}", b.name);
        let id = world.add_host(&name, false).map_err(|e| e.to_string())?;
        let attach = b.attach.as_deref().ok_or("no attach host")?;
        let l = world
            .add_link(&LinkSpec::new(
                &format!("{}.access{i}", b.name),
                &name,
                attach,
                b.access.clone(),
            ))
            .map_err(|e| e.to_string())?;
        hosts.push((id, l.a.1));
    }
    let mut sources = Vec::new();
    let mut index = HashMap::new();
    for (i, (h, ip)) in hosts.into_iter().enumerate() {
        if index.insert(ip, i).is_some() {
            return Err(format!("two flows from {ip}: a host is listed twice"));
        }
        let sock = net
            .bind(h, SocketAddr::new(ip, 0))
            .map_err(|e| e.to_string())?;
        sources.push(
            endpoint(Socket::from(sock), None, Some(s.seed * 1000 + i as u64 + 1))
                .map_err(|e| e.to_string())?,
        );
    }
    let measure = match &b.measure {
        Some(m) => {
            let l = world.link(m).map_err(|e| e.to_string())?;
            let d = b.measure_direction.list()[0];
            net.log_sojourns(l.id, d, 20_000_000);
            Some((l.id, d))
        }
        None => None,
    };
    // Seeded start times: every seed changes the run (decision X4).
    let mut r = rng(s.seed, s.index);
    let step = b.stagger_ms / 1000.0;
    let stagger = (0..sources.len())
        .map(|i| secs(step * (i as f64 + r.random::<f64>())))
        .collect();
    Ok(Prepared {
        spec: b.clone(),
        net,
        sources,
        sink_addr,
        server,
        ccfg: client_config(&s.pki.trust(), &[ALPN], &opts).map_err(|e| e.to_string())?,
        index,
        measure,
        stagger,
    })
}

impl Prepared {
    pub(super) async fn run(self, clock: Clock) -> Measurements {
        let b = &self.spec;
        let n = self.sources.len();
        let received: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
        let sink = tokio::spawn(sink_loop(
            self.server.clone(),
            received.clone(),
            self.index.clone(),
        ));
        let conns = Arc::new(Mutex::new(vec![None; n]));
        let begin = clock.start + secs(b.start_s);
        let mut writers = Vec::new();
        for (i, ep) in self.sources.iter().enumerate() {
            let (ep, ccfg, conns, to) =
                (ep.clone(), self.ccfg.clone(), conns.clone(), self.sink_addr);
            let at = begin + self.stagger[i];
            writers.push(tokio::spawn(async move {
                tokio::time::sleep_until(at).await;
                let Ok(c) = connect(&ep, &ccfg, to, "localhost", false).await else {
                    return;
                };
                let conn = c.connection().clone();
                conns.lock().expect("lock")[i] = Some(conn.clone());
                let Ok(mut st) = conn.open_uni().await else {
                    return;
                };
                let chunk = Bytes::from(vec![0x42u8; 64 * 1024]);
                while st.write_chunk(chunk.clone()).await.is_ok() {}
            }));
        }
        let warm = b.start_s + b.warmup_s;
        let mut m = Measurements::default();
        let (mut goodput, mut rtt_series, mut qd_series) = (Vec::new(), Vec::new(), Vec::new());
        let mut last = vec![0u64; n];
        let mut flow_bytes = vec![0u64; n];
        let mut rtt_sums = vec![(0.0f64, 0u32); n];
        let mut qdelays = Vec::new();
        // The discipline's signal probability (PIE's p, PID-Delay's U), sampled every
        // U_SAMPLE so that oscillation at the controller's period shows.
        let (mut u_series, mut u_samples) = (Vec::new(), Vec::new());
        // The discipline's target delay where it moves (the stable PID-Delay's busy-time
        // guard), once a second.
        let (mut target_series, mut target_samples) = (Vec::new(), Vec::new());
        let mut at_warm = None;
        let mut measured_s = 0.0f64;
        // The measured link's capacity over the measured seconds, bits: its rate may change on
        // the timeline, and a down link has none.
        let mut capacity_bits = 0.0f64;
        let mut counting = warm <= 0.0;
        if counting {
            at_warm = self
                .measure
                .map(|(id, d)| (self.net.stats(id, d), self.net.queue_stats(id, d)));
        }
        for sec in 1u64.. {
            let at = clock.start + Duration::from_secs(sec);
            if at > clock.deadline || clock.finished() {
                break;
            }
            // The second (t − 1, t] counts once it starts after the warm-up, the same
            // boundary the counters' snapshot below is taken at.
            let after = counting;
            let mut u_second = Vec::new();
            if let Some((id, d)) = self.measure {
                let second_start = at - Duration::from_secs(1);
                for k in 1..U_SAMPLES_PER_SECOND {
                    tokio::time::sleep_until(second_start + U_SAMPLE * k).await;
                    u_second.extend(self.net.signal_probability(id, d));
                }
            }
            tokio::time::sleep_until(at).await;
            let t = sec as f64;
            if let Some((id, d)) = self.measure {
                u_second.extend(self.net.signal_probability(id, d));
                if let Some(target) = self.net.target_delay(id, d) {
                    let ms = target.as_secs_f64() * 1e3;
                    target_series.push((t, ms));
                    if after {
                        target_samples.push(ms);
                    }
                }
            }
            if !u_second.is_empty() {
                u_series.push((t, Summary::of(&u_second).mean));
                if after {
                    u_samples.extend(u_second);
                }
            }
            let mut total = 0u64;
            for (i, r) in received.iter().enumerate() {
                let now = r.load(Ordering::Relaxed);
                total += now - last[i];
                if after {
                    flow_bytes[i] += now - last[i];
                }
                last[i] = now;
            }
            goodput.push((t, total as f64 * 8.0 / 1e6));
            let mut rtts = Vec::new();
            for (i, c) in conns.lock().expect("lock").iter().enumerate() {
                if let Some(c) = c {
                    let r = c.rtt().as_secs_f64() * 1000.0;
                    rtts.push(r);
                    if after {
                        rtt_sums[i].0 += r;
                        rtt_sums[i].1 += 1;
                    }
                }
            }
            if !rtts.is_empty() {
                rtt_series.push((t, rtts.iter().sum::<f64>() / rtts.len() as f64));
            }
            if let Some((id, d)) = self.measure {
                let qd: Vec<f64> = self
                    .net
                    .take_sojourns(id, d)
                    .samples
                    .iter()
                    .map(|(_, d)| d.as_secs_f64() * 1000.0)
                    .collect();
                if !qd.is_empty() {
                    qd_series.push((t, qd.iter().sum::<f64>() / qd.len() as f64));
                }
                if after {
                    qdelays.extend(qd);
                    measured_s += 1.0;
                    let p = self.net.params(id, d);
                    if p.up {
                        capacity_bits += p.rate_bps.map_or(f64::NAN, |r| r as f64);
                    }
                }
                if !counting && t >= warm {
                    at_warm = Some((self.net.stats(id, d), self.net.queue_stats(id, d)));
                }
            } else if after {
                measured_s += 1.0;
            }
            if !counting && t >= warm {
                counting = true;
            }
        }
        for w in &writers {
            w.abort();
        }
        m.series
            .push(("goodput_mbps".into(), std::mem::take(&mut goodput)));
        m.series
            .push(("rtt_ms".into(), std::mem::take(&mut rtt_series)));
        if self.measure.is_some() {
            m.series
                .push(("qdelay_ms".into(), std::mem::take(&mut qd_series)));
        }
        if !u_series.is_empty() {
            m.series.push(("drop_probability".into(), u_series));
        }
        if !target_series.is_empty() {
            m.series.push(("target_ms".into(), target_series));
        }
        sink.abort();
        self.server.close(0u32.into(), b"done");

        let span = measured_s.max(1e-9);
        let flows: Vec<f64> = flow_bytes
            .iter()
            .map(|b| *b as f64 * 8.0 / span / 1e6)
            .collect();
        let sum: f64 = flows.iter().sum();
        let sq: f64 = flows.iter().map(|x| x * x).sum();
        if measured_s == 0.0 {
            // The run ended before the warm-up did: nothing was measured (not a zero).
            return m;
        }
        m.scalars.push(("goodput_mbps".into(), sum));
        if sq > 0.0 {
            m.scalars
                .push(("fairness".into(), sum * sum / (flows.len() as f64 * sq)));
        }
        let means: Vec<f64> = rtt_sums
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(s, n)| s / *n as f64)
            .collect();
        m.samples.push((
            "flow_rtt_ms".into(),
            means.iter().map(|r| (warm, *r)).collect(),
        ));
        if !means.is_empty() {
            m.scalars.push(("rtt_ms".into(), Summary::of(&means).mean));
        }
        if let (Some((id, d)), Some((s0, q0))) = (self.measure, at_warm) {
            let s1 = self.net.stats(id, d);
            let q1 = self.net.queue_stats(id, d);
            let q = Summary::of(&qdelays);
            if q.n > 0 {
                let mut sorted = qdelays.clone();
                sorted.sort_by(f64::total_cmp);
                let p99 = sorted[((sorted.len() as f64 * 0.99) as usize).min(sorted.len() - 1)];
                m.scalars.push(("qdelay_ms".into(), q.mean));
                m.scalars.push(("qdelay_std_ms".into(), q.std));
                m.scalars.push(("qdelay_p99_ms".into(), p99));
            }
            if capacity_bits.is_finite() && capacity_bits > 0.0 {
                let bits = (s1.delivered_bytes - s0.delivered_bytes) as f64 * 8.0;
                m.scalars.push(("utilisation".into(), bits / capacity_bits));
            }
            m.scalars.push((
                "queue_drops".into(),
                (s1.dropped_queue - s0.dropped_queue) as f64,
            ));
            m.scalars
                .push(("aqm_drops".into(), (q1.dropped_aqm - q0.dropped_aqm) as f64));
            m.scalars.push((
                "random_losses".into(),
                (s1.dropped_loss - s0.dropped_loss) as f64,
            ));
            m.scalars.push((
                "delivered_packets".into(),
                (s1.delivered - s0.delivered) as f64,
            ));
            if !u_samples.is_empty() {
                let u = Summary::of(&u_samples);
                m.scalars.push(("drop_probability".into(), u.mean));
                m.scalars.push(("drop_probability_std".into(), u.std));
            }
            if !target_samples.is_empty() {
                m.scalars
                    .push(("target_ms".into(), Summary::of(&target_samples).mean));
            }
        }
        m.samples.push((
            "flow_goodput_mbps".into(),
            flows.iter().map(|g| (warm, *g)).collect(),
        ));
        m
    }
}

/// How often the discipline's signal probability is sampled.
const U_SAMPLE: Duration = Duration::from_millis(10);
/// Samples per measured second.
const U_SAMPLES_PER_SECOND: u32 = 100;

async fn sink_loop(
    server: quinn::Endpoint,
    received: Arc<Vec<AtomicU64>>,
    index: HashMap<IpAddr, usize>,
) {
    let index = Arc::new(index);
    while let Some(incoming) = server.accept().await {
        let (received, index) = (received.clone(), index.clone());
        tokio::spawn(async move {
            let Ok(conn) = incoming.await else { return };
            let Some(&i) = index.get(&conn.remote_address().ip()) else {
                return;
            };
            while let Ok(mut rx) = conn.accept_uni().await {
                let received = received.clone();
                tokio::spawn(async move {
                    while let Ok(Some(c)) = rx.read_chunk(1 << 20, false).await {
                        received[i].fetch_add(c.bytes.len() as u64, Ordering::Relaxed);
                    }
                });
            }
        });
    }
}
