// Live dashboard: polls the JSON API and redraws (see /docs for the endpoints). The
// overview is drawn here; the clients and round-detail views are in views.js.
"use strict";

const POLL_MS = 1000;
const ROUNDS_SHOWN = 200;
const TABLE_ROWS = 15;
const css = (name) => getComputedStyle(document.documentElement).getPropertyValue(name).trim();
const $ = (id) => document.getElementById(id);

function fmtBytes(b) {  // SI units, so the log axis' decades read 1 kB, 10 kB, ...
  if (b === null || b === undefined) return "–";
  const units = ["B", "kB", "MB", "GB"];
  let i = 0;
  while (b >= 1000 && i < units.length - 1) { b /= 1000; i++; }
  return String(Number(b.toPrecision(3))) + " " + units[i];
}
function fmtNum(x) {
  if (x === null || x === undefined) return "–";
  if (x === 0) return "0";
  const a = Math.abs(x);
  return a >= 1e4 || a < 1e-3 ? x.toExponential(2) : String(Number(x.toPrecision(3)));
}
function fmtDuration(s) {
  s = Math.floor(s);
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
  return (h ? h + "h " : "") + (h || m ? m + "m " : "") + r + "s";
}

function renderConfig(st) {
  const c = st.config;
  const rows = [
    ["scheme", c.scheme], ["transform", c.transform], ["n · k · d", `${c.n} · ${c.k} · ${c.d}`],
    ["task", c.task], ["evaluation", c.evaluation ? "on" : "off (MSE unknown)"],
    ["clients joined", `${st.clients_joined} of ${c.n}`],
  ];
  const dl = $("config");
  dl.textContent = "";
  for (const [k, v] of rows) {
    const dt = document.createElement("dt"); dt.textContent = k;
    const dd = document.createElement("dd"); dd.textContent = v;
    dl.append(dt, dd);
  }
  // the clients' own vectors without --eval: no reference, so no error charts at all
  const external = c.settings.data === "external" && !c.evaluation;
  $("eval-off").hidden = c.evaluation || external;
  $("external-note").hidden = !external;
  for (const id of ["rel-card", "mse-card", "task-card"]) $(id).hidden = external;
  const v = st.versions;
  $("versions").textContent = `${v.protocol} · ${v.seed_spec} · rpsagg ${v.rpsagg}`;
  $("uptime").textContent = fmtDuration(st.uptime_seconds);
}

function renderRound(st) {
  const r = st.current_round || st.latest_round;
  const job = st.job;
  if (!r) {
    $("round-id").textContent = "–";
    $("round-state").textContent = "waiting";
    $("job-line").textContent = betaLine(st.beta);
    return;
  }
  $("round-id").textContent = r.round_id;
  document.body.dataset.round = r.round_id;
  const stateEl = $("round-state");
  stateEl.textContent = st.current_round ? r.state : (job && job.done ? "job done" : r.state);
  stateEl.className = "state " + r.state;
  const arrived = r.clients.arrived.length, expected = r.clients.expected;
  $("progress-bar").style.width = Math.min(100, (100 * arrived) / Math.max(1, expected)) + "%";
  $("round-progress").textContent = `${arrived} of ${expected} clients arrived`;
  const dl = r.timestamps.deadline;
  const closed = r.timestamps.closed;
  $("round-deadline").textContent = st.current_round && dl && r.state === "collecting"
    ? `· deadline in ${Math.max(0, Math.round(dl - Date.now() / 1000))} s`
    : st.current_round && closed && r.state === "decoding"  // a long wait: say how long
      ? `· decoding for ${Math.max(0, Math.round(Date.now() / 1000 - closed))} s`
      : "";
  $("job-line").textContent = (job
    ? `task step ${job.steps_done} ` + (job.rounds_planned
      ? `of ${job.rounds_planned}` : "(until stopped)") + (job.state === "failed"
      ? ` · job failed: ${job.failure}` : job.done ? " · job done" : "")
    : "") + betaLine(st.beta);
}

function betaLine(b) {
  if (!b || b.state === "ready" || b.state === "not needed") return "";
  const secs = Math.round(b.elapsed_seconds);
  return b.state === "failed" ? ` · beta failed: ${b.error}`
    : ` · computing beta for n = ${b.n} (${secs} s; the first decode waits for it)`;
}

const pt = (r, y, what) => ({ x: r.round_id, y, title: `round ${r.round_id}: ${what}` });

function errorSeries(st, done, field) {
  const has = done.filter((r) => r[field]);
  const one = (key, label, color, dashed) => ({
    key, label, color, dashed,
    points: has.filter((r) => r[field][key] != null)  // null: not computable
      .map((r) => pt(r, r[field][key], fmtNum(r[field][key]))),
  });
  return [
    one("estimate", st.config.scheme, css("--s0"), false),
    one("rand_k", "rand-k", css("--s1"), true),
    one("rand_k_spatial", "rand-k-spatial", css("--s2"), true),
  ];
}

function renderTask(st, done) {
  const withTp = done.filter((r) => r.task_progress);
  const last = withTp.length ? withTp[withTp.length - 1].task_progress : null;
  $("task-name").textContent = st.config.task;
  // the starting state (before round 1) is drawn at x = 0, so the progress shows
  const rows = (withTp.length && st.task_start
    ? [{ round_id: 0, task_progress: st.task_start, start: true }] : []).concat(withTp);
  const at = (r, y) => r.start
    ? { x: 0, y, title: `start (before round 1): ${fmtNum(y)}` } : pt(r, y, fmtNum(y));
  let series = [];
  if (last && last.eigenvector_distance !== null) {
    series = [
      { key: "eigvec", label: "distance to the top eigenvector (sin ∠)", color: css("--s0"),
        points: rows.map((r) => at(r, r.task_progress.eigenvector_distance)) },
      { key: "gap", label: "top eigenvalue − Rayleigh quotient", color: css("--s2"),
        dashed: true,
        points: rows.map((r) => at(r, r.task_progress.optimum - r.task_progress.value)) },
    ];
  } else if (last) {
    series = [{ key: "value", label: last.name, color: css("--s0"),
                points: rows.map((r) => at(r, r.task_progress.value)) }];
  }
  let line = "";
  if (last) {
    const rid = withTp[withTp.length - 1].round_id;
    line = `after round ${rid}: ${last.name} ${fmtNum(last.value)}`;
    if (last.optimum !== null) line += ` (top eigenvalue ${fmtNum(last.optimum)})`;
    if (last.eigenvector_distance !== null) {
      line += ` · distance to the top eigenvector ${fmtNum(last.eigenvector_distance)}`;
    }
  }  // else the chart says why (task_metrics_note)
  $("task-line").textContent = line;
  drawLegend($("task-legend"), series);
  drawLogChart($("task-chart"), series, {
    empty: st.task_metrics_note || "no finished round yet",
  });
}

function renderCharts(st, rounds) {
  const asc = rounds.slice().reverse();
  const done = asc.filter((r) => r.state === "done");
  const finished = asc.filter((r) => r.state === "done" || r.state === "failed");
  const offMsg = "evaluation mode is off: the error is unknown";

  const relSeries = errorSeries(st, done, "relative_error");
  drawLegend($("rel-legend"), st.config.evaluation ? relSeries : []);
  drawLogChart($("rel-chart"), relSeries, {
    empty: st.config.evaluation ? "no finished round yet" : offMsg,
  });
  renderTask(st, done);

  const mseSeries = errorSeries(st, done, "squared_error");
  drawLegend($("mse-legend"), st.config.evaluation ? mseSeries : []);
  drawLogChart($("mse-chart"), mseSeries, {
    empty: st.config.evaluation ? "no finished round yet"
      : "evaluation mode is off: the squared error is unknown",
  });

  const bytesSeries = [
    { key: "wire", label: "received (wire)", color: css("--s0"),
      points: finished.map((r) => pt(r, r.bytes.wire, fmtBytes(r.bytes.wire))) },
    { key: "payload", label: "payload", color: css("--s2"),
      points: finished.map((r) => pt(r, r.bytes.payload, fmtBytes(r.bytes.payload))) },
    { key: "raw", label: "raw float32 vectors", color: css("--s3"), dashed: true,
      points: finished.map((r) => pt(r, r.bytes.raw_float32, fmtBytes(r.bytes.raw_float32))) },
  ];
  drawLegend($("bytes-legend"), bytesSeries);
  drawLogChart($("bytes-chart"), bytesSeries, { yFormat: fmtBytes });
}

function renderTable(rounds) {
  const body = document.querySelector("#rounds-table tbody");
  body.textContent = "";
  for (const r of rounds.slice(0, TABLE_ROWS)) {
    const tr = document.createElement("tr");
    tr.dataset.round = r.round_id;
    const se = r.squared_error, rel = r.relative_error, tp = r.task_progress;
    const cells = [
      r.round_id, r.state + (r.reason ? ` (${r.reason})` : ""),
      `${r.clients.arrived.length}/${r.clients.expected}`, fmtBytes(r.bytes.wire),
      r.bytes.wire_fraction_of_raw === null ? "–"
        : (100 * r.bytes.wire_fraction_of_raw).toFixed(1) + "%",
      fmtNum(r.decode_seconds), fmtNum(r.beta), fmtNum(r.r_hat),
      se ? fmtNum(se.estimate) : "unknown", rel ? fmtNum(rel.estimate) : "–",
      tp ? fmtNum(tp.eigenvector_distance !== null ? tp.eigenvector_distance : tp.value) : "–",
    ];
    cells.forEach((v, i) => {
      const td = document.createElement("td");
      if (i === 0) {
        const a = document.createElement("a");
        a.href = `#round/${r.round_id}`;
        a.textContent = v;
        a.className = "round-link";
        td.appendChild(a);
      } else {
        td.textContent = v;
      }
      if (i === 1) td.className = "state " + r.state;
      tr.appendChild(td);
    });
    body.appendChild(tr);
  }
}

async function getJSON(path) {
  const res = await apiFetch(path);
  if (!res.ok) throw new Error(`${path}: HTTP ${res.status}`);
  return res.json();
}

async function tick() {
  inFlight = true;
  const conn = $("conn");
  try {
    const [st, page] = await Promise.all([
      getJSON("/api/status"), getJSON(`/api/rounds?limit=${ROUNDS_SHOWN}`),
    ]);
    renderConfig(st);
    if (currentView().name === "overview") {
      renderRound(st);
      renderCharts(st, page.rounds);
      renderTable(page.rounds);
    }
    await renderView(st);
    conn.textContent = "live";
    conn.className = "pill live";
    document.body.dataset.updated = String(Date.now());
    document.body.dataset.view = currentView().name;
  } catch (err) {
    conn.textContent = err instanceof AuthNeeded ? "token needed" : "disconnected";
    conn.className = "pill down";
    conn.title = String(err);
  } finally {
    inFlight = false;
    timer = setTimeout(tick, POLL_MS);
  }
}

let timer = null, inFlight = false;
window.addEventListener("hashchange", () => {  // a new view: draw it now, not in a second
  showView();
  if (!inFlight) {
    clearTimeout(timer);
    tick();
  }
});
wireAuth(() => {  // a new token: try it now
  if (!inFlight) {
    clearTimeout(timer);
    tick();
  }
});
showView();
tick();
