// Muster dashboard: plain JS over the gateway's REST API (docs/dashboard.md).
// One view at a time (the URL's hash); the visible view and the summary are polled
// every POLL_MS, so the page updates without reloading.
"use strict";

const POLL_MS = 2000;
const $ = (sel) => document.querySelector(sel);
const state = { view: "queue", jobId: null, queuePage: 1, mapPage: 1, timer: null };

const esc = (v) => String(v ?? "").replace(/[&<>"']/g, (c) => ({
  "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
const when = (t) => (t == null ? "" : new Date(t * 1000).toLocaleString());
const dur = (s) => {
  if (s == null) return "";
  s = Math.round(s);
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
  return (h ? `${h}:` : "") + `${String(m).padStart(h ? 2 : 1, "0")}:${String(r).padStart(2, "0")}`;
};
const num = (v, d = 3) => (v == null ? "" : Number(v).toFixed(d));
// One stable colour per job, so a job's GPUs read as one block across nodes.
const jobColour = (id) => `hsl(${(id * 137.508) % 360}, 62%, 45%)`;

async function get(path) {
  const r = await fetch(path, { headers: { Accept: "application/json" } });
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || `${r.status} ${r.statusText}`);
  return body;
}

function showError(err) {
  const el = $("#error");
  el.hidden = !err;
  el.textContent = err ? String(err.message || err) : "";
  $("#live").classList.toggle("stale", !!err);
}

// --- summary (always visible) --------------------------------------------------

async function loadSummary() {
  const map = await get("/api/gpumap?per_page=1");
  const g = map.by_state;
  $("#summary").innerHTML =
    `<span>${map.total} nodes</span>` +
    `<span data-testid="gpus-allocated">${g.allocated} allocated</span>` +
    `<span>${g.idle} idle</span>` +
    `<span>${g.unhealthy} unhealthy</span>` +
    `<span>${g.drained} drained</span>`;
}

// --- queue ---------------------------------------------------------------------

function queueQuery() {
  const f = new FormData($("#queue-filter"));
  const q = new URLSearchParams({ page: state.queuePage, per_page: 100 });
  const st = f.get("state");
  if (st === "all") q.set("all", "1");
  else if (st) q.set("state", st);
  for (const k of ["user", "partition"]) if (f.get(k)) q.set(k, f.get(k));
  return q;
}

async function loadQueue() {
  const page = await get(`/api/queue?${queueQuery()}`);
  state.queuePage = page.page;
  const chips = Object.entries(page.by_state).map(([s, n]) => `<span>${esc(s)} ${n}</span>`);
  const reasons = Object.entries(page.by_reason).map(([r, n]) => `<span>pending: ${esc(r)} ${n}</span>`);
  $("#queue-counts").innerHTML = chips.concat(reasons).join("");
  $("#queue-table tbody").innerHTML = page.jobs.map((j) => `
    <tr data-job="${j.job_id}">
      <td><a href="#job/${j.job_id}">${j.job_id}</a></td><td>${esc(j.name)}</td>
      <td>${esc(j.user)}</td><td>${esc(j.partition)}</td>
      <td class="state-${esc(j.state)}">${esc(j.state)}</td>
      <td class="reason">${esc(j.reason)}${j.detail ? ` — ${esc(j.detail)}` : ""}</td>
      <td>${j.nodelist.length ? esc(j.nodelist.join(",")) : j.nodes}</td><td>${j.gpus}</td>
      <td>${j.restart_count}</td><td>${when(j.estimated_start)}</td><td>${dur(j.elapsed_s)}</td>
    </tr>`).join("");
  $("#page").textContent = `page ${page.page} of ${page.pages} (${page.total} jobs)`;
  $("#prev").disabled = page.page <= 1;
  $("#next").disabled = page.page >= page.pages;
}

// --- GPU map -------------------------------------------------------------------

function cellHtml(node, [index, st, job, xid]) {
  const title = `${node}/${index}: ${st}` + (job != null ? ` (job ${job})` : "") + (xid != null ? `, last XID ${xid}` : "");
  const style = st === "allocated" ? ` style="background:${jobColour(job)}"` : "";
  const label = st === "unhealthy" ? "✕" : "";
  const link = job != null ? ` onclick="location.hash='#job/${job}'"` : "";
  return `<span class="cell ${st}" data-gpu="${esc(node)}/${index}" data-state="${st}"` +
    ` data-job="${job ?? ""}" title="${esc(title)}"${style}${link}>${label}</span>`;
}

async function loadGpus() {
  const map = await get(`/api/gpumap?page=${state.mapPage}&per_page=1000`);
  const filter = $("#node-filter").value.trim().toLowerCase();
  const rows = map.nodes.filter((n) => !filter || n.name.toLowerCase().includes(filter) || n.state.toLowerCase() === filter);
  $("#gpumap").innerHTML = rows.map((n) => `
    <div class="node ${n.state === "UP" ? "" : "not-up"}" data-node="${esc(n.name)}" data-state="${esc(n.state)}"
         title="${esc(n.name)}: ${esc(n.state)}${n.reason ? " — " + esc(n.reason) : ""}">
      <div><span class="name">${esc(n.name)}</span>${n.state === "UP" ? "" : `<span class="badge">${esc(n.state)}</span>`}${n.xid != null ? `<span class="xid" data-xid="${n.xid}">XID ${n.xid}</span>` : ""}</div>
      <div class="cells">${n.gpus.map((c) => cellHtml(n.name, c)).join("")}</div>
    </div>`).join("");
  state.mapPage = map.page;
  $("#map-pager").textContent = map.pages > 1 ? `nodes page ${map.page} of ${map.pages}` : "";
}

// --- job page ------------------------------------------------------------------

async function loadJob() {
  const r = await get(`/api/jobs/${state.jobId}`);
  const j = r.job;
  $("#job-title").textContent = `Job ${j.job_id}: ${j.name}`;
  const facts = {
    state: j.state, reason: j.reason + (j.detail ? ` — ${j.detail}` : ""),
    "why pending": r.why_pending, user: j.user, account: j.account, partition: j.partition,
    qos: j.qos, nodes: j.nodelist.join(",") || j.nodes, GPUs: j.gpus,
    restarts: j.restart_count, submitted: when(j.submitted_at), started: when(j.started_at),
    ended: when(j.ended_at), "estimated start": when(j.estimated_start),
    elapsed: dur(j.elapsed_s), "time limit": dur(j.time_limit_s), "exit code": j.exit_code,
    dependency: r.dependency, approval: r.approval,
  };
  $("#job-facts").innerHTML = Object.entries(facts)
    .filter(([, v]) => v !== "" && v != null)
    .map(([k, v]) => `<dt>${esc(k)}</dt><dd data-fact="${esc(k)}">${esc(v)}</dd>`).join("");
  $("#job-attempts tbody").innerHTML = r.attempts.map((a) => `
    <tr><td>${a.attempt}</td><td>${a.seq}</td><td>${esc(a.nodes.join(","))}</td><td>${a.world_size}</td>
    <td>${esc(a.reason)}</td><td>${esc(a.outcome)}</td><td>${when(a.started_at)}</td><td>${when(a.ended_at)}</td></tr>`).join("");
  const out = r.output;
  $("#job-output-path").textContent = [out.path, out.note].filter(Boolean).join(" — ");
  const pre = $("#job-output");
  const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
  pre.textContent = out.tail;
  if (atEnd) pre.scrollTop = pre.scrollHeight;
}

// --- fair share ------------------------------------------------------------------

async function loadShare() {
  const r = await get("/api/share");
  $("#share-algo").textContent = `algorithm ${r.algorithm}, usage half-life ${dur(r.half_life_s)}`;
  $("#share-table tbody").innerHTML = r.rows.map((row) => `
    <tr><td style="padding-left:${0.5 + row.depth * 1.4}em" class="${row.user ? "" : "share-account"}">
      ${esc(row.user ? row.user : row.account)}</td>
    <td>${row.raw_shares}</td><td>${num(row.norm_shares)}</td><td>${num(row.raw_usage, 1)}</td>
    <td>${num(row.effective_usage)}</td><td>${row.level_fs == null ? "∞" : num(row.level_fs)}</td>
    <td>${num(row.fairshare)}</td></tr>`).join("");
}

// --- utilisation chart --------------------------------------------------------------

async function loadUtil() {
  const hours = $("#util-hours").value;
  const u = await get(`/api/utilisation?hours=${hours}`);
  const W = 800, H = 260, pad = 28, n = u.share.length;
  const x = (i) => pad + (i / Math.max(1, n - 1)) * (W - 2 * pad);
  const y = (v) => H - pad - v * (H - 2 * pad);
  const points = u.share.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
  const grid = [0, 0.25, 0.5, 0.75, 1].map((v) =>
    `<line x1="${pad}" x2="${W - pad}" y1="${y(v)}" y2="${y(v)}" stroke="#e3e6ea"/>` +
    `<text x="2" y="${y(v) + 4}" font-size="10">${v * 100}%</text>`).join("");
  const area = n ? `<polygon fill="#3f7be033" points="${x(0)},${y(0)} ${points} ${x(n - 1)},${y(0)}"/>` : "";
  $("#util-chart").innerHTML = grid + area +
    `<polyline fill="none" stroke="#3f7be0" stroke-width="2" points="${points}"/>` +
    `<text x="${pad}" y="${H - 6}" font-size="10">${esc(when(u.start))}</text>` +
    `<text x="${W - pad}" y="${H - 6}" font-size="10" text-anchor="end">now</text>`;
  const mean = n ? u.busy.reduce((a, b) => a + b, 0) / n : 0;
  $("#util-caption").textContent =
    `${u.total_gpus} GPUs; mean ${mean.toFixed(2)} held over the last ${hours} h ` +
    `(buckets of ${dur(u.bucket_s)})`;
}

// --- routing and polling ------------------------------------------------------------

const LOADERS = { queue: loadQueue, gpus: loadGpus, job: loadJob, share: loadShare, util: loadUtil };

function route() {
  const [view, arg] = (location.hash.slice(1) || "queue").split("/");
  state.view = LOADERS[view] ? view : "queue";
  state.jobId = view === "job" ? arg : null;
  for (const el of document.querySelectorAll("main section")) el.hidden = el.id !== `view-${state.view}`;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.view === state.view);
  refresh();
}

async function refresh() {
  clearTimeout(state.timer);
  try {
    await Promise.all([LOADERS[state.view](), loadSummary()]);
    showError(null);
  } catch (err) {
    showError(err);
  }
  state.timer = setTimeout(refresh, document.hidden ? POLL_MS * 5 : POLL_MS);
}

async function start() {
  try {
    $("#user").textContent = (await get("/api/whoami")).user;
  } catch (err) {
    showError(err);
  }
  $("#prev").onclick = () => { state.queuePage -= 1; refresh(); };
  $("#next").onclick = () => { state.queuePage += 1; refresh(); };
  $("#queue-filter").onchange = () => { state.queuePage = 1; refresh(); };
  $("#queue-filter").onsubmit = (e) => { e.preventDefault(); refresh(); };
  $("#node-filter").oninput = () => refresh();
  $("#util-hours").onchange = () => refresh();
  window.onhashchange = route;
  route();
}

start();
