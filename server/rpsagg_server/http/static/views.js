// The clients view (#clients) and the round detail view (#round/N); the overview is "#".
"use strict";

function currentView() {
  const h = location.hash.replace(/^#/, "");
  const m = /^round\/(\d+)$/.exec(h);
  if (m) return { name: "round", round: Number(m[1]) };
  if (h === "clients") return { name: "clients" };
  return { name: "overview" };
}

function showView() {
  const v = currentView();
  for (const name of ["overview", "clients", "round"]) {
    document.getElementById("view-" + name).hidden = name !== v.name;
  }
  document.getElementById("nav-overview").classList.toggle("here", v.name === "overview");
  document.getElementById("nav-clients").classList.toggle("here", v.name === "clients");
  showJobList(!document.body.classList.contains("no-job"));
}

function fmtTime(t) {
  if (t === null || t === undefined) return "–";
  return new Date(t * 1000).toLocaleTimeString([], { hour12: false });
}
function fmtAgo(t) {
  if (t === null || t === undefined) return "–";
  return fmtDuration(Math.max(0, Date.now() / 1000 - t)) + " ago";
}
function fmtSecs(a, b) {
  return a === null || b === null || a === undefined || b === undefined
    ? "–" : fmtNum(b - a) + " s";
}

function fillRows(tbody, rows, decorate) {
  tbody.textContent = "";
  for (const row of rows) {
    const tr = document.createElement("tr");
    row.cells.forEach((v, i) => {
      const td = document.createElement("td");
      td.textContent = v;
      if (decorate) decorate(td, i, row);
      tr.appendChild(td);
    });
    Object.assign(tr.dataset, row.data || {});
    tbody.appendChild(tr);
  }
}

function fillKv(dl, rows) {
  dl.textContent = "";
  for (const [k, v] of rows) {
    const dt = document.createElement("dt"); dt.textContent = k;
    const dd = document.createElement("dd"); dd.textContent = v;
    dl.append(dt, dd);
  }
}

function renderClients(st, clients) {
  $("clients-count").textContent = `(${clients.length} of ${st.config.n} joined)`;
  fillRows(document.querySelector("#clients-table tbody"), clients.map((c) => ({
    cells: [c.index, c.client_id, fmtTime(c.joined_at), fmtAgo(c.last_seen),
            c.rounds_contributed, c.rounds_missed, fmtBytes(c.bytes_sent),
            c.straggler ? "straggler" : "ok"],
    data: { client: c.client_id, straggler: String(c.straggler) },
  })), (td, i, row) => {
    if (i === 7) td.className = row.data.straggler === "true" ? "state failed" : "state done";
    if (i === 1) td.style.textAlign = "left";
  });
}

function renderRoundDetail(st, r, id) {
  $("detail-id").textContent = id;
  const prev = $("detail-prev"), next = $("detail-next");
  prev.href = `#round/${Math.max(1, id - 1)}`;
  prev.hidden = id <= 1;
  const newest = st.latest_round ? st.latest_round.round_id : 0;
  next.href = `#round/${id + 1}`;
  next.hidden = id >= newest;
  const msg = $("detail-missing-msg");
  if (!r) {
    $("detail-state").textContent = "unknown";
    msg.hidden = false;
    msg.textContent = newest ? `No round ${id}: rounds 1 to ${newest} exist.`
      : "No round exists yet.";
    for (const el of ["detail-decode", "detail-timing"]) $(el).textContent = "";
    $("detail-estimate").hidden = true;
    document.querySelector("#detail-contributors tbody").textContent = "";
    $("detail-missing").textContent = "";
    return;
  }
  msg.hidden = true;
  const stateEl = $("detail-state");
  stateEl.textContent = r.state + (r.reason ? ` (${r.reason})` : "");
  stateEl.className = "state " + r.state;
  const est = $("detail-estimate");  // the estimate itself, once the round is done
  est.hidden = r.state !== "done";
  for (const fmt of ["json", "csv", "npy"]) {
    $("est-" + fmt).href = `${API}/rounds/${id}/estimate?format=${fmt}`;
  }
  $("detail-estimate-what").textContent = r.state === "done"
    ? `(n′ = ${r.clients.arrived.length}, d = ${st.config.d})` : "";
  const se = r.squared_error, rel = r.relative_error, tp = r.task_progress;
  const decode = [
    ["scheme", r.scheme], ["transform", r.transform], ["task step", r.task_step],
    ["β (unbiasing)", fmtNum(r.beta)], ["c (transform)", fmtNum(r.c)],
    ["R̂ (from the sketches)", fmtNum(r.r_hat)], ["R prior", fmtNum(r.r_prior)],
    ["decode", r.decode_seconds === null ? "–" : fmtNum(r.decode_seconds) + " s"],
  ];
  const ee = r.error_estimate;
  if (ee) {
    const pm = (v, e) => fmtNum(v) + (v != null && e != null ? ` ± ${fmtNum(e)}` : "");
    decode.push(["estimated squared error", pm(ee.squared_error, ee.squared_error_stderr)],
                ["estimated relative error", pm(ee.relative_error, ee.relative_error_stderr)],
                ["  estimate's method", ee.method]);
  }
  decode.splice(2, 0, ["k (values per client)", r.k || st.config.k]);
  if (se) {
    decode.push(["measured squared error", fmtNum(se.estimate)],
                ["  rand-k · rand-k-spatial", `${fmtNum(se.rand_k)} · ${fmtNum(se.rand_k_spatial)}`]);
  } else {
    decode.push(["measured squared error",
                 st.config.evaluation ? "–" : "not measured (evaluation off)"]);
  }
  if (rel) {
    decode.push(["measured relative error", fmtNum(rel.estimate)],
                ["  rand-k · rand-k-spatial", `${fmtNum(rel.rand_k)} · ${fmtNum(rel.rand_k_spatial)}`]);
  }
  if (tp) {
    decode.push([tp.name, fmtNum(tp.value) + (tp.optimum !== null ? ` of ${fmtNum(tp.optimum)}` : "")]);
    if (tp.eigenvector_distance !== null) {
      decode.push(["distance to the top eigenvector", fmtNum(tp.eigenvector_distance)]);
    }
  }
  fillKv($("detail-decode"), decode);
  const t = r.timestamps, b = r.bytes;
  fillKv($("detail-timing"), [
    ["opened", fmtTime(t.opened)], ["first submission", fmtTime(t.first_submission)],
    ["deadline", fmtTime(t.deadline)], ["closed", fmtTime(t.closed)],
    ["finished", fmtTime(t.finished)],
    ["collecting", fmtSecs(t.first_submission, t.closed)],
    ["closed → finished", fmtSecs(t.closed, t.finished)],
    ["wire bytes", fmtBytes(b.wire)], ["payload bytes", fmtBytes(b.payload)],
    ["raw float32", fmtBytes(b.raw_float32)],
    ["wire / raw", b.wire_fraction_of_raw === null ? "–"
      : (100 * b.wire_fraction_of_raw).toFixed(1) + "%"],
  ]);
  const index = new Map(st.clients.map((c) => [c.client_id, c.index]));
  $("detail-con-count").textContent =
    `(${r.clients.arrived.length} of ${r.clients.expected})`;
  const first = t.first_submission;
  fillRows(document.querySelector("#detail-contributors tbody"), r.arrivals.map((a) => ({
    cells: [index.has(a.client_id) ? index.get(a.client_id) : "–", a.client_id,
            fmtTime(a.received_at), fmtSecs(first, a.received_at), fmtBytes(a.wire_bytes),
            fmtBytes(a.payload_bytes)],
    data: { client: a.client_id },
  })), (td, i) => { if (i === 1) td.style.textAlign = "left"; });
  $("detail-missing").textContent = r.clients.missing.length
    ? `Did not submit: ${r.clients.missing.join(", ")}` : "";
}

async function renderView(st) {
  const v = currentView();
  if (v.name === "clients") {
    renderClients(st, await getJSON(`${API}/clients`));
  } else if (v.name === "round") {
    const res = await apiFetch(`${API}/rounds/${v.round}`);
    const unknown = res.status === 404 || res.status === 422;  // no such round / id 0
    if (!unknown && !res.ok) throw new Error(`round ${v.round}: HTTP ${res.status}`);
    renderRoundDetail(st, unknown ? null : await res.json(), v.round);
  }
}
