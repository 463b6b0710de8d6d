//! Real-time link emulation for any program (Linux, root): `qgate-lab linkem`.
//!
//! A run makes two network namespaces, *inside* (where COMMAND runs) and *outside* (where an
//! optional server runs), joined by one TUN pair per path. A relay thread per path direction
//! moves every packet through the same [`qgate_link::LinkModel`] the simulator uses (rate,
//! delay, jitter, loss, any of the six queue disciplines), on the real clock, as Mahimahi does.
//! Kernel TCP, Linux MPTCP and any QUIC stack run across it unchanged. The namespaces are
//! removed when the run ends, however it ends (short of SIGKILL; a later run removes those).

pub mod config;
mod ip;
pub mod netns;
mod relay;
pub mod report;
mod tun;

use std::process::{Child, Command};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use config::{LinkemConfig, PathConfig, TimedChange, Way};
pub use relay::RelayReport;

use crate::netns::Namespaces;
use crate::relay::{RelayHandle, RelaySpec};
use crate::tun::Tun;

/// Why a run could not start or finish.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration is invalid; the message names the problem.
    #[error("{0}")]
    Config(String),
    /// Not running as root.
    #[error(
        "qgate-lab linkem needs root: it creates network namespaces and TUN devices (run it with sudo)"
    )]
    NotRoot,
    /// No TUN support.
    #[error("no /dev/net/tun: this kernel has no TUN support loaded (try 'modprobe tun')")]
    NoTun,
    /// A system step failed.
    #[error("{0}")]
    Setup(String),
}

/// How a run ended.
pub struct Outcome {
    /// COMMAND's exit code (128 + signal if a signal ended it).
    pub exit_code: i32,
    /// The signal that stopped linkem itself (Ctrl-C, SIGTERM), if one did.
    pub interrupted_by: Option<i32>,
    /// What each path direction measured, path 1 uplink first.
    pub reports: Vec<RelayReport>,
    /// Why the CSV files could not be written, if they could not (the run itself stands).
    pub csv_error: Option<String>,
    /// The outside command's exit status, if it ended before COMMAND did (a server that
    /// failed to start, usually).
    pub outside_ended_early: Option<i32>,
}

/// Where a program name resolves on PATH (or the path given), if it exists and is executable.
fn find_program(name: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &std::path::Path| {
        p.metadata()
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    if name.contains('/') {
        return executable(std::path::Path::new(name));
    }
    std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).any(|d| executable(&d.join(name))))
        .unwrap_or(false)
}

/// A child that dies with linkem, even if linkem is SIGKILLed. (The signal follows the thread
/// that spawned the child: linkem spawns from the thread that runs the emulation, which lives
/// until the end.)
fn die_with_parent(c: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe and touches only the child being started.
    unsafe {
        let parent = libc::getpid();
        c.pre_exec(move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
            // linkem may have died between fork and prctl: then nothing would ever come.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

/// The last termination signal received (0 = none).
static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNAL.store(sig, Ordering::SeqCst);
}

/// Catch SIGINT, SIGTERM and SIGHUP so the run can end cleanly (and remove its namespaces).
fn catch_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores into an atomic, which is async-signal-safe.
        unsafe {
            libc::signal(sig, on_signal as *const () as libc::sighandler_t);
        }
    }
}

/// Check the machine can run an emulation at all, with an error a user can act on.
pub fn preflight() -> Result<(), Error> {
    // SAFETY: plain syscall.
    if unsafe { libc::geteuid() } != 0 {
        return Err(Error::NotRoot);
    }
    if !std::path::Path::new("/dev/net/tun").exists() {
        return Err(Error::NoTun);
    }
    Command::new("ip")
        .arg("-V")
        .output()
        .map_err(|e| Error::Setup(format!("cannot run 'ip' (install iproute2): {e}")))?;
    Ok(())
}

/// The environment a side's program gets: its own and the far side's address on each path.
fn environment(paths: usize, inside: bool) -> Vec<(String, String)> {
    let (me, peer) = if inside { (1, 2) } else { (2, 1) };
    let mut env = vec![("QGATE_LINKEM_PATHS".to_string(), paths.to_string())];
    for path in 1..=paths {
        let suffix = if path == 1 {
            String::new()
        } else {
            format!("_{path}")
        };
        env.push((
            format!("QGATE_LINKEM_PEER{suffix}"),
            netns::address(path, peer).to_string(),
        ));
        env.push((
            format!("QGATE_LINKEM_ADDR{suffix}"),
            netns::address(path, me).to_string(),
        ));
    }
    env
}

/// Sleep up to `d`, returning early (false) when a signal arrives.
fn sleep_unless_signalled(d: Duration) -> bool {
    let until = Instant::now() + d;
    while Instant::now() < until {
        if SIGNAL.load(Ordering::SeqCst) != 0 {
            return false;
        }
        std::thread::sleep((until - Instant::now()).min(Duration::from_millis(10)));
    }
    true
}

/// Send `sig` to a child's process group (the outside command) or to the child alone.
fn kill(child: &Child, sig: libc::c_int, group: bool) {
    let pid = child.id() as libc::pid_t;
    // SAFETY: signalling a process we started.
    unsafe {
        if group {
            libc::killpg(pid, sig);
        } else {
            libc::kill(pid, sig);
        }
    }
}

/// Stop a child: `sig`, then SIGKILL if it has not exited within `grace`.
fn stop(child: &mut Child, sig: libc::c_int, group: bool, grace: Duration) -> Option<i32> {
    if let Ok(Some(s)) = child.try_wait() {
        return Some(exit_code(s));
    }
    kill(child, sig, group);
    let until = Instant::now() + grace;
    while Instant::now() < until {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(exit_code(s));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    kill(child, libc::SIGKILL, group);
    child.wait().ok().map(exit_code)
}

fn exit_code(s: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    s.code()
        .unwrap_or_else(|| 128 + s.signal().unwrap_or(libc::SIGKILL))
}

/// Relays, namespaces and the outside command of a running emulation. Dropping it stops the
/// outside command and removes the namespaces.
struct Running {
    relays: Vec<RelayHandle>,
    outside: Option<Child>,
    // Dropped last: the devices go with the namespaces.
    ns: Namespaces,
}

impl Running {
    fn finish(mut self) -> Vec<RelayReport> {
        if let Some(mut o) = self.outside.take() {
            stop(&mut o, libc::SIGTERM, true, Duration::from_secs(2));
        }
        self.relays.drain(..).map(RelayHandle::finish).collect()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut o) = self.outside.take() {
            stop(&mut o, libc::SIGTERM, true, Duration::from_secs(2));
        }
        for r in self.relays.drain(..) {
            r.finish();
        }
    }
}

/// Run COMMAND inside an emulation described by `cfg`, and report.
pub fn run(cfg: &LinkemConfig, command: &[String]) -> Result<Outcome, Error> {
    cfg.validate().map_err(Error::Config)?;
    if command.is_empty() {
        return Err(Error::Config(
            "no COMMAND: give the program to run after '--' (e.g. qgate-lab linkem --link \
             rate=10mbit,delay=25ms -- ping 10.77.1.2)"
                .into(),
        ));
    }
    if command[0].is_empty() || !find_program(&command[0]) {
        return Err(Error::Config(format!(
            "COMMAND '{}' is not an executable program (not found on PATH?)",
            command[0]
        )));
    }
    if let Some(dir) = &cfg.out {
        // Checked before the run, so a long experiment does not lose its results at the end.
        std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::write(dir.join("counters.csv"), ""))
            .map_err(|e| {
                Error::Config(format!("--out {}: cannot write there: {e}", dir.display()))
            })?;
    }
    preflight()?;
    catch_signals();
    let paths = cfg.paths.len();
    let ns = Namespaces::create(paths)?;
    let epoch = Instant::now();
    let mut running = Running {
        relays: Vec::new(),
        outside: None,
        ns,
    };
    for (i, path_cfg) in cfg.paths.iter().enumerate() {
        let path = i + 1;
        let dev = netns::device(path);
        let inside = Arc::new(Tun::open_in(&running.ns.inside, &dev)?);
        let outside = Arc::new(Tun::open_in(&running.ns.outside, &dev)?);
        for way in Way::BOTH {
            let (from, to) = match way {
                Way::Uplink => (inside.clone(), outside.clone()),
                Way::Downlink => (outside.clone(), inside.clone()),
            };
            let trace = match (&cfg.out, cfg.trace) {
                (Some(dir), true) => {
                    let file = dir.join(format!("trace-p{path}-{}.csv", way.as_str()));
                    let mut w =
                        std::io::BufWriter::new(std::fs::File::create(&file).map_err(|e| {
                            Error::Setup(format!("cannot create {}: {e}", file.display()))
                        })?);
                    use std::io::Write;
                    writeln!(w, "{}", relay::TRACE_HEADER)
                        .map_err(|e| Error::Setup(e.to_string()))?;
                    Some(w)
                }
                _ => None,
            };
            let seed = cfg
                .seed()
                .wrapping_add((path as u64) * 2 + u64::from(way == Way::Downlink))
                .wrapping_mul(0x9e37_79b9_7f4a_7c15);
            running.relays.push(
                relay::start(RelaySpec {
                    path,
                    way,
                    params: path_cfg.params(way).map_err(Error::Config)?,
                    seed,
                    from,
                    to,
                    epoch,
                    trace,
                    realtime: !cfg.no_realtime,
                    spin: cfg.spin().map_err(Error::Config)?,
                })
                .map_err(Error::Setup)?,
            );
        }
    }
    if let Some(cmd) = &cfg.outside {
        use std::os::unix::process::CommandExt;
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &running.ns.outside, "sh", "-c", cmd])
            .envs(environment(paths, false))
            // COMMAND reads standard input, not the server.
            .stdin(std::process::Stdio::null())
            .process_group(0);
        die_with_parent(&mut c);
        let child = c
            .spawn()
            .map_err(|e| Error::Setup(format!("cannot start the outside command: {e}")))?;
        running.outside = Some(child);
        sleep_unless_signalled(cfg.settle().map_err(Error::Config)?);
    }
    let mut timeline: Vec<(Duration, &TimedChange)> = cfg
        .timeline
        .iter()
        .map(|t| Ok((t.at()?, t)))
        .collect::<Result<_, String>>()
        .map_err(Error::Config)?;
    timeline.sort_by_key(|(at, _)| *at);
    let mut next_change = 0;
    let mut interrupted_by = None;
    let mut outside_ended_early = None;
    let exit_code = if SIGNAL.load(Ordering::SeqCst) != 0 {
        interrupted_by = Some(SIGNAL.load(Ordering::SeqCst));
        128 + interrupted_by.unwrap_or(0)
    } else {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &running.ns.inside])
            .args(command)
            .envs(environment(paths, true));
        die_with_parent(&mut c);
        let mut child = c
            .spawn()
            .map_err(|e| Error::Setup(format!("cannot start '{}': {e}", command[0])))?;
        let start = Instant::now();
        let mut warmup = cfg.warmup().map_err(Error::Config)?;
        loop {
            if warmup.is_some_and(|w| start.elapsed() >= w) {
                for r in &running.relays {
                    r.restart_stats();
                }
                warmup = None;
            }
            let sig = SIGNAL.load(Ordering::SeqCst);
            if sig != 0 {
                interrupted_by = Some(sig);
                break stop(&mut child, sig, false, Duration::from_secs(5)).unwrap_or(128 + sig);
            }
            if let Ok(Some(status)) = child.try_wait() {
                break exit_code(status);
            }
            if outside_ended_early.is_none() {
                if let Some(Ok(Some(status))) = running.outside.as_mut().map(|o| o.try_wait()) {
                    let code = exit_code(status);
                    eprintln!("linkem: the outside command ended early (status {code})");
                    outside_ended_early = Some(code);
                }
            }
            while let Some((at, t)) = timeline.get(next_change) {
                if start.elapsed() < *at {
                    break;
                }
                let change = t.change.change().map_err(Error::Config)?;
                for way in t.ways() {
                    let index = (t.path - 1) * 2 + usize::from(*way == Way::Downlink);
                    running.relays[index].change(change.clone());
                }
                next_change += 1;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let reports = running.finish();
    // Handled: the next run in this process (a lab's) starts with no signal pending.
    SIGNAL.store(0, Ordering::SeqCst);
    let csv_error = cfg.out.as_ref().and_then(|dir| {
        report::write_csv(dir, &reports)
            .err()
            .map(|e| format!("cannot write results to {}: {e}", dir.display()))
    });
    Ok(Outcome {
        exit_code,
        interrupted_by,
        reports,
        csv_error,
        outside_ended_early,
    })
}

/// The traffic tools the accuracy tests and the kernel-flow labs run on either side of an
/// emulation (Python 3; `python3 traffic.py --help` lists them).
pub const TRAFFIC_PY: &str = include_str!("../tools/traffic.py");
