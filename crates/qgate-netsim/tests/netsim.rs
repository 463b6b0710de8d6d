//! Behaviour of the simulated network, measured in virtual time.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use qgate_netsim::{
    Direction, LinkId, LinkParams, LinkStats, LossModel, Network, SimSocket, TraceEvent,
    IPV4_UDP_OVERHEAD,
};
use tokio::time::Instant;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// client 10.0.0.1 —— server 10.0.0.2, the given parameters both ways.
struct Pair {
    net: Network,
    link: LinkId,
    client: Arc<SimSocket>,
    server: Arc<SimSocket>,
}

fn pair(seed: u64, params: LinkParams) -> Pair {
    let net = Network::new(seed);
    let (a, b) = (net.add_host("client"), net.add_host("server"));
    let ia = net.add_interface(a, ip("10.0.0.1")).unwrap();
    let ib = net.add_interface(b, ip("10.0.0.2")).unwrap();
    let link = net.connect_symmetric(ia, ib, params).unwrap();
    let client = net.bind(a, sa("10.0.0.1:5000")).unwrap();
    let server = net.bind(b, sa("10.0.0.2:6000")).unwrap();
    Pair {
        net,
        link,
        client,
        server,
    }
}

fn seq_payload(seq: u32, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len.max(4)];
    v[..4].copy_from_slice(&seq.to_be_bytes());
    v
}

fn seq_of(data: &[u8]) -> u32 {
    u32::from_be_bytes(data[..4].try_into().unwrap())
}

fn assert_counters_add_up(s: &LinkStats) {
    assert_eq!(
        s.sent,
        s.delivered + s.dropped_loss + s.dropped_queue + s.dropped_down,
        "{s:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn delay_is_exact_in_virtual_time() {
    let p = pair(1, LinkParams::new(10_000_000, Duration::from_millis(25)));
    p.net.enable_trace(100);
    let t0 = Instant::now();
    // 1222 bytes payload + 28 header = 1250 bytes = exactly 1 ms at 10 Mbit/s.
    p.client
        .send_to(&[7u8; 1250 - IPV4_UDP_OVERHEAD], sa("10.0.0.2:6000"))
        .unwrap();
    let r = p.server.recv_from().await;
    let observed = t0.elapsed();
    assert_eq!(r.from, sa("10.0.0.1:5000"));
    assert_eq!(r.to, ip("10.0.0.2"));
    assert_eq!(r.data.len(), 1222);
    // The link computes exact times; endpoints see them at the clock's 1 ms ticks.
    let trace = p.net.take_trace();
    let deliver = trace
        .records
        .iter()
        .find(|r| r.event == TraceEvent::Deliver)
        .unwrap();
    assert_eq!(deliver.at, Duration::from_millis(26));
    assert!(
        observed >= Duration::from_millis(26) && observed < Duration::from_millis(27),
        "{observed:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn rate_serialises_one_megabyte_in_point_eight_seconds() {
    let delay = Duration::from_millis(10);
    let params =
        LinkParams::new(10_000_000, delay).with_queue("droptail:packets=2000".parse().unwrap());
    let p = pair(1, params);
    p.net.enable_trace(10_000);
    let t0 = Instant::now();
    // 1000 datagrams of 1000 bytes on the wire = 1 MB = 8 Mbit = 0.8 s at 10 Mbit/s.
    for i in 0..1000 {
        p.client
            .send_to(
                &seq_payload(i, 1000 - IPV4_UDP_OVERHEAD),
                sa("10.0.0.2:6000"),
            )
            .unwrap();
    }
    for _ in 0..1000 {
        p.server.recv_from().await;
    }
    let observed = t0.elapsed();
    let last = p
        .net
        .take_trace()
        .records
        .iter()
        .rev()
        .find(|r| r.event == TraceEvent::Deliver)
        .unwrap()
        .at;
    assert_eq!(last, Duration::from_millis(800) + delay);
    assert!(
        observed >= last && observed < last + Duration::from_millis(1),
        "{observed:?}"
    );
    let s = p.net.stats(p.link, Direction::AtoB);
    assert_eq!(s.delivered_bytes, 1_000_000);
    assert_eq!(s.max_queue_packets, 999);
    assert_counters_add_up(&s);
}

#[tokio::test(start_paused = true)]
async fn queue_limit_drops_the_overflow() {
    let params = LinkParams::new(1_000_000, Duration::from_millis(5))
        .with_queue("droptail:packets=10".parse().unwrap());
    let p = pair(1, params);
    for i in 0..100 {
        p.client
            .send_to(&seq_payload(i, 500), sa("10.0.0.2:6000"))
            .unwrap();
    }
    // One on the transmitter + ten queued get through; the rest are tail-dropped.
    let mut got = Vec::new();
    for _ in 0..11 {
        got.push(seq_of(&p.server.recv_from().await.data));
    }
    assert_eq!(got, (0..11).collect::<Vec<_>>());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let s = p.net.stats(p.link, Direction::AtoB);
    assert_eq!(
        (s.delivered, s.dropped_queue, s.max_queue_packets),
        (11, 89, 10)
    );
    assert_counters_add_up(&s);
    assert_eq!(
        p.net.queue_stats(p.link, Direction::AtoB).dropped_overflow,
        89
    );
}

/// Send `n` numbered datagrams over a link with a large queue and no rate limit, in batches,
/// and return which arrived.
async fn arrivals(p: &Pair, n: u32) -> Vec<bool> {
    let mut arrived = vec![false; n as usize];
    let dst = sa("10.0.0.2:6000");
    for batch in 0..(n / 1000) {
        for i in 0..1000 {
            p.client
                .send_to(&seq_payload(batch * 1000 + i, 16), dst)
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        while let Some(r) = try_recv(&p.server).await {
            arrived[seq_of(&r.data) as usize] = true;
        }
    }
    arrived
}

async fn try_recv(s: &SimSocket) -> Option<qgate_netsim::Received> {
    tokio::time::timeout(Duration::ZERO, s.recv_from())
        .await
        .ok()
}

#[tokio::test(start_paused = true)]
async fn bernoulli_loss_rate_over_100k_packets() {
    let params = LinkParams::new(1_000_000_000, Duration::from_millis(1))
        .with_loss(LossModel::Bernoulli { p: 0.03 });
    let p = pair(42, params);
    let arrived = arrivals(&p, 100_000).await;
    let lost = arrived.iter().filter(|a| !**a).count() as f64;
    let rate = lost / 100_000.0;
    // Standard error sqrt(.03·.97/1e5) ≈ 0.00054: allow 5 of them.
    assert!((rate - 0.03).abs() < 0.0027, "loss rate {rate}");
    let s = p.net.stats(p.link, Direction::AtoB);
    assert_eq!(s.dropped_loss as f64, lost);
    assert_eq!(s.dropped_queue, 0);
    assert_counters_add_up(&s);
}

#[tokio::test(start_paused = true)]
async fn gilbert_elliott_loss_rate_and_burst_length_over_100k_packets() {
    let params = LinkParams::new(1_000_000_000, Duration::from_millis(1))
        .with_loss(LossModel::bursty(0.05, 3.0));
    let p = pair(7, params);
    let arrived = arrivals(&p, 100_000).await;
    let lost = arrived.iter().filter(|a| !**a).count();
    let bursts = arrived.windows(2).filter(|w| w[0] && !w[1]).count() + usize::from(!arrived[0]);
    let rate = lost as f64 / 100_000.0;
    let mean_burst = lost as f64 / bursts as f64;
    assert!((rate - 0.05).abs() < 0.006, "loss rate {rate}");
    assert!((mean_burst - 3.0).abs() < 0.25, "mean burst {mean_burst}");
}

#[tokio::test(start_paused = true)]
async fn jitter_never_reorders_and_order_is_fifo() {
    let params = LinkParams::new(5_000_000, Duration::from_millis(20))
        .with_jitter(Duration::from_millis(15));
    let p = pair(3, params);
    let mut delays = Vec::new();
    for i in 0..300u32 {
        p.client
            .send_to(&seq_payload(i, 200), sa("10.0.0.2:6000"))
            .unwrap();
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let mut last = None;
    for expected in 0..300u32 {
        let r = p.server.recv_from().await;
        let seq = seq_of(&r.data);
        assert_eq!(seq, expected, "FIFO order");
        if let Some(prev) = last {
            assert!(seq > prev);
        }
        last = Some(seq);
        delays.push(seq);
    }
    assert_counters_add_up(&p.net.stats(p.link, Direction::AtoB));
}

#[tokio::test(start_paused = true)]
async fn jitter_spreads_delays() {
    let params = LinkParams::new(1_000_000_000, Duration::from_millis(30))
        .with_jitter(Duration::from_millis(10));
    let p = pair(5, params);
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..200u32 {
        let t = Instant::now();
        p.client
            .send_to(&seq_payload(i, 100), sa("10.0.0.2:6000"))
            .unwrap();
        p.server.recv_from().await;
        let d = t.elapsed();
        assert!(
            d >= Duration::from_millis(20) && d <= Duration::from_millis(41),
            "{d:?}"
        );
        seen.insert(d.as_millis());
    }
    assert!(seen.len() > 10, "delays should vary: {seen:?}");
}

#[tokio::test(start_paused = true)]
async fn multi_homed_hosts_use_each_interface_as_its_own_path() {
    // device (wifi 10.1.0.1, cell 10.2.0.1) —— server (10.1.0.2, 10.2.0.2).
    let net = Network::new(1);
    let (dev, srv) = (net.add_host("device"), net.add_host("server"));
    let wifi = net.add_interface(dev, ip("10.1.0.1")).unwrap();
    let cell = net.add_interface(dev, ip("10.2.0.1")).unwrap();
    let s1 = net.add_interface(srv, ip("10.1.0.2")).unwrap();
    let s2 = net.add_interface(srv, ip("10.2.0.2")).unwrap();
    let l1 = net
        .connect_symmetric(
            wifi,
            s1,
            LinkParams::new(20_000_000, Duration::from_millis(5)),
        )
        .unwrap();
    let l2 = net
        .connect_symmetric(
            cell,
            s2,
            LinkParams::new(5_000_000, Duration::from_millis(60)),
        )
        .unwrap();
    // A wildcard socket on the server receives on both interfaces and learns which.
    let server = net.bind(srv, sa("0.0.0.0:443")).unwrap();
    let on_wifi = net.bind(dev, sa("10.1.0.1:0")).unwrap();
    let on_cell = net.bind(dev, sa("10.2.0.1:0")).unwrap();
    assert!(on_wifi.local().port() >= 49152);

    let t = Instant::now();
    on_cell.send_to(b"cell", sa("10.2.0.2:443")).unwrap();
    on_wifi.send_to(b"wifi", sa("10.1.0.2:443")).unwrap();
    let first = server.recv_from().await;
    assert_eq!(
        (first.data.as_slice(), first.to),
        (&b"wifi"[..], ip("10.1.0.2"))
    );
    assert!(t.elapsed() < Duration::from_millis(7));
    let second = server.recv_from().await;
    assert_eq!(
        (second.data.as_slice(), second.to),
        (&b"cell"[..], ip("10.2.0.2"))
    );
    assert!(t.elapsed() >= Duration::from_millis(60));
    assert_eq!(net.stats(l1, Direction::AtoB).delivered, 1);
    assert_eq!(net.stats(l2, Direction::AtoB).delivered, 1);

    // quinn's src_ip: a wildcard socket answers from the interface the datagram arrived on.
    use quinn::udp::Transmit;
    use quinn::AsyncUdpSocket;
    server
        .try_send(&Transmit {
            destination: second.from,
            ecn: None,
            contents: b"back",
            segment_size: None,
            src_ip: Some(second.to),
        })
        .unwrap();
    let back = on_cell.recv_from().await;
    assert_eq!(
        (back.data.as_slice(), back.from),
        (&b"back"[..], sa("10.2.0.2:443"))
    );
    assert_eq!(net.stats(l2, Direction::BtoA).delivered, 1);
    assert_eq!(net.stats(l1, Direction::BtoA).delivered, 0);
}

#[tokio::test(start_paused = true)]
async fn routers_forward_through_a_bottleneck() {
    // client —(100 Mbit/s, 1 ms)— router —(10 Mbit/s, 20 ms)— server
    let net = Network::new(1);
    let (c, r, s) = (net.add_host("c"), net.add_host("r"), net.add_host("s"));
    let c0 = net.add_interface(c, ip("10.0.1.1")).unwrap();
    let r0 = net.add_interface(r, ip("10.0.1.2")).unwrap();
    let r1 = net.add_interface(r, ip("10.0.2.1")).unwrap();
    let s0 = net.add_interface(s, ip("10.0.2.2")).unwrap();
    net.connect_symmetric(
        c0,
        r0,
        LinkParams::new(100_000_000, Duration::from_millis(1)),
    )
    .unwrap();
    let bottleneck = net
        .connect_symmetric(
            r1,
            s0,
            LinkParams::new(10_000_000, Duration::from_millis(20)),
        )
        .unwrap();
    let cs = net.bind(c, sa("0.0.0.0:1000")).unwrap();
    let ss = net.bind(s, sa("0.0.0.0:2000")).unwrap();
    // Without forwarding there is no route through the router.
    let e = cs.send_to(b"hello", sa("10.0.2.2:2000")).unwrap_err();
    assert_eq!(e.to_string(), "no route to 10.0.2.2");
    assert_eq!(net.host_drops().unroutable, 1);
    net.set_forwarding(r, true);
    let t = Instant::now();
    cs.send_to(b"hello", sa("10.0.2.2:2000")).unwrap();
    let got = ss.recv_from().await;
    assert_eq!(got.from, sa("10.0.1.1:1000"));
    assert!(t.elapsed() >= Duration::from_millis(21) && t.elapsed() < Duration::from_millis(23));
    ss.send_to(b"reply", got.from).unwrap();
    assert_eq!(cs.recv_from().await.data, b"reply");
    assert_eq!(net.stats(bottleneck, Direction::AtoB).delivered, 1);
    assert_eq!(net.stats(bottleneck, Direction::BtoA).delivered, 1);
}

#[tokio::test(start_paused = true)]
async fn link_parameters_change_while_running() {
    let p = pair(1, LinkParams::new(10_000_000, Duration::from_millis(10)));
    let dst = sa("10.0.0.2:6000");
    let t = Instant::now();
    p.client.send_to(b"a", dst).unwrap();
    p.server.recv_from().await;
    assert!(t.elapsed() < Duration::from_millis(12));

    p.net
        .update(p.link, Direction::AtoB, |l| {
            l.delay = Duration::from_millis(80)
        })
        .unwrap();
    let t = Instant::now();
    p.client.send_to(b"b", dst).unwrap();
    p.server.recv_from().await;
    assert!(t.elapsed() >= Duration::from_millis(80));

    // Down: packets in flight and sent later are lost and counted.
    p.client.send_to(b"in-flight", dst).unwrap();
    tokio::time::sleep(Duration::from_millis(40)).await;
    p.net
        .update(p.link, Direction::AtoB, |l| l.up = false)
        .unwrap();
    p.client.send_to(b"while-down", dst).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let s = p.net.stats(p.link, Direction::AtoB);
    assert_eq!((s.delivered, s.dropped_down), (2, 2));

    p.net
        .update(p.link, Direction::AtoB, |l| l.up = true)
        .unwrap();
    p.client.send_to(b"c", dst).unwrap();
    assert_eq!(p.server.recv_from().await.data, b"c");

    // Rate change: 1 Mbit/s makes a 1250-byte datagram take 10 ms to serialise.
    p.net
        .update(p.link, Direction::AtoB, |l| l.rate_bps = Some(1_000_000))
        .unwrap();
    let t = Instant::now();
    p.client
        .send_to(&[0; 1250 - IPV4_UDP_OVERHEAD], dst)
        .unwrap();
    p.server.recv_from().await;
    assert!(
        t.elapsed() >= Duration::from_millis(90),
        "{:?}",
        t.elapsed()
    );
    assert_counters_add_up(&p.net.stats(p.link, Direction::AtoB));
    assert!(p
        .net
        .update(p.link, Direction::AtoB, |l| l.rate_bps = Some(0))
        .is_err());
}

async fn lossy_run(seed: u64) -> (LinkStats, qgate_netsim::Trace) {
    let params = LinkParams::new(2_000_000, Duration::from_millis(15))
        .with_loss(LossModel::bursty(0.1, 2.0))
        .with_jitter(Duration::from_millis(5))
        .with_queue("droptail:packets=20".parse().unwrap());
    let p = pair(seed, params);
    p.net.enable_trace(100_000);
    for i in 0..2000u32 {
        p.client
            .send_to(
                &seq_payload(i, 300 + (i as usize % 700)),
                sa("10.0.0.2:6000"),
            )
            .unwrap();
        if i % 7 == 0 {
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    (p.net.stats(p.link, Direction::AtoB), p.net.take_trace())
}

#[tokio::test(start_paused = true)]
async fn same_seed_same_run() {
    let (s1, t1) = lossy_run(9).await;
    let (s2, t2) = lossy_run(9).await;
    let (s3, _) = lossy_run(10).await;
    assert_eq!(s1, s2);
    assert_eq!(t1, t2);
    assert_ne!(s1, s3, "another seed gives another run");
    assert!(s1.dropped_loss > 0 && s1.dropped_queue > 0);
    assert_counters_add_up(&s1);
}

#[tokio::test(start_paused = true)]
async fn bind_errors_are_clear() {
    let net = Network::new(1);
    let h = net.add_host("h");
    net.add_interface(h, ip("10.0.0.1")).unwrap();
    let e = net.add_interface(h, ip("10.0.0.1")).unwrap_err();
    assert_eq!(
        e.to_string(),
        "address 10.0.0.1 is already assigned to an interface"
    );
    let e = net.bind(h, sa("10.9.9.9:1")).unwrap_err();
    assert_eq!(
        e.to_string(),
        "host 'h' has no interface with address 10.9.9.9"
    );
    let s = net.bind(h, sa("10.0.0.1:7")).unwrap();
    assert!(net.bind(h, sa("0.0.0.0:7")).is_err());
    drop(s);
    let _wild = net.bind(h, sa("0.0.0.0:7")).unwrap();
    let e = s_err(net.bind(h, sa("10.0.0.1:7")));
    assert_eq!(e, "address 10.0.0.1:7 is already in use");
}

fn s_err<T>(r: Result<T, qgate_netsim::NetError>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test(flavor = "current_thread")]
async fn runs_in_real_time_too() {
    let p = pair(1, LinkParams::new(100_000_000, Duration::from_millis(20)));
    let t = std::time::Instant::now();
    p.client.send_to(b"real", sa("10.0.0.2:6000")).unwrap();
    assert_eq!(p.server.recv_from().await.data, b"real");
    let d = t.elapsed();
    assert!(
        d >= Duration::from_millis(20) && d < Duration::from_millis(500),
        "{d:?}"
    );
}

/// Two hosts may each listen on the same wildcard port (a server and a gateway on 0.0.0.0:443).
#[tokio::test(start_paused = true)]
async fn wildcard_ports_are_per_host() {
    let net = Network::new(1);
    let (a, b) = (net.add_host("a"), net.add_host("b"));
    let ia = net.add_interface(a, ip("10.0.0.1")).unwrap();
    let ib = net.add_interface(b, ip("10.0.0.2")).unwrap();
    net.connect_symmetric(
        ia,
        ib,
        LinkParams::new(10_000_000, Duration::from_millis(1)),
    )
    .unwrap();
    let sa_ = net.bind(a, sa("0.0.0.0:443")).unwrap();
    let sb = net.bind(b, sa("0.0.0.0:443")).unwrap();
    sa_.send_to(b"to b", sa("10.0.0.2:443")).unwrap();
    sb.send_to(b"to a", sa("10.0.0.1:443")).unwrap();
    assert_eq!(sb.recv_from().await.data, b"to b");
    assert_eq!(sa_.recv_from().await.data, b"to a");
    assert_eq!(net.host_drops().no_listener, 0);
}
