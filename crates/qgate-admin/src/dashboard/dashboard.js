// The qgate admin dashboard: polls the daemon's JSON API once a second and draws what it finds
// (the gateway's paths, per-class delay and spool, the broker's queues, the server's ingest rate).
"use strict";
const HISTORY = 120; // samples kept for the charts (two minutes)
const $ = (id) => document.getElementById(id);
const el = (tag, attrs = {}, text) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
};

function headers() {
  const t = sessionStorage.getItem("qgate-token");
  return t ? { Authorization: "Bearer " + t } : {};
}

async function api(path) {
  const r = await fetch(path, { headers: headers(), cache: "no-store" });
  if (r.status === 401) {
    $("login").style.display = "block";
    throw new Error("the token is missing or wrong");
  }
  if (!r.ok) throw new Error(path + ": " + r.status);
  return r.json();
}

$("login").addEventListener("submit", (e) => {
  e.preventDefault();
  sessionStorage.setItem("qgate-token", $("token").value.trim());
  $("login").style.display = "none";
});

function fmt(v, digits = 1) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "number" && !Number.isInteger(v)) return v.toFixed(digits);
  return String(v);
}

// A table whose rows are replaced on each refresh; `cls` gives a row its class.
function table(id, cols, rows, cls) {
  const t = el("table", { id });
  const head = el("tr");
  for (const [, label] of cols) head.append(el("th", {}, label));
  const thead = el("thead");
  thead.append(head);
  t.append(thead);
  const body = el("tbody");
  for (const r of rows) {
    const tr = el("tr", cls ? { class: cls(r) } : {});
    for (const [key, , klass] of cols) tr.append(el("td", klass ? { class: klass } : {}, fmt(typeof key === "function" ? key(r) : r[key])));
    body.append(tr);
  }
  t.append(body);
  const wrap = el("div", { class: "scroll" });
  wrap.append(t);
  return wrap;
}

// Lines over the last samples: series = [{name, color, values}].
function chart(series, unit) {
  const w = 600, h = 150, pad = 4;
  const all = series.flatMap((s) => s.values).filter((v) => v !== null && isFinite(v));
  const max = Math.max(1e-9, ...all);
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  svg.setAttribute("preserveAspectRatio", "none");
  for (const s of series) {
    const pts = s.values
      .map((v, i) => (v === null ? null : `${(i / (HISTORY - 1)) * w},${h - pad - (v / max) * (h - 2 * pad)}`))
      .filter(Boolean)
      .join(" ");
    const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
    line.setAttribute("points", pts);
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", s.color);
    line.setAttribute("stroke-width", "2");
    line.setAttribute("vector-effect", "non-scaling-stroke");
    svg.append(line);
  }
  const legend = el("div", { class: "legend" });
  for (const s of series) {
    const last = s.values[s.values.length - 1];
    const item = el("span");
    item.append(el("i", { style: `background:${s.color}` }), `${s.name} ${fmt(last)} ${unit}`);
    legend.append(item);
  }
  legend.append(el("span", {}, `(max ${fmt(max)} ${unit})`));
  const box = el("div");
  box.append(svg, legend);
  return box;
}

function panel(id, title, ...content) {
  let s = $(id);
  if (!s) {
    s = el("section", { id });
    $("panels").append(s);
  }
  s.replaceChildren(el("h2", {}, title), ...content);
}

// Per-second rates from two samples of a counter.
const series = {};
function push(name, v) {
  const a = (series[name] ||= []);
  a.push(v);
  if (a.length > HISTORY) a.shift();
  while (a.length < HISTORY) a.unshift(null);
  return a;
}
let last = null;
function rate(now, key, value) {
  const prev = last && last.values[key];
  const dt = last ? (now - last.at) / 1000 : 0;
  return prev === undefined || dt <= 0 ? null : Math.max(0, (value - prev) / dt);
}

async function gateway(now, values) {
  const [paths, delay, sched] = await Promise.all([api("/api/paths"), api("/api/delay"), api("/api/scheduler")]);
  panel("gw-paths", `Backhaul paths · scheduler ${sched.name}`,
    table("paths", [["id", "path"], [(p) => (p.up ? "up" : "down"), "state", "state"], ["rtt_ms", "RTT ms"], ["quic_rtt_ms", "QUIC RTT ms"], ["hits", "devices"], ["requests", "requests"], ["connections", "connections"], ["loss", "loss"]],
      paths, (p) => (p.up ? "up" : "down")));
  const lines = [];
  for (const [cls, color] of [["priority", "#c5221f"], ["best_effort", "#1a73e8"]]) {
    const d = delay[cls];
    values[cls + ".sum"] = d.sum_s;
    values[cls + ".n"] = d.count;
    const dn = rate(now, cls + ".n", d.count), ds = rate(now, cls + ".sum", d.sum_s);
    lines.push({ name: cls.replace("_", "-"), color, values: push("delay." + cls, dn ? (ds / dn) * 1000 : null) });
  }
  panel("gw-delay", "Response delay per class (mean each second)", chart(lines, "ms"));
  await spool();
}

// The gateway's spool, if it has one (a gateway without answers 404: asked once).
let hasSpool = true;
async function spool() {
  if (!hasSpool) return;
  let s;
  try {
    s = await api("/api/spool");
  } catch (e) {
    hasSpool = false;
    return;
  }
  const rows = [["priority", s.priority], ["best-effort", s.best_effort]].map(([name, c]) => ({
    class: name,
    records: c.held.records,
    bytes: c.held.bytes,
    in_flight: c.in_flight,
    oldest_s: c.oldest_at_ms ? Math.max(0, (s.now_ms - c.oldest_at_ms) / 1000) : null,
  }));
  const held = rows.reduce((a, r) => a + r.records, 0);
  panel("gw-spool", s.unavailable ? `Spool · off: ${s.unavailable}` : `Spool · ${s.dir}`,
    table("spool", [["class", "class"], ["records", "records"], ["bytes", "bytes"], ["in_flight", "in flight"], ["oldest_s", "oldest, s"]], rows),
    chart([{ name: "held", color: "#e37400", values: push("spool", held) }], "records"));
}

async function broker(now, values) {
  const queues = (await api("/api/queues?limit=200")).queues;
  panel("br-queues", "Queues", table("queues", [["name", "queue"], ["depth", "depth"], ["ready", "ready"], ["unacked", "unacked"], ["in_per_s", "in/s"], ["out_per_s", "out/s"]], queues));
  const depth = queues.reduce((a, q) => a + q.depth, 0);
  const enq = queues.reduce((a, q) => a + q.enqueued, 0), acked = queues.reduce((a, q) => a + q.acked, 0);
  values.enq = enq;
  values.acked = acked;
  panel("br-rates", "Messages per second (all queues)", chart([
    { name: "in", color: "#1a73e8", values: push("in", rate(now, "enq", enq)) },
    { name: "out", color: "#137333", values: push("out", rate(now, "acked", acked)) },
  ], "/s"), chart([{ name: "held", color: "#e37400", values: push("depth", depth) }], "messages"));
}

async function server(now, values) {
  const s = await api("/api/stats");
  values.ingested = s.ingest.ingested;
  const sink = s.sink ? [{ sink: "queue", up: s.sink.up ? "up" : "down", accepted: s.sink.accepted, failed: s.sink.failed }] : [];
  panel("sv-ingest", "Ingest rate", chart([{ name: "stored", color: "#1a73e8", values: push("ingest", rate(now, "ingested", s.ingest.ingested)) }], "/s"),
    table("ingest", [["ingested", "stored"], ["ingested_bytes", "bytes"], ["duplicates", "duplicates"], ["errors", "errors"]], [s.ingest]),
    ...(sink.length ? [table("sink", [["sink", "sink"], ["up", "state", "state"], ["accepted", "accepted"], ["failed", "failed"]], sink, (r) => r.up)] : []));
}

let kind = null;
let ticks = 0;
async function refresh() {
  try {
    if (!kind) {
      const routes = (await api("/api")).map((r) => r.path);
      kind = routes.includes("paths") ? "gateway" : routes.includes("queues") ? "broker" : "server";
      $("title").textContent = "qgate " + kind;
      document.title = "qgate " + kind;
    }
    const now = Date.now();
    const values = {};
    await { gateway, broker, server }[kind](now, values);
    last = { at: now, values };
    $("ticks").textContent = String(++ticks);
    $("updated").textContent = new Date(now).toLocaleTimeString();
    $("error").textContent = "";
  } catch (e) {
    $("error").textContent = String(e.message || e);
  }
}
refresh();
setInterval(refresh, 1000);
