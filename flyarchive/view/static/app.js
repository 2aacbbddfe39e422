// flyarchive view: the world table (filtered, sorted and paged on the server), the
// selection that drives traces, the 3D pose view and renders.
import { Traces } from "/static/traces.js";

const $ = (id) => document.getElementById(id);
const token = new URLSearchParams(location.search).get("token") || sessionStorage.getItem("flyarchive-token") || "";
sessionStorage.setItem("flyarchive-token", token);
history.replaceState(null, "", location.pathname);  // the token leaves the address bar

// What tests and the benchmark wait on: counters of finished updates.
const state = window.flyarchiveView = {
  info: null, table: { where: "", sort: "world", desc: false, page: 0, size: 50 },
  selected: [], frame: 0, tableSeq: 0, tracesSeq: 0, poseSeq: 0, errors: 0, playing: false,
};

class ApiError extends Error {
  constructor(message, replaced) { super(message); this.replaced = replaced; }
}

async function api(path, options = {}) {
  const response = await fetch(path, {
    ...options, headers: { "X-Flyarchive-Token": token, ...(options.headers || {}) },
  });
  const timing = /dur=([0-9.]+)/.exec(response.headers.get("Server-Timing") || "");
  if (timing) state.serverMs = Number(timing[1]);
  if (!response.ok) {
    let text = `${response.status} ${response.statusText}`;
    let replaced = false;
    try { const j = await response.json(); text = j.error || text; replaced = !!j.replaced; } catch (e) { /* not JSON */ }
    throw new ApiError(text, replaced);
  }
  return response;
}
const getJson = async (path) => (await api(path)).json();

function say(text, isError = false) {
  const box = $("message");
  box.hidden = !text;
  box.className = isError ? "error" : "";
  box.textContent = text;
  if (isError) state.errors += 1;
}

function failed(err) {
  say(err.message, true);
  if (err.replaced) {
    const button = document.createElement("button");
    button.textContent = "Open it again";
    button.id = "reopen";
    button.onclick = reopen;
    $("message").append(button);
  }
}

async function guarded(work) {
  try { return await work(); } catch (err) { failed(err); return undefined; }
}

// ------------------------------------------------------------------ the table
let tableAsked = 0;
async function loadTable() {
  const asked = ++tableAsked;
  const t = state.table;
  const q = new URLSearchParams({ where: t.where, sort: t.sort, desc: t.desc ? "1" : "0", page: t.page, size: t.size });
  const answer = await getJson(`/api/table?${q}`);
  if (asked !== tableAsked) return;
  t.page = answer.page;
  t.matched = answer.matched_worlds;
  drawTable(answer);
  state.tableSeq += 1;
}

function drawTable(answer) {
  const head = $("table").tHead, body = $("table").tBodies[0];
  const row = document.createElement("tr");
  answer.columns.forEach((name) => {
    const th = document.createElement("th");
    th.textContent = name;
    if (name === state.table.sort) th.className = state.table.desc ? "sorted desc" : "sorted";
    th.onclick = () => {
      const t = state.table;
      t.desc = t.sort === name ? !t.desc : false;
      t.sort = name;
      t.page = 0;
      guarded(loadTable);
    };
    row.append(th);
  });
  head.replaceChildren(row);
  body.replaceChildren(...answer.rows.map((values) => {
    const tr = document.createElement("tr");
    const world = values[0];
    tr.dataset.world = world;
    if (state.selected.includes(world)) tr.className = "selected";
    values.forEach((v, i) => {
      const td = document.createElement("td");
      td.textContent = v === null ? "nan" : (answer.kinds[i] === "number" && !Number.isInteger(v) ? v.toPrecision(5) : String(v));
      tr.append(td);
    });
    tr.onclick = () => toggle(world);
    return tr;
  }));
  $("page-info").textContent = `${answer.matched} of ${answer.total} worlds, page ${answer.page + 1}/${answer.pages}`;
}

function toggle(world) {
  const i = state.selected.indexOf(world);
  if (i >= 0) state.selected.splice(i, 1); else state.selected.push(world);
  selectionChanged();
}

function selectionChanged() {
  for (const tr of $("table").tBodies[0].rows) {
    tr.className = state.selected.includes(Number(tr.dataset.world)) ? "selected" : "";
  }
  const n = state.selected.length;
  $("selection").textContent = n ? `${n} selected: ${state.selected.slice(0, 20).join(", ")}${n > 20 ? " ..." : ""}` : "no world selected";
  guarded(drawTraces);
  guarded(showWorlds);
}

// ------------------------------------------------------------------ traces
let traces;
let tracesAsked = 0;
async function drawTraces() {
  const asked = ++tracesAsked;
  if (!state.selected.length) { traces.clear(); return; }
  const q = new URLSearchParams({
    worlds: state.selected.slice(0, 200).join(","), width: traces.width(),
    dof: $("dof").value, leg: $("leg").value, joint: $("joint").value, axis: $("axis").value,
    keypoint: $("keypoint").value,
  });
  const answer = await getJson(`/api/traces?${q}`);
  if (asked !== tracesAsked) return;  // a later selection won
  traces.show(answer);
  traces.setCursor(state.info.times[state.frame]);
  state.traceWorlds = answer.lines.map((l) => l.world);
  state.traceValues = answer.lines.map((l) => l.v);
  state.tracesSeq += 1;
}

// ------------------------------------------------------------------ 3D view
let view = null;
const MAX_3D = 9;

async function loadScene() {
  if (!state.info.model) {
    $("view3d-note").textContent = `No 3D view: ${state.info.model_problem}`;
    return;
  }
  // three.js (2 MB) loads after the table is drawn: the first page does not wait for it.
  const [{ PoseView }, description, blob] = await Promise.all([
    import("/static/view3d.js"), getJson("/api/scene"), api("/api/meshes").then((r) => r.arrayBuffer())]);
  view = new PoseView($("view3d"), $("tile-labels"));
  view.load(description, blob);
  state.geoms = description.geoms.length;
}

async function showWorlds() {
  if (!view) return;
  state.frame = Math.min(state.frame, state.info.frames - 1);
  const worlds = state.selected.slice(0, MAX_3D);
  $("view3d-note").textContent = worlds.length ? "" : "Select worlds in the table to see them here.";
  view.setWorlds(worlds);
  if (worlds.length) await showFrame(state.frame);
}

const poseCache = new Map();  // "worlds|frame" -> Float32Array, filled by play's blocks
async function fetchPoses(worlds, start, count) {
  const response = await api(`/api/poses?worlds=${worlds.join(",")}&start=${start}&count=${count}`);
  const [w, n, g, k] = response.headers.get("X-Shape").split(",").map(Number);
  const all = new Float32Array(await response.arrayBuffer());
  const frames = [];
  for (let f = 0; f < n; f++) {
    const one = new Float32Array(w * g * k);
    for (let i = 0; i < w; i++) one.set(all.subarray((i * n + f) * g * k, (i * n + f + 1) * g * k), i * g * k);
    frames.push(one);
  }
  return frames;
}

async function showFrame(frame) {
  state.frame = frame;
  $("time").value = frame;
  const t = state.info.times[frame];
  $("time-label").textContent = `frame ${frame}  t = ${t.toFixed(4)} s`;
  traces.setCursor(t);
  state.traceCursor = t;
  if (!view || !view.tiles.length) return;
  const worlds = view.tiles.map((tile) => tile.world);
  const key = `${worlds.join(",")}|${frame}`;
  let poses = poseCache.get(key);
  if (!poses) [poses] = await fetchPoses(worlds, frame, 1);
  if (state.frame !== frame) return;  // a later move won
  view.setPoses(poses);
  state.poseSeq += 1;
  state.poseFrame = frame;
}

// Play at the recorded speed: output_fps frames per second, poses fetched a block ahead.
async function play() {
  if (state.playing) { state.playing = false; return; }
  if (!view || !view.tiles.length) { say("Select worlds in the table to play them."); return; }
  state.playing = true;
  $("play").textContent = "\u23f8";
  const fps = state.info.fps, last = state.info.frames - 1;
  const worlds = view.tiles.map((tile) => tile.world);
  const block = Math.max(1, Math.round(fps));
  const fill = async (start) => {
    const frames = await fetchPoses(worlds, start, Math.min(block, last - start + 1));
    frames.forEach((p, i) => poseCache.set(`${worlds.join(",")}|${start + i}`, p));
  };
  try {
    let frame = state.frame >= last ? 0 : state.frame;
    await fill(frame);
    const t0 = performance.now(), f0 = frame;
    while (state.playing && frame <= last) {
      if ((frame - f0) % block === Math.floor(block / 2) && frame + block <= last) fill(frame + block - Math.floor(block / 2)).catch(failed);
      await showFrame(frame);
      const due = t0 + ((frame + 1 - f0) * 1000) / fps;
      await new Promise((r) => setTimeout(r, Math.max(0, due - performance.now())));
      frame += 1;
    }
  } catch (err) { failed(err); }
  state.playing = false;
  $("play").textContent = "\u25b6";
  poseCache.clear();
}

// ------------------------------------------------------------------ renders
async function render() {
  if (!state.selected.length) { say("Select worlds in the table to render them.", true); return; }
  const body = { worlds: state.selected.slice(0, 16), camera: $("camera").value, size: $("size").value };
  if ($("use-window").checked && traces.plot) {
    const x = traces.plot.scales.x;
    body.start = x.min; body.end = x.max;
  }
  $("video").hidden = true;
  const job = await (await api("/api/render", { method: "POST", body: JSON.stringify(body), headers: { "Content-Type": "application/json" } })).json();
  say(`Rendering worlds ${job.worlds.join(", ")} into ${job.folder} (${state.info.backend})`);
  await follow(job.id);
}

async function follow(id) {
  const bar = $("render-progress");
  bar.hidden = false;
  for (;;) {
    const job = await getJson(`/api/render/${id}`);
    bar.value = job.progress;
    $("render-status").textContent = `render ${job.id}: ${job.state} ${Math.round(job.progress * 100)}% ${job.elapsed.toFixed(1)} s  ${job.message}`;
    $("render-status").dataset.state = job.state;
    if (job.state === "done") {
      const video = $("video");
      video.src = job.video;
      video.hidden = false;
      video.dataset.expectedDuration = job.duration;
      say(`Rendered ${job.frames} frames to ${job.folder}`);
      bar.hidden = true;
      return;
    }
    if (job.state === "failed") {
      bar.hidden = true;
      throw new ApiError(`The render failed: ${job.message}`);
    }
    await new Promise((r) => setTimeout(r, 300));
  }
}

// ------------------------------------------------------------------ start
async function reopen() {
  await guarded(async () => {
    state.info = await (await api("/api/reopen", { method: "POST" })).json();
    say(`Opened ${state.info.url} again: ${state.info.worlds} worlds x ${state.info.frames} frames.`);
    describe();
    await loadTable();
    selectionChanged();
  });
}

function describe() {
  const info = state.info;
  $("archive").textContent = `${info.url}: ${info.worlds} worlds x ${info.frames} frames at ${info.fps} fps (x${info.playback_speed})`;
  $("header-out").textContent = `videos go to ${info.out}`;
  $("time").max = info.frames - 1;
  $("dof-list").replaceChildren(...info.dofs.map((d) => Object.assign(document.createElement("option"), { value: d })));
  if (!$("dof").value && !$("leg").value) $("dof").value = info.dofs.find((d) => !d.includes("/q") && !/\/[xyz]$/.test(d)) || info.dofs[0];
  if (info.model !== undefined) describeModel();
}

// The model's part of the page: it loads after the table (/api/model waits for it).
function describeModel() {
  const info = state.info;
  $("camera").replaceChildren(...info.cameras.map((c) => Object.assign(document.createElement("option"), { value: c, textContent: c })));
  $("render").disabled = !info.model;
  $("keypoint-label").hidden = !info.keypoints;
  const option = (b) => Object.assign(document.createElement("option"), { value: b, textContent: b });
  $("keypoint").replaceChildren(option(""), ...info.bodies.map(option));
  $("keypoint").options[0].textContent = "(dofs)";
}

async function main() {
  traces = new Traces($("traces"), (t) => {
    const times = state.info.times;
    let k = times.findIndex((x) => x >= t);
    if (k < 0) k = times.length - 1;
    guarded(() => showFrame(k));
  });
  $("filter-form").onsubmit = (e) => {
    e.preventDefault();
    state.table.where = $("filter").value;
    state.table.page = 0;
    guarded(async () => { await loadTable(); say(""); });
  };
  $("prev").onclick = () => { state.table.page = Math.max(0, state.table.page - 1); guarded(loadTable); };
  $("next").onclick = () => { state.table.page += 1; guarded(loadTable); };
  $("select-page").onclick = () => {
    for (const tr of $("table").tBodies[0].rows) { const w = Number(tr.dataset.world); if (!state.selected.includes(w)) state.selected.push(w); }
    selectionChanged();
  };
  $("clear").onclick = () => { state.selected = []; selectionChanged(); };
  $("time").oninput = () => guarded(() => showFrame(Number($("time").value)));
  $("play").onclick = () => play();
  $("draw").onclick = () => guarded(drawTraces);
  $("render").onclick = () => guarded(render);
  state.info = await getJson("/api/info");
  describe();
  await loadTable();
  state.firstPage = performance.now();
  if (state.info.model === undefined) {
    Object.assign(state.info, await getJson("/api/model"));
    describeModel();
  }
  await loadScene();
  showFrame(0).catch(failed);
  state.ready = true;
}

main().catch(failed);
