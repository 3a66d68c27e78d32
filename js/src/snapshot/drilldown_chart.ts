// A stacked area chart on one canvas: the kernel already reduced the snapshot to one column per
// screen pixel, each shown as its range: the stack at the column's lowest instant (its floor,
// solid) under the stack at its highest (the rise to its peak, lighter; the trace entry in
// `event`), so what stays shows apart from what comes and goes at any zoom, and drawing is a
// polygon per series whatever the file's size. The y axis always holds what is drawn (active and
// reserved, with room above for the labels). A click asks about the tallest column under the
// pointer at its own peak entry; a drag selects a range to zoom, which the owner has the kernel
// re-aggregate. OOM, peak and reserved labels sit in HTML over the canvas, clear of each other and
// of the data; cell bands lie behind the stack; a search's matched bytes run over it as a line.

import { byteTicks, formatBytes, formatDuration, formatTick, niceCeiling } from "../common/format";
import type { Band, Oom, Series, Stacked } from "../wire/drilldown";
import { readPalette, type Palette } from "../common/theme";
import { setFigures } from "./text";

// Categorical colours (Tableau 10); "other" is grey. Readable on light and dark backgrounds.
export const SERIES_COLORS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#86bcb6", "#d37295", "#a0cbe8"];
export const OTHER_COLOR = "#bab0ac";
export const HEADROOM = 1.08; // the axis top is at least this much above the highest value drawn
const HEIGHT = 260;
const LABEL_ROW = 20; // px above the data kept free per label (peak, reserved, OOMs)
const PAD = { left: 64, right: 12, top: 12, bottom: 22 };
const DRAG_PX = 5; // a press that moves less than this is a click

export function seriesColor(column: string, index: number): string {
  return column === "other" ? OTHER_COLOR : (SERIES_COLORS[index % SERIES_COLORS.length] as string);
}

/** The share of a series' colour in its lighter tone (the rise from a column's floor to its peak). */
const RISE_SHARE = 0.45;

/** "#rrggbb" or "rgb(a)(…)" (a canvas's normalised fillStyle) as [r, g, b]. */
function rgbOf(ctx: CanvasRenderingContext2D, color: string): [number, number, number] {
  ctx.fillStyle = "#000000";
  ctx.fillStyle = color;
  const c = String(ctx.fillStyle);
  if (c.startsWith("#")) return [1, 3, 5].map((i) => parseInt(c.slice(i, i + 2), 16)) as [number, number, number];
  const [r = 0, g = 0, b = 0] = (c.match(/[\d.]+/g) ?? []).map(Number);
  return [r, g, b];
}

/** The widget's background colour (behind the chart). */
function backgroundOf(el: HTMLElement): string {
  return getComputedStyle(el).getPropertyValue("--gpumem-bg").trim() || "#ffffff";
}

/** Each series' lighter tone: its colour mixed, opaque, with the widget's background. */
export function riseColors(v: Stacked, el: HTMLElement): string[] {
  const ctx = document.createElement("canvas").getContext("2d");
  if (!ctx) return v.series.map((s, i) => seriesColor(s.column, i));
  const bg = rgbOf(ctx, backgroundOf(el));
  return v.series.map((s, i) => {
    const c = rgbOf(ctx, seriesColor(s.column, i));
    return `#${c.map((ch, j) => Math.round(RISE_SHARE * ch + (1 - RISE_SHARE) * (bg[j] as number)).toString(16).padStart(2, "0")).join("")}`;
  });
}

/** The axis top for values up to `max`: a round value just at or above `max * HEADROOM`
 * (`niceCeiling`), labelled with the ticks below it and itself. */
export function axisTop(max: number): { top: number; ticks: number[]; unit: ReturnType<typeof byteTicks>["unit"] } {
  const want = Math.max(max * HEADROOM, 1);
  const top = niceCeiling(want);
  const { unit, step, ticks } = byteTicks(top, 5);
  // A tick closer than 0.4 steps below the top would print its label on the top's.
  const all = ticks.filter((t) => t <= top - step * 0.4 || Math.abs(t - top) <= step * 1e-9);
  if ((all[all.length - 1] ?? -1) < top - step * 1e-9) all.push(top);
  return { top, ticks: all, unit };
}

/** The byte axis: a grid line and a label at each tick, across the plot's width. */
function drawYGrid(
  ctx: CanvasRenderingContext2D,
  palette: Palette,
  width: number,
  y: (b: number) => number,
  ticks: readonly number[],
  unit: ReturnType<typeof byteTicks>["unit"],
): void {
  ctx.strokeStyle = palette.grid;
  ctx.fillStyle = palette.muted;
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  for (const tick of ticks) {
    ctx.beginPath();
    ctx.moveTo(PAD.left, y(tick));
    ctx.lineTo(width - PAD.right, y(tick));
    ctx.stroke();
    ctx.fillText(formatTick(tick, unit), PAD.left - 6, y(tick));
  }
}

export function oomText(o: Oom): string {
  const cell = o.cell !== null ? ` \u00b7 cell [${o.cell}]` : o.tag ? ` \u00b7 ${o.tag}` : "";
  return `OOM: requested ${formatBytes(o.requested)}, ${formatBytes(o.deviceFree)} free${cell}`;
}

export interface Pick {
  event: number; // the entry to answer at: the column's peak
  t: number; // the column's start on the x axis
  column: number;
}

export class StackedChart {
  readonly el: HTMLElement;
  private readonly canvas: HTMLCanvasElement;
  private readonly overlay: HTMLElement;
  private readonly selection: HTMLElement;
  private readonly readout: HTMLElement;
  private view: Stacked | null = null;
  private base: Stacked | null = null; // carries reserved and time (the sites view)
  private bands: Band[] = [];
  private search: { t: Float64Array; values: Float64Array } | null = null;
  private range: [number, number] | null = null; // a zoom drawn from these columns until the kernel answers
  private marker: number | null = null;
  private press: number | null = null;
  private interactive = true; // clicks and drags ask the kernel: off without one

  constructor(
    private readonly onPick: (pick: Pick) => void,
    private readonly onZoom: (range: [number, number]) => void,
  ) {
    this.el = document.createElement("div");
    this.el.className = "gpumem-drilldown-chart";
    const stage = document.createElement("div");
    stage.className = "gpumem-drilldown-stage";
    this.canvas = document.createElement("canvas");
    this.canvas.style.height = `${HEIGHT}px`;
    this.canvas.title = "Click a column to see what was alive at its peak; drag to zoom";
    this.overlay = document.createElement("div");
    this.overlay.className = "gpumem-drilldown-overlay";
    this.selection = document.createElement("div");
    this.selection.className = "gpumem-drilldown-selection";
    this.selection.hidden = true;
    stage.append(this.canvas, this.overlay, this.selection);
    this.readout = document.createElement("div");
    this.readout.className = "gpumem-drilldown-readout";
    this.el.append(stage, this.readout);
    this.canvas.addEventListener("mousedown", (e) => {
      if (!this.interactive) return;
      this.press = e.offsetX;
      e.preventDefault();
    });
    this.canvas.addEventListener("mousemove", (e) => {
      this.describeAt(e.offsetX);
      if (this.press !== null && Math.abs(e.offsetX - this.press) >= DRAG_PX) this.showSelection(this.press, e.offsetX);
    });
    this.canvas.addEventListener("mouseup", (e) => {
      const from = this.press;
      this.press = null;
      this.selection.hidden = true;
      if (from === null) return;
      if (Math.abs(e.offsetX - from) >= DRAG_PX) {
        const a = this.xAt(Math.min(from, e.offsetX));
        const b = this.xAt(Math.max(from, e.offsetX));
        if (a !== null && b !== null && b > a) {
          this.range = [a, b];
          this.draw();
          this.onZoom([a, b]);
        }
        return;
      }
      const pick = this.pickAt(e.offsetX);
      if (pick) this.onPick(pick);
    });
    this.canvas.addEventListener("mouseleave", () => {
      this.press = null;
      this.selection.hidden = true;
    });
  }

  /** Whether clicks and drags ask the kernel (the readout under the pointer works either way). */
  setInteractive(on: boolean): void {
    this.interactive = on;
    this.press = null;
    this.canvas.style.cursor = on ? "" : "default";
    this.canvas.title = on ? "Click a column to see what was alive at its peak; drag to zoom" : "No kernel: hover to read a column";
  }

  /** A new view, drawn once with the search line and the marker it comes with (each of them
   * set alone draws again: a whole view's draw is the tab's costliest step). */
  set(view: Stacked, base: Stacked, bands: Band[], with_: { search?: { t: Float64Array; values: Float64Array } | null; marker?: number | null } = {}): void {
    this.view = view;
    this.base = base;
    this.bands = bands;
    this.range = null;
    if (with_.search !== undefined) this.search = with_.search;
    if (with_.marker !== undefined) this.marker = with_.marker;
    this.draw();
  }

  setSearch(search: { t: Float64Array; values: Float64Array } | null): void {
    this.search = search;
    this.draw();
  }

  setMarker(x: number | null): void {
    this.marker = x;
    this.draw();
  }

  private showSelection(a: number, b: number): void {
    this.selection.hidden = false;
    this.selection.style.left = `${Math.min(a, b)}px`;
    this.selection.style.width = `${Math.abs(b - a)}px`;
  }

  /** Columns within the pending zoom (all of them otherwise). */
  private visible(): [number, number] {
    const v = this.view;
    if (!v) return [0, 0];
    if (!this.range) return [0, v.t.length];
    const [a, b] = this.range;
    let lo = Math.max(0, columnAt(v.t, a));
    let hi = lo;
    while (hi < v.t.length && (v.t[hi] as number) < b) hi++;
    if (hi <= lo) hi = lo + 1;
    lo = Math.min(lo, v.t.length - 1);
    return [lo, Math.min(hi, v.t.length)];
  }

  private span(): [number, number] {
    const v = this.view as Stacked;
    if (this.range) return this.range;
    return [v.t0, v.t1 > v.t0 ? v.t1 : v.t0 + 1];
  }

  private plotWidth(): number {
    return Math.max(1, this.canvas.clientWidth - PAD.left - PAD.right);
  }

  private xAt(px: number): number | null {
    if (!this.view) return null;
    const [t0, t1] = this.span();
    const f = Math.min(1, Math.max(0, (px - PAD.left) / this.plotWidth()));
    return t0 + f * (t1 - t0);
  }

  /** The tallest of the columns under pixel `px`: a click answers at its peak entry. */
  private pickAt(px: number): Pick | null {
    const v = this.view;
    if (!v || px < PAD.left || px > PAD.left + this.plotWidth()) return null;
    const a = this.xAt(px - 0.5) as number;
    const b = this.xAt(px + 0.5) as number;
    let k = Math.max(0, columnAt(v.t, a));
    let best = k;
    for (; k < v.t.length && (v.t[k] as number) < b; k++) if ((v.total[k] as number) > (v.total[best] as number)) best = k;
    return { event: v.event[best] as number, t: v.t[best] as number, column: best };
  }

  private describeAt(px: number): void {
    const v = this.view;
    const x = this.xAt(px);
    if (!v || x === null) return;
    const pick = this.pickAt(px);
    if (!pick) return;
    const k = pick.column;
    const top = v.series.map((s) => ({ s, b: s.values[k] ?? 0 })).sort((p, q) => q.b - p.b)[0];
    const reserved = this.base?.reservedMax ? `; reserved up to ${formatBytes(this.base.reservedMax[k])}` : "";
    const largest = top && top.b > 0 ? `; largest at its peak: ${top.s.label} ${formatBytes(top.b)}` : "";
    const base = this.base && this.base.t.length === v.t.length ? this.base : null;
    const floor = v.min?.[k] ?? base?.min?.[k] ?? null;
    setFigures(this.readout, `${columnText(v, k)}: ${rangeText(floor, v.total[k] ?? 0)} active${reserved}${largest}`);
  }

  draw(): void {
    const v = this.view;
    const ctx = this.canvas.getContext("2d");
    if (!v || !ctx) return;
    const base = this.base ?? v;
    const ratio = window.devicePixelRatio || 1;
    const width = Math.max(200, this.el.clientWidth || 800);
    this.canvas.width = Math.round(width * ratio);
    this.canvas.height = Math.round(HEIGHT * ratio);
    this.canvas.style.width = `${width}px`;
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    const palette = readPalette(this.el);
    ctx.clearRect(0, 0, width, HEIGHT);
    ctx.font = palette.font;
    const [lo, hi] = this.visible();
    const [t0, t1] = this.span();
    let max = 0;
    for (let k = lo; k < hi; k++) max = Math.max(max, v.total[k] ?? 0, base.reservedMax?.[k] ?? base.reserved?.[k] ?? 0, this.search?.values[k] ?? 0);
    const plotW = width - PAD.left - PAD.right;
    const plotH = HEIGHT - PAD.top - PAD.bottom;
    // Room above the data for the labels, so none has to sit on what it points at.
    const rows = Math.min(3, 1 + (base.reservedMax ? 1 : 0) + v.ooms.filter((o) => o.t >= t0 && o.t <= t1).length);
    const { top: yMax, ticks, unit } = axisTop((max * plotH) / (plotH - rows * LABEL_ROW));
    const x = (t: number): number => PAD.left + ((t - t0) / (t1 - t0 || 1)) * plotW;
    const y = (b: number): number => PAD.top + plotH - (b / yMax) * plotH;
    Object.assign(this.el.dataset, { yMax: String(yMax), drawnMax: String(max), axis: v.axis, range: `${t0},${t1}`, plot: [PAD.left, PAD.top, plotW, plotH].join(","), columns: String(hi - lo) });
    ctx.save();
    ctx.beginPath();
    ctx.rect(PAD.left, PAD.top, plotW, plotH);
    ctx.clip();
    this.bands.forEach((band, i) => {
      ctx.fillStyle = i % 2 ? palette.bandAlt : palette.band;
      ctx.fillRect(x(band.x0), PAD.top, Math.max(1, x(band.x1) - x(band.x0)), plotH);
    });
    ctx.restore();
    drawYGrid(ctx, palette, width, y, ticks, unit);
    ctx.save();
    ctx.beginPath();
    ctx.rect(PAD.left, PAD.top, plotW, plotH);
    ctx.clip();
    // Steps: column k holds from t[k] to t[k+1].
    const right = (k: number): number => (k + 1 < v.t.length ? (v.t[k + 1] as number) : v.t1);
    const rMax = base.reservedMax;
    const rMin = base.reservedMin;
    if (rMax && rMin && base.t.length === v.t.length) {
      ctx.beginPath();
      for (let k = lo; k < hi; k++) {
        ctx.lineTo(x(v.t[k] as number), y(rMax[k] ?? 0));
        ctx.lineTo(x(right(k)), y(rMax[k] ?? 0));
      }
      for (let k = hi - 1; k >= lo; k--) {
        ctx.lineTo(x(right(k)), y(rMin[k] ?? 0));
        ctx.lineTo(x(v.t[k] as number), y(rMin[k] ?? 0));
      }
      ctx.closePath();
      ctx.globalAlpha = 0.15;
      ctx.fillStyle = palette.reserved;
      ctx.fill();
      ctx.globalAlpha = 1;
      // Under the stack: where reserved equals active the stack's own top is that line.
      this.steps(ctx, palette.reserved, lo, hi, (k) => x(v.t[k] as number), (k) => x(right(k)), (k) => y(rMax[k] ?? 0), [4, 3]);
    }
    // Each column's range: the stack at its peak, lighter, under the stack at its floor, solid.
    // Where the kernel sent no floors, the peak's stack alone, solid.
    const ranged = v.series.length > 0 && v.series.every((s) => s.floor !== null);
    const rise = ranged ? riseColors(v, this.el) : null;
    this.el.dataset["riseColors"] = JSON.stringify(rise ?? []);
    // Each stack's outline first, as one shape: where two series meet inside a pixel, the edge
    // blends with it (the background under the peaks, a solid colour under the floors), not
    // with what lies behind.
    const outline = (of: (s: Series) => Float64Array, color: string): void => {
      const sum = new Float64Array(v.t.length);
      for (const s of v.series) for (let k = lo; k < hi; k++) sum[k] = (sum[k] as number) + (of(s)[k] ?? 0);
      this.stack(ctx, { ...v, series: [{ column: "", label: "", detail: "", peak: 0, values: sum, floor: null }] }, lo, hi, x, y, right, (s) => s.values, () => color);
    };
    const solid = (i: number): string => seriesColor(v.series[i]?.column ?? "", i);
    // The instant answered, behind the stack: over it, a 1 px line would hide a peak one column
    // wide (the trace's peak is often a single entry), where the answer is most often asked.
    const marked = this.marker !== null && this.marker >= t0 && this.marker <= t1 ? this.vline(ctx, x(this.marker), palette.fg, 1) : null;
    outline((s) => s.values, backgroundOf(this.el));
    this.stack(ctx, v, lo, hi, x, y, right, (s) => s.values, (i) => rise?.[i] ?? solid(i));
    if (ranged) {
      outline((s) => s.floor ?? s.values, solid(0));
      this.stack(ctx, v, lo, hi, x, y, right, (s) => s.floor ?? s.values, solid);
    }
    const found = this.search;
    if (found && found.t.length === v.t.length) this.steps(ctx, palette.fg, lo, hi, (k) => x(v.t[k] as number), (k) => x(right(k)), (k) => y(found.values[k] ?? 0), []);
    // Vertical lines (OOMs over the stack, the instant answered under it): where, in the DOM.
    const lines: number[] = [];
    for (const oom of v.ooms) lines.push(this.vline(ctx, x(oom.t), palette.capacity, 2));
    if (marked !== null) lines.push(marked);
    this.el.dataset["lines"] = lines.map((px) => px.toFixed(1)).join(",");
    ctx.restore();
    ctx.fillStyle = palette.muted;
    ctx.textAlign = "left";
    ctx.textBaseline = "alphabetic";
    const spanText = v.unit === "entry" ? `entries ${Math.round(t0).toLocaleString("en-US")}\u2013${Math.round(t1).toLocaleString("en-US")} (event order)` : `${formatDuration(t1 - t0)} shown (wall-clock${v.idle.length ? ", idle stretches collapsed" : ""})`;
    ctx.fillText(spanText, PAD.left, HEIGHT - 6);
    const ooms = this.labels(v, x, t0, t1, palette.muted);
    const center = (k: number): number => (x(v.t[k] as number) + x(right(k))) / 2;
    // The highest thing drawn in each column (active, reserved, a search): what a label must clear.
    const rShown = rMax && rMin && base.t.length === v.t.length ? rMax : null;
    const searched = found && found.t.length === v.t.length ? found.values : null;
    const ceiling = (k: number): number => Math.max(v.total[k] ?? 0, rShown?.[k] ?? 0, searched?.[k] ?? 0);
    const marks = [...ooms, ...this.pointLabels(v, rShown, lo, hi, center)];
    this.place(marks, lo, hi, (k) => x(v.t[k] as number), (k) => x(right(k)), (k) => y(ceiling(k)));
  }

  /** Marks over the tallest column in view (the peak, the part the user came for) and over the
   * reserved line's highest stretch; `place` puts them where they cover nothing. */
  private pointLabels(v: Stacked, rMax: Float64Array | null, lo: number, hi: number, center: (k: number) => number): Mark[] {
    const marks: Mark[] = [];
    const tallest = (values: Float64Array): number => {
      let best = lo;
      for (let k = lo; k < hi; k++) if ((values[k] as number) > (values[best] as number)) best = k;
      return best;
    };
    const add = (className: string, k: number, bytes: number, text: string): void => {
      if (!(bytes > 0)) return;
      const label = document.createElement("div");
      label.className = className;
      const px = center(k);
      label.dataset["x"] = String(px);
      label.dataset["bytes"] = String(bytes);
      label.dataset["event"] = String(v.event[k]);
      label.textContent = text;
      this.overlay.append(label);
      marks.push({ el: label, x: px, side: "point" });
    };
    if (rMax && rMax.length === v.total.length && hi > lo) {
      const k = tallest(rMax);
      add("gpumem-drilldown-reserved-peak", k, rMax[k] ?? 0, `\u25be reserved ${formatBytes(rMax[k])}`);
    }
    if (hi > lo) {
      const k = tallest(v.total);
      add("gpumem-drilldown-peak", k, v.total[k] ?? 0, `\u25be peak ${formatBytes(v.total[k])}`);
    }
    return marks;
  }

  /** Each mark just above the data under it, beside its point or line, and above any mark it
   * would cover; cell numbers that a mark covers give way (their bands still show). */
  private place(marks: Mark[], lo: number, hi: number, left: (k: number) => number, right: (k: number) => number, top: (k: number) => number): void {
    const plotLeft = PAD.left;
    const plotRight = PAD.left + this.plotWidth();
    const placed: Box[] = [];
    const dataTop = (a: number, b: number): number => {
      let t = HEIGHT - PAD.bottom;
      for (let k = lo; k < hi; k++) if (right(k) > a && left(k) < b) t = Math.min(t, top(k));
      return t;
    };
    for (const m of marks) {
      const w = m.el.offsetWidth;
      const h = m.el.offsetHeight;
      // A point mark's "▾" sits over its point (or its right end does); an OOM's box beside its line.
      const lefts = m.side === "point" ? [m.x - 5, m.x - w + 5] : [m.x + 4, m.x - 4 - w];
      let best: Box | null = null;
      for (const raw of lefts) {
        const l = Math.min(Math.max(raw, plotLeft), Math.max(plotLeft, plotRight - w));
        let t = dataTop(l, l + w) - h - 3;
        for (let moved = true; moved; ) {
          moved = false;
          for (const b of placed)
            if (overlaps({ left: l, top: t, right: l + w, bottom: t + h }, b)) {
              t = b.top - h - 2;
              moved = true;
            }
        }
        if (t >= 0 && (!best || t > best.top)) best = { left: l, top: t, right: l + w, bottom: t + h };
      }
      best ??= { left: Math.max(plotLeft, m.x - 5), top: 0, right: Math.max(plotLeft, m.x - 5) + w, bottom: h };
      placed.push(best);
      m.el.style.left = `${best.left}px`;
      m.el.style.top = `${best.top}px`;
    }
    for (const label of this.overlay.querySelectorAll<HTMLElement>(".gpumem-drilldown-band-label")) {
      const l = parseFloat(label.style.left);
      const t = parseFloat(label.style.top);
      const box = { left: l, top: t, right: l + label.offsetWidth, bottom: t + label.offsetHeight };
      if (placed.some((b) => overlaps(box, b))) label.hidden = true;
    }
  }

  /** Cell, OOM and idle labels as HTML over the canvas: readable, selectable, in the DOM. The
   * OOMs' come back for `place` to position. */
  private labels(v: Stacked, x: (t: number) => number, t0: number, t1: number, hatch: string): Mark[] {
    const marks: Mark[] = [];
    this.overlay.replaceChildren();
    for (const band of this.bands) {
      const left = Math.max(x(band.x0), PAD.left);
      const right = Math.min(x(band.x1), PAD.left + this.plotWidth());
      if (right - left < 28) continue; // too narrow to name; its band still shows
      const label = document.createElement("div");
      label.className = "gpumem-drilldown-band-label";
      label.dataset["executionCount"] = String(band.executionCount);
      label.textContent = `[${band.executionCount}]`;
      label.style.left = `${left + 2}px`;
      label.style.top = `${PAD.top + 2}px`;
      this.overlay.append(label);
    }
    for (const gap of v.idle) {
      if (gap.x + gap.width < t0 || gap.x > t1) continue;
      const mark = document.createElement("div");
      mark.className = "gpumem-drilldown-idle";
      mark.style.left = `${x(gap.x)}px`;
      mark.style.width = `${Math.max(2, x(gap.x + gap.width) - x(gap.x))}px`;
      mark.style.borderColor = hatch;
      mark.title = `No allocator activity for ${formatDuration(gap.seconds)}: collapsed`;
      const text = document.createElement("span");
      text.textContent = `idle ${formatDuration(gap.seconds)}`;
      mark.append(text);
      this.overlay.append(mark);
    }
    for (const oom of v.ooms) {
      if (oom.t < t0 || oom.t > t1) continue;
      const label = document.createElement("div");
      label.className = "gpumem-drilldown-oom";
      label.dataset["event"] = String(oom.event);
      label.textContent = oomText(oom);
      this.overlay.append(label);
      marks.push({ el: label, x: x(oom.t), side: "line" });
    }
    return marks;
  }

  /** The series stacked (bottom first), column k from `v.t[k]` to `right(k)`, each `of` its values. */
  private stack(
    ctx: CanvasRenderingContext2D,
    v: Stacked,
    lo: number,
    hi: number,
    x: (t: number) => number,
    y: (b: number) => number,
    right: (k: number) => number,
    of: (s: Series) => Float64Array,
    color: (i: number) => string,
  ): void {
    const below = new Float64Array(hi - lo);
    v.series.forEach((s, i) => {
      const values = of(s);
      ctx.beginPath();
      for (let k = lo; k < hi; k++) {
        const top = (below[k - lo] as number) + (values[k] ?? 0);
        ctx.lineTo(x(v.t[k] as number), y(top));
        ctx.lineTo(x(right(k)), y(top));
      }
      for (let k = hi - 1; k >= lo; k--) {
        ctx.lineTo(x(right(k)), y(below[k - lo] as number));
        ctx.lineTo(x(v.t[k] as number), y(below[k - lo] as number));
      }
      ctx.closePath();
      ctx.fillStyle = color(i);
      ctx.fill();
      for (let k = lo; k < hi; k++) below[k - lo] = (below[k - lo] as number) + (values[k] ?? 0);
    });
  }

  /** A step line: column k at height `yAt(k)` from `left(k)` to `right(k)`. */
  private steps(ctx: CanvasRenderingContext2D, color: string, lo: number, hi: number, left: (k: number) => number, right: (k: number) => number, yAt: (k: number) => number, dash: number[]): void {
    ctx.strokeStyle = color;
    ctx.lineWidth = 1.5;
    ctx.setLineDash(dash);
    ctx.beginPath();
    for (let k = lo; k < hi; k++) {
      ctx.lineTo(left(k), yAt(k));
      ctx.lineTo(right(k), yAt(k));
    }
    ctx.stroke();
    ctx.setLineDash([]);
    ctx.lineWidth = 1;
  }

  private vline(ctx: CanvasRenderingContext2D, px: number, color: string, width: number): number {
    ctx.strokeStyle = color;
    ctx.lineWidth = width;
    ctx.beginPath();
    ctx.moveTo(px, PAD.top);
    ctx.lineTo(px, HEIGHT - PAD.bottom);
    ctx.stroke();
    ctx.lineWidth = 1;
    return px;
  }
}

/** A label to place over the chart: at a point ("▾" over it) or beside a vertical line. */
interface Mark {
  el: HTMLElement;
  x: number;
  side: "point" | "line";
}

interface Box {
  left: number;
  top: number;
  right: number;
  bottom: number;
}

function overlaps(a: Box, b: Box): boolean {
  return a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
}

/** Which entries (event order) or which stretch of time column `k` holds. */
export function columnText(v: Stacked, k: number): string {
  const a = v.t[k] as number;
  const b = k + 1 < v.t.length ? (v.t[k + 1] as number) : v.t1;
  if (v.unit === "s") return `in +${formatDuration(a - v.t0)}\u2013+${formatDuration(b - v.t0)}`;
  // Entry i sits at x = i: the column holds the entries from ceil(a) to below b.
  const first = Math.ceil(a);
  const last = k + 1 < v.t.length ? Math.ceil(b) - 1 : Math.floor(b); // the last column holds its end
  const n = (i: number): string => i.toLocaleString("en-US");
  if (last < first) return `after entry ${n(first - 1)}`; // none inside: what that one left
  return first === last ? `at entry ${n(first)}` : `in entries ${n(first)}\u2013${n(last)}`;
}

/** "118–324 MiB" (floor to peak), one unit where both share it; the peak alone without a floor. */
export function rangeText(floor: number | null, peak: number): string {
  const [lo, hi] = [formatBytes(floor), formatBytes(peak)];
  if (floor === null || lo === hi) return hi;
  const unit = (s: string): string => s.slice(s.indexOf(" "));
  return unit(lo) === unit(hi) ? `${lo.slice(0, lo.indexOf(" "))}\u2013${hi}` : `${lo}\u2013${hi}`;
}

/** The column holding position `t` (columns start at `starts`, ascending); -1 before the first. */
export function columnAt(starts: Float64Array, t: number): number {
  let lo = 0;
  let hi = starts.length; // first start > t, by bisection
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if ((starts[mid] as number) <= t) lo = mid + 1;
    else hi = mid;
  }
  return lo - 1;
}

/** Two timelines on one x axis (a comparison): active solid, reserved dashed, each its colour. */
export function drawCompare(canvas: HTMLCanvasElement, host: HTMLElement, c: { t: Float64Array; t0: number; t1: number; lines: { values: Float64Array; color: string; dash: number[]; width: number }[] }): number {
  const ctx = canvas.getContext("2d");
  if (!ctx) return 0;
  const palette = readPalette(host);
  const ratio = window.devicePixelRatio || 1;
  const width = Math.max(200, host.clientWidth || 800);
  const height = 200;
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(height * ratio);
  canvas.style.width = `${width}px`;
  canvas.style.height = `${height}px`;
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, width, height);
  ctx.font = palette.font;
  let max = 0;
  for (const line of c.lines) for (const v of line.values) if (Number.isFinite(v)) max = Math.max(max, v);
  const { top, ticks, unit } = axisTop(max);
  const plotW = width - PAD.left - PAD.right;
  const plotH = height - PAD.top - PAD.bottom;
  const x = (t: number): number => PAD.left + ((t - c.t0) / (c.t1 - c.t0 || 1)) * plotW;
  const y = (b: number): number => PAD.top + plotH - (b / top) * plotH;
  drawYGrid(ctx, palette, width, y, ticks, unit);
  for (const line of c.lines) {
    ctx.strokeStyle = line.color;
    ctx.lineWidth = line.width;
    ctx.setLineDash(line.dash);
    ctx.beginPath();
    let open = false;
    c.t.forEach((t, k) => {
      const v = line.values[k] as number;
      if (!Number.isFinite(v)) {
        open = false;
        return;
      }
      const right = k + 1 < c.t.length ? (c.t[k + 1] as number) : c.t1;
      if (open) ctx.lineTo(x(t), y(v));
      else ctx.moveTo(x(t), y(v));
      ctx.lineTo(x(right), y(v));
      open = true;
    });
    ctx.stroke();
  }
  ctx.setLineDash([]);
  ctx.lineWidth = 1;
  return top;
}
