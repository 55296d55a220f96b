// The server's jobs (GET /api/jobs) and which job this page shows.
//
// "/" lists every job (newest state from /api/jobs), then the default job's page below the
// list, read through today's paths (/api/status, /api/rounds, ...), where the server has a
// default job. "/jobs/ID/" is the same page for job ID: its API is /api/jobs/ID/... (API
// below), with a link back to the list. A server without the list (/api/jobs 404, or an
// older server's {"past_jobs": [...]} alone) has one job: the page is then the job's page,
// as before there were several.
"use strict";

// the job of a "/jobs/ID/" page (its id decoded), null on "/" (and any other path)
function pageJob(path) {
  const m = /^\/jobs\/([^/]+)\/?$/.exec(path);
  if (!m) return null;
  try { return decodeURIComponent(m[1]); } catch (e) { return m[1]; }
}

const PAGE_JOB = pageJob(location.pathname);
// every per-job request goes under API (the page's job; "/api": the default job)
const API = PAGE_JOB === null ? "/api" : "/api/jobs/" + encodeURIComponent(PAGE_JOB);
const jobHref = (id) => "/jobs/" + encodeURIComponent(id) + "/";

// null until /api/jobs answers; false once the server said it has no job list (then it is
// not asked again)
let jobsListed = null;
// the state the list gives the job this page shows (the default job's on "/"), null
// without a list: a job's own /status says "failed" (job.failure) where it was cancelled
let listedState = null;

// The job list, or null where the server has none (a server of one job).
async function fetchJobs() {
  if (jobsListed === false) return null;
  const res = await apiFetch("/api/jobs");
  if (res.status === 404) { jobsListed = false; return null; }
  if (!res.ok) throw new Error(`/api/jobs: HTTP ${res.status}`);
  const body = await res.json();
  if (!body || !Array.isArray(body.jobs)) { jobsListed = false; return null; }
  jobsListed = true;
  return body;
}

function fmtDateTime(t) {
  if (t === null || t === undefined) return "–";
  const d = new Date(t * 1000), p = (x) => String(x).padStart(2, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} `
    + `${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}

// "3/8", or "3 (until stopped)" for a job of --rounds 0
const jobProgress = (j) => (j.rounds > 0 ? `${j.rounds_done}/${j.rounds}`
  : `${j.rounds_done} (until stopped)`);
const jobEstimator = (j) => (j.settings && (j.settings.estimator || j.settings.scheme)) || "–";

function renderJobTable(jobs) {
  $("jobs-count").textContent = `(${jobs.length})`;
  $("jobs-empty").hidden = jobs.length > 0;
  const body = document.querySelector("#jobs-table tbody");
  body.textContent = "";
  for (const j of jobs) {
    const tr = document.createElement("tr");
    tr.dataset.job = j.id;
    tr.dataset.state = j.state;
    const s = j.settings || {};
    const cells = [
      null, j.state, jobProgress(j), jobEstimator(j),
      s.n !== undefined ? `${j.clients}/${s.n}` : String(j.clients),
      fmtBytes(j.bytes_up), fmtNum(j.last_rel_error), fmtDateTime(j.created_at),
    ];
    cells.forEach((v, i) => {
      const td = document.createElement("td");
      if (i === 0) {
        const a = document.createElement("a");
        a.href = jobHref(j.id);
        a.textContent = j.id;
        a.className = "job-link";
        td.appendChild(a);
        if (j.default && j.id !== "default") {  // (the id says it already)
          const tag = document.createElement("span");
          tag.className = "muted";
          tag.textContent = " (default)";
          td.appendChild(tag);
        }
      } else {
        td.textContent = v;
      }
      if (i === 1) {
        td.className = "state " + j.state;
        if (j.failure) td.title = j.failure;
      }
      tr.appendChild(td);
    });
    body.appendChild(tr);
  }
}

// the jobs earlier starts moved aside (--on-finished-job new); none: the card is hidden
function renderPastJobs(past) {
  $("past-jobs-card").hidden = past.length === 0;
  fillRows(document.querySelector("#past-jobs-table tbody"), past.map((p) => ({
    cells: [p.file, p.state, `${p.rounds_done}/${p.rounds}`, fmtDateTime(p.started_at),
            fmtDateTime(p.last_round_at), p.clients],
    data: { file: p.file },
  })), (td, i, row) => {
    if (i === 1) {
      td.className = "state " + row.cells[1];
      const p = past.find((q) => q.file === row.data.file);
      if (p && p.failure) td.title = p.failure;
    }
  });
}

// The head of a job's own page: its state, rounds and times; queued and cancelled say so.
function renderJobHead(job) {
  $("job-head").hidden = false;
  $("job-head-id").textContent = PAGE_JOB;
  const stateEl = $("job-head-state");
  const kv = [];
  let note = "";
  if (!job) {
    stateEl.textContent = "unknown";
    stateEl.className = "state failed";
    note = `This server has no job "${PAGE_JOB}".`;
  } else {
    stateEl.textContent = job.state;
    stateEl.className = "state " + job.state;
    const s = job.settings || {};
    kv.push(["rounds done", jobProgress(job)],
            ["estimator", jobEstimator(job)],
            ["n · k · d", `${s.n} · ${s.k} · ${s.d}`],
            ["created", fmtDateTime(job.created_at)],
            ["started", fmtDateTime(job.started_at)],
            ["finished", fmtDateTime(job.finished_at)]);
    if (job.state === "queued") {
      note = "Queued: the job starts when the server gets to it; it has no rounds yet.";
    } else if (job.state === "cancelled") {
      note = job.rounds_done > 0
        ? `Cancelled after ${job.rounds_done} finished round${job.rounds_done === 1 ? "" : "s"}`
          + (job.rounds > 0 ? ` of ${job.rounds}` : "") + ": they are shown below."
        : "Cancelled before it finished a round.";
    } else if (job.state === "failed") {
      note = "Failed" + (job.failure ? `: ${job.failure}` : ".");
    }
  }
  const dl = $("job-head-kv");  // each pair in a div, so a pair wraps as one
  dl.textContent = "";
  for (const [k, v] of kv) {
    const div = document.createElement("div");
    const dt = document.createElement("dt"); dt.textContent = k;
    const dd = document.createElement("dd"); dd.textContent = v;
    div.append(dt, dd);
    dl.appendChild(div);
  }
  $("job-head-note").textContent = note;
  $("job-head-note").hidden = note === "";
}

// What the server keeps of its ended jobs (GET /api/jobs' "retention"; absent on an
// older server): how many, their bytes, and its rules.
function renderKept(kept) {
  const p = $("jobs-kept");
  p.hidden = !kept;
  if (!kept) return;
  const n = kept.ended_jobs;
  const f = kept.keep_finished_for;
  const age = !(f > 0) ? "" : f >= 86400 ? ` for ${Number((f / 86400).toPrecision(3))} days`
    : ` for ${fmtDuration(f)}`;
  p.textContent = `${n} ended job${n === 1 ? "" : "s"} kept (${fmtBytes(kept.ended_bytes)}` +
    (kept.oldest_finished_at ? `, the oldest ended ${fmtDateTime(kept.oldest_finished_at)}` : "") +
    `); the server keeps the last ${kept.keep_finished_jobs}${age}, then removes the ` +
    "oldest (--keep-finished-jobs, --keep-finished-for).";
}

// Draws the list (on "/") or the job's head (on "/jobs/ID/") from /api/jobs' answer (null:
// a server of one job); returns whether the page goes on to show a job's views.
function renderJobs(listing) {
  const root = PAGE_JOB === null;
  $("nav-jobs").hidden = root || listing === null;
  listedState = null;
  if (listing === null) {
    $("jobs-view").hidden = true;
    $("job-head").hidden = true;
    document.body.classList.remove("no-job");
    return true;
  }
  let show;
  if (root) {
    renderJobTable(listing.jobs);
    renderPastJobs(Array.isArray(listing.past_jobs) ? listing.past_jobs : []);
    renderKept(listing.retention);
    const dflt = listing.jobs.find((j) => j.default);
    show = dflt !== undefined;
    if (show) listedState = dflt.state;
    const note = $("default-note");
    note.hidden = !show;
    if (show) {
      const a = $("default-link");
      a.href = jobHref(dflt.id);
      a.textContent = dflt.id;
    }
  } else {
    const job = listing.jobs.find((j) => j.id === PAGE_JOB);
    renderJobHead(job);
    show = job !== undefined && job.state !== "queued";
    if (show) listedState = job.state;
  }
  document.body.classList.toggle("no-job", !show);
  showJobList(show);
  return show;
}

// The list shows on "/" above the default job's overview, and alone where there is none
// (its clients and round views show without it).
function showJobList(jobShown) {
  if (PAGE_JOB !== null || jobsListed !== true) return;
  $("jobs-view").hidden = jobShown && currentView().name !== "overview";
}

// the links of the page that name the API: under the page's job
function prefixLinks() {
  $("dl-csv").setAttribute("href", `${API}/rounds/export.csv`);
  $("dl-json").setAttribute("href", `${API}/rounds/export.json`);
  if (PAGE_JOB !== null) document.title = `rpsagg · job ${PAGE_JOB}`;
}
