// Live dashboard: polls the JSON API and redraws (see /docs for the endpoints). The
// overview is drawn here; the clients and round-detail views are in views.js, the job list
// and the page's job (API: its endpoints' prefix) in jobs.js.
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
    ["task", c.task],
    ["evaluation", c.evaluation ? "on (error measured)" : "off (error estimated)"],
    ["clients joined", `${st.clients_joined} of ${c.n}`],
  ];
  const target = targetRelError(st);
  if (target !== null) rows.splice(3, 0, ["target relative error", fmtNum(target)]);
  const dl = $("config");
  dl.textContent = "";
  for (const [k, v] of rows) {
    const dt = document.createElement("dt"); dt.textContent = k;
    const dd = document.createElement("dd"); dd.textContent = v;
    dl.append(dt, dd);
  }
  // the clients' own vectors without --eval: no reference, so no task to measure (the
  // error charts show the estimate, as in every mode)
  const external = c.settings.data === "external" && !c.evaluation;
  $("eval-off").hidden = c.evaluation || external;
  $("external-note").hidden = !external;
  $("task-card").hidden = external;
  $("calib-card").hidden = !c.evaluation;
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
  const cancelled = Boolean(job && job.state === "cancelled") || listedState === "cancelled";
  stateEl.textContent = st.current_round ? r.state
    : cancelled ? "job cancelled" : (job && job.done ? "job done" : r.state);
  stateEl.className = "state " + (!st.current_round && cancelled ? "cancelled" : r.state);
  const arrived = r.clients.arrived.length, expected = r.clients.expected;
  const finished = !st.current_round && job && (job.done || cancelled);  // nothing to wait for
  const bar = $("progress-bar");
  bar.style.width = (finished ? 100 : Math.min(100, (100 * arrived) / Math.max(1, expected))) + "%";
  bar.classList.toggle("done", Boolean(finished));
  $("round-progress").textContent = `${arrived} of ${expected} clients arrived`
    + (finished ? " in the last round" : "");
  const dl = r.timestamps.deadline;
  const closed = r.timestamps.closed;
  $("round-deadline").textContent = st.current_round && dl && r.state === "collecting"
    ? `· deadline in ${Math.max(0, Math.round(dl - Date.now() / 1000))} s`
    : st.current_round && closed && r.state === "decoding"  // a long wait: say how long
      ? `· decoding for ${Math.max(0, Math.round(Date.now() / 1000 - closed))} s`
      : "";
  $("job-line").textContent = (job
    ? `task step ${job.steps_done} ` + (job.rounds_planned
      ? `of ${job.rounds_planned}` : "(until stopped)") + (cancelled ? " · job cancelled"
      : job.state === "failed" ? ` · job failed: ${job.failure}`
        : job.done ? " · job done" : "")
    : "") + betaLine(st.beta);
}

function betaLine(b) {
  if (!b || b.state === "ready" || b.state === "not needed") return "";
  const secs = Math.round(b.elapsed_seconds);
  return b.state === "failed" ? ` · beta failed: ${b.error}`
    : ` · computing beta for n = ${b.n} (${secs} s; the first decode waits for it)`;
}

const pt = (r, y, what) => ({ x: r.round_id, y, title: `round ${r.round_id}: ${what}` });
const SMOOTH_FROM = 6;  // rounds with an estimate from which a running mean is drawn
const SMOOTH_HALF = 2;  // the mean is over 2 * SMOOTH_HALF + 1 rounds

// --target-rel-error where the server has one (null otherwise, or on servers without it)
function targetRelError(st) {
  const c = st.config || {};
  const t = [c.target_rel_error, (c.settings || {}).target_rel_error,
             (st.job || {}).target_rel_error].find((v) => typeof v === "number");
  return t !== undefined && t > 0 ? t : null;
}

// The error estimated from the messages (error_estimate), relative or squared: the value
// of every done round with its standard error. The relative error also gets a running
// mean: at a fixed k it stays put while the vectors change, so the mean reads better than
// the scattered rounds; the squared error follows the vectors' norms (power iteration's
// first round is far below the rest), which a mean across rounds would smear.
function estimatedSeries(st, done, relative) {
  const key = relative ? "relative_error" : "squared_error";
  const rows = done.filter((r) => r.error_estimate && r.error_estimate[key] != null);
  const points = rows.map((r) => {
    const e = r.error_estimate, y = e[key], se = e[key + "_stderr"];
    const p = pt(r, y, `estimated ${fmtNum(y)}` + (se != null ? ` ± ${fmtNum(se)}` : ""));
    if (se != null) { p.lo = y - se; p.hi = y + se; }
    return p;
  });
  const color = css("--s4");
  const smooth = relative && rows.length >= SMOOTH_FROM;
  const out = [{ key: "estimated", label: `${st.config.scheme} estimated (± 1 s.e.)`, color,
                 points, line: !smooth, radius: smooth ? 2.5 : 3.5 }];
  if (smooth) {
    // a centred mean over rounds of the same k (negative estimates included: the mean of
    // unbiased estimates is unbiased); it does not reach across a change of k
    const kOf = (r) => r.k || st.config.k;  // (0 or absent: the job's k)
    const mean = rows.map((r, i) => {
      let sum = 0, n = 0;
      for (let j = Math.max(0, i - SMOOTH_HALF); j <= Math.min(rows.length - 1, i + SMOOTH_HALF); j++) {
        if (kOf(rows[j]) === kOf(r)) { sum += rows[j].error_estimate[key]; n += 1; }
      }
      return pt(r, sum / n, `mean of ${n} rounds ${fmtNum(sum / n)}`);
    });
    out.push({ key: "estimated_mean", label: `estimated, mean of ${2 * SMOOTH_HALF + 1} rounds`,
               color, points: mean, dots: false, width: 2.5 });
  }
  return out;
}

function errorSeries(st, done, field) {
  const has = done.filter((r) => r[field]);
  const one = (key, label, color, dashed) => ({
    key, label, color, dashed,
    points: has.filter((r) => r[field][key] != null)  // null: not computable
      .map((r) => pt(r, r[field][key], fmtNum(r[field][key]))),
  });
  return [
    one("estimate", `${st.config.scheme} measured`, css("--s0"), false),
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

// Evaluation mode: the estimated squared error of every done round against the measured.
function renderCalibration(st, done) {
  const rows = done.filter((r) => r.error_estimate && r.error_estimate.squared_error != null
    && r.squared_error && r.squared_error.estimate != null);
  const s = { key: "calibration", color: css("--s4"), points: rows.map((r) => {
    const e = r.error_estimate, x = r.squared_error.estimate, y = e.squared_error;
    const se = e.squared_error_stderr;
    return { x, y, round: r.round_id, lo: se != null ? y - se : null,
             hi: se != null ? y + se : null,
             title: `round ${r.round_id}: measured ${fmtNum(x)}, estimated ${fmtNum(y)}`
               + (se != null ? ` ± ${fmtNum(se)}` : "") };
  }) };
  const inside = rows.filter((r) => {
    const e = r.error_estimate, se = e.squared_error_stderr;
    return se != null && Math.abs(e.squared_error - r.squared_error.estimate) <= se;
  }).length;
  $("calib-line").textContent = rows.length
    ? `${rows.length} rounds; the measured error is within one standard error of the `
      + `estimate in ${inside} (about 68% expected)` : "";
  drawScatter($("calib-chart"), s, {
    empty: "no finished round yet", xLabel: "measured ‖x̂ − x̄‖²",
    yLabel: "estimated (± 1 s.e.)",
  });
}

// k per round, where rounds carry their own k (--target-rel-error) or it changes
function renderK(st, done) {
  const withK = done.filter((r) => r.k > 0);  // (0 or absent: rounds without their own k)
  const show = withK.length > 0
    && (targetRelError(st) !== null || new Set(withK.map((r) => r.k)).size > 1);
  $("k-card").hidden = !show;
  if (!show) return;
  const series = [{ key: "k", label: "values per client (k)", color: css("--s0"),
                    points: withK.map((r) => pt(r, r.k, `k = ${r.k}`)) }];
  drawLegend($("k-legend"), series);
  drawLogChart($("k-chart"), series, {});
}

function renderCharts(st, rounds) {
  const asc = rounds.slice().reverse();
  const done = asc.filter((r) => r.state === "done");
  const finished = asc.filter((r) => r.state === "done" || r.state === "failed");
  // measured (evaluation mode) and estimated (every mode) side by side
  const measured = (field) => (st.config.evaluation ? errorSeries(st, done, field) : []);
  const target = targetRelError(st);

  const relSeries = measured("relative_error").concat(estimatedSeries(st, done, true));
  drawLegend($("rel-legend"), relSeries);
  drawLogChart($("rel-chart"), relSeries, {
    hlines: target === null ? [] : [{ y: target, key: "target", label: `target ${fmtNum(target)}` }],
  });
  renderTask(st, done);

  const mseSeries = measured("squared_error").concat(estimatedSeries(st, done, false));
  drawLegend($("mse-legend"), mseSeries);
  drawLogChart($("mse-chart"), mseSeries, {});
  if (st.config.evaluation) renderCalibration(st, done);
  renderK(st, done);

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

function renderTable(rounds, k) {
  const body = document.querySelector("#rounds-table tbody");
  body.textContent = "";
  for (const r of rounds.slice(0, TABLE_ROWS)) {
    const tr = document.createElement("tr");
    tr.dataset.round = r.round_id;
    const se = r.squared_error, rel = r.relative_error, tp = r.task_progress;
    const est = r.error_estimate;
    const cells = [
      r.round_id, r.state + (r.reason ? ` (${r.reason})` : ""),
      `${r.clients.arrived.length}/${r.clients.expected}`, r.k || k,
      fmtBytes(r.bytes.wire),
      r.bytes.wire_fraction_of_raw === null ? "–"
        : (100 * r.bytes.wire_fraction_of_raw).toFixed(1) + "%",
      fmtNum(r.decode_seconds), fmtNum(r.beta), fmtNum(r.r_hat),
      est && est.relative_error != null ? fmtNum(est.relative_error)
        + (est.relative_error_stderr != null ? ` ± ${fmtNum(est.relative_error_stderr)}` : "")
        : "–",
      se ? fmtNum(se.estimate) : "–", rel ? fmtNum(rel.estimate) : "–",
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
    // the job list first ("/") or the page's job ("/jobs/ID/"): queued, unknown, or no
    // default job on "/": no job's views to draw
    if (renderJobs(await fetchJobs())) {
      const [st, page] = await Promise.all([
        getJSON(`${API}/status`), getJSON(`${API}/rounds?limit=${ROUNDS_SHOWN}`),
      ]);
      renderConfig(st);
      if (currentView().name === "overview") {
        renderRound(st);
        renderCharts(st, page.rounds);
        renderTable(page.rounds, st.config.k);
      }
      await renderView(st);
    }
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
prefixLinks();
showView();
tick();
