// A stacked area chart on one canvas: the kernel already reduced the snapshot to one column per
// screen pixel (each at its highest instant), so drawing is a polygon per series, whatever the
// file's size. A click reports the time under the pointer; the owner asks the kernel what was
// alive then and marks it with `setMarker`. Reserved memory (the allocator's cached segments)
// runs over the stack as a dashed line on its own columns, with the band each column spans.

import { byteTicks, formatBytes, formatTick } from "./format";
import type { ReservedOverTime, Stacked } from "./drilldown_data";
import { readPalette } from "./theme";

// Categorical colours (Tableau 10); "other" is grey. Readable on light and dark backgrounds.
export const SERIES_COLORS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#86bcb6", "#d37295", "#a0cbe8"];
export const OTHER_COLOR = "#bab0ac";
const HEIGHT = 220;
const PAD = { left: 64, right: 12, top: 10, bottom: 22 };

export function seriesColor(column: string, index: number): string {
  return column === "other" ? OTHER_COLOR : (SERIES_COLORS[index % SERIES_COLORS.length] as string);
}

export class StackedChart {
  readonly el: HTMLElement;
  private readonly canvas: HTMLCanvasElement;
  private readonly readout: HTMLElement;
  private view: Stacked | null = null;
  private reserved: ReservedOverTime | null = null;
  private range: [number, number] | null = null; // zoom window, in the view's unit
  private marker: number | null = null;

  constructor(private readonly onPick: (t: number) => void) {
    this.el = document.createElement("div");
    this.el.className = "gpumem-drilldown-chart";
    this.canvas = document.createElement("canvas");
    this.canvas.style.height = `${HEIGHT}px`;
    this.canvas.title = "Click a time to see what was alive then";
    this.readout = document.createElement("div");
    this.readout.className = "gpumem-drilldown-readout";
    this.el.append(this.canvas, this.readout);
    this.canvas.addEventListener("click", (e) => {
      const t = this.timeAt(e.offsetX);
      if (t !== null) this.onPick(t);
    });
    this.canvas.addEventListener("mousemove", (e) => this.describeAt(e.offsetX));
  }

  /** `reserved`: reserved beside active over the same trace; without it, the view's own
   * reserved column (reserved at each column's highest active instant) is drawn. */
  set(view: Stacked, reserved: ReservedOverTime | null = null): void {
    this.view = view;
    this.reserved = reserved;
    this.draw();
  }

  zoom(range: [number, number] | null): void {
    this.range = range;
    this.draw();
  }

  setMarker(t: number | null): void {
    this.marker = t;
    this.draw();
  }

  /** Columns within the zoom window (all of them unzoomed). */
  private visible(): [number, number] {
    const v = this.view;
    if (!v) return [0, 0];
    if (!this.range) return [0, v.t.length];
    const [a, b] = this.range;
    let lo = 0;
    while (lo < v.t.length - 1 && (v.t[lo + 1] as number) <= a) lo++;
    let hi = lo;
    while (hi < v.t.length && (v.t[hi] as number) <= b) hi++;
    return [lo, Math.max(hi, lo + 1)];
  }

  private span(): [number, number] {
    const v = this.view as Stacked;
    const [lo, hi] = this.visible();
    const step = v.t.length > 1 ? (v.t1 - v.t0) / v.t.length : 1;
    return [v.t[lo] as number, hi < v.t.length ? (v.t[hi] as number) : v.t1 + (v.t.length ? 0 : step)];
  }

  private timeAt(px: number): number | null {
    if (!this.view) return null;
    const plot = this.canvas.clientWidth - PAD.left - PAD.right;
    if (plot <= 0) return null;
    const [t0, t1] = this.span();
    const f = Math.min(1, Math.max(0, (px - PAD.left) / plot));
    return t0 + f * (t1 - t0);
  }

  private describeAt(px: number): void {
    const v = this.view;
    const t = this.timeAt(px);
    if (!v || t === null) return;
    let k = 0;
    while (k < v.t.length - 1 && (v.t[k + 1] as number) <= t) k++;
    const top = v.series.map((s) => ({ s, b: s.values[k] ?? 0 })).sort((a, b) => b.b - a.b)[0];
    const when = v.unit === "s" ? `+${(t - v.t0).toFixed(3)} s` : `entry ${Math.round(t)}`;
    const r = this.reserved;
    const rk = r ? columnAt(r.t, t) : -1;
    const reserved = r && rk >= 0 ? `; reserved up to ${formatBytes(r.reserved[rk])}` : "";
    this.readout.textContent = `${when}: ${formatBytes(v.total[k])} active${reserved}` + (top && top.b > 0 ? `; largest: ${top.s.label} ${formatBytes(top.b)}` : "");
  }

  /** Reserved's columns overlapping [t0, t1), as [first, end). */
  private reservedColumns(t0: number, t1: number): [number, number] {
    const r = this.reserved;
    if (!r) return [0, 0];
    const lo = Math.max(0, columnAt(r.t, t0));
    let hi = lo;
    while (hi < r.t.length && (r.t[hi] as number) < t1) hi++;
    return [lo, hi];
  }

  draw(): void {
    const v = this.view;
    const ctx = this.canvas.getContext("2d");
    if (!v || !ctx) return;
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
    for (let k = lo; k < hi; k++) max = Math.max(max, v.total[k] ?? 0, v.reserved?.[k] ?? 0);
    const [rLo, rHi] = this.reservedColumns(t0, t1);
    for (let k = rLo; k < rHi; k++) max = Math.max(max, this.reserved?.reserved[k] ?? 0);
    const { unit, ticks } = byteTicks(max, 5);
    const yMax = ticks[ticks.length - 1] || 1;
    const plotW = width - PAD.left - PAD.right;
    const plotH = HEIGHT - PAD.top - PAD.bottom;
    const x = (t: number): number => PAD.left + ((t - t0) / (t1 - t0 || 1)) * plotW;
    const y = (b: number): number => PAD.top + plotH - (b / yMax) * plotH;
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
    // Steps: column k holds from t[k] to t[k+1].
    const right = (k: number): number => (k + 1 < v.t.length ? (v.t[k + 1] as number) : v.t1);
    const base = new Float64Array(hi - lo);
    v.series.forEach((s, i) => {
      ctx.beginPath();
      for (let k = lo; k < hi; k++) {
        const top = (base[k - lo] as number) + (s.values[k] ?? 0);
        ctx.lineTo(x(v.t[k] as number), y(top));
        ctx.lineTo(x(right(k)), y(top));
      }
      for (let k = hi - 1; k >= lo; k--) {
        ctx.lineTo(x(right(k)), y(base[k - lo] as number));
        ctx.lineTo(x(v.t[k] as number), y(base[k - lo] as number));
      }
      ctx.closePath();
      ctx.fillStyle = seriesColor(s.column, i);
      ctx.fill();
      for (let k = lo; k < hi; k++) base[k - lo] = (base[k - lo] as number) + (s.values[k] ?? 0);
    });
    const r = this.reserved;
    if (r) {
      const rRight = (k: number): number => (k + 1 < r.t.length ? (r.t[k + 1] as number) : r.t1);
      ctx.save();
      ctx.beginPath();
      ctx.rect(PAD.left, PAD.top, plotW, plotH); // its columns need not line up with the window
      ctx.clip();
      ctx.beginPath();
      for (let k = rLo; k < rHi; k++) {
        ctx.lineTo(x(r.t[k] as number), y(r.reserved[k] ?? 0));
        ctx.lineTo(x(rRight(k)), y(r.reserved[k] ?? 0));
      }
      for (let k = rHi - 1; k >= rLo; k--) {
        ctx.lineTo(x(rRight(k)), y(r.reservedMin[k] ?? 0));
        ctx.lineTo(x(r.t[k] as number), y(r.reservedMin[k] ?? 0));
      }
      ctx.closePath();
      ctx.globalAlpha = 0.15;
      ctx.fillStyle = palette.reserved;
      ctx.fill();
      ctx.globalAlpha = 1;
      this.steps(ctx, palette.reserved, rLo, rHi, (k) => x(r.t[k] as number), (k) => x(rRight(k)), (k) => y(r.reserved[k] ?? 0));
      ctx.restore();
    } else if (v.reserved) {
      const col = v.reserved;
      this.steps(ctx, palette.reserved, lo, hi, (k) => x(v.t[k] as number), (k) => x(right(k)), (k) => y(col[k] ?? 0));
    }
    ctx.fillStyle = palette.muted;
    ctx.textAlign = "left";
    ctx.textBaseline = "alphabetic";
    const spanText = v.unit === "s" ? `${(t1 - t0).toFixed(3)} s shown` : `entries ${Math.round(t0)}\u2013${Math.round(t1)}`;
    ctx.fillText(spanText, PAD.left, HEIGHT - 6);
    for (const oom of v.ooms) this.vline(ctx, x(oom.t), palette.capacity);
    if (this.marker !== null && this.marker >= t0 && this.marker <= t1) this.vline(ctx, x(this.marker), palette.fg);
  }

  /** A dashed step line: column k at height `yAt(k)` from `left(k)` to `right(k)`. */
  private steps(ctx: CanvasRenderingContext2D, color: string, lo: number, hi: number, left: (k: number) => number, right: (k: number) => number, yAt: (k: number) => number): void {
    ctx.strokeStyle = color;
    ctx.setLineDash([4, 3]);
    ctx.beginPath();
    for (let k = lo; k < hi; k++) {
      ctx.lineTo(left(k), yAt(k));
      ctx.lineTo(right(k), yAt(k));
    }
    ctx.stroke();
    ctx.setLineDash([]);
  }

  private vline(ctx: CanvasRenderingContext2D, px: number, color: string): void {
    ctx.strokeStyle = color;
    ctx.beginPath();
    ctx.moveTo(px, PAD.top);
    ctx.lineTo(px, HEIGHT - PAD.bottom);
    ctx.stroke();
  }
}

/** The column holding time `t` (columns start at `starts`, ascending); -1 before the first. */
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
