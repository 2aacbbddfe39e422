// A small plot on a <canvas>: a box inside margins, linear scales from data to pixels and
// back, axes with "nice" ticks and labels that carry units. The gait panels (gait.js) and
// the scatter (scatter.js) draw on it; uPlot draws the traces. Sharp on high-density
// screens (the canvas holds devicePixelRatio pixels per CSS pixel).

export const AXIS = "#5a6170", GRID = "#e6e8ec", TEXT = "#1d2330";

// "label (unit)": no parentheses for no unit or a ratio ("1").
export function withUnit(label, unit) {
  return unit && unit !== "1" ? `${label} (${unit})` : label;
}

// About `count` round tick values covering [lo, hi].
export function ticks(lo, hi, count = 5) {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / count, power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * power).find((s) => s >= raw) || raw;
  const out = [];
  for (let v = Math.ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step) out.push(Math.abs(v) < step * 1e-9 ? 0 : v);
  return out;
}

// A tick's value with as many decimals as its step needs (2.5 -> "12.5", 0.02 -> "0.04").
function tickText(v, step) {
  let digits = 0;
  while (digits < 8 && Math.abs(step * 10 ** digits - Math.round(step * 10 ** digits)) > 1e-6 * step * 10 ** digits) digits += 1;
  return v.toFixed(digits);
}

// [lo, hi] of finite values, widened a little (and made non-empty).
export function extent(values, pad = 0.04) {
  let lo = Infinity, hi = -Infinity;
  for (const v of values) if (Number.isFinite(v)) { if (v < lo) lo = v; if (v > hi) hi = v; }
  if (lo === Infinity) return [0, 1];
  if (hi === lo) { const d = Math.abs(lo) * 0.05 || 0.5; return [lo - d, hi + d]; }
  const d = (hi - lo) * pad;
  return [lo - d, hi + d];
}

export class CanvasPlot {
  // canvas: the <canvas> (its CSS size sets the plot's); margin: {left, right, top, bottom} px.
  constructor(canvas, margin = { left: 54, right: 12, top: 10, bottom: 36 }) {
    this.canvas = canvas;
    this.margin = margin;
    this.x = { min: 0, max: 1 };
    this.y = { min: 0, max: 1 };
  }

  // Size the canvas to its CSS box; returns the drawing context (in CSS pixels), cleared.
  begin() {
    const c = this.canvas, ratio = window.devicePixelRatio || 1;
    const w = Math.max(100, c.clientWidth), h = Math.max(80, c.clientHeight);
    if (c.width !== Math.round(w * ratio) || c.height !== Math.round(h * ratio)) {
      c.width = Math.round(w * ratio); c.height = Math.round(h * ratio);
    }
    const ctx = c.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, w, h);
    const m = this.margin;
    this.box = { left: m.left, top: m.top, width: w - m.left - m.right, height: h - m.top - m.bottom };
    this.ctx = ctx;
    return ctx;
  }

  px(v) { return this.box.left + ((v - this.x.min) / (this.x.max - this.x.min)) * this.box.width; }
  py(v) { return this.box.top + (1 - (v - this.y.min) / (this.y.max - this.y.min)) * this.box.height; }
  valueX(px) { return this.x.min + ((px - this.box.left) / this.box.width) * (this.x.max - this.x.min); }
  valueY(py) { return this.y.min + (1 - (py - this.box.top) / this.box.height) * (this.y.max - this.y.min); }

  // Make the y scale hold as many units per pixel as the x scale (a map seen from above):
  // the narrower range is widened around its middle.
  equalAspect() {
    const { width, height } = this.box;
    const perX = (this.x.max - this.x.min) / width, perY = (this.y.max - this.y.min) / height;
    if (perX > perY) {
      const mid = (this.y.min + this.y.max) / 2, half = (perX * height) / 2;
      this.y = { min: mid - half, max: mid + half };
    } else {
      const mid = (this.x.min + this.x.max) / 2, half = (perY * width) / 2;
      this.x = { min: mid - half, max: mid + half };
    }
  }

  // Grid lines, ticks and axis labels; yTicks false: no y ticks (a footfall diagram's rows).
  axes(xLabel, yLabel, { yTicks = true } = {}) {
    const { ctx, box } = this;
    ctx.save();
    ctx.font = "11px system-ui, sans-serif";
    ctx.strokeStyle = GRID; ctx.fillStyle = AXIS; ctx.lineWidth = 1;
    const xs = ticks(this.x.min, this.x.max, Math.max(2, Math.floor(box.width / 80)));
    ctx.textAlign = "center"; ctx.textBaseline = "top";
    for (const v of xs) {
      const x = Math.round(this.px(v)) + 0.5;
      ctx.beginPath(); ctx.moveTo(x, box.top); ctx.lineTo(x, box.top + box.height); ctx.stroke();
      ctx.fillText(tickText(v, xs[1] - xs[0]), x, box.top + box.height + 3);
    }
    if (yTicks) {
      const ys = ticks(this.y.min, this.y.max, Math.max(2, Math.floor(box.height / 40)));
      ctx.textAlign = "right"; ctx.textBaseline = "middle";
      for (const v of ys) {
        const y = Math.round(this.py(v)) + 0.5;
        ctx.beginPath(); ctx.moveTo(box.left, y); ctx.lineTo(box.left + box.width, y); ctx.stroke();
        ctx.fillText(tickText(v, ys[1] - ys[0]), box.left - 4, y);
      }
    }
    ctx.strokeStyle = AXIS;
    ctx.strokeRect(box.left + 0.5, box.top + 0.5, box.width, box.height);
    ctx.fillStyle = TEXT; ctx.textAlign = "center"; ctx.textBaseline = "bottom";
    ctx.fillText(xLabel, box.left + box.width / 2, box.top + box.height + 34);
    if (yLabel) {
      ctx.translate(12, box.top + box.height / 2);
      ctx.rotate(-Math.PI / 2);
      ctx.textBaseline = "middle";
      ctx.fillText(yLabel, 0, 0);
    }
    ctx.restore();
  }

  // A vertical line at x = value (the time cursor), clipped to the box.
  vline(value, colour = "#d0302f") {
    if (value === null || value === undefined || value < this.x.min || value > this.x.max) return;
    const { ctx, box } = this, x = this.px(value);
    ctx.save();
    ctx.strokeStyle = colour; ctx.lineWidth = 2;
    ctx.beginPath(); ctx.moveTo(x, box.top); ctx.lineTo(x, box.top + box.height); ctx.stroke();
    ctx.restore();
  }

  // Whether the event's point (CSS px in the canvas) lies inside the box.
  inside(x, y) {
    const b = this.box;
    return b && x >= b.left && x <= b.left + b.width && y >= b.top && y <= b.top + b.height;
  }
}
