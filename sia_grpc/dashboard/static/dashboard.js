// sia dashboard: live updates from the server's /events stream (server-sent events).
// The server renders every fragment; this script only puts them in place, and keeps
// the jobs table sorted and filtered as the person asked (kept in the URL's #).
"use strict";

const page = document.body.dataset.page;
const jobId = document.body.dataset.job;  // on a job's page
const jobsTable = document.getElementById("jobs");  // on the jobs page
let opened = false;

function byJob(root, id) {
  return root.querySelector(`tr[data-job="${CSS.escape(id)}"]`);
}

function fromHtml(html, tag) {
  const holder = document.createElement(tag);
  holder.innerHTML = html;
  return holder.firstElementChild;
}

// -- jobs table: sort and filter --------------------------------------------------
const view = { col: null, dir: 1, text: "", state: "" };

function readHash() {
  const p = new URLSearchParams(location.hash.slice(1));
  view.col = p.has("sort") ? Number(p.get("sort")) : null;
  view.dir = p.get("dir") === "desc" ? -1 : 1;
  view.text = p.get("q") || "";
  view.state = p.get("state") || "";
}

function writeHash() {
  const p = new URLSearchParams();
  if (view.col !== null) { p.set("sort", view.col); p.set("dir", view.dir < 0 ? "desc" : "asc"); }
  if (view.text) p.set("q", view.text);
  if (view.state) p.set("state", view.state);
  history.replaceState(null, "", "#" + p.toString());
}

const FINISHED = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);

function shown(tr) {
  const st = tr.dataset.state;
  if (view.state === "ACTIVE" ? FINISHED.has(st) : view.state && st !== view.state) return false;
  return !view.text || tr.textContent.toLowerCase().includes(view.text.toLowerCase());
}

function sortKey(tr) {
  const v = tr.children[view.col].dataset.sort;
  const n = Number(v);
  return v !== "" && !Number.isNaN(n) ? n : v;
}

function arrange() {
  const tbody = document.querySelector("#jobs tbody");
  if (!tbody) return;
  const rows = Array.from(tbody.rows);
  if (view.col !== null) {
    rows.sort((a, b) => {
      const x = sortKey(a), y = sortKey(b);
      return (x < y ? -1 : x > y ? 1 : 0) * view.dir;
    });
    rows.forEach((tr) => tbody.appendChild(tr));
  }
  let visible = 0;
  rows.forEach((tr) => { const s = shown(tr); tr.hidden = !s; visible += s; });
  document.querySelectorAll("#jobs th").forEach((th) => {
    th.setAttribute("aria-sort", Number(th.dataset.col) === view.col
      ? (view.dir > 0 ? "ascending" : "descending") : "none");
  });
  document.getElementById("job-count").textContent =
    visible === rows.length ? rows.length : `${visible} of ${rows.length}`;
  document.getElementById("no-jobs").hidden = rows.length > 0;
}

// A burst of events sorts and counts once, at the next frame, not once per event.
let arranging = false;
function arrangeSoon() {
  if (arranging) return;
  arranging = true;
  requestAnimationFrame(() => { arranging = false; arrange(); });
}

function setupJobs() {
  readHash();
  const filter = document.getElementById("filter");
  const state = document.getElementById("state-filter");
  filter.value = view.text;
  state.value = view.state;
  filter.addEventListener("input", () => { view.text = filter.value; writeHash(); arrange(); });
  state.addEventListener("change", () => { view.state = state.value; writeHash(); arrange(); });
  document.querySelectorAll("#jobs th").forEach((th) => {
    const sort = () => {
      const col = Number(th.dataset.col);
      view.dir = view.col === col ? -view.dir : 1;
      view.col = col;
      writeHash();
      arrange();
    };
    th.addEventListener("click", sort);
    th.addEventListener("keydown", (e) => { if (e.key === "Enter") sort(); });
  });
  arrange();
}

// AGE, kept current in the browser from each row's create time (no request needed).
function age(s) {
  s = Math.max(0, Math.floor(s));
  const m = Math.floor(s / 60), h = Math.floor(s / 3600), d = Math.floor(s / 86400);
  if (s < 120) return `${s}s`;
  if (m < 10) return s % 60 ? `${m}m${s % 60}s` : `${m}m`;
  if (m < 180) return `${m}m`;
  if (h < 8) return m % 60 ? `${h}h${m % 60}m` : `${h}h`;
  if (h < 48) return `${h}h`;
  return `${d}d`;
}

function tickAges() {
  const now = Date.now() / 1000;
  document.querySelectorAll("#jobs tbody tr").forEach((tr) => {
    const created = Number(tr.dataset.created);
    if (created) tr.querySelector("td.age").textContent = age(now - created);
  });
}

// -- events -----------------------------------------------------------------------
const handlers = {
  hello() {},
  upstream(d) {
    const el = document.getElementById("upstream");
    el.textContent = d.state;
    el.className = "upstream " + (d.state === "live" ? "live" : "down");
    el.title = d.detail || "the dashboard's connection to the controller";
  },
  job(d) {
    if (jobsTable) {
      const tbody = jobsTable.tBodies[0];
      const old = byJob(tbody, d.id);
      if (d.deleted) { if (old) old.remove(); }
      else {
        const tr = fromHtml(d.row, "tbody");
        tr.hidden = !shown(tr);  // (filtered at once; sorted with the rest below)
        if (old) old.replaceWith(tr); else tbody.prepend(tr);
      }
      arrangeSoon();
    } else if (jobId && d.id === jobId) {
      refreshDetail();
    }
  },
  cluster(d) {
    const el = document.getElementById("cluster");
    if (el && page === "/") el.replaceWith(fromHtml(d.html, "div"));
  },
  queues(d) {
    const el = document.getElementById("queues");
    if (el && page === "/queues") el.replaceWith(fromHtml(d.html, "div"));
  },
  // Each round is a tbody of its own: its row, then the jobs it moved.
  round(d) {
    const table = document.getElementById("rounds");
    if (!table) return;
    table.tHead.after(fromHtml(d.row, "table"));
    while (table.tBodies.length > 50) table.tBodies[table.tBodies.length - 1].remove();
    document.getElementById("no-rounds").hidden = true;
  },
  rounds(d) {
    const table = document.getElementById("rounds");
    if (!table) return;
    Array.from(table.tBodies).forEach((tb) => tb.remove());
    table.insertAdjacentHTML("beforeend", d.rows);
    document.getElementById("no-rounds").hidden = table.tBodies.length > 0;
  },
};

let detailBusy = null;
async function refreshDetail() {
  // One fetch at a time; a change during it fetches once more after.
  if (detailBusy) { detailBusy.again = true; return; }
  detailBusy = { again: false };
  try {
    const resp = await fetch(`/jobs/${encodeURIComponent(jobId)}/detail`);
    if (resp.ok) document.getElementById("detail").innerHTML = await resp.text();
  } finally {
    const again = detailBusy.again;
    detailBusy = null;
    if (again) refreshDetail();
  }
}

function connect() {
  const es = new EventSource("/events");
  for (const [kind, fn] of Object.entries(handlers)) {
    es.addEventListener(kind, (e) => fn(JSON.parse(e.data)));
  }
  es.addEventListener("open", () => {
    // Reconnected after a break (the dashboard restarted, or this page fell behind):
    // what changed meanwhile was not sent, so draw the page anew.
    if (opened) location.reload();
    opened = true;
  });
}

if (jobsTable) { setupJobs(); setInterval(tickAges, 5000); }
connect();
