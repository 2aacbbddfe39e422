// flyarchive view: the world table (filtered, sorted and paged on the server), the
// selection that drives traces, the 3D pose view, the gait panels and renders; a scatter
// of two world variables whose brush filters the table and queues renders.
import { api, ApiError, getJson, serverTime, showing } from "/static/api.js";
import { withUnit } from "/static/canvasplot.js";
import { Footfall, PathPlot } from "/static/gait.js";
import { PoseFrames } from "/static/poseframes.js";
import { ScatterPlot } from "/static/scatter.js";
import { visible } from "/static/text.js";
import { colour, Traces } from "/static/traces.js";

const $ = (id) => document.getElementById(id);

// What tests and the benchmark wait on: counters of finished updates.
const state = window.flyarchiveView = {
  info: null, table: { where: "", sort: "world", desc: false, page: 0, size: 50 },
  selected: [], frame: 0, tableSeq: 0, tracesSeq: 0, poseSeq: 0, errors: 0, playing: false,
  filter: "", brush: null, gaitSeq: 0, scatterSeq: 0, batchSeq: 0, changesSeq: 0,
  checkChanges: () => checkChanges(),
  // what the gait panels and the scatter drew (data and CSS pixels), for tests
  footfallBars: () => (footfall ? footfall.bars : []), pathsDrawn: () => (paths ? paths.drawn : []),
  scatterPoints: () => (scatter ? scatter.points : []), scatterBrushed: () => (scatter ? scatter.brushed : []),
  took: {}, tookSeq: {}, serverMs: 0, posesKept: () => (poseFrames ? poseFrames.frames.size : 0),
};

// What the benchmark reads: ms from the user's action (`asked`) to the next animation
// frame after the page was updated (state.took[kind]; state.tookSeq[kind] counts them).
function mark(kind, asked) {
  requestAnimationFrame(() => {
    state.took[kind] = performance.now() - asked;
    state.tookSeq[kind] = (state.tookSeq[kind] || 0) + 1;
  });
}

function say(text, isError = false) {
  const box = $("message");
  delete box.dataset.changes;
  box.hidden = !text;
  box.className = isError ? "error" : "";
  box.textContent = text;
  if (isError) state.errors += 1;
}

function offerReopen() {
  const button = document.createElement("button");
  button.textContent = "Open it again";
  button.id = "reopen";
  button.onclick = reopen;
  $("message").append(button);
}

function failed(err) {
  say(err.message, true);
  if (err.replaced) offerReopen();
}

// A writer may append frames, or set-world-var (gait --save) add or replace world
// variables, while the page is open: when the page opens and every CHANGES_MS (while it
// is shown) the viewer is asked what changed since it opened the archive, and the page
// offers to open it again. Only a replaced archive is said from a failed ask; the next
// ask comes anyway.
const CHANGES_MS = 15000;
async function checkChanges() {
  let answer;
  try { answer = await getJson("/api/changes"); } catch (err) {
    if (err.replaced) failed(err);
    return;
  }
  state.changes = answer;
  state.changesSeq += 1;
  const parts = [];
  if (answer.generation !== state.info.generation) parts.push("the viewer has opened it again since this page did");
  if (answer.worlds_grown > 0) {
    const w = answer.worlds_grown;
    parts.push(`${answer.frames_now - answer.frames_shown} more frames in ${w} world${w === 1 ? "" : "s"}`);
  }
  const names = answer.variables_changed;
  if (names.length) {
    const shown = names.slice(0, 5).join(", ") + (names.length > 5 ? ` and ${names.length - 5} more` : "");
    parts.push(`world variable${names.length === 1 ? "" : "s"} ${shown} added, replaced or removed`);
  }
  const box = $("message");
  if (!parts.length || !(box.hidden || box.dataset.changes)) return;  // an error stays said
  const text = `The archive has changed since the viewer opened it: ${parts.join("; ")}.`;
  if (box.dataset.changes === text) return;
  say(text);
  box.dataset.changes = text;
  offerReopen();
}

async function guarded(work) {
  try { return await work(); } catch (err) { failed(err); return undefined; }
}

// ------------------------------------------------------------------ the table
let tableAsked = 0;
async function loadTable(kind = "table", since = performance.now()) {
  const asked = ++tableAsked;
  const t = state.table;
  const q = new URLSearchParams({ where: t.where, sort: t.sort, desc: t.desc ? "1" : "0", page: t.page, size: t.size });
  const response = await api(`/api/table?${q}`);
  const answer = await response.json();
  if (asked !== tableAsked) return;
  state.serverMs = serverTime(response);
  t.page = answer.page;
  t.matched = answer.matched_worlds;
  drawTable(answer);
  scatterChoices(answer);
  describeBrush(answer.matched_worlds);
  state.tableSeq += 1;
  mark(kind, since);
}

function drawTable(answer) {
  const head = $("table").tHead, body = $("table").tBodies[0];
  const row = document.createElement("tr");
  answer.columns.forEach((name) => {
    const th = document.createElement("th");
    th.textContent = visible(name);
    if (name === state.table.sort) th.className = state.table.desc ? "sorted desc" : "sorted";
    th.onclick = () => {
      const t = state.table, since = performance.now();
      t.desc = t.sort === name ? !t.desc : false;
      t.sort = name;
      t.page = 0;
      guarded(() => loadTable("sort", since));
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
      td.textContent = v === null ? "nan" : (answer.kinds[i] === "number" && !Number.isInteger(v) ? v.toPrecision(5) : visible(v));
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
  guarded(drawTraces).then(() => guarded(drawGait));  // the traces first: they are quicker
  guarded(showWorlds);
  if (scatter) scatter.setSelected(state.selected);
}

// ------------------------------------------------------------------ traces
let traces;
let tracesAsked = 0;
async function drawTraces(since = performance.now()) {
  const asked = ++tracesAsked;
  if (!state.selected.length) { traces.clear(); return; }
  const q = new URLSearchParams({
    worlds: state.selected.slice(0, 200).join(","), width: traces.width(),
    dof: $("dof").value, leg: $("leg").value, joint: $("joint").value, axis: $("axis").value,
    keypoint: $("keypoint").value,
  });
  const response = await api(`/api/traces?${q}`);
  const answer = readTraces(await response.arrayBuffer());
  if (asked !== tracesAsked) return;  // a later selection won
  state.serverMs = serverTime(response);
  const keypoint = $("keypoint").value;
  traces.show(answer, Object.fromEntries(answer.labels.map((l) => [l, keypoint ? state.info.length_unit : (state.info.dof_units || {})[l]])));
  traces.setCursor(state.info.times[state.frame]);
  state.traceWorlds = answer.lines.map((l) => l.world);
  state.traceValues = answer.lines.map((l) => Array.from(l.v));
  state.tracesSeq += 1;
  mark("traces", since);
}

// /api/traces's answer: uint32 length of a JSON head, the head (labels, lines' worlds and
// labels, points m), zeros up to a multiple of 8 bytes, then float64 times (m) and values
// (lines x m; NaN: no data, given to uPlot as null, a gap).
function readTraces(buffer) {
  const size = new DataView(buffer).getUint32(0, true);
  const head = JSON.parse(new TextDecoder().decode(new Uint8Array(buffer, 4, size)));
  const offset = Math.ceil((4 + size) / 8) * 8, m = head.points;
  const t = new Float64Array(buffer, offset, m);
  const lines = head.lines.map(([world, label], i) => {
    let v = new Float64Array(buffer, offset + 8 * m * (i + 1), m);
    if (v.some(Number.isNaN)) v = Array.from(v, (x) => (Number.isNaN(x) ? null : x));
    return { world, label, v };
  });
  return { labels: head.labels, t, lines, frames: head.frames };
}

// ------------------------------------------------------------------ 3D view
let view = null;  // the PoseView while the model has one
let poseView = null;
const MAX_3D = 9;

async function loadScene() {
  if (!state.info.model) {
    if (view) view.setWorlds([]);
    view = null;
    $("view3d-note").textContent = `No 3D view: ${state.info.model_problem}`;
    return;
  }
  // three.js (2 MB) loads after the table is drawn: the first page does not wait for it.
  const [{ PoseView }, description, blob] = await Promise.all([
    import("/static/view3d.js"), getJson("/api/scene"), api("/api/meshes").then((r) => r.arrayBuffer())]);
  poseView = poseView || new PoseView($("view3d"), $("tile-labels"));  // one WebGL context
  view = poseView;
  view.load(description, blob);
  state.geoms = description.geoms.length;
}

let poseFrames = null;  // PoseFrames of the tiles' worlds (made in main)

async function showWorlds() {
  if (!view) return;
  state.frame = Math.min(state.frame, state.info.frames - 1);
  const worlds = state.selected.slice(0, MAX_3D);
  $("view3d-note").textContent = worlds.length ? "" : "Select worlds in the table to see them here.";
  view.setWorlds(worlds);
  poseFrames.reset(worlds);
  if (!worlds.length) return;
  showFrame(state.frame);
  // the rest of the recording, in blocks, while the user looks (one frame's poses: bytes)
  poseFrames.prefetch(state.frame, worlds.length * (state.geoms + 1) * 48).catch(failed);
}

async function fetchPoses(worlds, start, count) {
  const response = await api(`/api/poses?worlds=${worlds.join(",")}&start=${start}&count=${count}`);
  if (count === 1) state.serverMs = serverTime(response);
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

// A move of the time cursor: the label and the traces' cursor at once; the 3D view at the
// next animation frame, with the latest frame asked for (moves in between are skipped),
// from the poses kept in the page, else fetched (one such request at a time).
let poseWanted = null, poseAsked = 0;
function showFrame(frame, asked = performance.now()) {
  state.frame = frame;
  $("time").value = frame;
  const t = state.info.times[frame];
  $("time-label").textContent = `frame ${frame}  t = ${t.toFixed(4)} s`;
  traces.setCursor(t);
  footfall.setCursor(t);
  paths.setCursor(t);
  state.traceCursor = t;
  if (!view || !view.tiles.length) return;
  const idle = poseWanted === null;
  poseWanted = frame;
  poseAsked = asked;
  if (idle) requestAnimationFrame(() => drawPose().catch(failed));
}

async function drawPose() {
  for (;;) {
    const frame = poseWanted, asked = poseAsked;
    const poses = poseFrames.get(frame) || await poseFrames.fetch(frame);
    if (poseWanted !== frame) continue;  // moved on meanwhile: fetch the latest
    poseWanted = null;
    view.setPoses(poses);
    state.poseSeq += 1;
    state.poseFrame = frame;
    mark("pose", asked);
    return;
  }
}

// Play at the recorded speed: output_fps frames per second, from the poses kept.
async function play() {
  if (state.playing) { state.playing = false; return; }
  if (!view || !view.tiles.length) { say("Select worlds in the table to play them."); return; }
  state.playing = true;
  $("play").textContent = "\u23f8";
  const fps = state.info.fps, last = state.info.frames - 1;
  let frame = state.frame >= last ? 0 : state.frame;
  const t0 = performance.now(), f0 = frame;
  while (state.playing && frame <= last) {
    showFrame(frame);
    const due = t0 + ((frame + 1 - f0) * 1000) / fps;
    await new Promise((r) => setTimeout(r, Math.max(0, due - performance.now())));
    frame += 1;
  }
  state.playing = false;
  $("play").textContent = "\u25b6";
}

// ------------------------------------------------------------------ gait
let footfall, paths;

function gaitNote(text, isError = false) {
  $("gait-note").textContent = text;
  $("gait-note").className = isError ? "error" : "";
}

// The footfalls of one shown world and the paths of all of them, from the server (which
// keeps what it computed: a world shown again is answered at once). One request at a
// time: clicks while one is computed ask again once it is answered, for the selection
// then (four quick clicks: the server computes each world once, not 1 + 2 + 3 + 4 times).
let gaitBusy = false, gaitAgain = false;
async function drawGait() {
  if (gaitBusy) { gaitAgain = true; return; }
  gaitBusy = true;
  try {
    do { gaitAgain = false; await gaitOnce(); } while (gaitAgain);
  } finally {
    gaitBusy = false;
  }
}

async function gaitOnce() {
  const worlds = state.selected.slice(0, MAX_3D);
  if (!worlds.length) {
    footfall.clear(); paths.clear();
    $("gait-world").replaceChildren();
    gaitNote("Select worlds in the table to see their footfalls and paths.");
    state.gait = null; state.gaitSeq += 1;
    return;
  }
  if (state.info.gait_problem) {  // no fly in the model: said without asking (no 400)
    footfall.clear(); paths.clear();
    gaitNote(state.info.gait_problem, true);
    state.gait = null; state.gaitError = state.info.gait_problem; state.gaitSeq += 1;
    return;
  }
  gaitNote("computing...");
  // a recording longer than one gait request covers: the window around the time cursor
  const info = state.info, each = Math.floor(info.max_gait_frames / worlds.length);
  const q = new URLSearchParams({ worlds: worlds.join(",") });
  if (info.frames > each) {
    const first = Math.max(0, Math.min(state.frame - Math.floor(each / 2), info.frames - each));
    q.set("start", info.times[first]);
    q.set("end", info.times[first + each - 1]);
  }
  $("gait-here").hidden = info.frames <= each;
  let answer;
  try {
    answer = await getJson(`/api/gait?${q}`);
  } catch (err) {
    if (err.replaced) throw err;  // said at the top, with the button that opens it again
    footfall.clear(); paths.clear();
    gaitNote(err.message, true);
    state.gait = null; state.gaitError = err.message; state.gaitSeq += 1;
    return;
  }
  if (gaitAgain) return;  // the selection changed meanwhile: asked again at once
  const chosen = worlds.includes(Number($("gait-world").value)) ? Number($("gait-world").value) : worlds[0];
  $("gait-world").replaceChildren(...worlds.map((w) => Object.assign(document.createElement("option"), { value: w, textContent: w })));
  $("gait-world").value = chosen;
  const t = state.info.times[state.frame];
  footfall.cursor = t; paths.cursor = t;
  footfall.show(answer, chosen);
  paths.show(answer);
  gaitNote(`${answer.frames} frames, ${answer.window[0].toFixed(3)} to ${answer.window[1].toFixed(3)} ${answer.units.time}; thorax ${answer.thorax}`);
  state.gait = answer; state.gaitWorld = chosen; state.gaitError = null;
  state.gaitSeq += 1;
}

// ------------------------------------------------------------------ scatter and brush
let scatter;
// Python's keywords and the filter's constants: a world variable named so (or not an
// identifier: "über" is one, "wing span" is not) is written in backticks in a filter.
const KEYWORDS = new Set(("False None True and as assert async await break class continue def del "
  + "elif else except finally for from global if import in is lambda nonlocal not or pass raise "
  + "return try while with yield true false nan inf").split(" "));
const named = (name) => (/^[\p{L}_][\p{L}\p{N}_]*$/u.test(name) && !KEYWORDS.has(name) ? name : `\`${name}\``);

// The numeric world variables a brush can filter by (named in backticks where needed).
function scatterChoices(answer) {
  const key = answer.columns.join("\u0000");
  if (key === state.scatterColumns) return;
  state.scatterColumns = key;
  const numeric = answer.columns.filter((name, i) => answer.kinds[i] !== "text" && !name.includes("`"));
  const variables = numeric.filter((n) => n !== "world" && n !== "n_frames");
  const [x, y] = variables.length >= 2 ? variables : variables.length ? [variables[0], "world"] : ["world", "n_frames"];
  const units = state.info.column_units || {};
  for (const [id, value] of [["scatter-x", x], ["scatter-y", y]]) {
    $(id).replaceChildren(...numeric.map((n) => Object.assign(document.createElement("option"), { value: n, textContent: withUnit(n, units[n]) })));
    $(id).value = value;
  }
  state.brush = null;
  guarded(loadScatter);
}

let scatterAsked = 0;
async function loadScatter() {
  const asked = ++scatterAsked;
  const x = $("scatter-x").value, y = $("scatter-y").value;
  const note = $("scatter-note");
  let answer;
  try {
    answer = await getJson(`/api/scatter?${new URLSearchParams({ x, y, where: state.filter })}`);
  } catch (err) {
    if (asked !== scatterAsked) return;
    if (err.replaced) throw err;
    note.textContent = err.message; note.className = "error";
    state.scatterSeq += 1;
    return;
  }
  if (asked !== scatterAsked) return;
  scatter.show(answer);
  scatter.setSelected(state.selected);
  note.className = "";
  note.textContent = `${answer.worlds.length} of ${answer.matched} worlds` + (answer.missing ? ` (${answer.missing} without both values)` : "");
  state.scatter = answer;
  state.scatterSeq += 1;
}

// The table's filter: the one typed, and the brush's ranges.
function tableWhere() {
  const b = state.brush;
  if (!b) return state.filter;
  const [x, y] = [named(b.x), named(b.y)];
  const ranges = `${x} >= ${b.x0} and ${x} <= ${b.x1} and ${y} >= ${b.y0} and ${y} <= ${b.y1}`;
  return state.filter.trim() ? `(${state.filter}) and ${ranges}` : ranges;
}

function brushed(range) {
  const a = state.scatter;
  state.brush = range && a ? { x: a.x, y: a.y, ...range } : null;
  state.table.where = tableWhere();
  state.table.page = 0;
  guarded(loadTable);
}

function describeBrush(matched) {
  const b = state.brush, units = state.info.column_units || {};
  const span = (name, lo, hi) => `${lo.toPrecision(4)} <= ${name} <= ${hi.toPrecision(4)}${units[name] && units[name] !== "1" ? " " + units[name] : ""}`;
  $("brush-info").textContent = b ? `${matched.length} worlds brushed: ${span(b.x, b.x0, b.x1)}, ${span(b.y, b.y0, b.y1)}`
    : "drag over the points to keep those worlds in the table";
  $("clear-brush").disabled = !b;
  $("render-brushed").disabled = !b || !matched.length || !state.info.model;
  $("render-brushed").textContent = b ? `Render the ${matched.length} brushed worlds` : "Render the brushed worlds";
}

// Queue renders of the brushed worlds (the table's matches, in its order): one video per
// 16 worlds at most, as many as the server's queue takes now; it says what it left.
async function renderBrushed() {
  const worlds = state.table.matched || [];
  const body = { worlds, camera: $("camera").value, size: $("size").value };
  let answer;
  try {
    answer = await (await api("/api/renders", { method: "POST", body: JSON.stringify(body), headers: { "Content-Type": "application/json" } })).json();
  } catch (err) {
    if (err.replaced) throw err;
    $("batch-status").textContent = err.status === 429 ? `Nothing queued: ${err.message}` : err.message;
    state.batch = { message: err.message, status: err.status, jobs: [] };
    state.batchSeq += 1;
    return;
  }
  state.batch = { message: answer.message, queued: answer.queued, not_queued: answer.not_queued, jobs: answer.jobs.map((j) => ({ id: j.id, state: j.state })) };
  state.batchSeq += 1;
  await followMany(answer);
}

async function followMany(answer) {
  const box = $("batch-status"), lines = new Map();
  const head = Object.assign(document.createElement("div"), { textContent: answer.message });
  box.replaceChildren(head, ...answer.jobs.map((job) => {
    const line = document.createElement("div");
    line.dataset.job = job.id;
    lines.set(job.id, line);
    return line;
  }));
  let open = answer.jobs.map((j) => j.id);
  while (open.length) {
    const jobs = await Promise.all(open.map((id) => getJson(`/api/render/${id}`)));
    for (const job of jobs) {
      const line = lines.get(job.id), shown = job.worlds.slice(0, 6).join(", ") + (job.worlds.length > 6 ? ", ..." : "");
      line.dataset.state = job.state;
      line.textContent = `render ${job.id} (worlds ${shown}): ${job.state} ${Math.round(job.progress * 100)}% ${job.message}`;
      if (job.state === "done") {
        const play = Object.assign(document.createElement("button"), { type: "button", textContent: "play" });
        play.onclick = () => { $("video").src = job.video; $("video").hidden = false; };
        line.append(play);
      } else if (job.state === "queued" || job.state === "running") {
        line.append(cancelButton(job.id));
      }
      const mine = state.batch.jobs.find((j) => j.id === job.id);
      if (mine) mine.state = job.state;
    }
    open = jobs.filter((j) => j.state === "queued" || j.state === "running").map((j) => j.id);
    state.batchSeq += 1;
    if (open.length) await new Promise((r) => setTimeout(r, 400));
  }
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

// A button that cancels render `id` (waiting: it leaves the queue; running: it stops and
// its folder goes).
function cancelButton(id) {
  const button = Object.assign(document.createElement("button"), { type: "button", textContent: "cancel", className: "cancel-render" });
  button.dataset.job = id;
  button.onclick = () => guarded(async () => {
    button.disabled = true;
    await api(`/api/render/${id}/cancel`, { method: "POST" });
  });
  return button;
}

async function follow(id) {
  const bar = $("render-progress"), cancel = $("render-cancel");
  bar.hidden = false;
  cancel.replaceChildren(cancelButton(id));
  try {
    await followed(id, bar);
  } finally {
    cancel.replaceChildren();
  }
}

async function followed(id, bar) {
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
    if (job.state === "cancelled") {
      bar.hidden = true;
      say(`Render ${job.id} ${job.message}; nothing of it was kept.`);
      return;
    }
    await new Promise((r) => setTimeout(r, 300));
  }
}

// ------------------------------------------------------------------ start
async function reopen() {
  await guarded(async () => {
    state.info = await (await api("/api/reopen", { method: "POST" })).json();
    showing(state.info.archive_id);
    poseFrames = new PoseFrames(fetchPoses, state.info.frames);
    say(`Opened ${state.info.url} again: ${state.info.worlds} worlds x ${state.info.frames} frames.`);
    state.selected = [];  // ids of the archive that was there before
    state.brush = null; state.scatterColumns = null;
    state.table.where = tableWhere();
    describe();
    await loadTable();
    await loadScene();  // the model may be another one now
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
  const pick = (t) => {
    const times = state.info.times;
    let k = times.findIndex((x) => x >= t);
    if (k < 0) k = times.length - 1;
    guarded(() => showFrame(k));
  };
  traces = new Traces($("traces"), $("traces-legend"), pick);
  footfall = new Footfall($("footfall"), $("footfall-legend"), pick);
  paths = new PathPlot($("paths"), $("paths-legend"), (w) => {
    const worlds = state.selected.slice(0, 200);
    return colour(worlds.indexOf(w), worlds.length);
  });
  scatter = new ScatterPlot($("scatter"), brushed);
  $("gait-world").onchange = () => {
    state.gaitWorld = Number($("gait-world").value);
    if (state.gait) footfall.show(state.gait, state.gaitWorld);
  };
  $("scatter-x").onchange = $("scatter-y").onchange = () => {
    if (state.brush) { scatter.setBrush(null); brushed(null); }
    guarded(loadScatter);
  };
  $("clear-brush").onclick = () => { scatter.setBrush(null); brushed(null); };
  $("render-brushed").onclick = () => guarded(renderBrushed);
  $("gait-here").onclick = () => guarded(drawGait);
  $("filter-form").onsubmit = (e) => {
    e.preventDefault();
    state.filter = $("filter").value;
    state.table.where = tableWhere();
    state.table.page = 0;
    const since = performance.now();
    guarded(async () => { await loadTable("filter", since); say(""); });
    guarded(loadScatter);
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
  $("draw").onclick = () => { const since = performance.now(); guarded(() => drawTraces(since)); };
  $("render").onclick = () => guarded(render);
  state.info = await getJson("/api/info");
  showing(state.info.archive_id);
  poseFrames = new PoseFrames(fetchPoses, state.info.frames);
  describe();
  await loadTable();
  state.firstPage = performance.now();
  if (state.info.model === undefined) {
    Object.assign(state.info, await getJson("/api/model"));
    describeModel();
  }
  await loadScene();
  showFrame(0);
  gaitNote("Select worlds in the table to see their footfalls and paths.");
  checkChanges();
  setInterval(() => { if (!document.hidden) checkChanges(); }, CHANGES_MS);
  state.ready = true;
}

main().catch(failed);
