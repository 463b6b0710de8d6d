//! The plan file format: what a scenario is, as data (the book's "Plan files" chapter,
//! docs/book/src/lab/plans.md, documents it with a complete example). Every table refuses
//! unknown keys, so a typo is an error, not a default.

use qgate_netsim::topology::{Directions, LinkChange, Topology};
use serde::Deserialize;

/// A scenario: a network, what changes in it when, what runs on it, the variants to compare,
/// and the figures to draw.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// Name, description, seeds, duration.
    pub plan: Header,
    /// Hosts and links.
    #[serde(default)]
    pub topology: Topology,
    /// Timed changes of the network.
    #[serde(default)]
    pub timeline: Vec<Change>,
    /// What runs on the network.
    #[serde(default)]
    pub workloads: Vec<Workload>,
    /// Named variants compared against the first; none = one variant called "base".
    #[serde(default)]
    pub schemes: Vec<Scheme>,
    /// Parameters taken through lists of values: one `[sweep]` table, or several
    /// `[[sweep]]` tables run one after another (each from the base plan).
    #[serde(default, deserialize_with = "one_or_many")]
    pub sweep: Vec<Sweep>,
    /// Figures to draw.
    #[serde(default)]
    pub figures: Vec<Figure>,
}

/// The `[plan]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    /// A short name: the default results directory is `results/<name>`.
    pub name: String,
    /// What the scenario asks.
    #[serde(default)]
    pub description: String,
    /// Runs per scheme and point, seeds 1..=seeds.
    #[serde(default = "default_seeds")]
    pub seeds: u64,
    /// Simulated time per run, s: every workload stops by then.
    pub duration_s: f64,
    /// Metrics written to the summary tables (all when empty). Names are
    /// `<workload>.<metric>`, where `*` stands for any characters (`gw.path*_share`); the
    /// book's "Plan files" chapter lists each workload's metrics.
    #[serde(default)]
    pub metrics: Vec<String>,
    /// What `--quick` changes.
    #[serde(default)]
    pub quick: Quick,
}

fn default_seeds() -> u64 {
    3
}

/// `[plan.quick]`: a short smoke version of the plan.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Quick {
    /// Seeds (default 1).
    pub seeds: Option<u64>,
    /// Simulated time per run, s.
    pub duration_s: Option<f64>,
    /// Only these sweeps (by name).
    pub sweeps: Option<Vec<String>>,
    /// Only these points of each sweep (by position, from 0).
    pub sweep_points: Option<Vec<usize>>,
    /// Overrides, as a scheme's `set`.
    #[serde(default)]
    pub set: toml::Table,
}

/// One timed change (`[[timeline]]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Change {
    /// When, s from the start of the workloads.
    pub at_s: f64,
    /// The link to change (none: only a phase mark).
    pub link: Option<String>,
    /// New values for both directions …
    #[serde(default)]
    pub set: LinkChange,
    /// … and for one direction only (as a link's `a_to_b`).
    pub a_to_b: Option<LinkChange>,
    /// … (as a link's `b_to_a`).
    pub b_to_a: Option<LinkChange>,
    /// Samples from here on belong to this phase (metrics are also reported per phase).
    pub phase: Option<String>,
}

/// A named variant (`[[schemes]]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scheme {
    /// Its name in tables and legends.
    pub name: String,
    /// Overrides: `"path.to.key" = value`; array elements are addressed by their `name` (or
    /// position), and a table value merges into the table it replaces.
    #[serde(default)]
    pub set: toml::Table,
}

/// `[sweep]` or `[[sweep]]`; each table's own error passes through (an untagged enum would
/// hide it behind "did not match any variant").
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Sweep>, D::Error> {
    use serde::de::Error;
    match toml::Value::deserialize(d)? {
        toml::Value::Array(items) => items
            .into_iter()
            .map(|v| {
                v.try_into()
                    .map_err(|e: toml::de::Error| D::Error::custom(e.message()))
            })
            .collect(),
        v @ toml::Value::Table(_) => v
            .try_into()
            .map(|s| vec![s])
            .map_err(|e: toml::de::Error| D::Error::custom(e.message())),
        _ => Err(D::Error::custom(
            "'sweep' must be a table or an array of tables",
        )),
    }
}

/// `[sweep]`: the points every scheme runs at.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sweep {
    /// Its name in tables, CSV and file names (needed when there are several).
    #[serde(default = "default_sweep_name")]
    pub name: String,
    /// The x-axis label.
    pub label: String,
    /// Set this key to each of `values`.
    pub key: Option<String>,
    /// Values of `key`; each is also the point's x.
    #[serde(default)]
    pub values: Vec<toml::Value>,
    /// Or: points with their own x and overrides.
    #[serde(default)]
    pub points: Vec<Point>,
    /// Overrides every point of this sweep also applies, under its own (e.g. the other axis
    /// of a grid: one sweep per value of it).
    #[serde(default)]
    pub set: toml::Table,
}

fn default_sweep_name() -> String {
    "sweep".into()
}

/// One sweep point given in full.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Point {
    /// Its x value.
    pub x: f64,
    /// Its overrides.
    #[serde(default)]
    pub set: toml::Table,
}

/// A workload (`[[workloads]]`), by `kind`.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Workload {
    /// Gateway + ingest server + devices (paper 000).
    Gateway(GatewayLoad),
    /// QUIC bulk flows from sources to a sink (paper 004).
    Bulk(BulkLoad),
    /// Sized downloads, one new connection each, with window history (paper 002).
    Downloads(DownloadLoad),
    /// AMQP 1.0 senders and receivers through a broker, over QUIC or TCP+TLS (paper 003).
    Amqp(AmqpLoad),
    /// A multi-homed device uploads a file over several links at once (paper 001).
    Upload(UploadLoad),
}

impl Workload {
    /// Its name (metric prefix).
    pub fn name(&self) -> &str {
        match self {
            Workload::Gateway(w) => &w.name,
            Workload::Bulk(w) => &w.name,
            Workload::Downloads(w) => &w.name,
            Workload::Amqp(w) => &w.name,
            Workload::Upload(w) => &w.name,
        }
    }

    /// When it starts, s.
    pub fn start_s(&self) -> f64 {
        match self {
            Workload::Gateway(w) => w.start_s,
            Workload::Bulk(w) => w.start_s,
            Workload::Downloads(w) => w.start_s,
            Workload::Amqp(w) => w.start_s,
            Workload::Upload(w) => w.start_s,
        }
    }
}

/// Which devices are priority class 1.
fn default_priority() -> f64 {
    0.5
}

/// `kind = "gateway"`: the real server, gateway and devices.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayLoad {
    /// Metric prefix.
    pub name: String,
    /// Seconds after the start before the devices begin (setup happens before the start).
    #[serde(default)]
    pub start_s: f64,
    /// The gateway's host.
    pub gateway: String,
    /// The ingest server's host.
    pub server: String,
    /// Backhaul paths: links joining the gateway and server hosts, path 1 first.
    pub paths: Vec<String>,
    /// Scheduler: one of `qgate_forward::scheduler::SCHEDULERS` (the gateway's default when absent).
    pub scheduler: Option<String>,
    /// Give up on a request on one path after this long and retry on another, ms.
    pub request_timeout_ms: Option<f64>,
    /// Devices, each on its own access link to the gateway.
    pub devices: usize,
    /// Each device's access link.
    #[serde(default)]
    pub access: LinkChange,
    /// Fraction of devices in priority class 1 (0.5: every other device, from device 0), with
    /// `classes = "device"`.
    #[serde(default = "default_priority")]
    pub priority_fraction: f64,
    /// Which classes a device sends.
    #[serde(default)]
    pub classes: Classes,
    /// Bytes each device sends in all. Alone: closed loop, request after request (with
    /// `pipelining` in flight) until done.
    pub file_bytes: Option<u64>,
    /// Open loop: one request per device every this many ms, until `file_bytes` are sent (if
    /// given) or the run ends.
    pub interval_ms: Option<f64>,
    /// Request body bytes (records batched, decision X1).
    #[serde(default = "default_body")]
    pub body_bytes: usize,
    /// Requests each device keeps in flight (closed loop).
    #[serde(default = "one")]
    pub pipelining: usize,
    /// Each device starts after a random delay in [0, this) ms (seeded).
    #[serde(default = "default_jitter")]
    pub start_jitter_ms: f64,
    /// Backhaul connections start from their path's window history of earlier connections (a
    /// reconnection after a path came back), with the careful-resume safeguard: EWMA by
    /// default, as `qgate gateway` (decision H6).
    #[serde(default = "backhaul_history")]
    pub history: HistoryMode,
    /// The gateway's congestion controller: cubic (quinn's default), new-reno, bbr or auto
    /// (CUBIC until random loss dominates, then BBR; decision G16).
    pub congestion: Option<String>,
    /// QUIC connections per backhaul path (the gateway's default when absent; decision G21).
    pub connections_per_path: Option<usize>,
    /// The gateway keeps what no path can take in a spool (issue 50; a fresh one per run, in the
    /// system's temporary directory) and drains it when a path returns.
    #[serde(default)]
    pub spool: bool,
}

pub(crate) fn backhaul_history() -> HistoryMode {
    HistoryMode::Ewma
}

/// Which priority classes each device of a `gateway` workload sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Classes {
    /// One class per device, by `priority_fraction` (the proxy plan's default reading).
    #[default]
    Device,
    /// Both: every device registers a priority and a best-effort session on its one
    /// connection and alternates its requests between them, even-numbered devices starting
    /// with priority, odd ones with best effort (paper 000 §4.1: "each client sends both
    /// priority types").
    Both,
}

fn default_body() -> usize {
    16 * 1024
}
fn one() -> usize {
    1
}
fn default_jitter() -> f64 {
    10.0
}

/// `kind = "bulk"`: endless QUIC uploads from sources to a sink.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BulkLoad {
    /// Metric prefix.
    pub name: String,
    /// Start, s.
    #[serde(default)]
    pub start_s: f64,
    /// Existing source hosts (one flow each) …
    #[serde(default)]
    pub from: Vec<String>,
    /// … and/or this many new source hosts, each linked to `attach` by `access`.
    #[serde(default)]
    pub sources: usize,
    /// The host new sources attach to.
    pub attach: Option<String>,
    /// New sources' access links.
    #[serde(default)]
    pub access: LinkChange,
    /// The receiving host.
    pub sink: String,
    /// IP packet size, bytes (QUIC datagrams are 28 bytes less).
    #[serde(default = "default_packet")]
    pub packet_bytes: usize,
    /// The link whose queue is measured (queueing delay, drops, utilisation).
    pub measure: Option<String>,
    /// Its direction.
    #[serde(default = "a_to_b")]
    pub measure_direction: Directions,
    /// Statistics skip the first seconds (slow start).
    #[serde(default)]
    pub warmup_s: f64,
    /// Flow i starts at i × this many ms plus a random [0, this) ms.
    #[serde(default = "default_stagger")]
    pub stagger_ms: f64,
}

fn default_packet() -> usize {
    1440
}
fn a_to_b() -> Directions {
    Directions::AToB
}
fn default_stagger() -> f64 {
    10.0
}

/// Initial-window history modes (paper 002).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HistoryMode {
    /// quinn's default initial window.
    #[default]
    Off,
    /// History, arithmetic mean.
    Mean,
    /// History, EWMA.
    Ewma,
}

impl HistoryMode {
    /// The store's averaging, `None` when off (EWMA at the product's weight).
    pub fn averaging(self) -> Option<qgate_history::Averaging> {
        match self {
            HistoryMode::Off => None,
            HistoryMode::Mean => Some(qgate_history::Averaging::Mean),
            HistoryMode::Ewma => Some(qgate_history::HistoryConfig::default().averaging),
        }
    }
}

/// `kind = "downloads"`: a client fetches `bytes` from a server, run after run, each on a new
/// connection; the server's initial window comes from the client's history.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DownloadLoad {
    /// Metric prefix.
    pub name: String,
    /// Start, s.
    #[serde(default)]
    pub start_s: f64,
    /// The downloading host.
    pub client: String,
    /// The serving host.
    pub server: String,
    /// Bytes per download.
    pub bytes: u64,
    /// Downloads (the first has no history).
    pub runs: usize,
    /// Download k starts at k × this many s (or when the previous one has drained, if later).
    #[serde(default = "default_interval")]
    pub interval_s: f64,
    /// Initial-window scheme.
    #[serde(default)]
    pub history: HistoryMode,
    /// Careful-resume safeguard (decision H5).
    #[serde(default)]
    pub safeguard: bool,
    /// With history on, start each connection's RTT estimate from the client's last smoothed
    /// RTT (decision H8); `false` is paper 002's window-only scheme.
    #[serde(default = "default_seed_rtt")]
    pub seed_rtt: bool,
    /// With history on, how a connection uses it: `window` (paper 002) or `careful` (RFC 9959
    /// careful resume, decision H9; its RTT check uses the safeguard's factor when
    /// `safeguard`, else RFC 9959's 10×).
    #[serde(default)]
    pub resume: qgate_history::Resume,
}

fn default_interval() -> f64 {
    2.0
}

/// The product's default (`HistoryConfig`), read from there.
pub(crate) fn default_seed_rtt() -> bool {
    qgate_history::HistoryConfig::default().seed_rtt
}

/// The transport under AMQP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AmqpTransport {
    /// One QUIC bidirectional stream per AMQP connection; 0-RTT once a ticket is held.
    #[default]
    Quic,
    /// Every AMQP connection a stream of one long-lived QUIC connection (quic-mux).
    QuicMux,
    /// TCP + TLS 1.3 (the user-space TCP on the simulated network).
    TcpTls13,
    /// TCP + TLS 1.2 (paper 003's baseline).
    TcpTls12,
}

impl AmqpTransport {
    /// AMQP rides on QUIC.
    pub fn is_quic(self) -> bool {
        matches!(self, AmqpTransport::Quic | AmqpTransport::QuicMux)
    }
}

/// How the sender's messages map to connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AmqpConnections {
    /// Each message on a new connection, pipelined with its opening (paper 003 §4.1, §4.3).
    #[default]
    PerMessage,
    /// All messages on one connection, each sent once the one before is accepted (§4.2).
    One,
}

/// A radio's supply voltage and currents, for the energy a device spends on its link
/// (paper 003 §3.2). The defaults are ns-3's `WifiRadioEnergyModel` at 3 V (EXPERIMENTS.md,
/// *decided*).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Radio {
    /// Volts.
    pub volts: f64,
    /// Amperes while transmitting.
    pub tx_amps: f64,
    /// Amperes while receiving.
    pub rx_amps: f64,
    /// Amperes otherwise (the Wi-Fi radio listens; it does not sleep without power save).
    pub idle_amps: f64,
}

impl Default for Radio {
    fn default() -> Radio {
        Radio {
            volts: 3.0,
            tx_amps: 0.38,
            rx_amps: 0.313,
            idle_amps: 0.273,
        }
    }
}

/// `kind = "amqp"`: a sender puts messages on a queue of the real broker, then (optionally) a
/// receiver takes them off, each on its own host and link.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AmqpLoad {
    /// Metric prefix.
    pub name: String,
    /// Start, s.
    #[serde(default)]
    pub start_s: f64,
    /// The broker's host.
    pub broker: String,
    /// The sending host (its link toward the broker is the radio measured).
    pub sender: String,
    /// The receiving host, which takes every accepted message once the sender is done (none:
    /// no receiver).
    pub receiver: Option<String>,
    /// Transport under AMQP.
    #[serde(default)]
    pub transport: AmqpTransport,
    /// QUIC path-MTU discovery at both ends (QUIC only).
    #[serde(default = "yes")]
    pub mtu_discovery: bool,
    /// Both ends use the constrained-link QUIC profile: they know the device's radio rate
    /// (the sender's link toward the broker, as it is when the workload starts; the broker
    /// is configured for its devices' radio) and assume an initial RTT no shorter than the
    /// handshake takes to serialise on it (decision T6), and neither probes for a larger MTU
    /// (QUIC only).
    #[serde(default)]
    pub constrained: bool,
    /// Both ends ask the other to acknowledge only after more than this many ack-eliciting
    /// packets (transport option `ack_eliciting_threshold`, decision T9; QUIC only). Unset:
    /// the transport's own default, which the constrained profile raises.
    pub ack_eliciting_threshold: Option<u32>,
    /// Each client keeps a history of its connections to the broker (as `qgate device` does,
    /// decision H6): a new connection starts from its window and last smoothed RTT (H8),
    /// with the safeguard on (QUIC only).
    #[serde(default)]
    pub history: bool,
    /// Messages to send.
    pub messages: usize,
    /// One connection per message or one for all (the receiver uses one per message).
    #[serde(default)]
    pub connections: AmqpConnections,
    /// Body bytes of each message (paper 003 §4.3's sample message: 138).
    #[serde(default = "default_amqp_body")]
    pub body_bytes: usize,
    /// A connection that takes longer than this fails, s.
    #[serde(default = "default_amqp_timeout")]
    pub timeout_s: f64,
    /// The radio energy model.
    #[serde(default)]
    pub radio: Radio,
}

fn yes() -> bool {
    true
}
/// Paper 003 §4.3's sample message size, the default body (*decided*: every case uses it).
pub const DEFAULT_AMQP_BODY: usize = 138;

fn default_amqp_body() -> usize {
    DEFAULT_AMQP_BODY
}
fn default_amqp_timeout() -> f64 {
    300.0
}

/// `kind = "upload"`: a device with several links uploads a file to the ingest server with
/// `qgate upload`'s code (one QUIC connection per link, chunks from both ends, paper 001).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UploadLoad {
    /// Metric prefix.
    pub name: String,
    /// Start, s.
    #[serde(default)]
    pub start_s: f64,
    /// The uploading host.
    pub device: String,
    /// The receiving host (the ingest server).
    pub server: String,
    /// The device's links, one connection each in this order: the first sends the file from
    /// its start, the second from its end (one link: a single-path upload).
    pub paths: Vec<String>,
    /// File size, bytes.
    pub bytes: u64,
    /// Chunk size, bytes.
    #[serde(default = "default_chunk")]
    pub chunk_bytes: u64,
    /// The server's QUIC receive window per connection, bytes: the receive buffer of paper
    /// 001 Fig. 4 (default: the transport's).
    pub receive_window: Option<u64>,
    /// The device's QUIC send window per connection, bytes: Fig. 5's send buffer.
    pub send_window: Option<u64>,
    /// Where the lanes meet, a lane with nothing left takes over another's queued chunks
    /// (decision U6); off is paper 001's literal scheme.
    #[serde(default = "yes")]
    pub steal: bool,
    /// Each lane has the next lane's link as its backup and migrates there when its own
    /// stalls (decision U7).
    #[serde(default = "yes")]
    pub backup: bool,
    /// Paper 001's baseline instead of `qgate upload`: one multipath QUIC connection (noq)
    /// with a path on each link, the file as one stream reassembled in the server's receive
    /// window (decision U9).
    #[serde(default)]
    pub conventional: bool,
}

fn default_chunk() -> u64 {
    qgate_chunks::DEFAULT_CHUNK
}

/// What a figure shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FigureKind {
    /// A metric's mean over the sweep, one line per scheme, 95 % confidence band.
    Lines,
    /// A metric's mean per scheme (and point), 95 % confidence interval bars.
    Bars,
    /// A per-second series, mean over seeds per scheme, min–max band.
    Series,
    /// The distribution of a sampled metric, all seeds pooled, per scheme.
    Cdf,
}

/// `[[figures]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Figure {
    /// What to draw.
    pub kind: FigureKind,
    /// `<workload>.<metric>` (a summary metric, a series or a sample).
    pub metric: String,
    /// Title (default: the metric).
    pub title: Option<String>,
    /// File name without `.svg` (default: kind and metric).
    pub file: Option<String>,
    /// Logarithmic y axis (default: when the values span more than two decades).
    pub log_y: Option<bool>,
    /// Only this sweep's points (default: all; `lines` draws one figure per sweep).
    pub sweep: Option<String>,
}
