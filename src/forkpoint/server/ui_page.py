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
</style>
</head>
<body>
<header><h1>forkpoint</h1><span id="status" role="status" aria-live="polite"></span></header>
<main>
  <div>
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
</main>
<script>
"use strict";
let state = null, selected = null, lastJson = "";
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

async function refresh() {
  try {
    const fresh = await api("GET", "/ui/state");
    const text = JSON.stringify(fresh);
    if (text !== lastJson) { lastJson = text; state = fresh; render(); }
  } catch (e) { say("cannot reach forkpoint: " + e.message); }
}

function tree() {
  const cks = new Map(state.checkpoints.map((c) => [c.id, c]));
  const sessions = new Map(state.sessions.map((s) => [s.id, s]));
  const kids = new Map(), roots = [];
  const add = (parent, id) => { if (!kids.has(parent)) kids.set(parent, []); kids.get(parent).push(id); };
  // A session hangs under the first checkpoint of its lineage it did not take itself
  // (after a rollback it runs from one of its own, marked "now").
  const origin = (s) => {
    let c = s.parent_checkpoint; const seen = new Set();
    while (c && cks.has(c) && cks.get(c).session_id === s.id && !seen.has(c)) {
      seen.add(c); c = cks.get(c).parent_checkpoint;
    }
    return c && cks.has(c) ? c : null;
  };
  for (const s of state.sessions) { const o = origin(s); if (o) add(o, s.id); else roots.push(s.id); }
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

function renderTree() {
  const t = tree();
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
    el("td", {}, s.state + (s.paused_on_disk ? " (disk only)" : "")),
    el("td", {}, s.metric ? s.metric.cpu_used_pct.toFixed(1) + "%" : "–"),
    el("td", {}, (s.metric ? size(s.metric.mem_used) + " / " : "") + s.memory_mib + " MiB"),
    el("td", {}, size(s.disk_bytes)),
    el("td", {}, ...s.ports.map((p) => el("a", {href: p.url, target: "_blank", rel: "noopener"},
      p.guest_port + "→" + p.host_port + " "))))));
}

function renderEvents() {
  $("events").replaceChildren(...state.events.slice().reverse().map((e) => el("li", {},
    el("span", {class: "when"}, e.at.slice(11, 19)), " ", el("b", {}, e.kind.replace("_", " ")),
    " " + e.session + (e.checkpoint ? " ← " + e.checkpoint : ""))));
}

function render() {
  renderSessions(); renderTree(); renderEvents();
  if (selected && !(state.sessions.some((s) => s.id === selected) ||
                    state.checkpoints.some((c) => c.id === selected))) {
    selected = null; $("detail").replaceChildren(el("p", {}, "It is gone."));
  }
}

function diffText(d) {
  const lines = [];
  const sign = {added: "+", removed: "-", modified: "~", started: "+", gone: "-", opened: "+", closed: "-"};
  for (const f of d.files) lines.push(`${sign[f.change]} ${f.path}  ${f.size} B  ${f.mode}`);
  for (const p of d.processes) lines.push(`${sign[p.change]} process ${p.pid}  ${p.command}`);
  for (const p of d.ports) lines.push(`${sign[p.change]} port ${p.address}:${p.port}`);
  return `${d.source} → ${d.target}: ${d.files.length} files, ${d.processes.length} processes, ` +
    `${d.ports.length} ports (${d.entries} paths, ${Math.round(d.duration_ms)} ms)\n` +
    (lines.length ? lines.join("\n") : "no changes");
}

async function act(what, fn) {
  say(what + "…");
  try { await fn(); say(what + ": done"); } catch (e) { say(what + " failed: " + e.message); }
  await refresh();
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
  const ck = state.checkpoints.find((c) => c.id === id);
  const actions = el("div", {class: "actions"});
  const title = el("h3", {}, (session ? "Session " : "Checkpoint ") + id);
  const diffBox = el("div", {class: "diff", "aria-label": "diff against its parent"}, "computing diff…");
  $("detail").replaceChildren(title, actions, el("h4", {}, "Diff against its parent"), diffBox);
  let diff;
  if (session) {
    actions.append(
      el("button", {class: "act", onclick: () => act("checkpoint", () =>
        api("POST", `/v1/sessions/${id}/checkpoints`, {}))}, "Checkpoint"),
      el("button", {class: "act", onclick: () => rollbackPreview(id, null)}, "Rollback…"),
      el("button", {class: "act danger", onclick: () => {
        if (confirm(`Remove session ${id}?`)) act("remove", () => api("DELETE", `/v1/sessions/${id}`));
      }}, "Remove"));
    for (const p of session.ports) {
      actions.append(el("button", {class: "act", onclick: () => {
        const img = el("img", {class: "thumb", alt: `screenshot of port ${p.guest_port}`,
          src: `/ui/screenshot?session=${id}&port=${p.guest_port}&t=${Date.now()}`});
        $("detail").append(img);
      }}, `Screenshot :${p.guest_port}`));
    }
    diff = session.state === "running" ? api("POST", "/v1/diff", {a: id}) : null;
  } else if (ck) {
    const count = el("input", {type: "number", min: "1", max: "128", value: "2", id: "fork-count",
      "aria-label": "number of forks"});
    actions.append(count,
      el("button", {class: "act", onclick: () => act("fork", () =>
        api("POST", `/v1/checkpoints/${id}/fork`, {count: Number(count.value)}))}, "Fork"));
    if (state.sessions.some((s) => s.id === ck.session_id)) {
      actions.append(el("button", {class: "act", onclick: () => rollbackPreview(ck.session_id, id)},
        `Rollback ${ck.session_id} here…`));
    }
    actions.append(el("button", {class: "act danger", onclick: () => {
      if (confirm(`Remove checkpoint ${id}?`)) act("remove", () => api("DELETE", `/v1/checkpoints/${id}`));
    }}, "Remove"));
    const parent = previousOf(ck);
    diff = parent ? api("POST", "/v1/diff", {a: parent, b: id}) : null;
  }
  if (diff === null) { diffBox.textContent = "nothing to compare with"; return; }
  try { diffBox.textContent = diffText(await diff); }
  catch (e) { diffBox.textContent = "no diff: " + e.message; }
}

refresh();
setInterval(refresh, 2000);
</script>
</body>
</html>
"""
