// Traces with uPlot: the server sends min/max per pixel column on one shared time axis;
// a vertical line marks the time cursor shared with the 3D view; a click moves it. The
// legend (HTML, below the plot) gives each world's colour and each label's dash and unit.
import uPlot from "uplot";
import { withUnit } from "/static/canvasplot.js";
import { visible } from "/static/text.js";

const DASHES = [[], [6, 3], [2, 2]];

// The colour of the i-th of n worlds (the traces' and the paths' alike).
export function colour(i, n) {
  return `hsl(${Math.round((360 * i) / Math.max(n, 1))} 70% 42%)`;
}

export class Traces {
  constructor(element, legend, onPick) {
    this.element = element;
    this.legend = legend;
    this.onPick = onPick;
    this.cursorTime = null;
    this.plot = null;
  }

  width() {
    return Math.max(200, this.element.clientWidth - 10);
  }

  // answer: the packed /api/traces answer, read; units: label -> unit ("rad", "mm", "1").
  show(answer, units = {}) {
    const worlds = [...new Set(answer.lines.map((l) => l.world))];
    const dash = (label) => (answer.labels.length > 1 ? DASHES[answer.labels.indexOf(label) % 3] : []);
    const series = [{ label: "time (s)" }, ...answer.lines.map((line) => ({
      label: `world ${line.world} ${line.label}`,
      stroke: colour(worlds.indexOf(line.world), worlds.length),
      width: 1,
      dash: dash(line.label),
      points: { show: false },
      spanGaps: false,
    }))];
    const data = [answer.t, ...answer.lines.map((l) => l.v)];
    const shared = [...new Set(answer.labels.map((l) => units[l] || ""))];
    const yLabel = answer.labels.length === 1 ? withUnit(visible(answer.labels[0]), units[answer.labels[0]])
      : withUnit("value", shared.length === 1 ? shared[0] : "");
    const options = {
      width: this.width(), height: 220, series, legend: { show: false },
      scales: { x: { time: false } },
      axes: [{ label: "simulated time (s)" }, { label: yLabel }],
      cursor: { drag: { x: false, y: false } },
      hooks: { draw: [(u) => this.drawCursor(u)] },
    };
    if (this.plot) this.plot.destroy();
    this.plot = new uPlot(options, data, this.element);
    this.plot.over.addEventListener("click", (e) => {
      this.onPick(this.plot.posToVal(e.offsetX, "x"));
    });
    this.describe(worlds, answer.labels, units, dash);
  }

  // The legend: a coloured line per world, a dashed line per label with its unit.
  describe(worlds, labels, units, dash) {
    const item = (colourOf, text, dashes) => {
      const span = document.createElement("span");
      span.className = "legend-item";
      const line = document.createElement("canvas");
      line.width = 24; line.height = 8; line.className = "legend-line";
      const ctx = line.getContext("2d");
      ctx.strokeStyle = colourOf; ctx.lineWidth = 2; ctx.setLineDash(dashes);
      ctx.beginPath(); ctx.moveTo(0, 4); ctx.lineTo(24, 4); ctx.stroke();
      span.append(line, ` ${text}`);
      return span;
    };
    const shown = worlds.slice(0, 40);
    const entries = shown.map((w, i) => item(colour(i, worlds.length), `world ${w}`, []));
    if (worlds.length > shown.length) entries.push(document.createTextNode(` ... ${worlds.length - shown.length} more worlds`));
    if (labels.length > 1) entries.push(...labels.map((l) => item("#445", withUnit(visible(l), units[l]), dash(l))));
    else entries.push(Object.assign(document.createElement("span"), { className: "legend-item", textContent: withUnit(visible(labels[0]), units[labels[0]]) }));
    this.legend.replaceChildren(...entries);
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
    this.legend.replaceChildren();
  }
}
