//! The broker scenario's producers and consumers: at-least-once producers that keep what is not
//! accepted and send it again on their next connection, consumers that note every message-id,
//! both reconnecting with a backoff after any failure.

use std::collections::BTreeSet;
use std::time::Duration;

use fe2o3_amqp::types::messaging::{Body, MessageId, Outcome as Settled};
use fe2o3_amqp::types::primitives::Value;
use futures_util::stream::{FuturesUnordered, StreamExt};
use qgate_amqp::client::{self, Connector};
use tokio::sync::watch;
use tokio::time::{sleep, sleep_until, timeout, Instant};

use super::tally::{tally, Clock, Shared};

const QUEUE: &str = "telemetry";
/// One message per producer every this long.
const PERIOD: Duration = Duration::from_millis(50);
/// Body bytes per message.
const BODY: usize = 100;
/// Most unsettled messages per producer.
const WINDOW: usize = 64;
/// Connect + attach, one send, one accept: each at most this long.
pub(super) const OP_TIMEOUT: Duration = Duration::from_secs(10);
/// A producer with messages in flight and no outcome for this long drops the connection.
const STALL: Duration = Duration::from_secs(10);
const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

fn message(k: usize, seq: u64) -> qgate_amqp::broker::AmqpMessage {
    let mut body = vec![0x5au8; BODY];
    body[..8].copy_from_slice(&seq.to_be_bytes());
    client::message_with_id(MessageId::String(format!("p{k}-{seq}")), body)
}

/// Count a failed connect (and attach); `None`: it timed out.
fn connect_failed(t: &Shared, e: Option<&client::ClientError>) {
    let mut g = tally(t);
    g.connect_failures += 1;
    // The connector does not fall back to 1-RTT when the broker refuses 0-RTT (a restarted
    // broker has new ticket keys): each ticket held costs one failed attempt.
    if e.is_some_and(|e| e.to_string().contains("ZeroRttRejected")) {
        g.zero_rtt_rejected += 1;
    }
}

/// Resolves when the client's QUIC connection has closed, for whatever reason.
fn connection_gone(info: &client::StreamInfo) -> impl std::future::Future<Output = ()> {
    let q = info.quic.clone();
    async move {
        match q {
            Some(q) => {
                q.closed().await;
            }
            None => std::future::pending().await,
        }
    }
}

enum End {
    /// Everything offered was accepted.
    Done,
    /// The connection failed: reconnect.
    Failed,
    /// Out of time.
    GaveUp,
}

/// Producer `k` (client index `k`): offers `total` messages, one every [`PERIOD`] from `clock`'s
/// start, until each is accepted or `give_up`.
pub(super) async fn produce(
    k: usize,
    c: Connector,
    clock: Clock,
    total: u64,
    give_up: Instant,
    t: Shared,
) {
    let mut unsent: BTreeSet<u64> = BTreeSet::new();
    let mut generated = 0u64;
    let mut attempts = vec![0u32; total as usize];
    let mut backoff = BACKOFF_MIN;
    let mut connections = 0u64;
    let due = |n: u64| clock.0 + PERIOD * n as u32;
    let generate = |generated: &mut u64, unsent: &mut BTreeSet<u64>| {
        while *generated < total && due(*generated) <= Instant::now() {
            unsent.insert(*generated);
            *generated += 1;
        }
    };
    loop {
        generate(&mut generated, &mut unsent);
        if generated == total && unsent.is_empty() {
            break;
        }
        if Instant::now() >= give_up {
            break;
        }
        let name = format!("p{k}-{connections}");
        let opened = timeout(OP_TIMEOUT, async {
            let (mut cl, info) = c.open().await?;
            let s = cl.sender(&name, QUEUE, false).await?;
            Ok::<_, client::ClientError>((cl, s, info))
        })
        .await;
        let (cl, mut sender, info) = match opened {
            Ok(Ok(x)) => x,
            Ok(Err(e)) => {
                connect_failed(&t, Some(&e));
                sleep_until((Instant::now() + backoff).min(give_up)).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
            Err(_) => {
                connect_failed(&t, None);
                sleep_until((Instant::now() + backoff).min(give_up)).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        backoff = BACKOFF_MIN;
        connections += 1;
        {
            let mut g = tally(&t);
            g.producer_connects += 1;
            g.zero_rtt += info.zero_rtt as u64;
        }
        let mut in_flight: BTreeSet<u64> = BTreeSet::new();
        let mut outcomes = FuturesUnordered::new();
        let mut progress = Instant::now();
        // The outcomes of messages in flight do not resolve when the QUIC connection dies
        // (fe2o3's sender keeps their settlement channels): watch the connection itself.
        let dead = connection_gone(&info);
        tokio::pin!(dead);
        let end = loop {
            generate(&mut generated, &mut unsent);
            if generated == total && unsent.is_empty() && in_flight.is_empty() {
                break End::Done;
            }
            if Instant::now() >= give_up {
                break End::GaveUp;
            }
            let mut failed = false;
            while in_flight.len() < WINDOW {
                let Some(seq) = unsent.pop_first() else { break };
                match timeout(OP_TIMEOUT, sender.send_batchable(message(k, seq))).await {
                    Ok(Ok(fut)) => {
                        if in_flight.is_empty() {
                            progress = Instant::now();
                        }
                        attempts[seq as usize] += 1;
                        in_flight.insert(seq);
                        outcomes.push(async move { (seq, fut.await) });
                    }
                    _ => {
                        unsent.insert(seq);
                        failed = true;
                        break;
                    }
                }
            }
            if failed {
                break End::Failed;
            }
            let next = if generated < total {
                due(generated)
            } else {
                give_up
            };
            tokio::select! {
                biased;
                Some((seq, r)) = outcomes.next(), if !outcomes.is_empty() => {
                    in_flight.remove(&seq);
                    progress = Instant::now();
                    match r {
                        Ok(Settled::Accepted(_)) => {
                            let now = clock.s();
                            let mut g = tally(&t);
                            g.accepted.entry(format!("p{k}-{seq}")).or_insert(now);
                            g.accept_times.push(now);
                            g.ok[k].push(now);
                        }
                        Ok(_) => {
                            tally(&t).not_accepted += 1;
                            unsent.insert(seq);
                        }
                        Err(_) => {
                            unsent.insert(seq);
                            break End::Failed;
                        }
                    }
                }
                _ = sleep_until(next.min(give_up)) => {}
                _ = &mut dead => {
                    tally(&t).connections_lost += 1;
                    break End::Failed;
                }
                _ = sleep_until(progress + STALL), if !in_flight.is_empty() => {
                    tally(&t).stalls += 1;
                    break End::Failed;
                }
            }
        };
        drop(outcomes);
        unsent.extend(std::mem::take(&mut in_flight));
        match end {
            End::Done => {
                let _ = timeout(OP_TIMEOUT, sender.close()).await;
                let _ = timeout(OP_TIMEOUT, cl.close()).await;
                break;
            }
            End::Failed | End::GaveUp => {
                // Abandon the connection at once (a real producer would not wait on it).
                if let Some(q) = &info.quic {
                    q.close(0u32.into(), b"producer gave up on the connection");
                }
                drop(sender);
                drop(cl);
                if matches!(end, End::GaveUp) {
                    break;
                }
                sleep_until((Instant::now() + backoff).min(give_up)).await;
            }
        }
    }
    let mut g = tally(&t);
    g.offered += total;
    g.pending += unsent.len() as u64 + (total - generated);
    g.resent += attempts
        .iter()
        .map(|a| a.saturating_sub(1) as u64)
        .sum::<u64>();
}

/// Consumer (client index `k`): receives and accepts until `done`, except during `pause` (s):
/// then it takes nothing (what the broker already pushed waits in the link, unsettled).
pub(super) async fn consume(
    k: usize,
    c: Connector,
    clock: Clock,
    pause: (f64, f64),
    mut done: watch::Receiver<bool>,
    t: Shared,
) {
    let mut backoff = BACKOFF_MIN;
    let mut connections = 0u64;
    loop {
        if *done.borrow() {
            return;
        }
        let name = format!("c{k}-{connections}");
        let opened = tokio::select! {
                biased;
            r = timeout(OP_TIMEOUT, async {
                let (mut cl, info) = c.open().await?;
                let r = cl.receiver(&name, QUEUE, false, 100).await?;
                Ok::<_, client::ClientError>((cl, r, info))
            }) => r,
            _ = done.wait_for(|d| *d) => return,
        };
        let (cl, mut receiver, info) = match opened {
            Ok(Ok(x)) => x,
            r => {
                connect_failed(&t, r.ok().and_then(|r| r.err()).as_ref());
                tokio::select! {
                biased;
                    _ = sleep(backoff) => {}
                    _ = done.wait_for(|d| *d) => return,
                }
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        backoff = BACKOFF_MIN;
        connections += 1;
        {
            let mut g = tally(&t);
            g.consumer_connects += 1;
            g.zero_rtt += info.zero_rtt as u64;
        }
        let dead = connection_gone(&info);
        tokio::pin!(dead);
        let finished = loop {
            let now = clock.s();
            if now >= pause.0 && now < pause.1 {
                tokio::select! {
                    biased;
                    _ = sleep_until(clock.at(pause.1)) => continue,
                    _ = done.wait_for(|d| *d) => break true,
                    _ = &mut dead => break false,
                }
            }
            let d = tokio::select! {
                biased;
                d = receiver.recv::<Body<Value>>() => d,
                _ = done.wait_for(|d| *d) => break true,
                _ = &mut dead => break false,
            };
            let Ok(d) = d else { break false };
            let m = d.message();
            let id = match m.properties.as_ref().and_then(|p| p.message_id.as_ref()) {
                Some(MessageId::String(s)) => s.clone(),
                other => format!("{other:?}"),
            };
            let redelivered = m.header.as_ref().is_some_and(|h| h.delivery_count > 0);
            {
                let now = clock.s();
                let mut g = tally(&t);
                *g.deliveries.entry(id).or_insert(0) += 1;
                g.redeliveries += redelivered as u64;
                g.ok[k].push(now);
            }
            if !matches!(timeout(OP_TIMEOUT, receiver.accept(&d)).await, Ok(Ok(()))) {
                break false;
            }
        };
        if finished {
            let _ = timeout(OP_TIMEOUT, receiver.close()).await;
            let _ = timeout(OP_TIMEOUT, cl.close()).await;
            return;
        }
        if let Some(q) = &info.quic {
            q.close(0u32.into(), b"consumer gave up on the connection");
        }
        drop(receiver);
        drop(cl);
        tokio::select! {
                biased;
            _ = sleep(backoff) => {}
            _ = done.wait_for(|d| *d) => return,
        }
    }
}
