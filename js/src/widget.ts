// The anywidget entry point. Every view draws only from the model's traits (so several views of
// one widget agree, and a notebook reopened without a kernel shows the last state). Trait changes
// mark what is stale; one requestAnimationFrame callback per frame reads and draws it, so a burst
// of updates costs one redraw and an update never waits longer than the next frame.

import "uplot/dist/uPlot.min.css";
import "./widget.css";
import type { AnyModel } from "@anywidget/types";
import type { DeviceChoice } from "./cells";
import { Chart } from "./chart";
import { Details } from "./details";
import { DeviceSelect } from "./device_select";
import { renderDrilldown } from "./drilldown";
import { Header } from "./header";
import { Ledger } from "./ledger";
import { cellRequest, LedgerStore } from "./ledger_store";
import { watchTheme } from "./theme";
import { TimelineStore } from "./timeline_store";
import {
  decodeBands,
  joinCells,
  parseCells,
  parseCellsPage,
  parseExtent,
  parseDevices,
  parseStatus,
  PROTOCOL_VERSION,
  ProtocolError,
  type CellRecord,
  type DeviceInfo,
  type Status,
  type BrowserMessage,
  type Traits,
} from "./wire/protocol";
import { sendToKernel } from "./wire/messages";
import { decodeTable } from "./wire/table";
import { parseWorkers } from "./wire/workers";
import { WorkersView, type SnapshotRef } from "./workers_view";

// The Memory and Workers tabs' traits; the Snapshot tab watches the drilldown ones itself.
type TraitName = Exclude<keyof Traits, `drilldown${string}`>;
const NO_ANSWER_MS = 15_000;
const TRAITS: readonly TraitName[] = ["devices", "status", "cells", "cells_tail", "cell_bands", "ledger_extent", "timeline_base", "timeline_tail", "workers"];

/** A kernel speaking another protocol version than this bundle reads: say so, once. */
function protocolMismatch(kernel: number | null): string | null {
  if (kernel === null || kernel === PROTOCOL_VERSION) return null;
  return `the kernel speaks wire protocol ${kernel}, this page's gpumem_widget ${PROTOCOL_VERSION}: reinstall the package and reload the page`;
}

class WidgetView {
  private readonly model: AnyModel<Traits>;
  private readonly root: HTMLElement;
  private readonly header = new Header();
  private readonly chart: Chart;
  private readonly deviceSelect: DeviceSelect;
  private readonly ledger: Ledger;
  private readonly details: Details;
  private readonly snapshotPanel: HTMLElement;
  private readonly workersView = new WorkersView(
    (key, index) => this.openWorkerSnapshot(key, index),
    (a, b) => this.compareWorkerSnapshots(a, b),
  );
  private readonly store = new TimelineStore();
  private readonly listeners: [string, () => void][] = [];
  private readonly stale = new Set<TraitName>(TRAITS);
  private readonly problems = new Map<string, string>();
  private readonly stopWatchingTheme: () => void;
  private stopDrilldown: (() => void) | null = null;
  private frameId = 0;
  private devices: DeviceInfo[] = [];
  private status: Status;
  private cells: CellRecord[] = [];
  private readonly ledgerStore = new LedgerStore();
  private asking = false; // a page was asked for and has not come
  private wanted: number | null = null; // a selected cell whose record was asked for
  private kernelGone = false; // the model's comm closed: nothing will answer or update
  private selected: number | null = null;
  private deviceChoice: DeviceChoice = null;
  private problemsChanged = true;

  constructor(model: AnyModel<Traits>, host: HTMLElement) {
    this.model = model;
    this.root = document.createElement("div");
    this.root.className = "gpumem-widget";
    this.status = parseStatus(undefined, []);
    this.deviceSelect = new DeviceSelect((choice) => this.chooseDevice(choice));
    this.chart = new Chart({
      root: this.root,
      requestFrame: () => this.requestFrame(),
      onSelectCell: (n) => this.select(n),
      toolbarStart: this.deviceSelect.el,
    });
    this.ledger = new Ledger(
      (n) => this.select(n),
      () => this.askOlder(),
    );
    this.details = new Details(() => this.select(null));

    const memoryPanel = document.createElement("div");
    memoryPanel.className = "gpumem-tab-panel";
    memoryPanel.dataset["tab"] = "memory";
    memoryPanel.append(this.chart.el, this.details.el, this.ledger.el);
    this.snapshotPanel = document.createElement("div");
    this.snapshotPanel.className = "gpumem-tab-panel gpumem-drilldown";
    this.snapshotPanel.dataset["tab"] = "snapshot";
    this.snapshotPanel.hidden = true;
    const workersPanel = document.createElement("div");
    workersPanel.className = "gpumem-tab-panel";
    workersPanel.dataset["tab"] = "workers";
    workersPanel.hidden = true;
    workersPanel.append(this.workersView.el);
    const panels = [memoryPanel, this.snapshotPanel, workersPanel];
    this.root.append(this.header.el, this.tabs(panels), ...panels);
    host.append(this.root);

    for (const name of TRAITS) {
      const onChange = (): void => {
        // The ledger arrives in four traits (records in blocks, the newest few, bands, extent).
        this.stale.add(name === "cells_tail" || name === "cell_bands" || name === "ledger_extent" ? "cells" : name);
        this.requestFrame();
      };
      model.on(`change:${name}`, onChange);
      this.listeners.push([`change:${name}`, onChange]);
    }
    // The kernel's one custom message: a ledger page it was asked for (`cells_page`).
    const onMessage = (content: unknown): void => this.onMessage(content);
    model.on("msg:custom", onMessage);
    this.listeners.push(["msg:custom", onMessage as () => void]);
    // The kernel went away (a restart, a shutdown) or closed the widget: say so.
    const onGone = (): void => {
      this.kernelGone = true;
      this.stale.add("status"); // the header, and no running band
      this.stale.add("cells"); // the ledger's footer: no kernel to ask
      this.requestFrame();
    };
    for (const event of ["comm:close", "comm_live_update"]) {
      model.on(event, onGone);
      this.listeners.push([event, onGone]);
    }
    this.stopWatchingTheme = watchTheme(() => this.chart.themeChanged());
    this.requestFrame();
  }

  destroy(): void {
    cancelAnimationFrame(this.frameId);
    for (const [event, callback] of this.listeners) this.model.off(event, callback);
    this.stopWatchingTheme();
    this.stopDrilldown?.();
    this.chart.destroy();
    this.root.remove();
  }

  private requestFrame(): void {
    if (this.frameId === 0) this.frameId = requestAnimationFrame(() => this.frame());
  }

  private frame(): void {
    this.frameId = 0;
    const stale = new Set(this.stale);
    this.stale.clear();
    const layout = stale.has("devices") || stale.has("status");
    const mode = this.status.mode;
    const multiDevice = this.devices.length > 1;
    const choice = this.deviceChoice;
    if (layout) {
      this.attempt("devices", () => (this.devices = parseDevices(this.model.get("devices"))));
      this.status = parseStatus(this.model.get("status"), this.devices);
      if (this.kernelGone) this.status = { ...this.status, running_cell: null, running_started: null };
      this.setProblem("protocol", protocolMismatch(this.status.protocol));
      if (!this.devices.some((d) => d.index === this.deviceChoice)) this.deviceChoice = null;
      this.deviceSelect.update(this.devices, this.status.mode, this.deviceChoice);
      this.chart.setLayout(this.devices, this.status.mode, this.deviceChoice);
      this.chart.setRunning(this.status.running_cell, this.status.running_started);
    }
    if (stale.has("cells")) {
      const { cells, problems } = parseCells(joinCells(this.model.get("cells"), this.model.get("cells_tail")));
      this.setProblem("cells", problems.length > 0 ? `${problems.length} cell record(s) left out: ${problems[0]}` : null);
      this.attempt("ledger_extent", () => this.ledgerStore.setWindow(parseExtent(this.model.get("ledger_extent"), cells.length), cells));
      this.attempt("cell_bands", () => this.ledgerStore.setBands(decodeBands(this.model.get("cell_bands"))));
      this.refreshCells();
    }
    // The status changes at every cell's edges: only a new mode (or a second device, or the chosen
    // device gone) changes the ledger's columns.
    const scopeChanged = this.status.mode !== mode || this.devices.length > 1 !== multiDevice || this.deviceChoice !== choice;
    if (stale.has("cells") || scopeChanged) {
      this.updateLedger();
    }
    if (stale.has("cells") || stale.has("devices") || this.status.mode !== mode) this.refreshDetails();
    let timeline = false;
    if (stale.has("timeline_base")) {
      timeline = this.attempt("timeline_base", () => this.store.setBase(decodeTable(this.model.get("timeline_base"), "timeline_base"))) || timeline;
    }
    if (stale.has("timeline_tail")) {
      timeline = this.attempt("timeline_tail", () => this.store.setTail(decodeTable(this.model.get("timeline_tail"), "timeline_tail"))) || timeline;
    }
    if (timeline) this.chart.setTimeline(this.store.timeline);
    if (stale.has("workers")) {
      this.attempt("workers", () => this.workersView.update(parseWorkers(this.model.get("workers")), this.ledgerStore.bands));
    } else if (stale.has("cells")) {
      this.workersView.setBands(this.ledgerStore.bands);
    }
    if (layout || stale.has("cells") || this.problemsChanged) {
      this.problemsChanged = false;
      this.header.update(this.devices, this.status, [...this.problems.values()], this.kernelGone);
    }
    this.chart.draw();
  }

  private setProblem(source: string, message: string | null): void {
    const before = this.problems.get(source) ?? null;
    if (before === message) return;
    if (message === null) this.problems.delete(source);
    else this.problems.set(source, message);
    this.problemsChanged = true;
  }

  /** Run one decoding step; a malformed trait keeps the last good state and says why in the header. */
  private attempt(source: string, step: () => unknown): boolean {
    try {
      step();
      this.setProblem(source, null);
      return true;
    } catch (e) {
      if (!(e instanceof ProtocolError)) throw e;
      this.setProblem(source, e.message);
      return false;
    }
  }

  private updateLedger(): void {
    this.ledger.update(this.cells, this.status.mode, this.deviceChoice, this.devices.length > 1);
    this.ledger.setMore(this.ledgerStore.olderMissing, this.ledgerStore.total, !this.kernelGone, this.asking);
  }

  /** The records and bands changed (a trait, or a page came). */
  private refreshCells(): void {
    this.cells = this.ledgerStore.cells;
    this.chart.setCells(this.cells);
    this.chart.setBands(this.ledgerStore.bands);
  }

  private askOlder(): void {
    const request = this.ledgerStore.olderRequest();
    if (request === null || this.asking || this.kernelGone) return;
    this.asking = true;
    sendToKernel(this.model, request);
    this.updateLedger();
    // No answer in a while: a busy kernel answers later, a notebook reopened without its kernel
    // never does. Let the user ask again rather than wait on a disabled button.
    window.setTimeout(() => {
      if (!this.asking) return;
      this.asking = false;
      this.ledger.noAnswer();
      this.updateLedger();
    }, NO_ANSWER_MS);
  }

  private onMessage(content: unknown): void {
    let page;
    try {
      page = parseCellsPage(content);
    } catch (e) {
      if (!(e instanceof ProtocolError)) throw e;
      this.setProblem("cells_page", e.message);
      this.requestFrame();
      return;
    }
    if (page === null) return; // another feature's message
    this.asking = false;
    this.ledger.noAnswer(false);
    if ("error" in page) {
      this.setProblem("cells_page", page.error);
    } else {
      this.setProblem("cells_page", page.problems.length > 0 ? `${page.problems.length} record(s) left out: ${page.problems[0]}` : null);
      if (this.ledgerStore.addPage(page)) this.refreshCells();
    }
    this.updateLedger();
    if (this.wanted !== null && this.wanted === this.selected) this.refreshDetails();
    this.wanted = null;
    this.requestFrame();
  }

  private chooseDevice(choice: DeviceChoice): void {
    this.deviceChoice = choice;
    this.chart.setLayout(this.devices, this.status.mode, choice);
    this.updateLedger();
  }

  private select(n: number | null): void {
    this.selected = n;
    this.ledger.setSelected(n);
    this.chart.setSelected(n, n !== null);
    this.refreshDetails();
  }

  private refreshDetails(): void {
    const n = this.selected;
    const cell = n === null ? undefined : this.ledgerStore.find(n);
    if (cell) this.details.show(cell, this.devices, this.status.mode);
    else this.details.hide();
    // A band of an older cell: its record is in the kernel; ask for it (once).
    if (!cell && n !== null && this.wanted !== n && !this.kernelGone) {
      this.wanted = n;
      sendToKernel(this.model, cellRequest(n));
    }
  }

  /** A rank's snapshot: the kernel opens it (the path a worker reported) in the Snapshot tab. */
  private openWorkerSnapshot(key: string, index: number): void {
    this.sendToSnapshotTab({ type: "worker_snapshot", key, index });
  }

  /** Two ranks' snapshots: the kernel compares them in the Snapshot tab. */
  private compareWorkerSnapshots(a: SnapshotRef, b: SnapshotRef): void {
    this.sendToSnapshotTab({ type: "worker_compare", a, b });
  }

  private sendToSnapshotTab(request: BrowserMessage): void {
    sendToKernel(this.model, request);
    this.root.querySelector<HTMLButtonElement>('nav.gpumem-tabs button[data-tab="snapshot"]')?.click();
  }

  private tabs(panels: HTMLElement[]): HTMLElement {
    const nav = document.createElement("nav");
    nav.className = "gpumem-tabs";
    nav.setAttribute("role", "tablist");
    const labels = ["Memory", "Snapshot", "Workers"];
    const buttons = panels.map((panel, i) => {
      const b = document.createElement("button");
      b.type = "button";
      b.setAttribute("role", "tab");
      b.dataset["tab"] = panel.dataset["tab"] ?? "";
      b.textContent = labels[i] ?? "";
      b.setAttribute("aria-selected", String(i === 0));
      b.addEventListener("click", () => {
        panels.forEach((p, j) => (p.hidden = j !== i));
        buttons.forEach((other) => other.setAttribute("aria-selected", String(other === b)));
        if (panel.dataset["tab"] === "workers") this.workersView.setBands(this.ledgerStore.bands); // sized now
        if (panel === this.snapshotPanel && !this.stopDrilldown) {
          this.stopDrilldown = renderDrilldown(this.snapshotPanel, this.model);
        }
      });
      return b;
    });
    nav.append(...buttons);
    return nav;
  }
}

export default {
  render({ model, el }: { model: AnyModel<Traits>; el: HTMLElement }): () => void {
    const view = new WidgetView(model, el);
    return () => view.destroy();
  },
};

