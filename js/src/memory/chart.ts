// The live chart: one uPlot panel per CUDA device shown (allocated, reserved, NVML process and
// device use, capacity as a ceiling) and a small host RSS panel, sharing one time range; a strip
// of cell bands above them, the running cell's band open-ended to the newest sample, and under
// them each cell's forward/backward/recompute/optimizer spans (the module tracer's); a cell's
// estimate as a dashed line across its band; a legend with current values per panel; zoom
// (drag), pan (shift-drag), a "follow live" toggle. Nothing here draws until `draw()`, which the
// widget calls once per frame.
//
// With several devices, "all" shows one panel per device rather than summed lines: each keeps its
// own capacity line and scale, so the one card that is full stays visible, which a sum hides.

import uPlot from "uplot";
import { outcome, tooltipLines, type DeviceChoice, type Mode } from "./cells";
import { decimate, nearestIndex, seriesMax, type Envelope } from "./decimate";
import { byteTicks, clockPrecision, formatBytes, formatClock, formatDuration, formatTick, niceCeiling } from "../common/format";
import type { Timeline } from "./timeline_store";
import { deviceColumn, HOST_RSS_COLUMN, type Band, type CellRecord, type DeviceField, type DeviceInfo } from "../wire/protocol";
import { PHASES, type PhaseSpans } from "../wire/notes";
import { spansIn, spanTooltip, type DrawnSpan } from "./phases";
import { readPalette, type Palette } from "../common/theme";

interface SeriesSpec {
  column: (device: number) => string;
  label: string;
  color: (p: Palette) => string;
  dash?: number[];
}

const deviceSeries = (field: DeviceField, label: string, color: (p: Palette) => string, extra: Partial<SeriesSpec> = {}): SeriesSpec => ({
  column: (d) => deviceColumn(d, field),
  label,
  color,
  ...extra,
});

const DEVICE_SERIES: readonly SeriesSpec[] = [
  deviceSeries("allocated", "allocated", (p) => p.allocated),
  deviceSeries("reserved", "reserved", (p) => p.reserved),
  deviceSeries("process_used", "process (NVML)", (p) => p.processUsed, { dash: [4, 3] }),
  deviceSeries("others_used", "other processes", (p) => p.othersUsed, { dash: [2, 2] }),
  deviceSeries("device_used", "whole device", (p) => p.deviceUsed, { dash: [1, 2] }),
];
const HOST_SERIES: readonly SeriesSpec[] = [{ column: () => HOST_RSS_COLUMN, label: "host RSS", color: (p) => p.hostRss }];

const Y_AXIS_WIDTH = 60; // the same in every panel, so the plots (and the band strip) line up
const RIGHT_PADDING = 8;
const MIN_VISIBLE_SPAN = 1; // seconds
const CLICK_SLOP_PX = 3;

interface Panel {
  el: HTMLElement;
  plot: uPlot;
  device: DeviceInfo | null; // null: the host RSS panel
  columns: string[];
  legendValues: HTMLElement[]; // one per series, showing its current value
  height: number;
  lows: (number | null)[][]; // per series, the minima under the plotted maxima (see decimate)
}

export interface ChartOptions {
  /** The widget root: its styles give the palette, and it hosts the band tooltip. */
  root: HTMLElement;
  requestFrame: () => void;
  onSelectCell: (executionCount: number) => void;
  /** Controls that belong at the start of the chart's toolbar (the device selector). */
  toolbarStart?: HTMLElement;
}

type Range = { min: number; max: number };

/** A cell's estimate, drawn as a dashed line at `predicted` across its band on `device`'s panel. */
interface EstimateLine {
  executionCount: number;
  device: number;
  start: number;
  end: number;
  predicted: number;
}

let nextSyncKey = 0;

export class Chart {
  readonly el: HTMLElement;
  private readonly opts: ChartOptions;
  private readonly toolbar: HTMLElement;
  private readonly followBox: HTMLInputElement;
  private readonly hoverText: HTMLElement;
  private readonly strip: HTMLElement;
  private readonly panelsEl: HTMLElement;
  private readonly empty: HTMLElement;
  private readonly tooltip: HTMLElement;
  private readonly syncKey = `gpumem-${nextSyncKey++}`;
  private readonly resizeObserver: ResizeObserver;
  private readonly hidden = new Set<string>(); // "panel/series label" the user switched off

  private panels: Panel[] = [];
  private palette: Palette | null = null;
  private layoutKey = "";
  private devices: DeviceInfo[] = [];
  private mode: Mode = "host";
  private timeline: Timeline = { n: 0, t: new Float64Array(0), values: new Map() };
  private deviceChoice: DeviceChoice = null;
  private cells = new Map<number, CellRecord>(); // the records here, for hover text
  private bandList: Band[] = []; // one per cell, in time order
  private estimates: EstimateLine[] = [];
  private bands = new Map<number, HTMLElement>();
  private readonly runningBand: HTMLElement;
  private running: { executionCount: number; started: number } | null = null;
  // The module tracer's phase spans: a thin strip under the bands, and its legend.
  private readonly phaseStrip: HTMLElement;
  private readonly phaseLegend: HTMLElement;
  private readonly phasePool: HTMLElement[] = [];
  private runningPhases: PhaseSpans | null = null;
  private drawnPhases: DrawnSpan[] = [];
  private selected: number | null = null;
  private width = 0;
  private dirty = true;
  private rebuildWanted = true;
  private settingScales = false;
  private hoverX: number | null = null;

  // The time range: while following live, the newest `followSpan` seconds (null: everything);
  // otherwise the fixed range the user zoomed or panned to.
  private follow = true;
  private followSpan: number | null = null;
  private fixed: Range = { min: 0, max: 1 };
  private shown: Range = { min: 0, max: 1 };

  constructor(opts: ChartOptions) {
    this.opts = opts;
    this.el = div("gpumem-chart");
    this.toolbar = div("gpumem-toolbar");
    const followLabel = document.createElement("label");
    followLabel.className = "gpumem-follow";
    this.followBox = document.createElement("input");
    this.followBox.type = "checkbox";
    this.followBox.checked = true;
    this.followBox.addEventListener("change", () => this.setFollow(this.followBox.checked));
    followLabel.append(this.followBox, " Follow live");
    const zoomOut = button("Zoom out", () => this.zoomOut());
    const showAll = button("Show all", () => this.showAll());
    showAll.title = "Show every sample and follow live (or double-click the chart)";
    this.hoverText = div("gpumem-hover-time");
    this.toolbar.append(...(opts.toolbarStart ? [opts.toolbarStart] : []), followLabel, zoomOut, showAll);
    this.toolbar.title = "Drag to zoom, shift-drag to pan, double-click to show all";

    this.strip = div("gpumem-strip");
    this.strip.addEventListener("pointermove", (e) => this.onStripHover(e));
    this.strip.addEventListener("pointerleave", () => this.hideTooltip());
    this.runningBand = div("gpumem-band gpumem-band--running");
    this.runningBand.dataset["running"] = "";
    this.runningBand.hidden = true;
    this.strip.append(this.runningBand);
    this.strip.addEventListener("click", (e) => {
      const band = (e.target as Element).closest<HTMLElement>(".gpumem-band:not([data-running])");
      const n = Number(band?.dataset["executionCount"]);
      if (band && Number.isFinite(n)) this.opts.onSelectCell(n);
    });
    this.phaseStrip = div("gpumem-phase-strip");
    this.phaseStrip.hidden = true;
    this.phaseStrip.addEventListener("pointermove", (e) => this.onPhaseHover(e));
    this.phaseStrip.addEventListener("pointerleave", () => this.hideTooltip());
    this.phaseLegend = div("gpumem-phase-legend");
    this.phaseLegend.hidden = true;
    this.phaseLegend.title = "The module tracer's phases of each cell (%gpumem modules)";
    for (const phase of PHASES) {
      const item = div("gpumem-legend-item gpumem-legend-item--static");
      item.dataset["phase"] = phase;
      const swatch = document.createElement("span");
      swatch.className = "gpumem-swatch gpumem-phase-swatch";
      swatch.dataset["phase"] = phase;
      const label = document.createElement("span");
      label.textContent = phase;
      item.append(swatch, label);
      this.phaseLegend.append(item);
    }
    this.panelsEl = div("gpumem-panels");
    this.empty = div("gpumem-empty");
    this.empty.textContent = "Waiting for the first samples\u2026";
    this.tooltip = div("gpumem-tooltip");
    this.tooltip.hidden = true;
    opts.root.append(this.tooltip);
    this.toolbar.append(this.phaseLegend, this.hoverText);
    this.el.append(this.toolbar, this.strip, this.phaseStrip, this.panelsEl, this.empty);

    this.resizeObserver = new ResizeObserver((entries) => {
      const w = Math.floor(entries[entries.length - 1]?.contentRect.width ?? 0);
      if (w > 0 && w !== this.width) {
        this.width = w;
        this.invalidate();
      }
    });
    this.resizeObserver.observe(this.el);
  }

  /** The devices, the mode, and which device's panel to show (null: one per device). */
  setLayout(devices: DeviceInfo[], mode: Mode, deviceChoice: DeviceChoice = null): void {
    const key = JSON.stringify([mode, deviceChoice, devices.map((d) => [d.index, d.name, d.total])]);
    if (key === this.layoutKey) return;
    this.layoutKey = key;
    this.devices = devices;
    this.mode = mode;
    this.deviceChoice = deviceChoice;
    this.rebuildWanted = true;
    this.invalidate();
  }

  /** The cell running now (`started`: unix seconds, kernel clock), or null when idle; its phase
   * spans so far, while the module tracer is on. */
  setRunning(executionCount: number | null, started: number | null, phases: PhaseSpans | null = null): void {
    const running = executionCount !== null && started !== null ? { executionCount, started } : null;
    const runningPhases = running && phases?.cell === running.executionCount ? phases : null;
    if (JSON.stringify([running, runningPhases]) === JSON.stringify([this.running, this.runningPhases])) return;
    this.runningPhases = runningPhases;
    if (JSON.stringify(running) === JSON.stringify(this.running)) {
      this.invalidate();
      return;
    }
    this.running = running;
    if (running) {
      this.runningBand.dataset["executionCount"] = String(running.executionCount);
      this.runningBand.textContent = `[${running.executionCount}] running`;
    } else {
      delete this.runningBand.dataset["executionCount"];
    }
    this.invalidate();
  }

  setTimeline(timeline: Timeline): void {
    this.timeline = timeline;
    this.invalidate();
  }

  /** The records the widget holds (hover text, estimate lines). */
  setCells(cells: CellRecord[]): void {
    this.cells = new Map(cells.map((c) => [c.execution_count, c]));
    this.estimates = cells.flatMap((c): EstimateLine[] => {
      const est = c.notes.estimate;
      if (!est) return [];
      return [{ executionCount: c.execution_count, device: est.device, start: c.started, end: c.started + c.duration, predicted: est.comparison.predicted }];
    });
    this.invalidate();
  }

  /** A band per cell, in time order (more than the records: see `ledger_store.ts`). */
  setBands(bands: Band[]): void {
    this.bandList = bands;
    // A new cell's band exists at once (hidden until the next draw places it), as its row does.
    const known = new Set(this.bands.keys());
    for (const band of bands.slice(-8)) if (!known.has(band.execution_count)) this.bandElement(band);
    this.invalidate();
  }

  private bandElement(cell: Band): HTMLElement {
    const n = cell.execution_count;
    let band = this.bands.get(n);
    if (!band) {
      band = div("gpumem-band");
      band.dataset["executionCount"] = String(n);
      band.textContent = `[${n}]`;
      band.hidden = true;
      band.classList.toggle("gpumem-band--selected", n === this.selected);
      this.bands.set(n, band);
      this.strip.insertBefore(band, this.runningBand);
    }
    band.dataset["outcome"] = cell.outcome;
    return band;
  }

  /** The bands that overlap [min, max]: cells run one after another, so starts ascend. */
  private visibleBands(min: number, max: number): Band[] {
    const bands = this.bandList;
    let lo = 0;
    let hi = bands.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if ((bands[mid] as Band).started < min) lo = mid + 1;
      else hi = mid;
    }
    if (lo > 0) lo--; // the band that started before `min` may reach into the view
    const out: Band[] = [];
    for (let i = lo; i < bands.length; i++) {
      const b = bands[i] as Band;
      if (b.started > max) break;
      if (b.started + b.duration >= min) out.push(b);
    }
    return out;
  }

  /** Highlight a cell; with `zoom`, show its time span (the user asked for that cell). */
  setSelected(n: number | null, zoom: boolean): void {
    this.selected = n;
    for (const [k, band] of this.bands) band.classList.toggle("gpumem-band--selected", k === n);
    const cell = n === null ? undefined : this.bandList.find((c) => c.execution_count === n);
    if (zoom && cell) {
      const pad = Math.max(cell.duration * 0.15, 0.25);
      this.setFollow(false, false);
      this.fixed = { min: cell.started - pad, max: cell.started + cell.duration + pad };
    }
    this.invalidate();
  }

  /** Re-read the palette (after a theme switch); panels are rebuilt only if a colour changed. */
  themeChanged(): void {
    if (!this.palette || !this.opts.root.isConnected) return;
    if (JSON.stringify(readPalette(this.opts.root)) !== JSON.stringify(this.palette)) {
      this.rebuildWanted = true;
      this.invalidate();
    }
  }

  /** Bring the canvas up to date; call at most once per animation frame. */
  draw(): void {
    if (!this.dirty || this.width <= 0 || !this.opts.root.isConnected) return;
    this.dirty = false;
    if (this.rebuildWanted) this.rebuild();
    const { n, t } = this.timeline;
    this.shown = this.currentRange();
    this.empty.hidden = n > 0;
    for (const panel of this.panels) this.drawPanel(panel);
    this.placeBands();
    this.updateLegends();
    // Tests and the benchmark read these to know what is on screen.
    this.el.dataset["samples"] = String(n);
    this.el.dataset["drawnUntil"] = n > 0 ? String(t[n - 1]) : "";
    this.el.dataset["viewFrom"] = String(this.shown.min);
    this.el.dataset["viewTo"] = String(this.shown.max);
  }

  destroy(): void {
    this.resizeObserver.disconnect();
    for (const p of this.panels) p.plot.destroy();
    this.panels = [];
    this.tooltip.remove();
    this.el.remove();
  }

  // -------------------------------------------------------------------------------------------
  // time range

  private invalidate(): void {
    this.dirty = true;
    this.opts.requestFrame();
  }

  private dataExtent(): Range | null {
    const { n, t } = this.timeline;
    return n > 0 ? { min: t[0] as number, max: t[n - 1] as number } : null;
  }

  /** The running cell's span: from its start to the newest sample (its "now"), if any. */
  private runningSpan(): Range | null {
    if (!this.running || this.bandList.slice(-4).some((c) => c.execution_count === this.running?.executionCount)) return null;
    const { started } = this.running;
    return { min: started, max: Math.max(started, this.dataExtent()?.max ?? started) };
  }

  private currentRange(): Range {
    let range: Range;
    if (this.follow) {
      const extent = this.dataExtent() ?? { min: Date.now() / 1000 - 60, max: Date.now() / 1000 };
      // A cell that started after the newest sample still shows its (thin) band at the edge.
      const newest = Math.max(extent.max, this.runningSpan()?.max ?? -Infinity);
      range = { min: this.followSpan === null ? extent.min : newest - this.followSpan, max: newest };
    } else {
      range = this.fixed;
    }
    if (range.max - range.min < MIN_VISIBLE_SPAN) {
      const mid = (range.min + range.max) / 2;
      range = { min: mid - MIN_VISIBLE_SPAN / 2, max: mid + MIN_VISIBLE_SPAN / 2 };
    }
    return range;
  }

  private setFollow(follow: boolean, invalidate = true): void {
    if (follow && !this.follow) {
      // Keep the zoom level the user chose, anchored at the newest sample.
      const extent = this.dataExtent();
      const span = this.shown.max - this.shown.min;
      this.followSpan = extent && span < extent.max - extent.min ? span : null;
    } else if (!follow && this.follow) {
      this.fixed = { ...this.shown };
    }
    this.follow = follow;
    this.followBox.checked = follow;
    if (invalidate) this.invalidate();
  }

  private showAll(): void {
    this.follow = true;
    this.followBox.checked = true;
    this.followSpan = null;
    this.invalidate();
  }

  private zoomOut(): void {
    const { min, max } = this.shown;
    const span = max - min;
    const extent = this.dataExtent();
    if (this.follow) {
      this.followSpan = extent && 2 * span < extent.max - extent.min ? 2 * span : null;
    } else {
      this.fixed = { min: min - span / 2, max: max + span / 2 };
    }
    this.invalidate();
  }

  /** A range the user picked on a plot (drag zoom) or dragged to (pan). */
  private userRange(range: Range): void {
    this.fixed = range;
    this.shown = range;
    this.follow = false;
    this.followBox.checked = false;
    this.invalidate();
  }

  // -------------------------------------------------------------------------------------------
  // panels

  private rebuild(): void {
    this.rebuildWanted = false;
    for (const p of this.panels) p.plot.destroy();
    this.panelsEl.replaceChildren();
    this.palette = readPalette(this.opts.root);
    const all = this.mode === "cuda" ? this.devices : [];
    const chosen = all.filter((d) => d.index === this.deviceChoice);
    const devices = chosen.length > 0 ? chosen : all;
    const deviceHeight = devices.length <= 1 ? 190 : devices.length === 2 ? 150 : devices.length <= 4 ? 110 : 80;
    this.panels = devices.map((d) => this.createPanel(d, DEVICE_SERIES, deviceHeight, false));
    this.panels.push(this.createPanel(null, HOST_SERIES, devices.length === 0 ? 190 : 90, true));
    // The strip's bands are placed in plot coordinates: indent it by the y axis.
    this.strip.style.marginLeft = `${Y_AXIS_WIDTH}px`;
  }

  private createPanel(device: DeviceInfo | null, specs: readonly SeriesSpec[], height: number, bottom: boolean): Panel {
    const p = this.palette as Palette;
    const el = div("gpumem-panel");
    if (device) el.dataset["device"] = String(device.index);
    else el.classList.add("gpumem-panel--host");
    const legendEl = div("gpumem-legend");
    const title = div("gpumem-legend-title");
    title.textContent = device ? `cuda:${device.index} ${device.name}` : "host";
    legendEl.append(title);
    const columns = specs.map((s) => s.column(device?.index ?? 0));
    const panelKey = device ? `cuda:${device.index}` : "host";

    const legendValues = specs.map((spec, i): HTMLElement => {
      const item = document.createElement("button");
      item.type = "button";
      item.className = "gpumem-legend-item";
      const swatch = document.createElement("span");
      swatch.className = "gpumem-swatch";
      swatch.style.background = spec.color(p);
      const label = document.createElement("span");
      label.textContent = spec.label;
      const value = document.createElement("span");
      value.className = "gpumem-legend-value";
      item.append(swatch, label, value);
      const hiddenKey = `${panelKey}/${spec.label}`;
      item.classList.toggle("gpumem-legend-item--off", this.hidden.has(hiddenKey));
      item.title = "Show or hide this line";
      item.addEventListener("click", () => {
        const show = this.hidden.has(hiddenKey);
        if (show) this.hidden.delete(hiddenKey);
        else this.hidden.add(hiddenKey);
        item.classList.toggle("gpumem-legend-item--off", !show);
        plot.setSeries(i + 1, { show });
        this.invalidate();
      });
      legendEl.append(item);
      return value;
    });

    if (device?.total != null) {
      const item = div("gpumem-legend-item gpumem-legend-item--static");
      const swatch = document.createElement("span");
      swatch.className = "gpumem-swatch gpumem-swatch--dashed";
      swatch.style.borderColor = p.capacity;
      const label = document.createElement("span");
      label.textContent = "capacity";
      const value = document.createElement("span");
      value.className = "gpumem-legend-value";
      value.textContent = formatBytes(device.total);
      item.append(swatch, label, value);
      legendEl.append(item);
    }

    const capacity = device?.total ?? null;
    const axisFont = p.font;
    const opts: uPlot.Options = {
      width: this.width,
      height,
      legend: { show: false },
      padding: [6, RIGHT_PADDING, bottom ? 0 : 2, 0],
      cursor: {
        sync: { key: this.syncKey },
        points: { show: false },
        drag: { x: true, y: false, setScale: true },
        // Double-click is ours ("show all"), so uPlot gets no listener for it.
        bind: { dblclick: () => null },
      },
      scales: {
        x: { time: true, auto: false, range: (_u, min, max) => [min, max] },
        y: { auto: false, range: (_u, min, max) => [min, max] },
      },
      axes: [
        {
          stroke: p.muted,
          font: axisFont,
          grid: { stroke: p.grid, width: 1 },
          ticks: { stroke: p.grid, width: 1, size: bottom ? 4 : 0 },
          size: bottom ? 26 : 2,
          space: 70,
          // Clock times; only the bottom panel labels them, the others keep the grid lines.
          values: (u: uPlot, splits: number[], _axis: number, _space: number, incr: number) =>
            bottom ? fitLabels(u, splits, splits.map((v) => formatClock(v, clockPrecision(incr))), axisFont) : splits.map(() => ""),
        },
        {
          stroke: p.muted,
          font: axisFont,
          size: Y_AXIS_WIDTH,
          gap: 4,
          grid: { stroke: p.grid, width: 1 },
          ticks: { show: false },
          splits: (u) => byteTicks(u.scales["y"]?.max ?? 1, Math.max(2, Math.floor(height / 32))).ticks,
          values: (u, splits) => {
            const unit = byteTicks(u.scales["y"]?.max ?? 1, 2).unit;
            return splits.map((v) => formatTick(v, unit));
          },
        },
      ],
      series: [
        {},
        ...specs.map((spec): uPlot.Series => ({
          label: spec.label,
          stroke: spec.color(p),
          width: 1.5,
          show: !this.hidden.has(`${panelKey}/${spec.label}`),
          points: { show: false },
          // The band between each pixel column's minimum and maximum.
          fill: withAlpha(spec.color(p), 0.3),
          paths: envelopePaths((i) => panel.lows[i - 1]),
          ...(spec.dash ? { dash: spec.dash } : {}),
        })),
      ],
      hooks: {
        drawClear: [(u) => this.paintBands(u)],
        draw: [
          (u) => {
            if (capacity !== null) this.paintCapacity(u, capacity);
            if (device) this.paintEstimates(u, device.index, el);
          },
        ],
        setScale: [(u, key) => this.onPlotScale(u, key)],
        setCursor: [(u) => this.onPlotCursor(u)],
      },
    };
    const plotEl = div("gpumem-plot");
    el.append(legendEl, plotEl);
    this.panelsEl.append(el);
    const plot = new uPlot(opts, [[], ...specs.map(() => [])], plotEl);
    const panel: Panel = { el, plot, device, columns, legendValues, height, lows: [] };
    this.attachPointer(plot);
    return panel;
  }

  private drawPanel(panel: Panel): void {
    const { plot } = panel;
    const { min, max } = this.shown;
    const plotWidth = Math.max(1, this.width - Y_AXIS_WIDTH - RIGHT_PADDING);
    const columns = panel.columns.map((c) => this.timeline.values.get(c) ?? null);
    const data: Envelope = decimate(this.timeline.t, columns, min, max, plotWidth);
    panel.lows = data.lo;
    const visible = data.hi.filter((_y, i) => plot.series[i + 1]?.show !== false);
    const index = panel.device?.index;
    let dataMax = seriesMax(visible);
    for (const e of this.estimates) {
      if (e.device === index && e.end >= min && e.start <= max) dataMax = Math.max(dataMax, e.predicted);
    }
    const top = yTop(dataMax, panel.device?.total ?? null);
    this.settingScales = true;
    try {
      plot.batch(() => {
        if (plot.width !== this.width) plot.setSize({ width: this.width, height: panel.height });
        plot.setData([data.x, ...data.hi], false);
        plot.setScale("x", { min, max });
        plot.setScale("y", { min: 0, max: top });
      });
    } finally {
      this.settingScales = false;
    }
  }

  private onPlotScale(u: uPlot, key: string): void {
    if (key !== "x" || this.settingScales) return;
    const min = u.scales["x"]?.min;
    const max = u.scales["x"]?.max;
    if (min != null && max != null && max > min) this.userRange({ min, max });
  }

  /** Shift-drag pans, a click (not a drag) selects the cell under the pointer, double-click shows all. */
  private attachPointer(plot: uPlot): void {
    const over = plot.over;
    let downX = NaN;
    over.addEventListener("mousedown", (e) => (downX = e.clientX));
    over.addEventListener("click", (e) => {
      if (Math.abs(e.clientX - downX) > CLICK_SLOP_PX) return;
      const x = plot.posToVal(e.clientX - over.getBoundingClientRect().left, "x");
      const cell = this.cellAt(x);
      if (cell) this.opts.onSelectCell(cell.execution_count);
    });
    over.addEventListener("dblclick", () => this.showAll());
    // Capture phase on the plot's root, so uPlot's own drag-to-zoom never sees a shift-drag.
    plot.root.addEventListener(
      "mousedown",
      (e) => {
        if (!e.shiftKey || e.button !== 0 || !over.contains(e.target as Node)) return;
        e.stopPropagation();
        e.preventDefault();
        const start = { ...this.shown };
        const x0 = e.clientX;
        const perPx = (start.max - start.min) / Math.max(1, over.clientWidth);
        const move = (ev: MouseEvent): void => {
          const dt = (ev.clientX - x0) * perPx;
          this.userRange({ min: start.min - dt, max: start.max - dt });
        };
        const up = (): void => {
          document.removeEventListener("mousemove", move);
          document.removeEventListener("mouseup", up);
        };
        document.addEventListener("mousemove", move);
        document.addEventListener("mouseup", up);
      },
      true,
    );
  }

  // -------------------------------------------------------------------------------------------
  // cell bands: shaded on every panel's canvas, labelled and interactive in the strip

  private paintEstimates(u: uPlot, device: number, panelEl: HTMLElement): void {
    const p = this.palette;
    const top = u.scales["y"]?.max;
    if (!p || top == null) return;
    const { ctx, bbox } = u;
    const { min, max } = this.shown;
    const drawn: number[] = [];
    ctx.save();
    ctx.strokeStyle = p.estimate;
    ctx.fillStyle = p.estimate;
    ctx.lineWidth = 2 * uPlot.pxRatio;
    ctx.setLineDash([5 * uPlot.pxRatio, 3 * uPlot.pxRatio]);
    ctx.font = p.font.replace(/^\d+px/, (px) => `${parseInt(px, 10) * uPlot.pxRatio}px`);
    ctx.textBaseline = "bottom";
    for (const e of this.estimates) {
      if (e.device !== device || e.end < min || e.start > max || e.predicted > top) continue;
      const x0 = Math.max(bbox.left, u.valToPos(e.start, "x", true));
      const x1 = Math.min(bbox.left + bbox.width, u.valToPos(e.end, "x", true));
      const y = Math.round(u.valToPos(e.predicted, "y", true)) + 0.5;
      ctx.beginPath();
      ctx.moveTo(x0, y);
      ctx.lineTo(Math.max(x1, x0 + 2 * uPlot.pxRatio), y);
      ctx.stroke();
      const label = `est ${formatBytes(e.predicted)}`;
      if (ctx.measureText(label).width + 4 * uPlot.pxRatio < x1 - x0) ctx.fillText(label, x0 + 2 * uPlot.pxRatio, y - 2 * uPlot.pxRatio);
      drawn.push(e.executionCount);
    }
    ctx.restore();
    // Tests read which estimates are on screen.
    const list = drawn.join(" ");
    if (panelEl.dataset["estimates"] !== list) panelEl.dataset["estimates"] = list;
  }

  private cellAt(x: number): Band | undefined {
    const here = this.visibleBands(x, x);
    return here[here.length - 1];
  }

  private paintBands(u: uPlot): void {
    const p = this.palette;
    if (!p) return;
    const { ctx, bbox } = u;
    const { min, max } = this.shown;
    for (const cell of this.visibleBands(min, max)) {
      const end = cell.started + cell.duration;
      const x0 = Math.max(bbox.left, u.valToPos(cell.started, "x", true));
      const x1 = Math.min(bbox.left + bbox.width, u.valToPos(end, "x", true));
      const kind = cell.outcome;
      ctx.fillStyle =
        cell.execution_count === this.selected
          ? p.bandSelected
          : kind === "oom"
            ? p.bandOom
            : kind === "error" || kind === "interrupted"
              ? p.bandError
              : cell.execution_count % 2 === 0
                ? p.band
                : p.bandAlt;
      ctx.fillRect(x0, bbox.top, Math.max(uPlot.pxRatio, x1 - x0), bbox.height);
    }
    const running = this.runningSpan();
    if (running && running.max >= min && running.min <= max) {
      const x0 = Math.max(bbox.left, u.valToPos(running.min, "x", true));
      const x1 = Math.min(bbox.left + bbox.width, u.valToPos(running.max, "x", true));
      ctx.fillStyle = p.bandRunning;
      ctx.fillRect(x0, bbox.top, Math.max(2 * uPlot.pxRatio, x1 - x0), bbox.height);
    }
  }

  private paintCapacity(u: uPlot, capacity: number): void {
    const p = this.palette;
    const top = u.scales["y"]?.max;
    if (!p || top == null || capacity > top) return;
    const { ctx, bbox } = u;
    const y = Math.round(u.valToPos(capacity, "y", true)) + 0.5;
    ctx.save();
    ctx.strokeStyle = p.capacity;
    ctx.lineWidth = uPlot.pxRatio;
    ctx.setLineDash([6 * uPlot.pxRatio, 4 * uPlot.pxRatio]);
    ctx.beginPath();
    ctx.moveTo(bbox.left, y);
    ctx.lineTo(bbox.left + bbox.width, y);
    ctx.stroke();
    ctx.restore();
  }

  private placeBands(): void {
    const plot = this.panels[0]?.plot;
    if (!plot) return;
    const { min, max } = this.shown;
    const width = plot.bbox.width / uPlot.pxRatio;
    this.strip.style.width = `${width}px`;
    // One element per band on screen, reused by execution count; with more than MAX_STRIP_BANDS
    // on screen they are slivers: the canvas draws them, the strip shows none.
    const visible = this.visibleBands(min, max);
    const shown = visible.length <= MAX_STRIP_BANDS ? visible : [];
    this.placePhases(plot, width, visible.length <= MAX_STRIP_BANDS);
    const keep = new Set(shown.map((b) => b.execution_count));
    for (const [n, el] of this.bands) {
      if (!keep.has(n)) {
        el.remove();
        this.bands.delete(n);
      }
    }
    for (const cell of shown) {
      const band = this.bandElement(cell);
      const end = cell.started + cell.duration;
      const left = Math.max(0, plot.valToPos(cell.started, "x"));
      const right = Math.min(width, plot.valToPos(end, "x"));
      const w = Math.max(2, right - left);
      band.hidden = false;
      band.style.left = `${left}px`;
      band.style.width = `${w}px`;
      band.classList.toggle("gpumem-band--narrow", w < 26);
    }
    const running = this.runningSpan();
    const band = this.runningBand;
    if (!running || running.max < min || running.min > max) {
      band.hidden = true;
      return;
    }
    const left = Math.max(0, plot.valToPos(running.min, "x"));
    const w = Math.max(4, Math.min(width, plot.valToPos(running.max, "x")) - left);
    band.hidden = false;
    band.style.left = `${Math.min(left, width - w)}px`; // a cell that just started: at the edge
    band.style.width = `${w}px`;
    band.classList.toggle("gpumem-band--narrow", w < 26);
  }

  /** The phase spans of the cells on screen (none when the bands are slivers). */
  private placePhases(plot: uPlot, width: number, show: boolean): void {
    const { min, max } = this.shown;
    const cells: [number, PhaseSpans][] = [];
    if (show) {
      for (const [n, cell] of this.cells) {
        const phases = cell.notes.modules?.phases;
        if (phases && phases.spans.length > 0) cells.push([n, phases]);
      }
      const running = this.runningSpan();
      if (running && this.running && this.runningPhases) cells.push([this.running.executionCount, this.runningPhases]);
    }
    const now = this.runningSpan()?.max ?? this.dataExtent()?.max ?? 0;
    const spans = spansIn(cells, min, max, now);
    this.drawnPhases = spans;
    this.phaseStrip.hidden = spans.length === 0;
    this.phaseLegend.hidden = spans.length === 0;
    this.phaseStrip.style.width = `${width}px`;
    this.phaseStrip.style.marginLeft = `${Y_AXIS_WIDTH}px`;
    const present = new Set<string>(spans.map((s) => s.phase));
    for (const item of this.phaseLegend.querySelectorAll<HTMLElement>(".gpumem-legend-item")) {
      item.hidden = !present.has(item.dataset["phase"] ?? "");
    }
    spans.forEach((s, i) => {
      let el = this.phasePool[i];
      if (!el) {
        el = div("gpumem-phase");
        this.phasePool.push(el);
        this.phaseStrip.append(el);
      }
      const left = Math.max(0, plot.valToPos(s.start, "x"));
      const right = Math.min(width, plot.valToPos(s.end, "x"));
      el.hidden = false;
      el.dataset["phase"] = s.phase;
      el.dataset["cell"] = String(s.cell);
      el.dataset["index"] = String(i);
      el.dataset["merged"] = String(s.span.merged);
      el.dataset["open"] = String(s.span.end === null);
      el.style.left = `${left}px`;
      el.style.width = `${Math.max(1, right - left)}px`;
    });
    for (let i = spans.length; i < this.phasePool.length; i++) (this.phasePool[i] as HTMLElement).hidden = true;
  }

  private onPhaseHover(e: PointerEvent): void {
    const el = (e.target as Element).closest<HTMLElement>(".gpumem-phase");
    const span = el ? this.drawnPhases[Number(el.dataset["index"])] : undefined;
    if (!span) {
      this.hideTooltip();
      return;
    }
    this.showTooltip(spanTooltip(span), "phase", e);
    this.tooltip.dataset["phase"] = span.phase;
  }

  private showTooltip(lines: readonly string[], kind: string, e: PointerEvent): void {
    this.tooltip.replaceChildren(
      ...lines.map((line, i) => {
        const el = div(i === 0 ? "gpumem-tooltip-head" : i === lines.length - 1 ? "gpumem-tooltip-figures" : "gpumem-tooltip-source");
        el.textContent = line;
        return el;
      }),
    );
    this.tooltip.dataset["outcome"] = kind;
    delete this.tooltip.dataset["phase"];
    this.tooltip.hidden = false;
    const rootBox = this.opts.root.getBoundingClientRect();
    const maxLeft = Math.max(0, rootBox.width - this.tooltip.offsetWidth - 4);
    this.tooltip.style.left = `${Math.min(maxLeft, Math.max(0, e.clientX - rootBox.left + 12))}px`;
    this.tooltip.style.top = `${e.clientY - rootBox.top + 16}px`;
  }

  private onStripHover(e: PointerEvent): void {
    const band = (e.target as Element).closest<HTMLElement>(".gpumem-band");
    const n = Number(band?.dataset["executionCount"]);
    const running = band === this.runningBand ? this.runningSpan() : null;
    const cell = band && !running ? this.cells.get(n) : undefined;
    const bare = band && !running && !cell ? this.bandList.find((b) => b.execution_count === n) : undefined;
    if (!cell && !running && !bare) {
      this.hideTooltip();
      return;
    }
    const lines = cell
      ? tooltipLines(cell, this.mode, this.deviceChoice)
      : bare
        ? [`[${n}]  ${formatDuration(bare.duration)}  ${bare.outcome === "ok" ? "" : bare.outcome}`.trimEnd(), "an older cell: click to load its record"]
        : [`[${n}]  running`, `started ${formatClock(running?.min ?? 0)}, ${formatDuration((running?.max ?? 0) - (running?.min ?? 0))} so far`];
    this.showTooltip(lines, cell ? outcome(cell) : bare ? bare.outcome : "running", e);
  }

  private hideTooltip(): void {
    this.tooltip.hidden = true;
  }

  // -------------------------------------------------------------------------------------------
  // legends: values under the cursor while hovering a plot, the newest values otherwise

  private onPlotCursor(u: uPlot): void {
    const left = u.cursor.left ?? -1;
    const x = left >= 0 ? u.posToVal(left, "x") : null;
    if (x === this.hoverX) return;
    this.hoverX = x;
    this.updateLegends();
  }

  private updateLegends(): void {
    const { n, t, values } = this.timeline;
    const idx = this.hoverX === null ? n - 1 : nearestIndex(t, this.hoverX);
    for (const panel of this.panels) {
      panel.columns.forEach((name, i) => {
        const col = values.get(name);
        const label = panel.legendValues[i];
        if (label) label.textContent = formatBytes(col && idx >= 0 ? (col[idx] as number) : NaN);
      });
    }
    if (this.hoverX === null) {
      this.hoverText.textContent = this.follow ? "live" : "";
      this.hoverText.dataset["live"] = String(this.follow); // hidden when no kernel feeds the widget
    } else {
      const cell = this.cellAt(this.hoverX);
      delete this.hoverText.dataset["live"];
      this.hoverText.textContent = formatClock(this.hoverX) + (cell ? ` \u00b7 in [${cell.execution_count}]` : "");
    }
  }
}

const MAX_STRIP_BANDS = 400;

/** The y axis top: the data with headroom, rounded to a tick; the capacity once data nears it. */
export function yTop(dataMax: number, capacity: number | null): number {
  if (capacity !== null && capacity > 0 && dataMax >= 0.6 * capacity) return Math.max(capacity * 1.04, dataMax);
  return niceCeiling(Math.max(dataMax * 1.1, 1024 ** 2));
}

/**
 * uPlot paths for one series of an envelope: a line through the maxima (uPlot's data) and a
 * band from them down to the minima, both a few vertices per pixel column, gaps left open.
 */
const DOT_RADIUS = 2.5;

function envelopePaths(lows: (seriesIdx: number) => (number | null)[] | undefined): uPlot.Series.PathBuilder {
  return (u, seriesIdx, idx0, idx1) => {
    const xs = u.data[0];
    const highs = u.data[seriesIdx] as (number | null)[] | undefined;
    const low = lows(seriesIdx) ?? highs;
    const stroke = new Path2D();
    const band = new Path2D();
    let hasBand = false;
    let runStart = -1;
    const px = (v: number): number => u.valToPos(v, "x", true);
    const py = (v: number): number => u.valToPos(v, "y", true);
    const closeRun = (end: number): void => {
      if (runStart < 0 || !low || !highs) return;
      if (end === runStart) {
        // A lone sample (the very first one, or one between gaps) has no line to draw: a dot.
        const x = px(xs[end] as number);
        const y = py(highs[end] as number);
        stroke.moveTo(x + DOT_RADIUS, y);
        stroke.arc(x, y, DOT_RADIUS, 0, 2 * Math.PI);
      }
      let differs = false;
      for (let i = runStart; i <= end && !differs; i++) differs = low[i] !== highs[i];
      if (differs) {
        hasBand = true;
        band.moveTo(px(xs[runStart] as number), py(highs[runStart] as number));
        for (let i = runStart + 1; i <= end; i++) band.lineTo(px(xs[i] as number), py(highs[i] as number));
        for (let i = end; i >= runStart; i--) band.lineTo(px(xs[i] as number), py(low[i] as number));
        band.closePath();
      }
      runStart = -1;
    };
    if (highs) {
      for (let i = idx0; i <= idx1; i++) {
        const v = highs[i];
        if (v == null) {
          closeRun(i - 1);
          continue;
        }
        const x = px(xs[i] as number);
        if (runStart < 0) {
          runStart = i;
          stroke.moveTo(x, py(v));
        } else {
          stroke.lineTo(x, py(v));
        }
      }
      closeRun(idx1);
    }
    return { stroke, fill: hasBand ? band : null, flags: 0 };
  };
}

/** A translucent fill from a hex or rgb() colour (a neutral grey for anything else). */
export function withAlpha(color: string, alpha: number): string {
  const c = color.trim();
  let rgb: number[] | null = null;
  const hex = /^#([0-9a-f]{3}|[0-9a-f]{6})$/i.exec(c)?.[1];
  if (hex) {
    const full = hex.length === 3 ? [...hex].map((h) => h + h).join("") : hex;
    const v = parseInt(full, 16);
    rgb = [(v >> 16) & 255, (v >> 8) & 255, v & 255];
  } else {
    const m = /^rgba?\(\s*([\d.]+)[\s,]+([\d.]+)[\s,]+([\d.]+)/i.exec(c);
    if (m) rgb = [Number(m[1]), Number(m[2]), Number(m[3])];
  }
  const [r, g, b] = rgb ?? [128, 128, 128];
  return `rgba(${r}, ${g}, ${b}, ${alpha})`;
}

let measurer: CanvasRenderingContext2D | null = null;
const EDGE_MARGIN = 3; // CSS px kept clear of text at the canvas's left and right edges

/** The x axis's labels, blank where one centred on its tick would run past the canvas's edge
 * (uPlot would draw it cut off, "05:50:0"); its grid line stays. */
export function fitLabels(u: uPlot, splits: readonly number[], labels: readonly string[], font: string): string[] {
  measurer ??= document.createElement("canvas").getContext("2d");
  if (measurer === null) return [...labels];
  measurer.font = font;
  const plotLeft = u.bbox.left / uPlot.pxRatio;
  return labels.map((text, i) => {
    const x = plotLeft + u.valToPos(splits[i] ?? NaN, "x");
    const half = measurer === null ? 0 : measurer.measureText(text).width / 2;
    // A margin of a few pixels: the canvas's text runs slightly wider than measured here.
    return x - half < EDGE_MARGIN || x + half > u.width - EDGE_MARGIN ? "" : text;
  });
}

function div(className: string): HTMLDivElement {
  const el = document.createElement("div");
  el.className = className;
  return el;
}

function button(label: string, onClick: () => void): HTMLButtonElement {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  b.addEventListener("click", onClick);
  return b;
}
