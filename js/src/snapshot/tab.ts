// The "Snapshot" tab: a drill-down into the session's current PyTorch memory snapshot, drawn from
// the `drilldown` (overview) and `drilldown_alive` (one instant) traits. The kernel computed every
// figure at screen size; a click on the chart or on a cell asks it what was alive at that time
// ({type: "alive_at", t, device}). Each answer comes with the allocator's segment map at that
// instant, drawn in a "Segments" sub-tab by segments.ts. All text goes in through textContent.

import "./snapshot.css";
import { drawCompare, StackedChart, seriesColor, type Pick } from "./drilldown_chart";
import { parseAlive, parseCompare, parseDrilldown, parseRangeView, parseSearch, type Alive, type Band, type CellSlice, type Compare, type DeviceOverview, type DrilldownState, type ModulesStacked, type Overview, type RangeView, type SearchAnswer, type Series, type Stacked, type TreeNode } from "../wire/drilldown";
import { PHASES, type ModuleNode, type ModuleTree } from "../wire/module_tree";
import { formatBytes, formatDelta, formatDuration } from "../common/format";
import { ProtocolError } from "../wire/json";
import { sendToKernel } from "../wire/messages";
import { parseStatus, type BrowserMessage, type Status, type Traits } from "../wire/protocol";
import type { Tab, TabHost } from "../common/mount";
import { renderSegmentMap } from "./segments";
import { isFigure, setFigures } from "./text";

type Mode = Status["mode"];
type Stacking = "sites" | "categories" | "modules";
type AxisKind = "event" | "time";
type Asked = "peak" | "column" | "step" | "cell";
type AliveTab = "allocations" | "modules" | "segments";
const ALIVE_TABS: [AliveTab, string][] = [
  ["allocations", "Call tree and largest"],
  ["modules", "By module"],
  ["segments", "Segments"],
];
const SERIES_A = "#4e79a7";
const SERIES_B = "#e15759";
const OPEN_DEPTH = 2; // tree levels open at first
const TREE_ROWS = 200; // rows drawn before "show more"

function el<K extends keyof HTMLElementTagNameMap>(tag: K, className: string, text?: string): HTMLElementTagNameMap[K] {
  const e = document.createElement(tag);
  e.className = className;
  if (text !== undefined) e.textContent = text;
  return e;
}

function table(className: string, headers: string[]): { table: HTMLTableElement; body: HTMLTableSectionElement } {
  const t = el("table", `gpumem-drilldown-table ${className}`);
  const head = t.createTHead().insertRow();
  for (const h of headers) head.append(el("th", "", h));
  return { table: t, body: t.createTBody() };
}

function row(body: HTMLTableSectionElement, cells: string[]): HTMLTableRowElement {
  const r = body.insertRow();
  for (const c of cells) {
    const cell = r.insertCell();
    cell.textContent = c;
    if (isFigure(c)) cell.className = "gpumem-figure";
  }
  return r;
}

export class DrilldownPanel {
  readonly el: HTMLElement;
  private readonly summary = el("div", "gpumem-drilldown-summary");
  private readonly controls = el("div", "gpumem-drilldown-controls");
  private readonly chart: StackedChart;
  private readonly legend = el("div", "gpumem-drilldown-legend");
  // The peak in one line, under the chart while it is stacked by module.
  private readonly reading = el("p", "gpumem-drilldown-reading");
  private readonly warnings = el("ul", "gpumem-drilldown-warnings");
  private readonly found = el("section", "gpumem-drilldown-search");
  private readonly compare = el("section", "gpumem-drilldown-compare");
  private readonly alive = el("section", "gpumem-drilldown-alive");
  private readonly cells = el("section", "gpumem-drilldown-cells");
  private readonly categories = el("section", "gpumem-drilldown-categories");
  private readonly message = el("p", "gpumem-drilldown-empty", "No snapshot loaded");
  private readonly progress = el("progress", "gpumem-drilldown-progress");
  // Which stage of a progressive load is drawn, while the next is computed (empty once complete).
  private readonly stage = el("p", "gpumem-drilldown-stage-line");
  private overview: Overview | null = null;
  private device = 0;
  private stacking: Stacking = "sites";
  private axis: AxisKind = "event";
  private range: RangeView | null = null; // the kernel's answer for a zoom or the time axis
  private wanted: { id: number; axis: AxisKind; zoom: [number, number] | null } | null = null;
  private nextId = 1;
  private asked: Asked = "peak";
  private lastAlive: Alive | null = null;
  private search: SearchAnswer = { kind: "none" };
  private query = "";
  private requested: string | null = null; // the pending snapshot already asked for
  private aliveTab: AliveTab = "allocations"; // kept across answers: a new click stays on it
  private disposeSegments: (() => void) | null = null;

  // No kernel behind the widget (saved state, or gone): what asks it is off, the rest works.
  private offline = false;
  private readonly offlineNote = el("p", "gpumem-drilldown-offline", "No kernel behind this widget: the chart is its saved state. Another axis, a zoom, a search and what was alive at a click need a live session.");

  constructor(private readonly sendToKernel: (msg: BrowserMessage) => void) {
    this.el = el("div", "gpumem-drilldown-body");
    this.chart = new StackedChart(
      (p) => this.pickColumn(p),
      (r) => this.zoom(r),
    );
    this.offlineNote.hidden = true;
    this.el.append(this.message, this.progress, this.summary, this.warnings, this.controls, this.offlineNote, this.stage, this.chart.el, this.reading, this.legend, this.found, this.alive, this.cells, this.categories, this.compare);
    this.compare.hidden = true;
    this.showBody(false);
  }

  private send(msg: BrowserMessage): void {
    if (!this.offline) this.sendToKernel(msg);
  }

  /** Whether a kernel answers: without one, the controls that ask it are off and say why. */
  setOffline(offline: boolean): void {
    if (offline === this.offline) return;
    this.offline = offline;
    this.el.dataset["offline"] = String(offline);
    this.offlineNote.hidden = !offline;
    this.chart.setInteractive(!offline);
    if (this.overview) this.drawControls(this.overview);
    if (this.lastAlive) this.setAlive(this.lastAlive);
  }

  private showBody(visible: boolean): void {
    for (const part of [this.summary, this.warnings, this.controls, this.chart.el, this.reading, this.legend, this.found, this.alive, this.cells, this.categories]) part.hidden = !visible;
    this.message.hidden = visible;
    this.progress.hidden = true;
    this.message.after(this.progress); // back under the message, from the stage line
    this.stage.hidden = true;
    this.stage.textContent = "";
  }

  /** A later stage of the load drawn now is under way: the chart stays, this line says so. */
  private showStage(text: string, fraction: number | null | undefined): void {
    this.stage.hidden = !text;
    this.stage.textContent = text;
    this.stage.dataset["busy"] = String(fraction !== undefined);
    if (fraction === undefined) return;
    this.stage.append(this.progress);
    this.progress.hidden = false;
    if (fraction === null) this.progress.removeAttribute("value");
    else this.progress.value = fraction;
  }

  /** A stage of a progressive load is drawn (the first views): the next ones replace it in place. */
  private get drawingStages(): boolean {
    return this.overview?.partial === true;
  }

  private current(): DeviceOverview | undefined {
    return this.overview?.devices.find((d) => d.device === this.device) ?? this.overview?.devices[0];
  }

  setOverview(state: DrilldownState, mode: Mode = "cuda"): void {
    if (state.kind === "empty") {
      this.overview = null;
      this.message.textContent = emptySnapshotText(mode);
      this.showBody(false);
      return;
    }
    if (state.kind === "loading") {
      // The kernel's child process converts the file; the bar follows it (no fraction: busy).
      const { source, stage, fraction } = state.loading;
      if (this.drawingStages) {
        this.showStage(`${this.stageDrawn()}; ${stage}${fraction === null ? "" : ` ${Math.round(fraction * 100)}%`}\u2026`, fraction);
        return;
      }
      this.overview = null;
      this.showBody(false);
      this.message.textContent = `Opening ${source}: ${stage}${fraction === null ? "" : ` ${Math.round(fraction * 100)}%`}\u2026`;
      this.progress.hidden = false;
      if (fraction === null) this.progress.removeAttribute("value");
      else this.progress.value = fraction;
      return;
    }
    if (state.kind === "pending") {
      if (this.drawingStages) this.showStage(`${this.stageDrawn()}; computing the rest\u2026`, null);
      else {
        this.overview = null;
        this.message.textContent = `Computing the snapshot (${state.source})\u2026`;
        this.showBody(false);
      }
      if (this.requested !== state.source && !this.offline) {
        this.requested = state.source;
        this.send({ type: "load" }); // the kernel answers once no cell runs
      }
      return;
    }
    this.overview = state.overview;
    this.range = null;
    this.wanted = null;
    this.axis = "event";
    this.search = { kind: "none" };
    if (!state.overview.devices.some((d) => d.device === this.device)) this.device = state.overview.devices[0]?.device ?? 0;
    this.showBody(true);
    this.drawOverview();
    if (state.overview.partial) this.showStage(`${this.stageDrawn()}; computing the rest\u2026`, null);
  }

  /** The stage drawn now, in words. */
  private stageDrawn(): string {
    const o = this.overview;
    if (!o) return "";
    if (o.preview) return "Drawn so far: every allocation as one series (by site once the stacks are read)";
    return o.partial ? "Drawn so far: active memory by site (categories, reserved and cells follow)" : "";
  }

  showError(message: string): void {
    this.message.textContent = `Snapshot view unavailable: ${message}`;
    this.message.hidden = false;
  }

  private drawOverview(): void {
    const o = this.overview;
    const d = this.current();
    if (!o || !d) return;
    const s = d.sites;
    const parts = [
      o.source,
      `cuda:${d.device}`,
      `peak ${formatBytes(s.peak.bytes)} active`,
      `${formatBytes(d.reserved?.peakReserved ?? s.peakReserved)} reserved${d.reserved ? ` (up to ${formatBytes(d.reserved.largestGap)} beyond active)` : ""}`,
      `${s.allocations.toLocaleString("en-US")} allocations, ${s.entries.toLocaleString("en-US")} events`,
    ];
    setFigures(this.summary, parts.join(" \u00b7 "));
    this.warnings.replaceChildren(...s.warnings.map((w) => el("li", "gpumem-drilldown-warn", w)));
    this.warnings.hidden = !s.warnings.length;
    this.drawControls(o);
    this.drawChart();
    this.drawSearch();
    this.drawCells(d.cells, o.cellsBy, o.partial);
    this.drawCategories(d, o.partial);
  }

  /** The views drawn now: the kernel's range answer when it matches the device, else the
   * overview pushed ahead (event order, whole trace). */
  private shown(): { sites: Stacked; categories: Stacked; modules: ModulesStacked | null; bands: Band[] } | null {
    const d = this.current();
    if (!d) return null;
    const r = this.range;
    if (r && r.device === d.device && r.axis === this.axis) return r;
    return { sites: d.sites, categories: d.categories ?? d.sites, modules: d.modules, bands: d.bands };
  }

  private button(label: string, className: string, pressed: boolean | null, onClick: () => void): HTMLButtonElement {
    const b = el("button", className, label);
    b.type = "button";
    if (pressed !== null) b.setAttribute("aria-pressed", String(pressed));
    b.addEventListener("click", onClick);
    return b;
  }

  private drawControls(o: Overview): void {
    this.controls.replaceChildren();
    if (o.devices.length > 1) {
      const select = el("select", "gpumem-drilldown-device");
      select.setAttribute("aria-label", "Device");
      for (const d of o.devices) {
        const opt = el("option", "", `cuda:${d.device}`);
        opt.value = String(d.device);
        opt.selected = d.device === this.device;
        select.append(opt);
      }
      select.addEventListener("change", () => {
        this.device = Number(select.value);
        this.range = null;
        this.axis = "event";
        this.drawOverview();
        const peak = this.current()?.sites.peak.event;
        if (peak !== undefined) this.ask(peak, "peak");
      });
      this.controls.append(select);
    }
    const group = (className: string, buttons: HTMLButtonElement[]): HTMLElement => {
      const g = el("div", `gpumem-drilldown-group ${className}`);
      g.setAttribute("role", "group");
      g.append(...buttons);
      return g;
    };
    const hasTime = this.current()?.sites.time?.some((t) => Number.isFinite(t)) ?? false;
    const axes: [AxisKind, string][] = [
      ["event", "Event order"],
      ["time", "Wall-clock"],
    ];
    const axisButtons = axes.map(([axis, label]) => {
      const b = this.button(label, "gpumem-drilldown-axis", axis === this.axis, () => this.setAxis(axis));
      b.dataset["axis"] = axis;
      if (axis === "time" && this.offline) {
        b.disabled = true;
        b.title = "Needs a live session";
      } else if (axis === "time" && !hasTime) {
        b.disabled = true;
        b.title = "This snapshot has no times";
      }
      return b;
    });
    const stackings: [Stacking, string][] = [
      ["sites", "By allocation site"],
      ["categories", "By category"],
      ["modules", "By module"],
    ];
    const modules = this.current()?.modules ?? null;
    const modeButtons = stackings.map(([mode, label]) => {
      const b = this.button(label, "gpumem-drilldown-mode", mode === this.stacking, () => {
        this.stacking = mode;
        this.drawControls(o);
        this.drawChart();
      });
      b.dataset["mode"] = mode;
      if (mode === "categories" && o.partial) b.disabled = true; // still being computed
      if (mode === "modules") {
        const why = o.partial ? "Still being computed" : !modules ? "This kernel computes no module view" : modulesEmpty(modules) ? (modules.reason ?? "No allocation carries a module") : null;
        if (why !== null) {
          b.disabled = true;
          b.title = why;
          b.dataset["why"] = why;
        } else if (!modules?.traced && modules?.reason) b.title = `${modules.reason}; other tools' tags as they are`;
      }
      return b;
    });
    const reset = this.button("Whole snapshot", "gpumem-drilldown-reset", null, () => this.request(this.axis, null));
    const form = el("form", "gpumem-drilldown-find");
    const input = el("input", "gpumem-drilldown-query");
    input.type = "search";
    input.placeholder = "frame text or 0x address";
    input.setAttribute("aria-label", "Search allocations by frame text or address");
    input.value = this.query;
    const go = el("button", "gpumem-drilldown-go", "Search");
    go.type = "submit";
    input.disabled = go.disabled = this.offline;
    form.append(input, go);
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      this.query = input.value.trim();
      if (!this.query) {
        this.search = { kind: "none" };
        this.drawSearch();
        return;
      }
      const v = this.shown()?.sites;
      this.send({ type: "search", device: this.current()?.device ?? this.device, query: this.query, axis: this.axis, t0: v?.t0 ?? null, t1: v?.t1 ?? null });
    });
    this.controls.append(group("gpumem-drilldown-axes", axisButtons), group("gpumem-drilldown-modes", modeButtons), reset, form);
  }

  private setAxis(axis: AxisKind): void {
    if (axis === this.axis && !this.wanted) return;
    this.axis = axis;
    if (this.overview) this.drawControls(this.overview);
    if (axis === "event") {
      this.range = null;
      this.drawChart();
    } else this.request("time", null);
  }

  /** Ask the kernel for `axis` over `zoom` (null: the whole trace) at this chart's width. */
  private request(axis: AxisKind, zoom: [number, number] | null): void {
    if (axis === "event" && zoom === null) {
      this.wanted = null;
      this.range = null;
      this.drawChart();
      return;
    }
    if (this.offline) return; // nothing would answer
    const id = this.nextId++;
    this.wanted = { id, axis, zoom };
    this.el.dataset["pending"] = String(id);
    const width = Math.max(100, Math.round(this.chart.el.clientWidth || 1000) - 76);
    this.send({ type: "view", id, device: this.current()?.device ?? this.device, axis, t0: zoom?.[0] ?? null, t1: zoom?.[1] ?? null, width });
  }

  private zoom(range: [number, number]): void {
    this.request(this.axis, range);
  }

  setRange(view: RangeView | null): void {
    if (!view || !this.wanted || view.id !== this.wanted.id) return; // an older answer
    this.wanted = null;
    delete this.el.dataset["pending"];
    this.range = view;
    this.axis = view.axis;
    if (this.overview) this.drawControls(this.overview);
    this.drawChart();
    if (this.query && this.search.kind === "ready") this.send({ type: "search", device: view.device, query: this.query, axis: view.axis, t0: view.sites.t0, t1: view.sites.t1 });
  }

  private drawChart(): void {
    const shown = this.shown();
    if (!shown) return;
    const byModule = this.stacking === "modules" && shown.modules !== null && !modulesEmpty(shown.modules) ? shown.modules : null;
    const view = byModule ?? (this.stacking === "categories" ? shown.categories : shown.sites);
    this.reading.hidden = !byModule?.reading;
    this.reading.textContent = byModule?.reading ?? "";
    const search = this.search.kind === "ready" && this.search.axis === shown.sites.axis && this.search.t.length === shown.sites.t.length && this.search.t[0] === shown.sites.t[0] ? { t: this.search.t, values: this.search.matched } : null;
    this.drawLegend(view.series.filter((s) => s.peak > 0), view); // first: the chart sizes itself after it
    this.chart.set(view, shown.sites, shown.bands, this.lastAlive ? { search, marker: this.markerOf(this.lastAlive) } : { search });
  }

  private drawLegend(series: Series[], view: Stacked): void {
    this.legend.replaceChildren();
    for (const s of series) {
      const item = el("div", "gpumem-drilldown-legend-item");
      item.dataset["site"] = s.label;
      item.dataset["peakBytes"] = String(s.peak);
      item.title = s.summed ? `${s.detail}: their highest sum on screen` : `${s.detail}: its highest at any one instant, exactly, from the replay`;
      const swatch = el("span", "gpumem-drilldown-swatch");
      swatch.style.background = seriesColor(s.column, view.series.indexOf(s));
      item.append(swatch, el("span", "gpumem-drilldown-label", s.label), el("span", "gpumem-drilldown-bytes", `${s.summed ? "up to" : "peak"} ${formatBytes(s.peak)}`));
      this.legend.append(item);
    }
    const d = this.current();
    const item = el("div", "gpumem-drilldown-legend-item gpumem-drilldown-legend-reserved");
    item.title = "What the caching allocator holds from CUDA (segments), in use or cached; the band is each column's range";
    item.dataset["peakBytes"] = String(d?.reserved?.peakReserved ?? view.peakReserved);
    item.append(el("span", "gpumem-drilldown-swatch gpumem-drilldown-swatch-reserved"), el("span", "gpumem-drilldown-label", "reserved (cached segments)"), el("span", "gpumem-drilldown-bytes", `peak ${formatBytes(d?.reserved?.peakReserved ?? view.peakReserved)}`));
    this.legend.append(item);
  }

  setSearch(answer: SearchAnswer): void {
    this.search = answer;
    this.drawSearch();
    this.drawChart();
  }

  private drawSearch(): void {
    const a = this.search;
    this.found.replaceChildren();
    this.found.hidden = a.kind === "none";
    if (a.kind === "none") return;
    if (a.kind === "error") {
      this.found.append(el("p", "gpumem-drilldown-warn", `Search ${JSON.stringify(a.query)}: ${a.message}`));
      return;
    }
    const by = a.by === "address" ? "whose bytes cover" : "with a frame containing";
    this.found.append(el("h4", "gpumem-drilldown-heading", `${a.matches.toLocaleString("en-US")} allocations ${by} ${JSON.stringify(a.query)}: at most ${formatBytes(a.peakBytes)} alive at once (the line on the chart), ${formatBytes(a.bytesAllocated)} allocated in all`));
    if (!a.allocations.length) return;
    const t = table("gpumem-drilldown-found", ["size", "address", "site", "entries"]);
    for (const m of a.allocations.slice(0, 10)) {
      const r = row(t.body, [formatBytes(m.size), `0x${m.addr.toString(16)}`, m.site, `${m.startEvent < 0 ? "before" : m.startEvent}\u2013${m.endEvent}`]);
      r.title = m.stack.join("\n");
      if (m.startEvent >= 0) {
        r.classList.add("gpumem-drilldown-clickable");
        r.addEventListener("click", () => this.ask(m.startEvent, "step"));
      }
    }
    this.found.append(t.table);
  }

  private pickColumn(p: Pick): void {
    this.ask(p.event, "column");
  }

  private ask(event: number, why: Asked): void {
    this.asked = why;
    this.send({ type: "alive_at", event, device: this.current()?.device ?? this.device, id: this.nextId++ });
  }

  private pick(t: number): void {
    this.asked = "cell";
    this.send({ type: "alive_at", t, device: this.current()?.device ?? this.device, id: this.nextId++ });
  }

  private markerOf(alive: Alive): number | null {
    if (!alive.x) return alive.t;
    return this.axis === "event" ? alive.x.event : alive.x.time;
  }

  setAlive(alive: Alive): void {
    this.lastAlive = alive;
    this.chart.setMarker(this.markerOf(alive));
    this.alive.replaceChildren();
    const s = this.current()?.sites;
    const at = alive.event < 0 ? "before the first event" : `entry ${alive.event.toLocaleString("en-US")}` + (alive.t !== null && s?.unit === "s" ? ` (+${formatDuration(alive.t - (s.time?.find((v) => Number.isFinite(v)) ?? alive.t))})` : "");
    const lead = { column: "Peak within this column at", peak: "At the peak,", step: "At", cell: "At" }[this.asked];
    const heading = el("h4", "gpumem-drilldown-heading gpumem-drilldown-alive-heading");
    setFigures(heading, `${lead} ${at} on cuda:${alive.device}: ${formatBytes(alive.total)} active in ${alive.count.toLocaleString("en-US")} allocations (reserved ${formatBytes(alive.reserved)})`);
    heading.dataset["totalBytes"] = String(alive.total);
    heading.dataset["event"] = String(alive.event);
    const steps = el("div", "gpumem-drilldown-steps");
    const last = (s?.entries ?? 0) - 1;
    const prev = this.button("\u25c2 previous event", "gpumem-drilldown-step", null, () => this.ask(alive.event - 1, "step"));
    prev.dataset["step"] = "-1";
    prev.disabled = alive.event < 0 || this.offline;
    const next = this.button("next event \u25b8", "gpumem-drilldown-step", null, () => this.ask(alive.event + 1, "step"));
    next.dataset["step"] = "1";
    next.disabled = alive.event >= last || this.offline;
    const e = alive.entry;
    const what = e ? `entry ${alive.event.toLocaleString("en-US")}: ${e.action.replace(/_/g, " ")} ${formatBytes(e.size)}${e.action === "oom" ? "" : ` at 0x${e.addr.toString(16)}`}${e.site ? ` (${e.site})` : ""}` : "before the first entry";
    steps.append(prev, next, el("span", "gpumem-drilldown-entry", what));
    this.alive.append(heading, steps);
    const tree = el("div", "gpumem-alive-tree");
    tree.setAttribute("role", "tree");
    this.renderNode(tree, alive.root, alive.root.bytes, { left: TREE_ROWS });
    // Tags are per thread: where none was recorded the column goes; where some lack one, why.
    const tagged = alive.largest.some((a) => a.tag !== "");
    const largest = table("gpumem-drilldown-largest", tagged ? ["size", "site", "tag"] : ["size", "site"]);
    for (const a of alive.largest) {
      const r = row(largest.body, [formatBytes(a.size), a.site]);
      r.dataset["site"] = a.site;
      r.title = a.stack.join("\n");
      if (!tagged) continue;
      const cell = r.insertCell();
      if (a.tag) {
        cell.textContent = a.tag;
        continue;
      }
      const why = untagged(a.stack);
      cell.className = "gpumem-drilldown-untagged";
      cell.textContent = why.short;
      cell.title = why.long;
    }
    this.aliveTabs(alive, [tree, el("h4", "gpumem-drilldown-heading", "Largest allocations"), largest.table]);
  }

  setCompare(c: Compare | null): void {
    this.compare.replaceChildren();
    this.compare.hidden = c === null;
    if (!c) return;
    const [la, lb] = c.labels;
    this.compare.append(el("h4", "gpumem-drilldown-heading", `Compare: ${la} (A) \u2192 ${lb} (B)`));
    const facts = el("p", "gpumem-drilldown-compare-facts", `peak active ${formatBytes(c.a.peakBytes)} \u2192 ${formatBytes(c.b.peakBytes)} (${formatDelta(c.peakDelta)}); peak reserved ${formatBytes(c.a.peakReserved)} \u2192 ${formatBytes(c.b.peakReserved)}; ${c.a.entries.toLocaleString("en-US")} vs ${c.b.entries.toLocaleString("en-US")} events`);
    facts.dataset["peakDelta"] = String(c.peakDelta);
    const legend = el("div", "gpumem-drilldown-legend");
    const colors = [SERIES_A, SERIES_B];
    c.labels.forEach((label, i) => {
      const item = el("div", "gpumem-drilldown-legend-item");
      const sw = el("span", "gpumem-drilldown-swatch");
      sw.style.background = colors[i] as string;
      item.append(sw, el("span", "gpumem-drilldown-label", `${i ? "B" : "A"}: ${label}`), el("span", "gpumem-drilldown-bytes", i ? "narrow line: active solid, reserved dashed" : "wide line: active solid, reserved dashed"));
      legend.append(item);
    });
    const canvas = el("canvas", "gpumem-drilldown-compare-chart");
    const host = el("div", "gpumem-drilldown-chart");
    host.append(canvas);
    const axis = el("p", "gpumem-drilldown-readout", c.unit === "entry" ? "x: entry number from each trace's start (event order)" : "x: seconds since each trace's first entry");
    const sites = table("gpumem-drilldown-compare-sites", ["site, at each peak", "A", "B", "B \u2212 A"]);
    for (const r of c.bySite) row(sites.body, [r.label, formatBytes(r.a), formatBytes(r.b), formatDelta(r.delta)]).dataset["delta"] = String(r.delta);
    const cats = table("gpumem-drilldown-compare-categories", ["category, at each peak", "A", "B", "B \u2212 A"]);
    for (const r of c.byCategory) row(cats.body, [r.label.replace(/_/g, " "), formatBytes(r.a), formatBytes(r.b), formatDelta(r.delta)]).dataset["delta"] = String(r.delta);
    this.compare.append(facts, legend, host, axis, sites.table, cats.table);
    const draw = (): void => {
      host.dataset["yMax"] = String(
        drawCompare(canvas, host, {
          t: c.t,
          t0: c.t0,
          t1: c.t1,
          lines: [
            // A wide under B narrow: where the two coincide, both still show.
            { values: c.aActive, color: SERIES_A, dash: [], width: 4 },
            { values: c.aReserved, color: SERIES_A, dash: [8, 4], width: 4 },
            { values: c.bActive, color: SERIES_B, dash: [], width: 1.5 },
            { values: c.bReserved, color: SERIES_B, dash: [3, 3], width: 1.5 },
          ],
        }),
      );
    };
    this.redrawCompare = draw;
    requestAnimationFrame(draw);
  }

  private redrawCompare: (() => void) | null = null;

  /** What is alive (tree and largest) and the segment map at the same instant, as sub-tabs; the
   * map is drawn when its tab shows. */
  private aliveTabs(alive: Alive, allocations: HTMLElement[]): void {
    this.disposeSegments?.();
    this.disposeSegments = null;
    const panes: Record<AliveTab, HTMLElement> = {
      allocations: el("div", "gpumem-drilldown-pane"),
      modules: el("div", "gpumem-drilldown-pane gpumem-drilldown-modules"),
      segments: el("div", "gpumem-drilldown-pane gpumem-drilldown-segments"),
    };
    panes.allocations.append(...allocations);
    if (alive.modules) renderModuleTree(panes.modules, alive.modules);
    const nav = el("nav", "gpumem-tabs gpumem-drilldown-subtabs");
    nav.setAttribute("role", "tablist");
    const buttons = ALIVE_TABS.map(([tab, label]) => {
      const b = el("button", "", label);
      b.type = "button";
      b.setAttribute("role", "tab");
      b.dataset["tab"] = tab;
      b.addEventListener("click", () => {
        this.aliveTab = tab;
        show(tab);
      });
      return b;
    });
    const byModule = buttons[1] as HTMLButtonElement;
    const noModules = !alive.modules?.traced && !alive.modules?.root.children.some((c) => c.label !== "untagged" && c.label !== "before recording" && c.label !== "(no module)");
    if (noModules) {
      byModule.disabled = true;
      byModule.title = alive.modules ? "No allocation carries a module: recorded without the module tracer (%gpumem modules on)" : "This kernel computes no module tree";
    }
    const segments = buttons[2] as HTMLButtonElement;
    if (alive.segments === null) {
      segments.disabled = true;
      segments.title = alive.segmentsPending ? "The segment map at this instant: computing\u2026" : "No segment map for this instant";
    }
    const show = (tab: AliveTab): void => {
      const shown: AliveTab = (tab === "segments" && alive.segments === null) || (tab === "modules" && noModules) ? "allocations" : tab;
      for (const b of buttons) b.setAttribute("aria-selected", String(b.dataset["tab"] === shown));
      panes.allocations.hidden = shown !== "allocations";
      panes.modules.hidden = shown !== "modules";
      panes.segments.hidden = shown !== "segments";
      if (shown === "segments" && !this.disposeSegments) this.disposeSegments = renderSegmentMap(panes.segments, alive.segments);
    };
    nav.append(...buttons);
    this.alive.append(nav, panes.allocations, panes.modules, panes.segments);
    show(this.aliveTab);
  }

  dispose(): void {
    this.disposeSegments?.();
    this.disposeSegments = null;
    this.el.remove();
  }

  /** One tree row, then its children while open; `budget.left` caps the rows drawn. */
  private renderNode(parent: HTMLElement, node: TreeNode, total: number, budget: { left: number }): void {
    if (budget.left-- <= 0) return;
    const item = el("div", "gpumem-alive-node");
    item.setAttribute("role", "treeitem");
    item.dataset["site"] = node.label;
    const line = el("div", "gpumem-alive-row");
    line.style.paddingLeft = `${node.depth * 14}px`;
    const open = node.depth < OPEN_DEPTH;
    const toggle = el("span", "gpumem-alive-toggle", node.children.length ? (open ? "\u25be" : "\u25b8") : "\u00a0");
    const share = total > 0 ? ` (${((node.bytes / total) * 100).toFixed(1)}%)` : "";
    line.append(
      toggle,
      el("span", "gpumem-alive-label", node.label),
      el("span", "gpumem-alive-bytes", `${formatBytes(node.bytes)}${share}`),
      el("span", "gpumem-alive-count", `${node.count.toLocaleString("en-US")}\u00d7`),
    );
    const kids = el("div", "gpumem-alive-children");
    item.append(line, kids);
    parent.append(item);
    if (!node.children.length) return;
    item.setAttribute("aria-expanded", String(open));
    const fill = (): void => {
      for (const c of node.children) this.renderNode(kids, c, total, budget);
    };
    if (open) fill();
    line.addEventListener("click", () => {
      const expand = item.getAttribute("aria-expanded") !== "true";
      item.setAttribute("aria-expanded", String(expand));
      toggle.textContent = expand ? "\u25be" : "\u25b8";
      if (expand && !kids.hasChildNodes()) {
        budget.left = TREE_ROWS;
        fill();
      }
      kids.hidden = !expand;
    });
  }

  private drawCells(cells: CellSlice[], by: string, partial: boolean): void {
    this.cells.replaceChildren();
    if (partial) {
      this.cells.append(el("h4", "gpumem-drilldown-heading", "Per cell: computing\u2026"));
      return;
    }
    const how = by === "tag" ? "by the cell tags on each allocation" : "by the ledger's cell times";
    this.cells.append(el("h4", "gpumem-drilldown-heading", cells.length ? `Per cell (${how})` : "No cell of the ledger falls within this snapshot"));
    if (!cells.length) return;
    const t = table("gpumem-drilldown-cell-table", ["cell", "allocated", "freed", "peak", "left behind", "largest at the peak"]);
    for (const c of cells) {
      const top = c.top_at_peak[0];
      const r = row(t.body, [
        `[${c.execution_count}]`,
        formatBytes(c.allocated_bytes),
        formatBytes(c.freed_bytes),
        formatBytes(c.peak_bytes),
        formatBytes(c.left_behind_bytes),
        top ? `${top.label} ${formatBytes(top.bytes)}` : "",
      ]);
      r.dataset["cell"] = String(c.execution_count);
      r.title = "Zoom to this cell and show what was alive at its peak";
      r.addEventListener("click", () => {
        const band = this.shown()?.bands.find((b) => b.executionCount === c.execution_count);
        if (band) this.request(this.axis, [band.x0, band.x1]);
        if (c.peak_t !== null) this.pick(c.peak_t);
      });
    }
    this.cells.append(t.table);
  }

  private drawCategories(d: DeviceOverview, partial: boolean): void {
    this.categories.replaceChildren();
    if (partial) {
      this.categories.append(el("h4", "gpumem-drilldown-heading", "By category: computing\u2026"));
      return;
    }
    const shown = d.atPeak.filter((c) => c.bytes > 0);
    this.categories.append(el("h4", "gpumem-drilldown-heading", "At the peak, by category (from each allocation's phase and lifetime)"));
    const t = table("gpumem-drilldown-category-table", ["category", "bytes"]);
    for (const c of shown) row(t.body, [c.label.replace(/_/g, " "), formatBytes(c.bytes)]).dataset["category"] = c.label;
    this.categories.append(t.table);
  }

  redraw(): void {
    this.chart.draw();
    this.redrawCompare?.();
  }
}

/** Whether a module view has nothing to stack by: no module, and no other tool's tags either. */
function modulesEmpty(m: ModulesStacked): boolean {
  return !m.traced && !m.kinds.includes("metadata");
}

/** The module tree at an instant: one row a module (its submodules' bytes included), with its
 * bytes per phase; what no module holds in rows of its own. Every row open to the blocks' level. */
function renderModuleTree(host: HTMLElement, tree: ModuleTree): void {
  const t = table("gpumem-module-tree", ["module", "bytes", ...PHASES, "allocations"]);
  const add = (node: ModuleNode): void => {
    const r = row(t.body, [node.label, formatBytes(node.bytes), ...PHASES.map((p) => (node.phases[p] ? formatBytes(node.phases[p]) : "")), node.count.toLocaleString("en-US")]);
    r.dataset["module"] = node.label;
    r.dataset["bytes"] = String(node.bytes);
    r.dataset["depth"] = String(node.depth);
    const first = r.cells[0];
    if (first) first.style.paddingLeft = `${node.depth * 14 + 4}px`;
    for (const c of node.children) add(c);
  };
  add(tree.root);
  host.append(el("h4", "gpumem-drilldown-heading", `By module at entry ${tree.event.toLocaleString("en-US")} (a module's bytes include its submodules'; by the phase that allocated them)`), t.table);
  if (tree.truncated) host.append(el("p", "gpumem-drilldown-readout", `${tree.truncated.toLocaleString("en-US")} smaller modules not listed (their bytes are in their parents')`));
}

/** Why an allocation in a tagged snapshot has no tag, in a cell's words and a tooltip's. A tag
 * belongs to the thread that set it, so autograd's backward thread (and any other) has none. */
export function untagged(stack: readonly string[]): { short: string; long: string } {
  // Autograd's backward thread runs no Python: its allocations have no Python stack.
  if (stack.length === 0) return { short: "\u2014 (backward thread)", long: "No tag: made with no Python stack, as on autograd's backward thread; tags are per thread, set on the thread that ran the cell" };
  if (stack.some((f) => /backward|autograd/i.test(f))) return { short: "\u2014 (backward thread)", long: "No tag: made under autograd's backward pass; tags are per thread, set on the thread that ran the cell" };
  return { short: "\u2014 (no tag)", long: "No tag: made on a thread that had none set (tags are per thread), or before the first tag" };
}

/** What the empty tab says: how to get a snapshot here (recording one needs CUDA). */
export function emptySnapshotText(mode: Mode): string {
  const open = "gpumem_widget.show_snapshot(path) or `%gpumem show-snapshot PATH`";
  return mode === "host"
    ? `No snapshot loaded. Recording one needs a CUDA device, and this kernel has none (host-memory mode); a snapshot file recorded elsewhere opens here with ${open}.`
    : `No snapshot loaded: run \`%gpumem record on\` then \`%gpumem record off\`, wrap a cell in \`%%gpumem cell\`, or open a file with ${open}.`;
}

/** The tab mounted in `el`: it watches the drilldown traits itself (the host mounts it when first shown). */
export function mountSnapshotTab(el: HTMLElement, host: { model: TabHost["model"]; readonly kernelGone?: boolean }): Tab {
  const { model } = host;
  const panel = new DrilldownPanel((msg) => sendToKernel(model, msg));
  panel.setOffline(host.kernelGone === true);
  el.append(panel.el);
  // The mode only changes what the empty tab says; a status update then redraws nothing else.
  let mode: Mode = parseStatus(model.get("status"), []).mode;
  const overview = (): void => {
    try {
      panel.setOverview(parseDrilldown(model.get("drilldown")), mode);
    } catch (e) {
      if (!(e instanceof ProtocolError)) throw e;
      panel.showError(e.message);
    }
  };
  const alive = (): void => {
    try {
      const state = parseAlive(model.get("drilldown_alive"));
      if (state.kind === "ready") panel.setAlive(state.alive);
      else if (state.kind === "error") panel.showError(state.message);
    } catch (e) {
      if (!(e instanceof ProtocolError)) throw e;
      panel.showError(e.message);
    }
  };
  const guarded =
    <T>(parse: (raw: unknown) => T, apply: (value: T) => void, name: keyof Traits) =>
    (): void => {
      try {
        apply(parse(model.get(name)));
      } catch (e) {
        if (!(e instanceof ProtocolError)) throw e;
        panel.showError(e.message);
      }
    };
  const range = guarded(parseRangeView, (v) => panel.setRange(v), "drilldown_view");
  const search = guarded(parseSearch, (v) => panel.setSearch(v), "drilldown_search");
  const compare = guarded(parseCompare, (v) => panel.setCompare(v), "drilldown_compare");
  const status = (): void => {
    const now = parseStatus(model.get("status"), []).mode;
    if (now === mode) return;
    mode = now;
    const raw: unknown = model.get("drilldown");
    // As parseDrilldown's empty state; a loaded snapshot stays as the user left it.
    if (raw == null || (typeof raw === "object" && Object.keys(raw).length === 0)) overview();
  };
  overview();
  alive();
  compare();
  const listeners: [keyof Traits, () => void][] = [
    ["status", status],
    ["drilldown", overview],
    ["drilldown_alive", alive],
    ["drilldown_view", range],
    ["drilldown_search", search],
    ["drilldown_compare", compare],
  ];
  for (const [name, onChange] of listeners) model.on(`change:${name}`, onChange);
  // Drawn while the tab was hidden, the canvas had no width: draw again once it has one.
  const resize = typeof ResizeObserver === "undefined" ? null : new ResizeObserver(() => panel.redraw());
  resize?.observe(panel.el);
  const dispose = (): void => {
    for (const [name, onChange] of listeners) model.off(`change:${name}`, onChange);
    resize?.disconnect();
    panel.dispose();
  };
  // Every frame: a saved widget taken over by a live session, or a kernel gone, shows at once.
  return { dispose, update: () => panel.setOffline(host.kernelGone === true) };
}
