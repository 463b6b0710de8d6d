//! `qgate-lab bench amqp`: broker throughput with 100-byte messages on loopback — producers →
//! one queue → consumers, pre-settled and unsettled, over QUIC and TCP, in memory and durable —
//! every configuration measured in the same run so they compare as ratios.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use qgate_amqp::broker::{Broker, BrokerConfig};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use fe2o3_amqp::types::messaging::Body;
use fe2o3_amqp::types::primitives::Value;
use qgate_amqp::client::{self, Connector, SendSpec};
use qgate_amqp::transport::{Scheme, ALPN_AMQP};
use qgate_transport::{endpoint, server_config, DevPki, Socket, TransportOptions};

use crate::stats::Summary;

/// One configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Case {
    /// Transport.
    pub scheme: Scheme,
    /// Producers (and as many consumers).
    pub pairs: usize,
    /// Pre-settled.
    pub settled: bool,
    /// Durable store.
    pub durable: bool,
    /// Against the embedded Apache Artemis instead of our broker (TCP only).
    pub artemis: bool,
}

impl std::fmt::Display for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}{} {}→{} {}{}",
            if self.artemis { "artemis " } else { "" },
            self.scheme,
            self.pairs,
            self.pairs,
            if self.settled {
                "pre-settled"
            } else {
                "unsettled"
            },
            if self.durable { " durable" } else { "" }
        )
    }
}

/// The configurations issue 6 asks for.
pub fn default_cases() -> Vec<Case> {
    let mut v = Vec::new();
    for scheme in [Scheme::Quic, Scheme::Tcp] {
        for pairs in [1, 10] {
            for settled in [true, false] {
                v.push(Case {
                    scheme,
                    pairs,
                    settled,
                    durable: false,
                    artemis: false,
                });
            }
        }
    }
    v.push(Case {
        scheme: Scheme::Quic,
        pairs: 1,
        settled: false,
        durable: true,
        artemis: false,
    });
    v
}

/// The same TCP cases against Apache Artemis (no persistence), for the ratio.
pub fn artemis_cases() -> Vec<Case> {
    default_cases()
        .into_iter()
        .filter(|c| c.scheme == Scheme::Tcp && !c.durable)
        .map(|c| Case { artemis: true, ..c })
        .collect()
}

/// One configuration's result.
#[derive(Debug, Clone)]
pub struct CaseResult {
    /// The configuration.
    pub case: Case,
    /// Messages per second through the broker (all consumers), per repeat.
    pub rates: Vec<f64>,
}

impl CaseResult {
    /// Mean ± std.
    pub fn summary(&self) -> Summary {
        Summary::of(&self.rates)
    }
}

/// Run every case `repeats` times (interleaved: case 1..k, then again), `messages` in total per
/// run, 100-byte bodies.
pub fn run(
    cases: &[Case],
    messages: u64,
    repeats: usize,
    artemis: Option<SocketAddr>,
    progress: impl Fn(usize, usize),
) -> Vec<CaseResult> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut out: Vec<CaseResult> = cases
        .iter()
        .map(|c| CaseResult {
            case: *c,
            rates: Vec::new(),
        })
        .collect();
    let dir = std::env::temp_dir().join(format!("qgate-bench-amqp-{}", std::process::id()));
    let total = cases.len() * repeats;
    // The JVM compiles its hot paths during the first runs: warm Artemis up, unmeasured.
    for (i, c) in cases.iter().enumerate().filter(|(_, c)| c.artemis) {
        rt.block_on(one(*c, messages, None, &format!("warmup-{i}"), artemis));
    }
    for r in 0..repeats {
        for (i, c) in cases.iter().enumerate() {
            let store = c.durable.then(|| dir.join(format!("run-{r}-{i}.redb")));
            let queue = format!("bench-{r}-{i}");
            let rate = rt.block_on(one(*c, messages, store, &queue, artemis));
            out[i].rates.push(rate);
            progress(r * cases.len() + i + 1, total);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    out
}

async fn one(
    c: Case,
    messages: u64,
    store: Option<std::path::PathBuf>,
    queue: &str,
    artemis: Option<SocketAddr>,
) -> f64 {
    let pki = DevPki::generate(&[]).expect("PKI");
    let builder = Broker::builder().config(BrokerConfig {
        store,
        ..Default::default()
    });
    // Held to the end: dropping it stops the broker.
    let (_running, addr) = match c.scheme {
        _ if c.artemis => (
            builder.start().expect("broker"),
            artemis.expect("an Artemis address for Artemis cases"),
        ),
        s if s.is_quic() => {
            let scfg = server_config(&pki.server, &[ALPN_AMQP], &TransportOptions::default())
                .expect("config");
            let ep = endpoint(
                Socket::bind_udp("127.0.0.1:0".parse().expect("addr")).expect("bind"),
                Some(scfg),
                None,
            )
            .expect("endpoint");
            let r = builder.quic(ep).start().expect("broker");
            let a = r.quic_addrs()[0];
            (r, a)
        }
        _ => {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let r = builder.tcp(l, None).start().expect("broker");
            let a = r.tcp_addrs()[0];
            (r, a)
        }
    };
    let connector = Connector::new(
        c.scheme,
        addr,
        "localhost",
        &pki.trust(),
        None,
        None,
        &TransportOptions::default(),
    )
    .expect("connector");
    let per = messages / c.pairs as u64;
    let total = per * c.pairs as u64;
    // Consumers stop together once the queue has handed out every message: a pre-settled
    // consumer that stopped at its own share would drop what was already on its way to it.
    let got = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    let queue = queue.to_string();
    for p in 0..c.pairs {
        let connector = connector.clone();
        let got = got.clone();
        let queue = queue.clone();
        tasks.push(tokio::spawn(async move {
            let Ok((mut cl, _)) = connector.open().await else {
                return 0;
            };
            let Ok(mut rx) = cl
                .receiver(&format!("consumer-{p}"), &queue, c.settled, 1000)
                .await
            else {
                return 0;
            };
            let mut mine = 0u64;
            while got.load(Ordering::Relaxed) < total {
                match tokio::time::timeout(Duration::from_millis(50), rx.recv::<Body<Value>>())
                    .await
                {
                    Ok(Ok(d)) => {
                        if rx.accept(&d).await.is_err() {
                            break;
                        }
                        mine += 1;
                        got.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(Err(_)) => break,
                    Err(_) => {
                        if start.elapsed() > Duration::from_secs(60) {
                            break;
                        }
                    }
                }
            }
            let _ = rx.close().await;
            cl.close().await;
            mine
        }));
    }
    for p in 0..c.pairs {
        let connector = connector.clone();
        let queue = queue.clone();
        tasks.push(tokio::spawn(async move {
            let spec = SendSpec {
                address: queue.clone(),
                settled: c.settled,
                window: 500,
                rate: None,
                link_name: format!("producer-{p}"),
            };
            let bodies = (0..per).map(|_| vec![b'x'; 100]);
            client::send(&connector, &spec, bodies)
                .await
                .map(|_| 0)
                .unwrap_or(0)
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    // Throughput up to the moment the last message was handed to a consumer.
    got.load(Ordering::Relaxed).min(total) as f64 / start.elapsed().as_secs_f64()
}
