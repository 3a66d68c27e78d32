// The Workers tab: every worker process reporting to the notebook. A chart with one line per rank
// (allocated solid, reserved dashed; host RSS for workers without CUDA) under the same cell bands
// as the Memory tab, and a table grouped by host: state (live, exited, gone: silent), an OOM with
// its figures, memory now, snapshots written. The kernel sends screen-sized series; this draws.

import { formatBytes, formatClock, byteTicks, formatTick } from "../common/format";
import { tableCell } from "../common/dom";
import type { Band } from "../wire/protocol";
import { readPalette, type Palette } from "../common/theme";
import { NO_WORKERS, type RankInfo, type WorkersState } from "../wire/workers";

export type OpenSnapshot = (key: string, index: number) => void;
/** A snapshot a worker reported: the worker's key and the snapshot's index in its list. */
export interface SnapshotRef {
  key: string;
  index: number;
}
export type CompareSnapshots = (a: SnapshotRef, b: SnapshotRef) => void;

const HEIGHT = 220;
const LEFT = 64;
const RIGHT = 12;
const TOP = 8;
const BOTTOM = 20;
// Categorical colours, distinguishable in light and dark themes.
const RANK_COLORS = ["#1f77d0", "#e0871a", "#2e9e6b", "#c2417f", "#8e5bd6", "#0f8a80", "#b8860b", "#d63a2f", "#5c6bc0", "#6d8f1d"];

export function rankColor(i: number): string {
  return RANK_COLORS[i % RANK_COLORS.length] as string;
}

/** GPU figures when any worker has a CUDA device, else host RSS. */
export function chartMetric(state: WorkersState): "gpu" | "host" {
  return state.ranks.some((r) => r.devices.length > 0) ? "gpu" : "host";
}

/** Ranks by host, in the kernel's order (host, rank, pid). */
export function byHost(ranks: readonly RankInfo[]): Map<string, RankInfo[]> {
  const out = new Map<string, RankInfo[]>();
  for (const r of ranks) {
    const list = out.get(r.host) ?? [];
    list.push(r);
    out.set(r.host, list);
  }
  return out;
}

export class WorkersView {
  readonly el: HTMLElement;
  private readonly canvas: HTMLCanvasElement;
  private readonly summary: HTMLElement;
  private readonly table: HTMLElement;
  private state: WorkersState = NO_WORKERS;
  private bands: Band[] = [];
  private readonly onOpen: OpenSnapshot | null;
  private readonly compare: CompareBar | null;

  /** `onOpen(key, index)`: open a rank's snapshot in the Snapshot tab (the rank selector);
   * `onCompare(a, b)`: compare two ranks' snapshots there. */
  constructor(onOpen: OpenSnapshot | null = null, onCompare: CompareSnapshots | null = null) {
    this.onOpen = onOpen;
    this.compare = onCompare ? new CompareBar(onCompare) : null;
    this.el = document.createElement("div");
    this.el.className = "gpumem-workers";
    this.summary = document.createElement("p");
    this.summary.className = "gpumem-workers-summary";
    this.canvas = document.createElement("canvas");
    this.canvas.className = "gpumem-workers-chart";
    this.table = document.createElement("div");
    this.table.className = "gpumem-workers-table";
    this.el.append(this.summary, this.canvas, this.table);
    if (this.compare) this.el.append(this.compare.el);
    this.update(NO_WORKERS, []);
  }

  update(state: WorkersState, bands: Band[]): void {
    this.state = state;
    this.bands = bands;
    this.el.dataset["ranks"] = String(state.ranks.length);
    this.el.dataset["metric"] = chartMetric(state);
    this.renderSummary();
    this.renderTable();
    this.compare?.update(state.ranks);
    this.draw();
  }

  setBands(bands: Band[]): void {
    this.bands = bands;
    this.draw();
  }

  private renderSummary(): void {
    const s = this.state;
    if (s.ranks.length === 0) {
      this.summary.textContent =
        "No worker has reported yet. In each worker process: import gpumem_widget; gpumem_widget.attach() " +
        "(processes this kernel starts find it through the environment; `%gpumem workers --env` prints the lines for a job started elsewhere).";
      return;
    }
    const live = s.ranks.filter((r) => r.state === "live").length;
    const dropped = Object.values(s.dropped).reduce((a, b) => a + b, 0);
    const parts = [`${live} live of ${s.ranks.length} workers`, `${s.accepted.toLocaleString()} samples`];
    if (dropped > 0) {
      parts.push(`${dropped.toLocaleString()} messages dropped (${Object.entries(s.dropped).map(([k, v]) => `${v} ${k}`).join(", ")})`);
    }
    if (s.problems.length > 0) parts.push(`${s.problems.length} left out: ${s.problems[0]}`);
    this.summary.textContent = parts.join(" \u00b7 ");
  }

  private renderTable(): void {
    const s = this.state;
    const index = new Map(s.ranks.map((r, i) => [r.key, i]));
    const groups: HTMLElement[] = [];
    for (const [host, ranks] of byHost(s.ranks)) {
      const group = document.createElement("section");
      group.className = "gpumem-workers-host";
      group.dataset["host"] = host;
      const title = document.createElement("h4");
      title.textContent = host;
      const table = document.createElement("table");
      for (const r of ranks) table.append(rankRow(r, index.get(r.key) ?? 0, this.onOpen));
      group.append(title, table);
      groups.push(group);
    }
    this.table.replaceChildren(...groups);
  }

  /** The chart: drawn on a canvas sized to the tab (nothing where the canvas has no 2D context). */
  private draw(): void {
    const s = this.state;
    this.canvas.hidden = s.ranks.length === 0;
    if (s.ranks.length === 0) return;
    const ctx = this.canvas.getContext?.("2d") ?? null;
    if (!ctx) return;
    const width = Math.max(300, this.el.clientWidth || 600);
    const ratio = window.devicePixelRatio || 1;
    this.canvas.width = width * ratio;
    this.canvas.height = HEIGHT * ratio;
    this.canvas.style.width = `${width}px`;
    this.canvas.style.height = `${HEIGHT}px`;
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    const p = readPalette(this.el);
    const metric = chartMetric(s);
    let t0 = Infinity;
    let t1 = -Infinity;
    let top = 0;
    for (const r of s.ranks) {
      const { series } = r;
      if (series.n === 0) continue;
      t0 = Math.min(t0, series.t[0] as number);
      t1 = Math.max(t1, series.t[series.n - 1] as number);
      const cols = metric === "gpu" ? [series.allocated, series.reserved] : [series.rss];
      for (const c of cols) for (let i = 0; i < series.n; i++) if (Number.isFinite(c[i])) top = Math.max(top, c[i] as number);
    }
    if (!Number.isFinite(t0)) return;
    if (t1 <= t0) t1 = t0 + 1;
    const ticks = byteTicks(top > 0 ? top * 1.05 : 1, 5);
    const yMax = Math.max(top * 1.05, ticks.ticks[ticks.ticks.length - 1] ?? 1);
    const x = (t: number): number => LEFT + ((t - t0) / (t1 - t0)) * (width - LEFT - RIGHT);
    const y = (v: number): number => TOP + (1 - v / yMax) * (HEIGHT - TOP - BOTTOM);
    ctx.clearRect(0, 0, width, HEIGHT);
    this.paintBands(ctx, p, x, t0, t1);
    paintAxes(ctx, p, ticks, y, width, t0, t1);
    let lines = 0;
    s.ranks.forEach((r, i) => {
      const color = rankColor(i);
      if (r.series.n > 0) lines += metric === "gpu" ? 2 : 1;
      if (metric === "gpu") {
        line(ctx, r, r.series.allocated, x, y, color, []);
        line(ctx, r, r.series.reserved, x, y, color, [4, 3]);
      } else {
        line(ctx, r, r.series.rss, x, y, color, []);
      }
      const last = r.series.n - 1;
      if (last >= 0 && (r.state !== "live" || r.oom)) {
        const col = metric === "gpu" ? r.series.allocated : r.series.rss;
        mark(ctx, x(r.series.t[last] as number), y((col[last] as number) || 0), r.oom ? p.capacity : p.muted, r.oom ? "OOM" : r.state);
      }
    });
    this.canvas.dataset["lines"] = String(lines); // what was drawn, for tests
  }

  private paintBands(ctx: CanvasRenderingContext2D, p: Palette, x: (t: number) => number, t0: number, t1: number): void {
    for (const b of this.bands) {
      const end = b.started + b.duration;
      if (end < t0 || b.started > t1) continue;
      ctx.fillStyle = b.outcome === "oom" ? p.bandOom : b.outcome === "ok" ? (b.execution_count % 2 ? p.band : p.bandAlt) : p.bandError;
      const x0 = Math.max(LEFT, x(b.started));
      ctx.fillRect(x0, TOP, Math.max(1, x(end) - x0), HEIGHT - TOP - BOTTOM);
    }
  }
}

/** "Compare [rank A's snapshot] with [rank B's snapshot]": shown once the workers have
 * reported two snapshots; the kernel opens both (by reference, never by path) side by side. */
export class CompareBar {
  readonly el: HTMLElement;
  private readonly a: HTMLSelectElement;
  private readonly b: HTMLSelectElement;
  private readonly button: HTMLButtonElement;
  private refs: SnapshotRef[] = [];

  constructor(onCompare: CompareSnapshots) {
    this.el = document.createElement("div");
    this.el.className = "gpumem-workers-compare";
    this.a = select("the first snapshot");
    this.b = select("the snapshot to compare it with");
    this.button = document.createElement("button");
    this.button.type = "button";
    this.button.textContent = "compare";
    this.button.title = "Both snapshots side by side in the Snapshot tab";
    this.button.addEventListener("click", () => {
      const a = this.refs[Number(this.a.value)];
      const b = this.refs[Number(this.b.value)];
      if (a && b) onCompare(a, b);
    });
    const sync = (): void => {
      this.button.disabled = this.a.value === this.b.value;
    };
    this.a.addEventListener("change", sync);
    this.b.addEventListener("change", sync);
    this.el.append("Compare ", this.a, " with ", this.b, " ", this.button);
    this.el.hidden = true;
  }

  update(ranks: readonly RankInfo[]): void {
    const refs: SnapshotRef[] = [];
    const labels: string[] = [];
    for (const r of ranks) {
      r.snapshots.forEach((path, index) => {
        refs.push({ key: r.key, index });
        labels.push(`${whoOf(r)} · ${path.split(/[\\/]/).pop() ?? path}`);
      });
    }
    const same = refs.length === this.refs.length && refs.every((x, i) => x.key === this.refs[i]?.key && x.index === this.refs[i]?.index);
    this.el.hidden = refs.length < 2;
    if (same) return; // keep the user's choice while samples arrive
    this.refs = refs;
    const options = (): HTMLOptionElement[] =>
      labels.map((text, i) => {
        const o = document.createElement("option");
        o.value = String(i);
        o.textContent = text;
        return o;
      });
    this.a.replaceChildren(...options());
    this.b.replaceChildren(...options());
    // Default: the first two ranks' newest snapshots, else the two newest.
    const newest = new Map<string, number>();
    refs.forEach((r, i) => newest.set(r.key, i));
    const picks = [...newest.values()];
    const [first, second] = picks.length >= 2 ? picks : [refs.length - 2, refs.length - 1];
    this.a.value = String(first ?? 0);
    this.b.value = String(second ?? 1);
    this.button.disabled = this.a.value === this.b.value;
  }
}

function select(label: string): HTMLSelectElement {
  const s = document.createElement("select");
  s.setAttribute("aria-label", label);
  return s;
}

/** A worker as the table names it: its rank (and world size, local rank), else its label. */
function whoOf(r: RankInfo): string {
  return r.rank !== null
    ? `rank ${r.rank}${r.world_size !== null ? `/${r.world_size}` : ""}${r.local_rank !== null ? ` (local ${r.local_rank})` : ""}`
    : r.label;
}

function line(
  ctx: CanvasRenderingContext2D,
  r: RankInfo,
  col: ArrayLike<number>,
  x: (t: number) => number,
  y: (v: number) => number,
  color: string,
  dash: number[],
): void {
  ctx.save();
  ctx.strokeStyle = color;
  ctx.lineWidth = 1.5;
  ctx.setLineDash(dash);
  ctx.beginPath();
  let pen = false;
  for (let i = 0; i < r.series.n; i++) {
    const v = col[i] as number;
    if (!Number.isFinite(v)) {
      pen = false;
      continue;
    }
    const px = x(r.series.t[i] as number);
    const py = y(v);
    if (pen) ctx.lineTo(px, py);
    else ctx.moveTo(px, py);
    pen = true;
  }
  ctx.stroke();
  ctx.restore();
}

function mark(ctx: CanvasRenderingContext2D, px: number, py: number, color: string, label: string): void {
  ctx.save();
  ctx.fillStyle = color;
  ctx.beginPath();
  ctx.arc(px, py, 3.5, 0, 2 * Math.PI);
  ctx.fill();
  ctx.font = "10px system-ui, sans-serif";
  ctx.fillText(label, Math.max(0, px - 30), Math.max(10, py - 5));
  ctx.restore();
}

function paintAxes(
  ctx: CanvasRenderingContext2D,
  p: Palette,
  ticks: ReturnType<typeof byteTicks>,
  y: (v: number) => number,
  width: number,
  t0: number,
  t1: number,
): void {
  ctx.save();
  ctx.font = p.font;
  ctx.fillStyle = p.muted;
  ctx.strokeStyle = p.grid;
  ctx.textBaseline = "middle";
  for (const v of ticks.ticks) {
    const py = Math.round(y(v)) + 0.5;
    ctx.beginPath();
    ctx.moveTo(LEFT, py);
    ctx.lineTo(width - RIGHT, py);
    ctx.stroke();
    ctx.fillText(formatTick(v, ticks.unit), 4, py);
  }
  ctx.textBaseline = "bottom";
  ctx.fillText(formatClock(t0), LEFT, HEIGHT - 2);
  const end = formatClock(t1);
  ctx.fillText(end, width - RIGHT - ctx.measureText(end).width, HEIGHT - 2);
  ctx.restore();
}

function rankRow(r: RankInfo, i: number, onOpen: OpenSnapshot | null): HTMLTableRowElement {
  const tr = document.createElement("tr");
  tr.dataset["key"] = r.key;
  tr.dataset["state"] = r.state;
  if (r.oom) tr.dataset["oom"] = "true";
  const swatch = document.createElement("td");
  const dot = document.createElement("span");
  dot.className = "gpumem-workers-swatch";
  dot.style.background = rankColor(i);
  swatch.append(dot);
  const who = whoOf(r);
  const stateText = r.state === "gone" ? `gone (silent since ${formatClock(r.last_seen)})` : r.state;
  const mem = r.devices
    .map((d) => `cuda:${d.index} ${formatBytes(d.allocated)} alloc \u00b7 ${formatBytes(d.reserved)} res \u00b7 peak ${formatBytes(d.peak_allocated)}`)
    .join("; ");
  tr.append(
    swatch,
    tableCell(who, "gpumem-workers-who", `pid ${r.pid}`),
    tableCell(stateText, `gpumem-workers-state gpumem-workers-state--${r.state}`),
    tableCell(mem || "no CUDA", "gpumem-workers-mem"),
    tableCell(r.rss !== null ? `RSS ${formatBytes(r.rss)}` : ""),
  );
  if (r.oom) {
    const o = r.oom;
    const asked = o.requested > 0 ? `asked ${formatBytes(o.requested)} with ${formatBytes(o.free)} free of ${formatBytes(o.limit)}; ` : "";
    tr.append(tableCell(`OOM on cuda:${o.device}: ${asked}${formatBytes(o.allocated)} allocated, ${formatBytes(o.reserved)} reserved`, "gpumem-workers-oom"));
  }
  if (r.snapshots.length > 0) {
    const td = tableCell("", "gpumem-workers-snapshot");
    r.snapshots.forEach((path, k) => {
      const name = path.split(/[\\/]/).pop() ?? path;
      if (onOpen) {
        const b = document.createElement("button");
        b.type = "button";
        b.className = "gpumem-workers-open";
        b.textContent = `open ${name}`;
        b.title = `${path}\nin the Snapshot tab`;
        b.dataset["index"] = String(k);
        b.addEventListener("click", () => onOpen(r.key, k));
        td.append(b);
      } else {
        td.append(`snapshot: ${path} `);
      }
    });
    tr.append(td);
  }
  return tr;
}
