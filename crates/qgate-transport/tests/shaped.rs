//! Egress shaping (paper 004's AQM at the sender's edge) on the simulated network, in virtual
//! time: a bulk upload and small request/response probes share one QUIC connection across a
//! 10 Mbit/s link with a bloated 1000-packet drop-tail buffer. Shaping just below the link rate
//! moves the standing queue into the shaper, where the discipline controls it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use qgate_netsim::{LinkParams, Network};
use qgate_transport::{client_config, endpoint, server_config, DevPki, Socket, TransportOptions};
use tokio::time::Instant;

const ALPN: &[&[u8]] = &[b"shape-test"];
const WARMUP: Duration = Duration::from_secs(5);
const RUN: Duration = Duration::from_secs(20);

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

struct Outcome {
    probe_median_ms: f64,
    bulk_mbps: f64,
    /// Packets the shaper's discipline dropped or marked CE (quinn negotiates ECN).
    shaper_signals: u64,
}

/// Server: count bulk bytes after the warm-up; answer each probe with 100 bytes.
fn serve(server: quinn::Endpoint, bulk: Arc<AtomicU64>, start: Instant) {
    tokio::spawn(async move {
        let conn = server.accept().await.unwrap().await.unwrap();
        let c2 = conn.clone();
        tokio::spawn(async move {
            while let Ok(mut recv) = c2.accept_uni().await {
                let bulk = bulk.clone();
                tokio::spawn(async move {
                    while let Ok(Some(chunk)) = recv.read_chunk(65536, true).await {
                        if start.elapsed() >= WARMUP {
                            bulk.fetch_add(chunk.bytes.len() as u64, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        while let Ok((mut send, mut recv)) = conn.accept_bi().await {
            tokio::spawn(async move {
                let _ = recv.read_to_end(4096).await;
                let _ = send.write_all(&[7u8; 100]).await;
                let _ = send.finish();
            });
        }
    });
}

async fn run(shape: Option<&str>) -> Outcome {
    let net = Network::new(3);
    let (c, s) = (net.add_host("gateway"), net.add_host("server"));
    let ic = net.add_interface(c, "10.0.0.1".parse().unwrap()).unwrap();
    let is = net.add_interface(s, "10.0.0.2".parse().unwrap()).unwrap();
    let modem = LinkParams::new(10_000_000, Duration::from_millis(20))
        .with_queue("droptail:packets=1000".parse().unwrap());
    net.connect_symmetric(ic, is, modem).unwrap();
    let pki = DevPki::generate(&[]).unwrap();
    let opts = TransportOptions::default();
    let server = endpoint(
        Socket::from(net.bind(s, sa("10.0.0.2:4433")).unwrap()),
        Some(server_config(&pki.server, ALPN, &opts).unwrap()),
        Some(1),
    )
    .unwrap();
    let mut socket = Socket::from(net.bind(c, sa("10.0.0.1:0")).unwrap());
    let mut handle = None;
    if let Some(shape) = shape {
        let change: qgate_link::LinkChange = shape.parse().unwrap();
        let mut params = LinkParams::default();
        change.apply(&mut params).unwrap();
        let (shaped, h) = socket.shaped(params, 5).unwrap();
        socket = shaped;
        handle = Some(h);
    }
    let client = endpoint(socket, None, Some(2)).unwrap();
    let start = Instant::now();
    let bulk = Arc::new(AtomicU64::new(0));
    serve(server, bulk.clone(), start);
    let conn = client
        .connect_with(
            client_config(&pki.trust(), ALPN, &opts).unwrap(),
            sa("10.0.0.2:4433"),
            "localhost",
        )
        .unwrap()
        .await
        .unwrap();
    let c2 = conn.clone();
    tokio::spawn(async move {
        let mut send = c2.open_uni().await.unwrap();
        let chunk = vec![1u8; 16384];
        while send.write_all(&chunk).await.is_ok() {}
    });
    let mut delays = Vec::new();
    while start.elapsed() < RUN {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let t = Instant::now();
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        send.write_all(&[3u8; 200]).await.unwrap();
        send.finish().unwrap();
        recv.read_to_end(4096).await.unwrap();
        if t.duration_since(start) >= WARMUP {
            delays.push(t.elapsed().as_secs_f64() * 1000.0);
        }
    }
    let measured = start.elapsed() - WARMUP;
    delays.sort_by(f64::total_cmp);
    Outcome {
        probe_median_ms: delays[delays.len() / 2],
        bulk_mbps: bulk.load(Ordering::Relaxed) as f64 * 8.0 / measured.as_secs_f64() / 1e6,
        shaper_signals: handle.map_or(0, |h| {
            let s = h.stats();
            s.dropped_queue + s.marked
        }),
    }
}

#[tokio::test(start_paused = true)]
async fn shaping_with_an_aqm_keeps_the_queue_out_of_the_modem() {
    let plain = run(None).await;
    let mut lines = vec![format!(
        "unshaped: probe median {:.1} ms, bulk {:.2} Mbit/s",
        plain.probe_median_ms, plain.bulk_mbps
    )];
    let mut shaped = Vec::new();
    for queue in ["pid-delay", "fq-codel", "pie"] {
        let o = run(Some(&format!("rate=9500kbit,queue={queue}"))).await;
        lines.push(format!(
            "shaped 9.5 Mbit/s + {queue}: probe median {:.1} ms, bulk {:.2} Mbit/s, {} drops or CE marks at the shaper",
            o.probe_median_ms, o.bulk_mbps, o.shaper_signals
        ));
        shaped.push((queue, o));
    }
    let all = lines.join("\n");
    eprintln!("{all}");
    for (queue, o) in shaped {
        assert!(
            o.shaper_signals > 0,
            "{queue}: the discipline never acted\n{all}"
        );
        assert!(
            o.probe_median_ms < plain.probe_median_ms / 3.0,
            "{queue}: delay not cut\n{all}"
        );
        assert!(
            o.bulk_mbps > 0.8 * plain.bulk_mbps,
            "{queue} costs too much goodput\n{all}"
        );
    }
}

#[tokio::test]
async fn shaping_refuses_what_it_cannot_do() {
    let net = Network::new(1);
    let h = net.add_host("h");
    net.add_interface(h, "10.0.0.1".parse().unwrap()).unwrap();
    for (bad, says) in [
        (LinkParams::default(), "needs a rate"),
        (
            LinkParams::new(1_000_000, Duration::from_millis(5)),
            "rate and a queue only",
        ),
        (
            LinkParams {
                up: false,
                ..LinkParams::new(1_000_000, Duration::ZERO)
            },
            "cannot be 'down'",
        ),
    ] {
        let socket = Socket::from(net.bind(h, sa("10.0.0.1:0")).unwrap());
        let e = socket.shaped(bad, 1).err().unwrap().to_string();
        assert!(e.contains(says), "{e}");
    }
}
