// The gait panels, from /api/gait's answer: a footfall diagram (each leg's stances as bars
// over time, one world) and the shown worlds' thorax paths seen from above, both with the
// time cursor shared with the traces and the 3D view; legends in HTML, with units. What
// each panel drew is kept (`bars`, `drawn`: data and pixels) for the page's tests.
import { CanvasPlot, extent, withUnit, TEXT } from "/static/canvasplot.js";
import { visible } from "/static/text.js";

const STANCE = "#2a3142", ROW_FILL = "#f3f5f8";

function swatch(colour, dashed = false) {
  const s = document.createElement("span");
  s.className = "swatch";
  s.style.borderTop = `3px ${dashed ? "dashed" : "solid"} ${colour}`;
  return s;
}

function fixed(v, digits) { return v === null || v === undefined ? "nan" : v.toFixed(digits); }

export class Footfall {
  // onPick(time): a click in the diagram moves the time cursor there.
  constructor(canvas, legend, onPick) {
    this.plot = new CanvasPlot(canvas, { left: 34, right: 12, top: 6, bottom: 36 });
    this.legend = legend;
    this.answer = null; this.world = null; this.cursor = null;
    this.bars = [];  // [{leg, start, stop, x, y, w, h}] as drawn
    canvas.addEventListener("click", (e) => {
      if (this.answer && this.plot.inside(e.offsetX, e.offsetY)) onPick(this.plot.valueX(e.offsetX));
    });
  }

  // answer: /api/gait's; world: which of its worlds to draw.
  show(answer, world) {
    this.answer = answer; this.world = world;
    this.draw();
    this.describe();
  }

  gait() { return this.answer && this.answer.worlds.find((w) => w.world === this.world); }

  draw() {
    const p = this.plot, ctx = p.begin(), one = this.gait();
    this.bars = [];
    if (!one) return;
    const a = this.answer, legs = a.legs;
    p.x = { min: a.window[0], max: a.window[1] };
    p.y = { min: 0, max: legs.length };
    const row = p.box.height / legs.length;
    ctx.save();
    ctx.font = "11px system-ui, sans-serif"; ctx.textAlign = "right"; ctx.textBaseline = "middle";
    legs.forEach((leg, i) => {
      const top = p.box.top + i * row;
      ctx.fillStyle = i % 2 ? "#fff" : ROW_FILL;
      ctx.fillRect(p.box.left, top, p.box.width, row);
      ctx.fillStyle = TEXT;
      ctx.fillText(visible(leg), p.box.left - 5, top + row / 2);
      ctx.fillStyle = STANCE;
      for (const [start, stop] of one.stance[i]) {
        const x = p.px(start), w = Math.max(1, p.px(stop) - x), y = top + row * 0.18, h = row * 0.64;
        ctx.fillRect(x, y, w, h);
        this.bars.push({ leg, start, stop, x, y, w, h });
      }
    });
    ctx.restore();
    p.axes(withUnit("simulated time", a.units.time), "", { yTicks: false });
    p.vline(this.cursor);
  }

  describe() {
    const one = this.gait();
    if (!one) { this.legend.replaceChildren(); return; }
    const a = this.answer, m = one.measures, u = a.units;
    const key = document.createElement("div");
    const bar = Object.assign(document.createElement("span"), { className: "swatch bar" });
    key.append(bar, ` stance, gaps: swing; world ${one.world}: mean speed ${fixed(m.mean_speed, 2)} ${u.mean_speed}, `
      + `distance ${fixed(m.distance, 2)} ${u.distance}, tcs ${fixed(m.tcs, 2)}`);
    const table = document.createElement("table");
    table.className = "measures";
    const head = document.createElement("tr");
    for (const text of ["leg", withUnit("step frequency", u.step_frequency), withUnit("duty factor", u.duty_factor)]) {
      head.append(Object.assign(document.createElement("th"), { textContent: text }));
    }
    table.append(head);
    a.legs.forEach((leg, i) => {
      const tr = document.createElement("tr");
      for (const text of [visible(leg), fixed(m.step_frequency[i], 2), fixed(m.duty_factor[i], 2)]) {
        tr.append(Object.assign(document.createElement("td"), { textContent: text }));
      }
      table.append(tr);
    });
    this.legend.replaceChildren(key, table);
  }

  setCursor(time) { this.cursor = time; if (this.answer) this.draw(); }

  clear() {
    this.answer = null; this.bars = [];
    this.plot.begin();
    this.legend.replaceChildren();
  }
}

export class PathPlot {
  // colourOf(world): the world's colour (the traces' colour for it).
  constructor(canvas, legend, colourOf) {
    this.plot = new CanvasPlot(canvas, { left: 48, right: 10, top: 8, bottom: 36 });
    this.legend = legend;
    this.colourOf = colourOf;
    this.answer = null; this.cursor = null;
    this.drawn = [];  // [{world, points: [[px, py]...]}] as drawn
  }

  show(answer) { this.answer = answer; this.draw(); this.describe(); }

  draw() {
    const p = this.plot, ctx = p.begin(), a = this.answer;
    this.drawn = [];
    if (!a) return;
    const xs = a.worlds.flatMap((w) => w.path.x), ys = a.worlds.flatMap((w) => w.path.y);
    const [x0, x1] = extent(xs, 0.08), [y0, y1] = extent(ys, 0.08);
    p.x = { min: x0, max: x1 }; p.y = { min: y0, max: y1 };
    p.equalAspect();
    p.axes(withUnit("x", a.units.path), withUnit("y", a.units.path));
    ctx.save();
    ctx.beginPath(); ctx.rect(p.box.left, p.box.top, p.box.width, p.box.height); ctx.clip();
    for (const w of a.worlds) {
      const colour = this.colourOf(w.world), points = [];
      ctx.strokeStyle = colour; ctx.fillStyle = colour; ctx.lineWidth = 1.6;
      ctx.beginPath();
      let pen = false;
      w.path.x.forEach((x, k) => {
        const y = w.path.y[k];
        if (x === null || y === null) { pen = false; return; }
        const point = [p.px(x), p.py(y)];
        points.push(point);
        if (pen) ctx.lineTo(...point); else ctx.moveTo(...point);
        pen = true;
      });
      ctx.stroke();
      if (points.length) {  // where it started: an open circle
        ctx.beginPath(); ctx.arc(points[0][0], points[0][1], 3.5, 0, 2 * Math.PI); ctx.stroke();
      }
      const now = this.at(w, this.cursor);
      if (now) {  // where it is at the time cursor: a dot
        ctx.beginPath(); ctx.arc(p.px(now[0]), p.py(now[1]), 4, 0, 2 * Math.PI); ctx.fill();
      }
      this.drawn.push({ world: w.world, points });
    }
    ctx.restore();
  }

  // The path's point at time t (the last kept point at or before it).
  at(w, t) {
    if (t === null) return null;
    let k = -1;
    for (let i = 0; i < w.path.t.length && w.path.t[i] <= t + 1e-12; i++) if (w.path.x[i] !== null) k = i;
    return k < 0 ? null : [w.path.x[k], w.path.y[k]];
  }

  describe() {
    const a = this.answer;
    this.legend.replaceChildren(...a.worlds.map((w) => {
      const item = document.createElement("span");
      item.className = "legend-item";
      item.dataset.world = w.world;
      item.append(swatch(this.colourOf(w.world)),
        ` world ${w.world}: ${fixed(w.measures.distance, 2)} ${a.units.distance} at ${fixed(w.measures.mean_speed, 2)} ${a.units.mean_speed}`);
      return item;
    }), Object.assign(document.createElement("span"), { className: "legend-note", textContent: "\u25cb start, \u25cf at the time cursor" }));
  }

  setCursor(time) { this.cursor = time; if (this.answer) this.draw(); }

  clear() { this.answer = null; this.drawn = []; this.plot.begin(); this.legend.replaceChildren(); }
}

export { swatch };
