// A scatter of two world variables (/api/scatter's answer), with a brush: drag a rectangle
// to pick the worlds inside it (onBrush({x0, x1, y0, y1}) in data units, the ranges the
// table's filter then keeps); a click without a drag clears it (onBrush(null)). Points of
// the selected worlds are ringed. What was drawn is kept (`points`, `brushed`) for tests.
import { CanvasPlot, extent, withUnit } from "/static/canvasplot.js";

const POINT = "#8a93a6", BRUSHED = "#1f5fd1", RINGED = "#d0302f";

export class ScatterPlot {
  constructor(canvas, onBrush) {
    this.plot = new CanvasPlot(canvas, { left: 58, right: 10, top: 8, bottom: 36 });
    this.onBrush = onBrush;
    this.answer = null; this.brush = null; this.selected = [];
    this.points = [];  // [{world, x, y, px, py}] as drawn
    this.brushed = [];  // world ids inside the brush
    let from = null, moved = false;
    canvas.addEventListener("pointerdown", (e) => {
      if (!this.answer || !this.plot.inside(e.offsetX, e.offsetY)) return;
      from = [e.offsetX, e.offsetY]; moved = false;
      canvas.setPointerCapture(e.pointerId);
    });
    canvas.addEventListener("pointermove", (e) => {
      if (!from) return;
      moved = moved || Math.hypot(e.offsetX - from[0], e.offsetY - from[1]) > 3;
      if (moved) { this.dragging = [from, this.clamp(e.offsetX, e.offsetY)]; this.draw(); }
    });
    canvas.addEventListener("pointerup", (e) => {
      if (!from) return;
      const start = from, end = this.clamp(e.offsetX, e.offsetY);
      from = null; this.dragging = null;
      if (!moved) { this.setBrush(null); this.onBrush(null); return; }
      const p = this.plot;
      const range = {
        x0: Math.min(p.valueX(start[0]), p.valueX(end[0])), x1: Math.max(p.valueX(start[0]), p.valueX(end[0])),
        y0: Math.min(p.valueY(start[1]), p.valueY(end[1])), y1: Math.max(p.valueY(start[1]), p.valueY(end[1])),
      };
      this.setBrush(range);
      this.onBrush(range);
    });
  }

  clamp(x, y) {
    const b = this.plot.box;
    return [Math.min(Math.max(x, b.left), b.left + b.width), Math.min(Math.max(y, b.top), b.top + b.height)];
  }

  // answer: /api/scatter's; the scales are kept while the same columns are shown (the
  // brush stays where it was drawn when the filter changes the points).
  show(answer) {
    const same = this.answer && this.answer.x === answer.x && this.answer.y === answer.y;
    this.answer = answer;
    if (!same) {
      const [x0, x1] = extent(answer.xs), [y0, y1] = extent(answer.ys);
      this.scales = { x: { min: x0, max: x1 }, y: { min: y0, max: y1 } };
    }
    this.draw();
  }

  setBrush(range) { this.brush = range; this.draw(); }

  setSelected(worlds) { this.selected = worlds; if (this.answer) this.draw(); }

  inBrush(x, y) {
    const b = this.brush;
    return b !== null && x >= b.x0 && x <= b.x1 && y >= b.y0 && y <= b.y1;
  }

  draw() {
    const p = this.plot, ctx = p.begin(), a = this.answer;
    this.points = []; this.brushed = [];
    if (!a) return;
    p.x = { ...this.scales.x }; p.y = { ...this.scales.y };
    p.axes(withUnit(a.x, a.units[a.x]), withUnit(a.y, a.units[a.y]));
    ctx.save();
    ctx.beginPath(); ctx.rect(p.box.left, p.box.top, p.box.width, p.box.height); ctx.clip();
    const chosen = new Set(this.selected);
    a.worlds.forEach((world, i) => {
      const x = a.xs[i], y = a.ys[i], px = p.px(x), py = p.py(y), inside = this.inBrush(x, y);
      ctx.fillStyle = inside ? BRUSHED : POINT;
      ctx.beginPath(); ctx.arc(px, py, inside ? 3.5 : 2.5, 0, 2 * Math.PI); ctx.fill();
      if (chosen.has(world)) {
        ctx.strokeStyle = RINGED; ctx.lineWidth = 1.5;
        ctx.beginPath(); ctx.arc(px, py, 5.5, 0, 2 * Math.PI); ctx.stroke();
      }
      this.points.push({ world, x, y, px, py });
      if (inside) this.brushed.push(world);
    });
    ctx.restore();
    const rect = this.dragging ? this.dragging : this.brush && [[p.px(this.brush.x0), p.py(this.brush.y1)], [p.px(this.brush.x1), p.py(this.brush.y0)]];
    if (rect) {
      const [[ax, ay], [bx, by]] = rect;
      ctx.save();
      ctx.fillStyle = "rgba(31, 95, 209, 0.10)"; ctx.strokeStyle = BRUSHED; ctx.setLineDash([4, 3]);
      ctx.fillRect(Math.min(ax, bx), Math.min(ay, by), Math.abs(bx - ax), Math.abs(by - ay));
      ctx.strokeRect(Math.min(ax, bx) + 0.5, Math.min(ay, by) + 0.5, Math.abs(bx - ax), Math.abs(by - ay));
      ctx.restore();
    }
  }

  clear() { this.answer = null; this.points = []; this.brushed = []; this.plot.begin(); }
}
