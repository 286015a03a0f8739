// forkbox dashboard: polls the Connect JSON API and /metrics (same origin,
// session cookie) and draws tables, the fork tree, a ledger timeline and
// small SVG charts. No framework, no external resources.
"use strict";

const POLL_MS = 2000;
const HISTORY = 60; // samples kept per chart
let selected = null; // sandbox id whose ledger is shown
const history = new Map(); // chart key -> [numbers]
let prevCounters = null; // {time, values} of the last scrape, for rates

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else if (k === "onclick") e.addEventListener("click", v);
    else e.setAttribute(k, v);
  }
  for (const k of kids) {
    if (k == null) continue;
    e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  }
  return e;
}

async function rpc(service, method, body) {
  const r = await fetch("/forkbox.v1." + service + "/" + method, {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-Forkbox-UI": "1" },
    body: JSON.stringify(body || {}),
  });
  const j = await r.json().catch(() => ({}));
  if (!r.ok) {
    const err = new Error((j.message || r.statusText) + (j.code ? " (" + j.code + ")" : ""));
    err.status = r.status;
    throw err;
  }
  return j;
}

// parseMetrics reads the Prometheus text format into [{name, labels, value}].
function parseMetrics(text) {
  const out = [];
  const labelRe = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
  for (const line of text.split("\n")) {
    if (!line || line[0] === "#") continue;
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)/);
    if (!m) continue;
    const labels = {};
    if (m[3]) for (const l of m[3].matchAll(labelRe)) labels[l[1]] = l[2];
    out.push({ name: m[1], labels, value: parseFloat(m[4]) });
  }
  return out;
}

function sum(samples, name, pred) {
  let s = 0;
  for (const x of samples) if (x.name === name && (!pred || pred(x.labels))) s += x.value;
  return s;
}

function fmtBytes(n) {
  if (n == null || isNaN(n)) return "";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + " " + u[i];
}

function fmtTime(ms) {
  const d = new Date(Number(ms));
  return isNaN(d) ? "" : d.toLocaleTimeString([], { hour12: false }) + "." + String(d.getMilliseconds()).padStart(3, "0");
}

function fmtAgo(ms) {
  const s = Math.max(0, (Date.now() - Number(ms)) / 1000);
  if (s < 60) return Math.round(s) + " s ago";
  if (s < 3600) return Math.round(s / 60) + " min ago";
  if (s < 86400) return Math.round(s / 3600) + " h ago";
  return Math.round(s / 86400) + " d ago";
}

function stateBadge(state) {
  return el("span", { class: "state state-" + state }, state);
}

function select(id) {
  selected = id;
  refresh();
}

// rows keeps one <tr> per live sandbox, updated in place, so that a row
// under the pointer is not replaced between polls.
const rows = new Map();

function renderSandboxes(list, usage) {
  const tbody = document.querySelector("#sandboxes tbody");
  document.getElementById("sandbox-count").textContent = "(" + list.length + " live)";
  if (!list.length) {
    rows.clear();
    tbody.replaceChildren(el("tr", {}, el("td", { colspan: "10", class: "empty" }, "no live sandboxes")));
    return;
  }
  const live = new Set(list.map((s) => s.id));
  for (const id of [...rows.keys()]) if (!live.has(id)) rows.delete(id);
  list.forEach((sb, i) => {
    let tr = rows.get(sb.id);
    if (!tr) {
      tr = el("tr", { "data-id": sb.id, onclick: () => select(sb.id) });
      rows.set(sb.id, tr);
    }
    const u = usage[sb.id] || {};
    const r = sb.resources || {};
    tr.className = sb.id === selected ? "selected" : "";
    tr.replaceChildren(
      el("td", {}, sb.name), el("td", { class: "mono" }, sb.id), el("td", {}, stateBadge(sb.state)),
      el("td", {}, sb.runtime || ""), el("td", {}, r.cpu || ""), el("td", {}, r.memory || ""),
      el("td", {}, u.cpuPct != null ? u.cpuPct.toFixed(1) + " %" : ""), el("td", {}, fmtBytes(u.mem)),
      el("td", { class: "mono" }, sb.ip || ""), el("td", { title: fmtTime(sb.createdAtUnixMs) }, fmtAgo(sb.createdAtUnixMs)));
    if (tbody.children[i] !== tr) tbody.insertBefore(tr, tbody.children[i] || null);
  });
  while (tbody.children.length > list.length) tbody.lastElementChild.remove();
}

// renderTree draws each sandbox under the one it was forked from, grouped
// by the checkpoint it started from.
function renderTree(list) {
  const byId = new Map(list.map((s) => [s.id, s]));
  const kids = new Map();
  const roots = [];
  for (const sb of list) {
    if (sb.parentId && byId.has(sb.parentId)) {
      if (!kids.has(sb.parentId)) kids.set(sb.parentId, []);
      kids.get(sb.parentId).push(sb);
    } else roots.push(sb);
  }
  const node = (sb) => {
    const label = el("span", { class: "sb-label", onclick: () => select(sb.id) },
      el("span", { class: "name" }, sb.name), " ", stateBadge(sb.state), " ", el("span", { class: "mono muted" }, sb.id));
    const li = el("li", { class: "sb", "data-id": sb.id }, label);
    if (sb.parentId && !byId.has(sb.parentId)) {
      li.append(" ", el("span", { class: "orphan" }, "forked from " + sb.parentId + " (gone)"));
    } else if (!sb.parentId && sb.fromCheckpoint) {
      li.append(" ", el("span", { class: "orphan" }, "restored from " + sb.fromCheckpoint));
    }
    const children = kids.get(sb.id) || [];
    if (children.length) {
      const groups = new Map();
      for (const c of children) {
        const k = c.fromCheckpoint || "";
        if (!groups.has(k)) groups.set(k, []);
        groups.get(k).push(c);
      }
      const ul = el("ul");
      for (const [ck, cs] of groups) {
        const n = cs.length;
        ul.append(el("li", { class: "ck", "data-checkpoint": ck },
          "checkpoint ", el("span", { class: "mono" }, ck || "?"), " → " + n + (n === 1 ? " child" : " children"),
          el("ul", {}, ...cs.map(node))));
      }
      li.append(ul);
    }
    return li;
  };
  const tree = document.getElementById("tree");
  tree.replaceChildren(roots.length ? el("ul", {}, ...roots.map(node)) : el("p", { class: "empty" }, "no live sandboxes"));
}

function eventClass(type) {
  if (type.startsWith("exec.")) return "ev-exec";
  if (type.includes("fork")) return "ev-fork";
  if (type.includes("checkpoint")) return "ev-checkpoint";
  if (type.includes("fail") || type.includes("lost") || type.includes("degraded")) return "ev-fail";
  return "";
}

function eventDetail(type, data) {
  if (!data || typeof data !== "object") return "";
  if (type === "exec.started") {
    const cmd = data.shell || (Array.isArray(data.argv) ? data.argv.join(" ") : "");
    return "$ " + cmd;
  }
  if (type === "exec.finished") {
    const parts = ["exit " + (data.exit_code ?? data.exitCode ?? "?")];
    if (data.duration_ms != null) parts.push(Number(data.duration_ms).toFixed(1) + " ms");
    if (data.signal) parts.push("signal " + data.signal);
    if (data.timed_out) parts.push("timed out");
    if (data.oom_killed) parts.push("OOM killed");
    if (data.error) parts.push("error: " + data.error);
    return parts.join(", ");
  }
  const s = JSON.stringify(data);
  return s === "{}" ? "" : s.length > 300 ? s.slice(0, 300) + "…" : s;
}

function renderLedger(sb, events) {
  document.getElementById("ledger-title").textContent = sb ? "of " + sb.name + " (" + sb.id + ")" : "";
  const ol = document.getElementById("ledger");
  ol.replaceChildren();
  if (!sb) {
    ol.append(el("li", { class: "empty" }, "select a sandbox"));
    return;
  }
  for (const e of events) {
    let data = null;
    try { data = e.dataJson ? JSON.parse(e.dataJson) : null; } catch (_) { data = null; }
    const detail = eventDetail(e.type, data);
    ol.append(el("li", { class: eventClass(e.type), "data-type": e.type, "data-seq": e.seq },
      el("span", { class: "time" }, fmtTime(e.timeUnixMs)), el("span", { class: "type" }, e.type),
      detail ? el("span", { class: "detail" }, detail) : null));
  }
  if (!events.length) ol.append(el("li", { class: "empty" }, "no events"));
}

function renderEnvs(envs) {
  const tbody = document.querySelector("#envs tbody");
  tbody.replaceChildren();
  if (!envs.length) {
    tbody.append(el("tr", {}, el("td", { colspan: "8", class: "empty" }, "no environments")));
    return;
  }
  for (const e of envs) {
    const d = e.definition || {};
    const steps = (d.steps || []).length;
    tbody.append(el("tr", { "data-env": d.name },
      el("td", {}, d.name), el("td", {}, stateBadge(e.state || "?")), el("td", { class: "mono" }, (e.hash || "").slice(0, 12)),
      el("td", { class: "mono" }, e.checkpoint || ""), el("td", {}, (e.cachedSteps || 0) + " / " + steps + " cached"),
      el("td", {}, (e.poolReady || 0) + " / " + (d.poolSize || 0) + " ready"),
      el("td", {}, e.builtAtUnixMs ? fmtAgo(e.builtAtUnixMs) : ""), el("td", {}, e.buildMs ? (e.buildMs / 1000).toFixed(1) + " s" : "")));
  }
}

// The charts: each reads one number from a scrape (rates from the change
// since the previous scrape).
const CHARTS = [
  { key: "live", title: "live sandboxes", fmt: (v) => v.toFixed(0), get: (s) => sum(s, "forkbox_sandboxes") },
  { key: "rps", title: "API calls / s", fmt: (v) => v.toFixed(2), rate: (s) => sum(s, "forkbox_rpc_requests_total") },
  { key: "eps", title: "API errors / s", fmt: (v) => v.toFixed(2), rate: (s) => sum(s, "forkbox_rpc_errors_total") },
  ...["create", "fork", "exec", "checkpoint"].map((op) => ({
    key: "lat-" + op, title: op + " latency (mean, ms)", fmt: (v) => v.toFixed(1),
    get: (s) => {
      const n = sum(s, "forkbox_operation_duration_seconds_count", (l) => l.operation === op);
      return n ? (1000 * sum(s, "forkbox_operation_duration_seconds_sum", (l) => l.operation === op)) / n : 0;
    },
  })),
  { key: "kids", title: "fork children started", fmt: (v) => v.toFixed(0), get: (s) => sum(s, "forkbox_fork_children_total", (l) => l.result === "ok") },
  { key: "hits", title: "pool hits", fmt: (v) => v.toFixed(0), get: (s) => sum(s, "forkbox_pool_hits_total") },
  { key: "misses", title: "pool misses", fmt: (v) => v.toFixed(0), get: (s) => sum(s, "forkbox_pool_misses_total") },
  { key: "builds", title: "environment builds", fmt: (v) => v.toFixed(0), get: (s) => sum(s, "forkbox_environment_builds_total") },
  { key: "sbmem", title: "sandbox memory", fmt: fmtBytes, get: (s) => sum(s, "forkbox_sandbox_memory_bytes") },
];

function push(key, v) {
  if (!history.has(key)) history.set(key, []);
  const h = history.get(key);
  h.push(v);
  if (h.length > HISTORY) h.shift();
  return h;
}

const SVGNS = "http://www.w3.org/2000/svg";
function svg(tag, attrs) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  return e;
}

function sparkline(values) {
  const w = 200, h = 48, pad = 3;
  const s = svg("svg", { viewBox: "0 0 " + w + " " + h, preserveAspectRatio: "none", role: "img" });
  const max = Math.max(...values, 1e-9), min = Math.min(...values, 0);
  // The samples so far span the width; one sample is a flat line.
  if (values.length === 1) values = [values[0], values[0]];
  const x = (i) => (i * w) / (values.length - 1);
  const y = (v) => h - pad - ((v - min) / (max - min || 1)) * (h - 2 * pad);
  s.append(svg("line", { x1: 0, y1: h - pad, x2: w, y2: h - pad, stroke: "#dfe3ea", "stroke-width": 1 }));
  const pts = values.map((v, i) => x(i).toFixed(1) + "," + y(v).toFixed(1));
  s.append(svg("polygon", { points: "0," + (h - pad) + " " + pts.join(" ") + " " + x(values.length - 1).toFixed(1) + "," + (h - pad), fill: "#2f6fde22" }));
  s.append(svg("polyline", { points: pts.join(" "), fill: "none", stroke: "#2f6fde", "stroke-width": 1.5, "vector-effect": "non-scaling-stroke" }));
  return s;
}

// renderMetrics records a scrape and returns per-sandbox usage {id: {mem, cpuPct}}.
function renderMetrics(samples) {
  const now = Date.now();
  const usage = {};
  const counters = {};
  for (const x of samples) {
    if (x.name === "forkbox_sandbox_memory_bytes") (usage[x.labels.sandbox] ||= {}).mem = x.value;
    if (x.name === "forkbox_sandbox_cpu_seconds_total") counters["cpu:" + x.labels.sandbox] = x.value;
  }
  for (const c of CHARTS) if (c.rate) counters[c.key] = c.rate(samples);
  const dt = prevCounters ? (now - prevCounters.time) / 1000 : 0;
  const rate = (k) => (dt > 0 && prevCounters.values[k] != null ? Math.max(0, (counters[k] - prevCounters.values[k]) / dt) : 0);
  for (const k of Object.keys(counters)) {
    if (k.startsWith("cpu:") && dt > 0 && prevCounters.values[k] != null) (usage[k.slice(4)] ||= {}).cpuPct = 100 * rate(k);
  }
  const box = document.getElementById("charts");
  box.replaceChildren();
  for (const c of CHARTS) {
    const v = c.rate ? rate(c.key) : c.get(samples);
    const h = push(c.key, v);
    box.append(el("div", { class: "chart", "data-chart": c.key },
      el("div", { class: "title" }, c.title), el("div", { class: "value" }, c.fmt(v)), sparkline(h)));
  }
  prevCounters = { time: now, values: counters };
  return usage;
}

let busy = false;
async function refresh() {
  if (busy) return;
  busy = true;
  const status = document.getElementById("status");
  try {
    const [sbs, envs, metricsText] = await Promise.all([
      rpc("SandboxService", "ListSandboxes", {}),
      rpc("EnvironmentService", "ListEnvironments", {}),
      fetch("/metrics", { credentials: "same-origin" }).then((r) => (r.ok ? r.text() : "")),
    ]);
    const list = sbs.sandboxes || [];
    const usage = renderMetrics(parseMetrics(metricsText));
    renderSandboxes(list, usage);
    renderTree(list);
    renderEnvs(envs.environments || []);
    const sb = list.find((s) => s.id === selected) || null;
    renderLedger(sb, sb ? (await rpc("SandboxService", "Events", { sandbox: sb.id })).events || [] : []);
    status.textContent = "updated " + new Date().toLocaleTimeString([], { hour12: false });
  } catch (e) {
    status.textContent = e.status === 401 ? "not logged in: open the link with ?token=" : "error: " + e.message;
  } finally {
    busy = false;
  }
}

refresh();
setInterval(refresh, POLL_MS);
