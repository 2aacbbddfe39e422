// Traces with uPlot: the server sends min/max per pixel column on one shared time axis;
// a vertical line marks the time cursor shared with the 3D view; a click moves it.
import uPlot from "uplot";

function colour(i, n) {
  return `hsl(${Math.round((360 * i) / Math.max(n, 1))} 70% 42%)`;
}

export class Traces {
  constructor(element, onPick) {
    this.element = element;
    this.onPick = onPick;
    this.cursorTime = null;
    this.plot = null;
  }

  width() {
    return Math.max(200, this.element.clientWidth - 10);
  }

  // answer: JSON of /api/traces.
  show(answer) {
    const worlds = [...new Set(answer.lines.map((l) => l.world))];
    const series = [{ label: "time (s)" }, ...answer.lines.map((line) => ({
      label: `world ${line.world} ${line.label}`,
      stroke: colour(worlds.indexOf(line.world), worlds.length),
      width: 1,
      dash: answer.labels.length > 1 ? [[], [6, 3], [2, 2]][answer.labels.indexOf(line.label) % 3] : undefined,
      points: { show: false },
      spanGaps: false,
    }))];
    const data = [answer.t, ...answer.lines.map((l) => l.v)];
    const options = {
      width: this.width(), height: 220, series, legend: { show: false },
      scales: { x: { time: false } },
      axes: [{ label: "simulated time (s)" }, { label: answer.labels.length === 1 ? answer.labels[0] : "value" }],
      cursor: { drag: { x: false, y: false } },
      hooks: { draw: [(u) => this.drawCursor(u)] },
    };
    if (this.plot) this.plot.destroy();
    this.plot = new uPlot(options, data, this.element);
    this.plot.over.addEventListener("click", (e) => {
      this.onPick(this.plot.posToVal(e.offsetX, "x"));
    });
  }

  setCursor(time) {
    this.cursorTime = time;
    if (this.plot) this.plot.redraw(false, false);
  }

  drawCursor(u) {
    if (this.cursorTime === null) return;
    const x = u.valToPos(this.cursorTime, "x", true);
    const { ctx } = u;
    ctx.save();
    ctx.strokeStyle = "#d0302f";
    ctx.lineWidth = 2;
    ctx.beginPath();
    ctx.moveTo(x, u.bbox.top);
    ctx.lineTo(x, u.bbox.top + u.bbox.height);
    ctx.stroke();
    ctx.restore();
  }

  clear() {
    if (this.plot) { this.plot.destroy(); this.plot = null; }
  }
}
