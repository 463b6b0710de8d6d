//! `qgate history …` and opening the history store for the other commands.

use std::path::PathBuf;
use std::sync::Arc;

use clap::{Args, Subcommand};
use qgate_history::{Averaging, HistoryConfig, DEFAULT_EWMA_WEIGHT};
use qgate_transport::window_history::{system_clock, HistoryStore, DEFAULT_SAFEGUARD_FACTOR};

use crate::config::{Config, HistoryMode, HistorySection};
use crate::{usage, Failure};

/// The store of `qgate get`, `post` and `server`, under `$QGATE_HOME` (beside the dev PKI).
pub const STORE: &str = "history.redb";
/// The gateway's backhaul store, under `$QGATE_HOME` (decision H6).
pub const GATEWAY_STORE: &str = "gateway-history.redb";
/// `qgate device`'s store, under `$QGATE_HOME` (decision H6).
pub const DEVICE_STORE: &str = "device-history.redb";

/// The default store file: `$QGATE_HOME/history.redb`.
pub fn default_store() -> PathBuf {
    crate::home_file(STORE)
}

/// The history settings from the config file.
pub fn history_config(mode: HistoryMode, s: &HistorySection) -> Result<HistoryConfig, Failure> {
    let d = HistoryConfig::default();
    let c = HistoryConfig {
        averaging: match mode {
            HistoryMode::Mean => Averaging::Mean,
            _ => Averaging::Ewma {
                weight: s.ewma_weight.unwrap_or(DEFAULT_EWMA_WEIGHT),
            },
        },
        ceiling_bytes: s.ceiling_bytes.unwrap_or(d.ceiling_bytes),
        max_age_ms: s.max_age_s.map_or(d.max_age_ms, |x| x.saturating_mul(1000)),
        capacity: s.capacity.unwrap_or(d.capacity),
        seed_rtt: s.seed_rtt.unwrap_or(d.seed_rtt),
        resume: s.resume.unwrap_or(d.resume),
    };
    c.validate().map_err(|e| usage(format!("[history] {e}")))?;
    safeguard(s)?;
    Ok(c)
}

/// The safeguard factor (`None` = off): 0 or at least 1, since below 1 every connection would
/// look like a path change.
fn safeguard(s: &HistorySection) -> Result<Option<f64>, Failure> {
    let factor = s.safeguard.unwrap_or(DEFAULT_SAFEGUARD_FACTOR);
    if !(factor.is_finite() && (factor == 0.0 || factor >= 1.0)) {
        return Err(usage(format!(
            "[history] safeguard = {factor}: must be 0 (off) or a factor of at least 1"
        )));
    }
    Ok((factor > 0.0).then_some(factor))
}

/// An open store and its safeguard factor (`None` = safeguard off).
pub type OpenHistory = (Arc<HistoryStore>, Option<f64>);

/// Open the store if history is on (a corrupt file is moved aside with a warning).
pub fn open(
    mode: Option<HistoryMode>,
    store: Option<PathBuf>,
    cfg: &Config,
) -> Result<Option<OpenHistory>, Failure> {
    let mode = mode.or(cfg.history.mode).unwrap_or(HistoryMode::Off);
    if mode == HistoryMode::Off {
        return Ok(None);
    }
    let hc = history_config(mode, &cfg.history)?;
    let path = store
        .or(cfg.history.store.clone())
        .unwrap_or_else(default_store);
    let (store, warning) = HistoryStore::open(&path, hc, system_clock()).map_err(usage)?;
    if let Some(w) = warning {
        eprintln!("qgate: warning: {w}");
    }
    Ok(Some((store, safeguard(&cfg.history)?)))
}

/// History for a long-running service or a device, **on (EWMA) unless turned off** (decision H6):
/// the store defaults to `$QGATE_HOME/<file>`; if it cannot be opened (another process holds
/// it) the command warns and runs without history rather than failing.
pub fn open_default_on(
    mode: Option<HistoryMode>,
    store: Option<PathBuf>,
    cfg: &Config,
    file: &str,
) -> Option<OpenHistory> {
    let mode = mode.or(cfg.history.mode).unwrap_or(HistoryMode::Ewma);
    let path = store
        .or(cfg.history.store.clone())
        .unwrap_or_else(|| default_store().with_file_name(file));
    match open(Some(mode), Some(path), cfg) {
        Ok(h) => h,
        Err(f) => {
            eprintln!(
                "qgate: warning: running without congestion-window history: {:#}",
                f.error
            );
            None
        }
    }
}

#[derive(Args, Debug)]
pub struct HistoryArgs {
    #[arg(long, value_name = "FILE", global = true, help = format!(
        "The store file [default: $QGATE_HOME/{STORE}, the store of get, post and server; the \
         gateway keeps its own in {GATEWAY_STORE} and qgate device in {DEVICE_STORE}, beside it]"))]
    store: Option<PathBuf>,
    #[command(subcommand)]
    which: HistoryCmd,
}

#[derive(Subcommand, Debug)]
enum HistoryCmd {
    /// One line per peer: average window, samples, minimum RTT, the last connection's smoothed
    /// RTT (a new connection's initial RTT), the capacity estimate and the last connection's
    /// minimum RTT (careful resume's), last update.
    List,
    /// Everything recorded for one peer (as `list` prints it).
    Show {
        /// The peer key, e.g. `localhost@127.0.0.1:4433` (client side) or `10.0.0.7` (server).
        peer: String,
    },
    /// Forget every peer.
    Clear,
}

pub fn run(a: HistoryArgs, cfg: &Config) -> Result<(), Failure> {
    let path = a
        .store
        .or(cfg.history.store.clone())
        .unwrap_or_else(default_store);
    let hc = history_config(cfg.history.mode.unwrap_or(HistoryMode::Ewma), &cfg.history)?;
    let (store, warning) = HistoryStore::open(&path, hc, system_clock()).map_err(usage)?;
    if let Some(w) = warning {
        eprintln!("qgate: warning: {w}");
    }
    let now = store.now_ms();
    let line = |peer: &str, e: &qgate_history::Entry| {
        format!(
            "{peer}\tavg_cwnd={:.0} B\tsamples={}\tmin_rtt={:.3} ms\tlast_srtt={:.3} ms\tcapacity={:.0} B\trecent_min_rtt={:.3} ms\tupdated={:.0} s ago",
            e.avg_cwnd,
            e.count,
            e.min_rtt_us as f64 / 1000.0,
            e.srtt_us as f64 / 1000.0,
            e.capacity,
            e.recent_rtt_us as f64 / 1000.0,
            now.saturating_sub(e.updated_ms) as f64 / 1000.0
        )
    };
    match a.which {
        HistoryCmd::List => {
            let entries = store.entries();
            if entries.is_empty() {
                eprintln!("qgate: no history in {}", path.display());
            }
            for (peer, e) in entries {
                println!("{}", line(&peer, &e));
            }
        }
        HistoryCmd::Show { peer } => match store.get(&peer) {
            Some(e) => println!("{}", line(&peer, &e)),
            None => {
                return Err(usage(format!(
                    "no history for '{peer}' in {}",
                    path.display()
                )))
            }
        },
        HistoryCmd::Clear => {
            let n = store.clear().map_err(|e| anyhow::anyhow!("{e}"))?;
            println!("forgot {n} peers");
        }
    }
    Ok(())
}
