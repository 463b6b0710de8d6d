//! The relay: one thread per path direction moves packets from one namespace's TUN device
//! through a [`LinkModel`] into the other's, on the real clock.
//!
//! The loop is the link model's polling order (see `qgate_link::LinkModel`): finish what is due,
//! write what has arrived, read what is waiting, then sleep in `ppoll` until the next possible
//! delivery (`poll_delivery_timeout`), a packet or a control message. How late each write is
//! against the model's schedule is recorded, so a run on a busy machine says whether it can be
//! trusted. (That is the write side: a packet is stamped when the relay reads it, so time it
//! spent in the TUN's queue before the read is not seen; reads are prompt while the relay keeps
//! up, which the write lateness shows.)

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use qgate_aqm::{Packet, QueueStats};
use qgate_link::{LinkChange, LinkModel, LinkParams, LinkStats};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::config::Way;
use crate::ip::IpView;
use crate::tun::Tun;

/// The longest a relay sleeps without a deadline, so a stop is never missed for long.
const IDLE_WAIT: Duration = Duration::from_millis(100);
/// The real-time priority asked for (SCHED_FIFO), as `chrt -f 50` in the references.
const RT_PRIORITY: libc::c_int = 50;
/// Queue-delay samples the model keeps between two passes of the loop (drained every pass; a
/// pass after a long stall at gigabit rates dequeues thousands).
const SOJOURN_BATCH: usize = 1 << 20;
/// Packets read per pass at most, so a flood cannot keep the relay from writing, or from
/// seeing a stop.
const READ_BATCH: usize = 64;

/// What the controlling thread tells a relay.
#[derive(Default)]
struct Control {
    changes: Vec<LinkChange>,
    /// Start the statistics afresh (the end of a warm-up).
    restart_stats: bool,
}

/// A handle to a running relay thread.
pub struct RelayHandle {
    control: Arc<Mutex<Control>>,
    stop: Arc<AtomicBool>,
    wake: Arc<EventFd>,
    thread: std::thread::JoinHandle<RelayReport>,
}

impl RelayHandle {
    /// Apply a change to this direction's parameters as soon as the relay wakes (at once).
    pub fn change(&self, change: LinkChange) {
        self.control
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .changes
            .push(change);
        self.wake.signal();
    }

    /// Start the statistics afresh: the report then covers only what follows (a warm-up ends).
    pub fn restart_stats(&self) {
        self.control
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .restart_stats = true;
        self.wake.signal();
    }

    /// Stop the relay and collect its report.
    pub fn finish(self) -> RelayReport {
        self.stop.store(true, Ordering::SeqCst);
        self.wake.signal();
        self.thread.join().expect("relay thread panicked")
    }
}

/// What one direction measured.
pub struct RelayReport {
    /// Path number, from 1.
    pub path: usize,
    /// Which way.
    pub way: Way,
    /// The link's counters.
    pub stats: LinkStats,
    /// The queue discipline's counters.
    pub queue: QueueStats,
    /// Time in queue of each dequeued packet, µs.
    pub queue_delay_us: Histogram<u64>,
    /// How late each packet was written against the model's schedule, µs.
    pub lateness_us: Histogram<u64>,
    /// Why real-time priority is not in effect, if it is not.
    pub realtime: Result<(), String>,
    /// CPU time the thread used.
    pub cpu: Duration,
    /// How long the relay ran.
    pub elapsed: Duration,
    /// Packets the far namespace refused (write errors).
    pub write_errors: u64,
    /// The trace file's write error, if the trace could not be written.
    pub trace_error: Option<String>,
    /// Why the relay stopped early (its TUN device failed, e.g. was deleted), if it did.
    pub failure: Option<String>,
    /// Packets already queued, transmitting or on the wire when the statistics started (a
    /// warm-up's end; 0 without one).
    pub in_flight_at_start: usize,
    /// Packets still queued, transmitting or on the wire when the run ended. With the above:
    /// `in_flight_at_start + sent = delivered + the drops + in_flight_at_end`. (`delivered`
    /// counts packets the relay handed to the far TUN, `write_errors` among them.)
    pub in_flight_at_end: usize,
}

/// A Linux eventfd: the way to wake a relay sleeping in `ppoll`.
struct EventFd(libc::c_int);

impl EventFd {
    fn new() -> std::io::Result<EventFd> {
        // SAFETY: plain syscall; the fd is owned by the returned value.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(EventFd(fd))
    }

    fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64.
        unsafe { libc::write(self.0, (&one as *const u64).cast(), 8) };
    }

    fn clear(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a valid u64.
        unsafe { libc::read(self.0, (&mut v as *mut u64).cast(), 8) };
    }
}

impl Drop for EventFd {
    fn drop(&mut self) {
        // SAFETY: we own the fd.
        unsafe { libc::close(self.0) };
    }
}

/// Where a relay writes its per-packet trace.
pub type TraceSink = std::io::BufWriter<std::fs::File>;

/// Everything a relay thread needs.
pub struct RelaySpec {
    /// Path number, from 1.
    pub path: usize,
    /// Which way.
    pub way: Way,
    /// The link's parameters at the start.
    pub params: LinkParams,
    /// Seed of the loss and jitter draws (and the queue's).
    pub seed: u64,
    /// Read packets here…
    pub from: Arc<Tun>,
    /// … and write them here.
    pub to: Arc<Tun>,
    /// The run's time zero (trace times count from it).
    pub epoch: Instant,
    /// A per-packet trace, when asked for.
    pub trace: Option<TraceSink>,
    /// Ask for real-time priority.
    pub realtime: bool,
    /// Spin instead of sleeping this close to a scheduled delivery (zero: always sleep).
    pub spin: Duration,
}

/// Start a relay thread.
pub fn start(spec: RelaySpec) -> Result<RelayHandle, String> {
    let model = LinkModel::new(spec.params.clone(), spec.seed ^ 0x5eed)?;
    let control = Arc::new(Mutex::new(Control::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let wake = Arc::new(EventFd::new().map_err(|e| format!("eventfd: {e}"))?);
    let name = format!("linkem-p{}-{}", spec.path, spec.way.as_str());
    let thread = {
        let (control, stop, wake) = (control.clone(), stop.clone(), wake.clone());
        std::thread::Builder::new()
            .name(name)
            .spawn(move || run(spec, model, &control, &stop, &wake))
            .map_err(|e| format!("cannot start a relay thread: {e}"))?
    };
    Ok(RelayHandle {
        control,
        stop,
        wake,
        thread,
    })
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds")
}

/// SCHED_FIFO for this thread and a 1 ns timer slack, or why not.
fn go_realtime() -> Result<(), String> {
    // SAFETY: plain syscalls on the calling thread.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong);
        let param = libc::sched_param {
            sched_priority: RT_PRIORITY,
        };
        if libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) != 0 {
            return Err(format!(
                "SCHED_FIFO refused: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(())
}

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes into a valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn run(
    mut spec: RelaySpec,
    mut model: LinkModel<Vec<u8>>,
    control: &Mutex<Control>,
    stop: &AtomicBool,
    wake: &EventFd,
) -> RelayReport {
    let realtime = if spec.realtime {
        go_realtime()
    } else {
        Err("not asked for (--no-realtime)".into())
    };
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed);
    model.log_sojourns(SOJOURN_BATCH);
    model.observe(spec.trace.is_some());
    let mut queue_delay = histogram();
    let mut lateness = histogram();
    let mut write_errors = 0u64;
    let mut trace_error = None;
    let mut failure = None;
    let mut buf = vec![0u8; 65_536];
    let mut started = Instant::now();
    let mut baseline = LinkStats::default();
    let mut in_flight_at_start = 0;
    let mut cpu_base = thread_cpu();
    while !stop.load(Ordering::SeqCst) {
        let now = Instant::now();
        model.handle_timeout(now, &mut rng);
        let (changes, restart) = {
            let mut c = control.lock().unwrap_or_else(|e| e.into_inner());
            (
                std::mem::take(&mut c.changes),
                std::mem::take(&mut c.restart_stats),
            )
        };
        if restart {
            model.restart_peaks();
            baseline = model.stats();
            in_flight_at_start = model.in_flight();
            started = Instant::now();
            cpu_base = thread_cpu();
            queue_delay.reset();
            lateness.reset();
        }
        for c in changes {
            let mut p = model.params().clone();
            // Changes were validated before the run; a failure here would be a bug.
            if c.apply(&mut p).is_ok() {
                let _ = model.set_params(now, p);
            }
        }
        let now = Instant::now();
        model.handle_timeout(now, &mut rng);
        while let Some((at, mut packet)) = model.poll_deliver(now) {
            if packet.ecn == qgate_aqm::Ecn::Ce {
                IpView::new(&mut packet.payload[..]).set_ce();
            }
            if spec.to.write(&packet.payload).is_err() {
                write_errors += 1;
            }
            let late = Instant::now().saturating_duration_since(at);
            let _ = lateness.record((late.as_micros() as u64).max(1));
        }
        for _ in 0..READ_BATCH {
            match spec.from.read(&mut buf) {
                Ok(Some(n)) => {
                    let t = Instant::now();
                    model.handle_timeout(t, &mut rng);
                    let data = buf[..n].to_vec();
                    let view = IpView::new(&data[..]);
                    let mut p = Packet::new(n, view.flow(), Vec::new());
                    p.ecn = view.ecn();
                    p.payload = data;
                    model.send(t, p);
                }
                Ok(None) => break,
                Err(e) => {
                    failure = Some(format!("reading the TUN device failed: {e}"));
                    break;
                }
            }
        }
        if failure.is_some() {
            break;
        }
        let log = model.take_sojourns();
        for (_, d) in log.samples {
            let _ = queue_delay.record((d.as_micros() as u64).max(1));
        }
        if let Some(trace) = spec.trace.as_mut() {
            while let Some(e) = model.poll_event() {
                if trace_error.is_none() {
                    if let Err(err) = write_trace(trace, spec.epoch, &e) {
                        trace_error = Some(err.to_string());
                    }
                }
            }
        }
        let wait = match model.poll_delivery_timeout() {
            // Close enough to a delivery to spin (decision L12): go round again (the loop reads the TUN
            // without blocking, so arrivals are still stamped on time).
            Some(t) => match t.saturating_duration_since(Instant::now()) {
                w if w <= spec.spin => {
                    std::hint::spin_loop();
                    continue;
                }
                // Wake early by the spin and spin the rest.
                w => (w - spec.spin).min(IDLE_WAIT),
            },
            None => IDLE_WAIT,
        };
        let mut fds = [
            libc::pollfd {
                fd: spec.from.raw(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: wake.0,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let ts = libc::timespec {
            tv_sec: wait.as_secs() as libc::time_t,
            tv_nsec: wait.subsec_nanos() as libc::c_long,
        };
        // SAFETY: fds and ts are valid for the call.
        unsafe { libc::ppoll(fds.as_mut_ptr(), 2, &ts, std::ptr::null()) };
        if fds[1].revents != 0 {
            wake.clear();
        }
        if fds[0].revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
            // The device is gone: stop rather than spin on a descriptor that is always ready.
            failure = Some("the TUN device failed or disappeared".into());
            break;
        }
    }
    if let Some(mut t) = spec.trace.take() {
        use std::io::Write;
        if let Err(e) = t.flush() {
            trace_error.get_or_insert(e.to_string());
        }
    }
    RelayReport {
        path: spec.path,
        way: spec.way,
        stats: since(model.stats(), &baseline),
        queue: model.queue_stats(),
        queue_delay_us: queue_delay,
        lateness_us: lateness,
        realtime,
        cpu: thread_cpu().saturating_sub(cpu_base),
        elapsed: started.elapsed(),
        write_errors,
        trace_error,
        failure,
        in_flight_at_start,
        in_flight_at_end: model.in_flight(),
    }
}

/// Counters accumulated since `base` (the largest queue is the largest seen since the model's
/// peaks were restarted with it).
fn since(now: LinkStats, base: &LinkStats) -> LinkStats {
    LinkStats {
        sent: now.sent - base.sent,
        sent_bytes: now.sent_bytes - base.sent_bytes,
        delivered: now.delivered - base.delivered,
        delivered_bytes: now.delivered_bytes - base.delivered_bytes,
        dropped_loss: now.dropped_loss - base.dropped_loss,
        dropped_loss_bytes: now.dropped_loss_bytes - base.dropped_loss_bytes,
        dropped_queue: now.dropped_queue - base.dropped_queue,
        dropped_down: now.dropped_down - base.dropped_down,
        marked: now.marked - base.marked,
        max_queue_packets: now.max_queue_packets,
        max_queue_bytes: now.max_queue_bytes,
    }
}

/// The header of a per-direction trace file.
pub const TRACE_HEADER: &str = "at_ns,size,event,queue_packets,queue_bytes";

fn write_trace(
    w: &mut TraceSink,
    epoch: Instant,
    e: &qgate_link::LinkEvent,
) -> std::io::Result<()> {
    use std::io::Write;
    writeln!(
        w,
        "{},{},{},{},{}",
        e.at.saturating_duration_since(epoch).as_nanos(),
        e.size,
        e.event.as_str(),
        e.queue_packets,
        e.queue_bytes
    )
}
