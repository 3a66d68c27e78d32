// The "Snapshot" tab: a drill-down into the session's current PyTorch memory snapshot, drawn from
// the `drilldown` (overview) and `drilldown_alive` (one instant) traits. The kernel computed every
// figure at screen size; a click on the chart or on a cell asks it what was alive at that time
// ({type: "alive_at", t, device}). Each answer comes with the allocator's segment map at that
// instant, drawn in a "Segments" sub-tab by segments.ts. All text goes in through textContent.

import type { AnyModel } from "@anywidget/types";
import { StackedChart, seriesColor } from "./drilldown_chart";
import { parseAlive, parseDrilldown, type Alive, type CellSlice, type DeviceOverview, type DrilldownState, type Overview, type Series, type TreeNode } from "./drilldown_data";
import { formatBytes, formatDuration } from "./format";
import { ProtocolError } from "./json";
import { renderSegmentMap } from "./segments";

type Stacking = "sites" | "categories";
type AliveTab = "allocations" | "segments";
const ALIVE_TABS: [AliveTab, string][] = [
  ["allocations", "Call tree and largest"],
  ["segments", "Segments"],
];
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
  for (const c of cells) r.insertCell().textContent = c;
  return r;
}

export class DrilldownPanel {
  readonly el: HTMLElement;
  private readonly summary = el("div", "gpumem-drilldown-summary");
  private readonly controls = el("div", "gpumem-drilldown-controls");
  private readonly chart: StackedChart;
  private readonly legend = el("div", "gpumem-drilldown-legend");
  private readonly alive = el("section", "gpumem-drilldown-alive");
  private readonly cells = el("section", "gpumem-drilldown-cells");
  private readonly categories = el("section", "gpumem-drilldown-categories");
  private readonly message = el("p", "gpumem-drilldown-empty", "No snapshot loaded");
  private overview: Overview | null = null;
  private device = 0;
  private stacking: Stacking = "sites";
  private requested: string | null = null; // the pending snapshot already asked for
  private aliveTab: AliveTab = "allocations"; // kept across answers: a new click stays on it
  private disposeSegments: (() => void) | null = null;

  constructor(private readonly send: (msg: Record<string, unknown>) => void) {
    this.el = el("div", "gpumem-drilldown-body");
    this.chart = new StackedChart((t) => this.pick(t));
    this.el.append(this.message, this.summary, this.controls, this.chart.el, this.legend, this.alive, this.cells, this.categories);
    this.showBody(false);
  }

  private showBody(visible: boolean): void {
    for (const part of [this.summary, this.controls, this.chart.el, this.legend, this.alive, this.cells, this.categories]) part.hidden = !visible;
    this.message.hidden = visible;
  }

  private current(): DeviceOverview | undefined {
    return this.overview?.devices.find((d) => d.device === this.device) ?? this.overview?.devices[0];
  }

  setOverview(state: DrilldownState): void {
    if (state.kind === "empty") {
      this.overview = null;
      this.message.textContent = "No snapshot loaded: run `%gpumem record on` then `%gpumem record off`, wrap a cell in `%%gpumem cell`, or call gpumem_widget.show_snapshot(path).";
      this.showBody(false);
      return;
    }
    if (state.kind === "pending") {
      this.overview = null;
      this.message.textContent = `Computing the snapshot (${state.source})\u2026`;
      this.showBody(false);
      if (this.requested !== state.source) {
        this.requested = state.source;
        this.send({ type: "load" }); // the kernel answers once no cell runs
      }
      return;
    }
    this.overview = state.overview;
    if (!state.overview.devices.some((d) => d.device === this.device)) this.device = state.overview.devices[0]?.device ?? 0;
    this.showBody(true);
    this.drawOverview();
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
      ...(d.reserved ? [`${formatBytes(d.reserved.peakReserved)} reserved (up to ${formatBytes(d.reserved.largestGap)} beyond active)`] : []),
      `${s.allocations.toLocaleString("en-US")} allocations, ${s.entries.toLocaleString("en-US")} events`,
    ];
    this.summary.textContent = parts.join(" \u00b7 ");
    if (s.overflowed) this.summary.append(el("span", "gpumem-drilldown-warn", " \u00b7 the ring buffer overflowed: the oldest events are lost"));
    this.drawControls(o);
    this.drawChart();
    this.drawCells(d.cells, o.cellsBy);
    this.drawCategories(d);
  }

  private drawControls(o: Overview): void {
    this.controls.replaceChildren();
    if (o.devices.length > 1) {
      const select = el("select", "gpumem-drilldown-device");
      for (const d of o.devices) {
        const opt = el("option", "", `cuda:${d.device}`);
        opt.value = String(d.device);
        opt.selected = d.device === this.device;
        select.append(opt);
      }
      select.addEventListener("change", () => {
        this.device = Number(select.value);
        this.drawOverview();
        const peak = this.current()?.sites.peak.t;
        if (peak != null) this.pick(peak);
      });
      this.controls.append(select);
    }
    for (const [mode, label] of [
      ["sites", "By allocation site"],
      ["categories", "By category"],
    ] as [Stacking, string][]) {
      const b = el("button", "gpumem-drilldown-mode", label);
      b.type = "button";
      b.dataset["mode"] = mode;
      b.setAttribute("aria-pressed", String(mode === this.stacking));
      b.addEventListener("click", () => {
        this.stacking = mode;
        this.drawControls(o);
        this.drawChart();
      });
      this.controls.append(b);
    }
    const reset = el("button", "gpumem-drilldown-reset", "Whole snapshot");
    reset.type = "button";
    reset.addEventListener("click", () => this.chart.zoom(null));
    this.controls.append(reset);
  }

  private drawChart(): void {
    const d = this.current();
    if (!d) return;
    const view = this.stacking === "sites" ? d.sites : d.categories;
    this.chart.set(view, d.reserved);
    this.drawLegend(view.series.filter((s) => s.peak > 0 || s.column === "other"));
  }

  private drawLegend(series: Series[]): void {
    this.legend.replaceChildren();
    const all = this.stacking === "sites" ? (this.current()?.sites.series ?? []) : (this.current()?.categories.series ?? []);
    for (const s of series) {
      const item = el("div", "gpumem-drilldown-legend-item");
      item.dataset["site"] = s.label;
      item.title = s.detail;
      const swatch = el("span", "gpumem-drilldown-swatch");
      swatch.style.background = seriesColor(s.column, all.indexOf(s));
      item.append(swatch, el("span", "gpumem-drilldown-label", s.label), el("span", "gpumem-drilldown-bytes", `peak ${formatBytes(s.peak)}`));
      this.legend.append(item);
    }
    const reserved = this.current()?.reserved;
    if (reserved) {
      const item = el("div", "gpumem-drilldown-legend-item gpumem-drilldown-legend-reserved");
      item.title = "What the caching allocator holds from CUDA (segments), in use or cached; the band is each column's range";
      item.append(el("span", "gpumem-drilldown-swatch gpumem-drilldown-swatch-reserved"), el("span", "gpumem-drilldown-label", "reserved (cached segments)"), el("span", "gpumem-drilldown-bytes", `peak ${formatBytes(reserved.peakReserved)}`));
      this.legend.append(item);
    }
  }

  private pick(t: number): void {
    this.chart.setMarker(t);
    this.send({ type: "alive_at", t, device: this.current()?.device ?? this.device });
  }

  setAlive(alive: Alive): void {
    this.chart.setMarker(alive.t);
    this.alive.replaceChildren();
    const s = this.current()?.sites;
    const when = alive.t === null ? "before the first event" : s?.unit === "entry" ? `after entry ${alive.t}` : `at +${formatDuration(alive.t - (s?.t0 ?? alive.t))}`;
    this.alive.append(
      el("h4", "gpumem-drilldown-heading", `Alive ${when} on cuda:${alive.device}: ${formatBytes(alive.total)} in ${alive.count.toLocaleString("en-US")} allocations (reserved ${formatBytes(alive.reserved)})`),
    );
    const tree = el("div", "gpumem-alive-tree");
    tree.setAttribute("role", "tree");
    this.renderNode(tree, alive.root, alive.root.bytes, { left: TREE_ROWS });
    const largest = table("gpumem-drilldown-largest", ["size", "site", "tag"]);
    for (const a of alive.largest) {
      const r = row(largest.body, [formatBytes(a.size), a.site, a.tag]);
      r.dataset["site"] = a.site;
      r.title = a.stack.join("\n");
    }
    this.aliveTabs(alive, [tree, el("h4", "gpumem-drilldown-heading", "Largest allocations"), largest.table]);
  }

  /** What is alive (tree and largest) and the segment map at the same instant, as sub-tabs; the
   * map is drawn when its tab shows. */
  private aliveTabs(alive: Alive, allocations: HTMLElement[]): void {
    this.disposeSegments?.();
    this.disposeSegments = null;
    const panes: Record<AliveTab, HTMLElement> = {
      allocations: el("div", "gpumem-drilldown-pane"),
      segments: el("div", "gpumem-drilldown-pane gpumem-drilldown-segments"),
    };
    panes.allocations.append(...allocations);
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
    const segments = buttons[1] as HTMLButtonElement;
    if (alive.segments === null) {
      segments.disabled = true;
      segments.title = "No segment map for this instant";
    }
    const show = (tab: AliveTab): void => {
      const shown: AliveTab = tab === "segments" && alive.segments === null ? "allocations" : tab;
      for (const b of buttons) b.setAttribute("aria-selected", String(b.dataset["tab"] === shown));
      panes.allocations.hidden = shown !== "allocations";
      panes.segments.hidden = shown !== "segments";
      if (shown === "segments" && !this.disposeSegments) this.disposeSegments = renderSegmentMap(panes.segments, alive.segments);
    };
    nav.append(...buttons);
    this.alive.append(nav, panes.allocations, panes.segments);
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

  private drawCells(cells: CellSlice[], by: string): void {
    this.cells.replaceChildren();
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
        this.chart.zoom([c.start, c.end]);
        if (c.peak_t !== null) this.pick(c.peak_t);
      });
    }
    this.cells.append(t.table);
  }

  private drawCategories(d: DeviceOverview): void {
    this.categories.replaceChildren();
    const shown = d.atPeak.filter((c) => c.bytes > 0);
    this.categories.append(el("h4", "gpumem-drilldown-heading", "At the peak, by category (from each allocation's phase and lifetime)"));
    const t = table("gpumem-drilldown-category-table", ["category", "bytes"]);
    for (const c of shown) row(t.body, [c.label.replace(/_/g, " "), formatBytes(c.bytes)]).dataset["category"] = c.label;
    this.categories.append(t.table);
  }

  redraw(): void {
    this.chart.draw();
  }
}

export function renderDrilldown(el: HTMLElement, model: AnyModel): () => void {
  const panel = new DrilldownPanel((msg) => model.send(msg));
  el.append(panel.el);
  const overview = (): void => {
    try {
      panel.setOverview(parseDrilldown(model.get("drilldown")));
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
  overview();
  alive();
  model.on("change:drilldown", overview);
  model.on("change:drilldown_alive", alive);
  // Drawn while the tab was hidden, the canvas had no width: draw again once it has one.
  const resize = typeof ResizeObserver === "undefined" ? null : new ResizeObserver(() => panel.redraw());
  resize?.observe(panel.el);
  return () => {
    model.off("change:drilldown", overview);
    model.off("change:drilldown_alive", alive);
    resize?.disconnect();
    panel.dispose();
  };
}
