# ruff: noqa: E501  (the page: HTML and JavaScript in a string)
"""The web page (one HTML document: styles and script inline, nothing fetched from
elsewhere). See ``ui.py``."""

from __future__ import annotations

__all__ = ["PAGE"]

PAGE = r"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>forkpoint</title>
<link rel="stylesheet" href="/ui/vendor/xterm.css">
<script src="/ui/vendor/xterm.js"></script>
<script src="/ui/vendor/addon-fit.js"></script>
<style>
  :root { font: 15px/1.4 system-ui, sans-serif; color: #1d2330; background: #f6f7f9; }
  body { margin: 0; }
  header { display: flex; gap: 1rem; align-items: baseline; padding: .6rem 1.2rem;
           background: #1d2330; color: #fff; }
  header h1 { font-size: 1.2rem; margin: 0; }
  #status { font-size: .9rem; color: #cfe3ff; }
  main { display: grid; grid-template-columns: minmax(22rem, 1fr) minmax(24rem, 1.3fr);
         gap: 1rem; padding: 1rem 1.2rem; }
  section { background: #fff; border: 1px solid #d8dce3; border-radius: 6px; padding: .6rem 1rem; }
  h2 { font-size: 1rem; margin: .2rem 0 .6rem; }
  table { border-collapse: collapse; width: 100%; font-size: .9rem; }
  th, td { text-align: left; padding: .2rem .4rem; border-bottom: 1px solid #eceef2; }
  ul.tree, ul.tree ul { list-style: none; margin: 0; padding-left: 1.1rem;
                        border-left: 1px dotted #b9c0cc; }
  ul.tree { border: 0; padding-left: 0; }
  .node { font: inherit; font-size: .9rem; border: 1px solid transparent; background: none;
          padding: .1rem .35rem; margin: .1rem 0; border-radius: 4px; cursor: pointer;
          text-align: left; }
  .node:hover, .node:focus-visible { border-color: #7aa7e8; outline: none; }
  .node[aria-current="true"] { background: #dbe8fb; border-color: #4a7fd1; }
  .kind { display: inline-block; min-width: 5.5rem; font-size: .75rem; color: #5b6475; }
  .session .kind { color: #0b6b3a; }
  .now { color: #a0521c; font-size: .75rem; }
  .actions { display: flex; flex-wrap: wrap; gap: .4rem; align-items: center; margin: .4rem 0; }
  button.act { font: inherit; font-size: .9rem; padding: .25rem .7rem; border-radius: 4px;
               border: 1px solid #4a7fd1; background: #fff; color: #1b4c9c; cursor: pointer; }
  button.act.danger { border-color: #c0392b; color: #a02a1f; }
  button.act:focus-visible { outline: 2px solid #1b4c9c; }
  input[type=number] { width: 3.5rem; font: inherit; }
  .diff { font: .85rem/1.35 ui-monospace, monospace; white-space: pre-wrap; margin: .3rem 0;
          max-height: 50vh; overflow: auto; background: #f8f9fb; padding: .4rem; }
  .preview { border: 2px solid #d68a00; border-radius: 6px; padding: .4rem .7rem;
             margin: .5rem 0; background: #fffaf0; }
  img.thumb { max-width: 100%; border: 1px solid #d8dce3; margin-top: .4rem; }
  ol.events { list-style: none; margin: 0; padding: 0; font-size: .85rem; }
  ol.events .when { color: #5b6475; font-variant-numeric: tabular-nums; }
  #terminal-section, #grid-section { grid-column: 1 / -1; }
  #host { margin-left: auto; font-size: .85rem; color: #cfe3ff; }
  form.inline { display: flex; flex-wrap: wrap; gap: .5rem; align-items: center; font-size: .9rem; }
  form.inline input[type=text] { font: inherit; min-width: 10rem; }
  .run { display: flex; gap: .4rem; margin: .4rem 0; }
  .run input { flex: 1; font: .9rem ui-monospace, monospace; }
  ol.timeline { display: flex; flex-wrap: wrap; gap: .3rem; list-style: none; padding: 0; margin: .3rem 0; }
  ol.timeline button { font: inherit; font-size: .8rem; border: 1px solid #c6ccd6; border-radius: 4px;
                       background: #fff; padding: .15rem .4rem; cursor: pointer; text-align: left; }
  ol.timeline button.step { border-color: #4a7fd1; }
  ol.timeline button[aria-pressed="true"] { background: #dbe8fb; }
  ol.timeline .when { display: block; color: #5b6475; font-size: .7rem; }
  .cells { display: grid; grid-template-columns: repeat(auto-fill, minmax(18rem, 1fr)); gap: .8rem; }
  figure.cell { margin: 0; border: 1px solid #d8dce3; border-radius: 6px; padding: .4rem; background: #fbfcfd; }
  figure.cell img, figure.cell .noshot { width: 100%; aspect-ratio: 16 / 10; display: block;
                       border: 1px solid #e1e4ea; background: #eef0f4; cursor: zoom-in; }
  figure.cell .noshot { display: flex; align-items: center; justify-content: center; color: #5b6475;
                        cursor: default; font-size: .85rem; }
  figure.cell figcaption { font-size: .85rem; margin-top: .3rem; }
  figure.cell .line { font: .78rem ui-monospace, monospace; color: #39424f; }
  dialog#enlarged { max-width: 95vw; padding: .6rem; border-radius: 6px; }
  dialog#enlarged img { max-width: 92vw; max-height: 80vh; display: block; }
  #terminal { height: 22rem; background: #000; padding: .3rem; border-radius: 4px; }
</style>
</head>
<body>
<header><h1>forkpoint</h1><span id="status" role="status" aria-live="polite"></span>
  <span id="host" aria-label="the host's room"></span></header>
<main>
  <div>
    <section aria-labelledby="new-h" style="margin-bottom:1rem">
      <h2 id="new-h">New session</h2>
      <form class="inline" id="new-session">
        <label>image <select id="new-image" aria-label="image"></select></label>
        <label>port <input type="number" id="new-port" min="1" max="65535" value="8000" aria-label="guest port to forward"></label>
        <label><input type="checkbox" id="new-history"> history</label>
        <button class="act" type="submit">Create</button>
      </form>
    </section>
    <section aria-labelledby="sessions-h">
      <h2 id="sessions-h">Sessions</h2>
      <table>
        <thead><tr><th>session</th><th>state</th><th>cpu</th><th>memory</th><th>disk</th><th>ports</th></tr></thead>
        <tbody id="sessions"></tbody>
      </table>
    </section>
    <section aria-labelledby="events-h" style="margin-top:1rem">
      <h2 id="events-h">Events</h2>
      <ol class="events" id="events" aria-label="latest events, newest first"></ol>
    </section>
    <section aria-labelledby="tree-h" style="margin-top:1rem">
      <h2 id="tree-h">Lineage</h2>
      <ul class="tree" id="tree" aria-label="checkpoints and sessions"></ul>
    </section>
  </div>
  <section aria-labelledby="detail-h">
    <h2 id="detail-h">Details</h2>
    <div id="detail"><p>Select a session or a checkpoint in the lineage.</p></div>
  </section>
  <section id="grid-section" aria-labelledby="grid-h" hidden>
    <div class="actions">
      <h2 id="grid-h" style="margin:0">Side by side</h2>
      <span id="grid-title"></span>
      <label>port <input type="number" id="grid-port" min="1" max="65535" aria-label="port to screenshot"></label>
      <button class="act" onclick="shootAll()">Take screenshots</button>
      <button class="act" onclick="closeGrid()">Close</button>
    </div>
    <div class="cells" id="cells" aria-label="sessions side by side"></div>
  </section>
  <section id="terminal-section" aria-labelledby="terminal-h" hidden>
    <div class="actions">
      <h2 id="terminal-h" style="margin:0">Terminal</h2>
      <span id="terminal-status" role="status" aria-live="polite"></span>
      <button class="act" onclick="closeTerminal()">Close terminal</button>
    </div>
    <div id="terminal" role="region" aria-label="terminal"></div>
  </section>
</main>
<dialog id="enlarged" aria-label="enlarged screenshot">
  <div class="actions"><strong id="enlarged-title"></strong>
    <button class="act" id="enlarged-toggle">Show differences</button>
    <button class="act" onclick="$('enlarged').close()">Close</button></div>
  <img id="enlarged-img" alt="">
</dialog>
<script>
"use strict";
let state = null, selected = null, selectedState = null, lastJson = "";
const $ = (id) => document.getElementById(id);
const el = (tag, attrs = {}, ...kids) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "onclick") e.addEventListener("click", v); else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k);
  return e;
};
const say = (text) => { $("status").textContent = text; };
const size = (n) => n >= 1 << 30 ? (n / 2 ** 30).toFixed(1) + " GiB"
  : n >= 1 << 20 ? (n / 2 ** 20).toFixed(1) + " MiB" : (n / 1024).toFixed(0) + " KiB";

async function api(method, path, body) {
  const r = await fetch(path, {
    method, credentials: "same-origin",
    headers: {"X-Forkpoint-UI": "1", "Content-Type": "application/json"},
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (r.status === 204) return null;
  const data = await r.json();
  if (!r.ok) throw new Error(data.error ? data.error.message : r.statusText);
  return data;
}

let asked = 0, shown = 0;  // /ui/state requests made, and the newest one rendered
async function refresh() {
  const mine = ++asked;
  try {
    const fresh = await api("GET", "/ui/state");
    if (mine < shown) return;  // an older answer arriving late (an operation refreshed since)
    shown = mine;
    const text = JSON.stringify(fresh);
    if (text !== lastJson) { lastJson = text; state = fresh; render(); }
  } catch (e) { say("cannot reach forkpoint: " + e.message); }
}

function tree() {
  const cks = new Map(state.checkpoints.map((c) => [c.id, c]));
  const sessions = new Map(state.sessions.map((s) => [s.id, s]));
  const kids = new Map(), roots = [];
  const add = (parent, id) => { if (!kids.has(parent)) kids.set(parent, []); kids.get(parent).push(id); };
  // A session hangs under the checkpoint it came from (the server's "origin": the first
  // of its lineage it did not take itself; after a rollback it runs from one of its own).
  for (const s of state.sessions) {
    if (s.origin && cks.has(s.origin)) add(s.origin, s.id); else roots.push(s.id);
  }
  for (const c of state.checkpoints) {
    if (sessions.has(c.session_id)) add(c.session_id, c.id);
    else if (c.parent_checkpoint && cks.has(c.parent_checkpoint)) add(c.parent_checkpoint, c.id);
    else roots.push(c.id);
  }
  return {cks, sessions, kids, roots};
}

function label(id, t) {
  if (t.sessions.has(id)) {
    const s = t.sessions.get(id);
    return [el("span", {class: "kind"}, "session"), (s.name ? s.name + " · " : "") + s.id + " · " + s.state];
  }
  const c = t.cks.get(id);
  const step = state.steps[id];
  const kind = c.kind === "template" ? "image " + c.image : step !== undefined ? "step" : "checkpoint";
  const text = step !== undefined ? step : c.name || c.id;
  const parts = [el("span", {class: "kind"}, kind), text];
  const here = state.sessions.filter((s) => s.parent_checkpoint === id && c.session_id === s.id);
  if (here.length) parts.push(" ", el("span", {class: "now"}, "← rolled back here"));
  return parts;
}

let treeDrawn = "";
function renderTree() {
  const t = tree();
  // Drawn again only when what it shows changed (not for every metrics sample): a button
  // replaced between a press and its release gets no click.
  const drawn = JSON.stringify([selected, t.roots, [...t.kids], state.steps,
    state.sessions.map((s) => [s.id, s.name, s.state, s.parent_checkpoint]),
    state.checkpoints.map((c) => [c.id, c.name, c.kind, c.image, c.session_id])]);
  if (drawn === treeDrawn) return;
  treeDrawn = drawn;
  const node = (id) => {
    const kind = t.sessions.has(id) ? "session" : "checkpoint";
    const li = el("li", {class: kind});
    li.append(el("button", {class: "node", "data-id": id, "data-kind": kind,
      "aria-current": String(id === selected), onclick: () => select(id)}, ...label(id, t)));
    const children = t.kids.get(id) || [];
    if (children.length) li.append(el("ul", {}, ...children.map(node)));
    return li;
  };
  $("tree").replaceChildren(...t.roots.map(node));
}

function renderSessions() {
  // cpu and memory in use: the last sample (every 5 s while this server runs)
  $("sessions").replaceChildren(...state.sessions.map((s) => el("tr", {},
    el("td", {}, (s.name ? s.name + " " : "") + s.id),
    el("td", {}, s.state + (s.paused_on_disk ? " (disk only)" : "") +
      (s.node ? " on " + s.node : "")),
    el("td", {}, s.metric ? s.metric.cpu_used_pct.toFixed(1) + "%" : "–"),
    el("td", {}, (s.metric ? size(s.metric.mem_used) + " / " : "") + s.memory_mib + " MiB"),
    el("td", {}, size(s.disk_bytes)),
    el("td", {}, ...s.ports.map((p) => portLink(s, p))))));
}

// A cluster's session forwards on its node's loopback: reached here by `forkpoint port`.
function portLink(s, p) {
  if (s.node) return el("span", {title: `forkpoint port ${s.id} ${p.guest_port}`},
    p.guest_port + " on " + s.node + " ");
  return el("a", {href: p.url, target: "_blank", rel: "noopener"},
    p.guest_port + "→" + p.host_port + " ");
}

function renderEvents() {
  $("events").replaceChildren(...state.events.slice().reverse().map((e) => el("li", {},
    el("span", {class: "when"}, e.at.slice(11, 19)), " ", el("b", {}, e.kind.replace("_", " ")),
    " " + e.session + (e.checkpoint ? " ← " + e.checkpoint : ""))));
}

const count = (n, one, many = one + "s") => `${n} ${n === 1 ? one : many}`;

function renderHost() {
  const h = state.host, gib = (mib) => (mib / 1024).toFixed(1) + " GiB";
  $("host").textContent = `sessions ${h.sessions_running}/${h.sessions_max} · memory ` +
    `${gib(h.memory_available_mib)} free, ${gib(h.memory_sessions_mib)} to guests · disk ` +
    `${size(h.disk_free_bytes)} free (${size(h.disk_reserve_bytes)} kept) · ` +
    `${count(h.warm_vms, "warm VM")} · load ${h.load_1m}`;
}

function render() {
  renderSessions(); renderTree(); renderEvents(); renderHost(); gridFollows();
  if (selected && !(state.sessions.some((s) => s.id === selected) ||
                    state.checkpoints.some((c) => c.id === selected))) {
    selected = null; $("detail").replaceChildren(el("p", {}, "It is gone."));
  }
  // A shown session that changed state (a fork that came up, one that stopped) is shown
  // again: what can be done with it changed (its Run box, its Terminal).
  const shownSession = state.sessions.find((s) => s.id === selected);
  if (shownSession && shownSession.state !== selectedState) select(selected);
}

function diffText(d) {
  const lines = [];
  const sign = {added: "+", removed: "-", modified: "~", started: "+", gone: "-", opened: "+", closed: "-"};
  for (const f of d.files) lines.push(`${sign[f.change]} ${f.path}  ${f.size} B  ${f.mode}`);
  for (const p of d.processes) lines.push(`${sign[p.change]} process ${p.pid}  ${p.command}`);
  for (const p of d.ports) lines.push(`${sign[p.change]} port ${p.address}:${p.port}`);
  return `${d.source} → ${d.target}: ${count(d.files.length, "file")}, ` +
    `${count(d.processes.length, "process", "processes")}, ${count(d.ports.length, "port")} ` +
    `(${d.entries} paths, ${Math.round(d.duration_ms)} ms)\n` +
    (lines.length ? lines.join("\n") : "no changes");
}

async function act(what, fn) {  // "done" once the page shows what the operation made
  say(what + "…");
  let outcome = ": done";
  try { await fn(); } catch (e) { outcome = " failed: " + e.message; }
  await refresh();
  say(what + outcome);
}

function previousOf(c) {
  const own = state.checkpoints.filter((x) => x.session_id === c.session_id && x.created_at < c.created_at);
  return own.length ? own[own.length - 1].id : c.parent_checkpoint;
}

async function rollbackPreview(session, checkpoint) {
  const box = el("div", {class: "preview", role: "region", "aria-label": "rollback preview"},
    el("p", {}, "Computing what the rollback would undo…"));
  $("detail").append(box);
  try {
    const d = await api("POST", `/v1/sessions/${session}/rollback/preview`, {checkpoint});
    box.replaceChildren(
      el("p", {}, el("strong", {}, `Rolling back ${session} to ${d.source} would undo:`)),
      el("div", {class: "diff"}, diffText(d)),
      el("div", {class: "actions"},
        el("button", {class: "act danger", onclick: () => act("rollback", async () => {
          await api("POST", `/v1/sessions/${session}/rollback`, {checkpoint});
          box.remove();
        })}, "Confirm rollback"),
        el("button", {class: "act", onclick: () => box.remove()}, "Cancel")));
  } catch (e) { box.replaceChildren(el("p", {}, "No preview: " + e.message)); }
}

async function select(id) {
  selected = id; renderTree();
  const session = state.sessions.find((s) => s.id === id);
  selectedState = session ? session.state : null;
  const ck = state.checkpoints.find((c) => c.id === id);
  const actions = el("div", {class: "actions"});
  const title = el("h3", {}, (session ? "Session " : "Checkpoint ") + id);
  const diffBox = el("div", {class: "diff", "aria-label": "diff against its parent"}, "computing diff…");
  $("detail").replaceChildren(title, actions);
  let diff;
  if (session) {
    actions.append(
      el("button", {class: "act", onclick: () => act("checkpoint", () =>
        api("POST", `/v1/sessions/${id}/checkpoints`, {}))}, "Checkpoint"),
      el("button", {class: "act", onclick: () => rollbackPreview(id, null)}, "Rollback…"),
      el("button", {class: "act danger", onclick: () => {
        if (confirm(`Remove session ${id}?`)) act("remove", () => api("DELETE", `/v1/sessions/${id}`));
      }}, "Remove"));
    if (session.state === "running") {
      actions.append(el("button", {class: "act", onclick: () => openTerminal(id)}, "Terminal"));
    }
    for (const p of session.ports) {
      actions.append(el("button", {class: "act", onclick: () => act(`screenshot of :${p.guest_port}`, async () => {
        const shot = await api("POST", `/ui/shots/${id}?port=${p.guest_port}`);
        $("detail").append(el("img", {class: "thumb", alt: `screenshot of port ${p.guest_port}`,
          src: shotUrl(id, p.guest_port, shot.shot)}));
      })}, `Screenshot :${p.guest_port}`));
    }
    if (session.state === "running") $("detail").append(runBox(id));
    $("detail").append(el("h4", {}, "Timeline"), timeline(id));
    // On request: a running session's diff checkpoints it first.
    diffBox.textContent = "";
    diffBox.append(el("button", {class: "act", onclick: async () => {
      diffBox.textContent = "computing diff…";
      try { diffBox.textContent = diffText(await api("POST", "/v1/diff", {a: id})); }
      catch (e) { diffBox.textContent = "no diff: " + e.message; }
    }}, "Compare with its parent"));
    $("detail").append(el("h4", {}, "Diff against its parent"), diffBox);
    return;
  } else if (ck) {
    const count = el("input", {type: "number", min: "1", max: "128", value: "2", id: "fork-count",
      "aria-label": "number of forks"});
    actions.append(count,
      el("button", {class: "act", onclick: () => act("fork", () =>
        api("POST", `/v1/checkpoints/${id}/fork`, {count: Number(count.value)}))}, "Fork"),
      el("button", {class: "act", onclick: () => openGrid(id)}, "Side by side"));
    if (state.sessions.some((s) => s.id === ck.session_id)) {
      actions.append(el("button", {class: "act", onclick: () => rollbackPreview(ck.session_id, id)},
        `Rollback ${ck.session_id} here…`));
    }
    actions.append(el("button", {class: "act danger", onclick: () => {
      if (confirm(`Remove checkpoint ${id}?`)) act("remove", () => api("DELETE", `/v1/checkpoints/${id}`));
    }}, "Remove"));
    const parent = previousOf(ck);
    diff = parent ? api("POST", "/v1/diff", {a: parent, b: id}) : null;
    $("detail").append(el("h4", {}, "Diff against its parent"), diffBox);
  }
  if (diff === null) { diffBox.textContent = "nothing to compare with"; return; }
  try { diffBox.textContent = diffText(await diff); }
  catch (e) { diffBox.textContent = "no diff: " + e.message; }
}

// -- new sessions --------------------------------------------------------------------
$("new-session").addEventListener("submit", (e) => {
  e.preventDefault();
  const body = {image: $("new-image").value || "default", history: $("new-history").checked};
  if ($("new-port").value) body.ports = [Number($("new-port").value)];
  let made = null;
  act("create", async () => { made = await api("POST", "/v1/sessions", body); })
    .then(() => { if (made) select(made.id); });
});
api("GET", "/v1/images").then((images) => $("new-image").replaceChildren(
  ...images.map((i) => el("option", {value: i.name, ...(i.name === "default" ? {selected: ""} : {})},
                          i.name)))).catch(() => {});

// -- a command in a session (a history step where the session keeps history) -----------
function runBox(session) {
  const input = el("input", {type: "text", "aria-label": "command to run", placeholder: "a shell command"});
  const out = el("div", {class: "diff", "aria-label": "command output", hidden: ""});
  const form = el("form", {class: "run"}, input, el("button", {class: "act", type: "submit"}, "Run"));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    act("run", async () => {
      const r = await api("POST", `/v1/sessions/${session}/exec`, {command: input.value, timeout: 600});
      out.hidden = false;
      out.textContent = `$ ${input.value}\n${r.stdout}${r.stderr}(exit ${r.exit_code}, ${Math.round(r.duration_ms)} ms)`;
    });
  });
  return el("div", {}, form, out);
}

// -- a session's timeline: its events and history steps, oldest first --------------------
function timeline(session) {
  const strip = el("ol", {class: "timeline", "aria-label": "timeline"}, el("li", {}, "loading…"));
  const detail = el("div", {"aria-label": "timeline item"});
  Promise.all([api("GET", `/v1/events?session=${session}&limit=1000`),
               // a session without history has no steps (the route says so with a 409)
               api("GET", `/v1/sessions/${session}/history`).catch(() => [])]).then(([events, steps]) => {
    const items = events.map((e) => ({at: e.at, kind: e.kind.replace("_", " "), event: e}))
      .concat(steps.map((st, i) => ({at: st.created_at, kind: `step ${st.step}`, step: st,
                                     next: steps[i + 1]})))
      .sort((a, b) => a.at < b.at ? -1 : a.at > b.at ? 1 : 0);
    strip.replaceChildren(...items.map((item) => {
      const text = item.step ? `${item.kind}: ${item.step.label}` : item.kind +
        (item.event.checkpoint ? " " + item.event.checkpoint : "");
      const b = el("button", {class: item.step ? "step" : "", "aria-pressed": "false"},
        el("span", {class: "when"}, item.at.slice(11, 19) + (item.step ? " · " + size(item.step.size_bytes) : "")),
        text);
      b.addEventListener("click", () => {
        strip.querySelectorAll("button").forEach((x) => x.setAttribute("aria-pressed", "false"));
        b.setAttribute("aria-pressed", "true");
        showItem(session, item, detail);
      });
      return el("li", {}, b);
    }));
    if (!items.length) strip.replaceChildren(el("li", {}, "nothing yet"));
  }).catch((e) => strip.replaceChildren(el("li", {}, "no timeline: " + e.message)));
  return el("div", {}, strip, detail);
}

async function showItem(session, item, box) {
  const target = item.step ? item.step.checkpoint : item.event.checkpoint;
  const own = target && state.checkpoints.some((c) => c.id === target);
  box.replaceChildren();
  if (own) {
    box.append(el("div", {class: "actions"}, el("button", {class: "act danger",
      onclick: () => rollbackPreview(session, target)},
      item.step ? `Undo to here (before step ${item.step.step})…` : "Roll back here…")));
  }
  if (!item.step) return;
  const d = el("div", {class: "diff", "aria-label": "what the step changed"}, "computing diff…");
  box.append(d);
  const after = item.next ? item.next.checkpoint : session;
  try { d.textContent = diffText(await api("POST", "/v1/diff", {a: item.step.checkpoint, b: after})); }
  catch (e) { d.textContent = "no diff: " + e.message; }
}

// -- side by side: a checkpoint's sessions, as pictures ----------------------------------
// A kept shot's picture; its number in the URL, so a new shot is a new picture to the cache.
const shotUrl = (session, port, n) => `/ui/shots/${session}?port=${port}&n=${n}`;
let grid = null;  // {checkpoint, diffs: {session: its one-line diff}}
const shotOf = {};  // session -> what it was when this page last shot it (see versionOf)
const gridPort = () => Number($("grid-port").value);

function openGrid(checkpoint) {
  const ck = state.checkpoints.find((c) => c.id === checkpoint);
  const related = state.sessions.filter((s) => s.id === ck.session_id || s.parent_checkpoint === checkpoint);
  const ports = related.flatMap((s) => s.ports.map((p) => p.guest_port));
  $("grid-port").value = ports.length ? ports[0] : 8000;
  grid = {checkpoint, diffs: {}};
  $("grid-section").hidden = false;
  $("grid-title").textContent = `checkpoint ${checkpoint}`;
  $("grid-section").scrollIntoView({block: "nearest"});
  drawGrid(true);
}

function closeGrid() { grid = null; $("grid-section").hidden = true; }

function shootAll() {
  if (!grid) return;
  for (const id of Object.keys(shotOf)) delete shotOf[id];
  drawGrid(true);
}

// What a session is now, as far as its picture goes: a new step or checkpoint of its own,
// a rollback, a pause or resume each make a new one.
function versionOf(id) {
  const s = state.sessions.find((x) => x.id === id);
  const own = state.checkpoints.filter((c) => c.session_id === id).length;  // history steps too
  return s ? `${s.state} ${s.parent_checkpoint} ${own}` : "gone";
}

async function drawGrid(shoot) {
  const g = grid; if (!g) return;
  const port = gridPort();
  let data;
  try { data = await api("GET", `/ui/grid?checkpoint=${g.checkpoint}&port=${port}`); }
  catch (e) { $("cells").replaceChildren(el("p", {}, "no grid: " + e.message)); return; }
  if (grid !== g) return;
  const due = !shoot ? [] : data.cells.filter((c) => c.forwards && c.state === "running" &&
    (!c.shot || shotOf[c.session] !== versionOf(c.session)));
  for (const c of due) {
    if (shotOf[c.session] !== undefined) delete g.diffs[c.session];  // it changed: diff again
    shotOf[c.session] = versionOf(c.session);
  }
  const parentShot = (data.cells.find((c) => c.session === data.parent) || {}).shot;
  $("cells").replaceChildren(...data.cells.map((c) => cell(c, data.parent, parentShot, port)));
  await Promise.all(due.map(async (c) => {
    const figure = document.querySelector(`figure.cell[data-session="${c.session}"]`);
    if (figure) figure.querySelector(".state").textContent = "taking a screenshot…";
    try { await api("POST", `/ui/shots/${c.session}?port=${port}`); }
    catch (e) { if (figure) figure.querySelector(".state").textContent = "no screenshot: " + e.message; return; }
  }));
  if (due.length && grid === g) drawGrid(false);
}

function gridFollows() {  // after each step, the sessions that changed are shot again
  if (grid && state.sessions.some((s) => shotOf[s.id] !== undefined && shotOf[s.id] !== versionOf(s.id))) {
    drawGrid(true);
  }
}

function cell(c, parent, parentShot, port) {
  const title = (c.name ? c.name + " · " : "") + c.session;
  const picture = c.shot
    ? el("img", {src: shotUrl(c.session, port, c.shot), alt: `screenshot of ${title}`,
                 tabindex: "0", "data-shot": String(c.shot)})
    : el("div", {class: "noshot"}, c.forwards ? "no screenshot yet" : `forwards no port ${port}`);
  const compared = c.session === parent ? "parent"
    : c.differs === null ? "" : `differs from the parent in ${(c.differs * 100).toFixed(2)}% of pixels`;
  const line = el("div", {class: "line"}, grid.diffs[c.session] || "");
  const figure = el("figure", {class: "cell", "data-session": c.session},
    picture, el("figcaption", {}, el("strong", {}, title), " · ", el("span", {class: "state"}, c.state),
      el("div", {class: "compared"}, compared), line));
  if (c.shot) {
    const open = () => enlarge(c, parent, parentShot, port, title);
    picture.addEventListener("click", open);
    picture.addEventListener("keydown", (e) => { if (e.key === "Enter") open(); });
  }
  if (c.session !== parent && c.state === "running" && !grid.diffs[c.session]) oneLineDiff(c.session, line);
  return figure;
}

async function oneLineDiff(session, line) {  // one at a time: each costs a checkpoint of the session
  const g = grid;
  g.diffs[session] = line.textContent = "comparing with the checkpoint…";
  g.diffQueue = (g.diffQueue || Promise.resolve()).then(async () => {
    try {
      const d = await api("POST", "/v1/diff", {a: g.checkpoint, b: session});
      g.diffs[session] = `changed: ${count(d.files.length, "file")}, ` +
        `${count(d.processes.length, "process", "processes")}, ${count(d.ports.length, "port")}`;
    } catch (e) { g.diffs[session] = "no diff: " + e.message; }
    const shown = document.querySelector(`figure.cell[data-session="${session}"] .line`);
    if (shown && grid === g) shown.textContent = g.diffs[session];
  });
}

function enlarge(c, parent, parentShot, port, title) {
  const img = $("enlarged-img"), toggle = $("enlarged-toggle");
  const plain = shotUrl(c.session, port, c.shot);
  const overlay = `/ui/shots/${c.session}/overlay?port=${port}&parent=${parent}&n=${c.shot}-${parentShot}`;
  img.src = plain; img.alt = "screenshot of " + title;
  $("enlarged-title").textContent = title;
  toggle.hidden = !parent || c.session === parent;
  toggle.textContent = "Show differences";
  toggle.onclick = () => {
    const showing = img.src.includes("/overlay");
    img.src = showing ? plain : overlay;
    toggle.textContent = showing ? "Show differences" : "Show the screenshot";
  };
  $("enlarged").showModal();
}

// -- the terminal: a login shell on a new PTY in the session (POST /terminals streams its
// output as NDJSON; keys go to /input, sizes to /size). When the stream breaks without an
// end (a rollback restarted the VM) it reconnects to the same pid: the shell is back if
// the checkpoint had it, otherwise the page says the rollback undid it.
let term = null;
const termSay = (text) => { $("terminal-status").textContent = text; };
const toBase64 = (bytes) => btoa(Array.from(bytes, (b) => String.fromCharCode(b)).join(""));
const fromBase64 = (text) => Uint8Array.from(atob(text), (c) => c.charCodeAt(0));

function closeTerminal() {
  if (!term) return;
  term.closed = true; term.abort.abort(); term.xterm.dispose(); term = null;
  $("terminal-section").hidden = true;
}

async function openTerminal(session) {
  closeTerminal();
  if (typeof Terminal === "undefined") {
    say("no terminal: xterm.js is not vendored here (make setup fetches it)"); return;
  }
  $("terminal-section").hidden = false;
  const xterm = new Terminal({cursorBlink: true, fontSize: 14, scrollback: 5000});
  const fit = new FitAddon.FitAddon();
  xterm.loadAddon(fit); xterm.open($("terminal")); fit.fit();
  $("terminal-section").scrollIntoView({block: "nearest"});  // xterm draws only what is seen
  const t = term = {session, pid: null, xterm, fit, abort: new AbortController(), closed: false,
                    typing: Promise.resolve()};
  const path = () => `/v1/sessions/${session}/terminals/${t.pid}`;
  xterm.onData((data) => {  // in order: one request after the other
    const bytes = new TextEncoder().encode(data);
    t.typing = t.typing.then(() => t.pid && api("POST", path() + "/input", {data: toBase64(bytes)}))
      .catch((e) => termSay("typing failed: " + e.message));
  });
  xterm.onResize(({cols, rows}) => {
    if (t.pid) api("POST", path() + "/size", {cols, rows}).catch(() => {});
  });
  termSay(`opening a shell in ${session}…`);
  xterm.focus();
  await follow(t, () => stream("POST", `/v1/sessions/${session}/terminals`,
                                {cols: xterm.cols, rows: xterm.rows}));
}

function stream(method, path, body) {
  return fetch(path, {method, credentials: "same-origin", signal: term.abort.signal,
    headers: {"X-Forkpoint-UI": "1", "Content-Type": "application/json"},
    body: body === undefined ? undefined : JSON.stringify(body)});
}

async function follow(t, open) {
  for (let attempt = 0; !t.closed; attempt++) {
    let r = null;
    try { r = await open(); } catch (e) { if (t.closed) return; }
    if (r && r.ok) {
      attempt = 0;
      if (await read(t, r) || t.closed) return;  // the shell ended, or the page closed it
    } else if (r && (t.pid === null || r.status === 404)) {
      const data = await r.json().catch(() => ({}));
      const why = data.error ? data.error.message : r.statusText;
      const undone = t.pid !== null && state.sessions.some((s) => s.id === t.session);
      termSay(undone ? `shell ${t.pid} is gone: the rollback undid it (${why})`
                     : "no terminal: " + why);
      return;
    }
    if (t.pid === null || attempt >= 30) { termSay("the terminal's connection is lost"); return; }
    termSay(`reconnecting to shell ${t.pid}…`);
    await new Promise((ok) => setTimeout(ok, 1000));
    open = () => stream("GET", `/v1/sessions/${t.session}/terminals/${t.pid}`);
  }
}

async function read(t, response) {  // true once the shell ended
  const reader = response.body.getReader(), text = new TextDecoder();
  let buffer = "";
  try {
    for (;;) {
      const {value, done} = await reader.read();
      if (done) return false;
      buffer += text.decode(value, {stream: true});
      let newline;
      while ((newline = buffer.indexOf("\n")) >= 0) {
        const event = JSON.parse(buffer.slice(0, newline));
        buffer = buffer.slice(newline + 1);
        if (event.kind === "start") {
          termSay((t.pid === null ? "shell" : "reconnected to shell") + ` ${event.pid} in ${t.session}`);
          t.pid = event.pid;
          t.fit.fit();
        } else if (event.kind === "end") {
          termSay(`shell ${t.pid} ended (exit ${event.exit_code ?? "signal " + event.signal})`);
          return true;
        } else t.xterm.write(fromBase64(event.data));
      }
    }
  } catch (e) { return false; }
}

window.addEventListener("resize", () => { if (term) term.fit.fit(); });
refresh();
setInterval(refresh, 2000);
</script>
</body>
</html>
"""
