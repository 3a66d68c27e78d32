// The anywidget entry point. Every view draws only from the model's traits (so several views of
// one widget agree, and a notebook reopened without a kernel shows the last state). Trait changes
// mark what is stale; one requestAnimationFrame callback per frame reads and draws it, so a burst
// of updates costs one redraw and an update never waits longer than the next frame.
// This module only hosts the tabs (memory/, snapshot/, workers/: common/mount.ts says how).

import "./widget.css";
import type { AnyModel } from "@anywidget/types";
import type { Tab, TabHost, TraitName } from "./common/mount";
import { Header, type Session } from "./header";
import { mountMemoryTab, type MemoryTab } from "./memory/tab";
import { mountSnapshotTab } from "./snapshot/tab";
import { decodeTable, TIME_COLUMN } from "./wire/table";
import { parseDevices, parseStatus, PROTOCOL_VERSION, ProtocolError, type DeviceInfo, type Status, type BrowserMessage, type Traits } from "./wire/protocol";
import { sendToKernel } from "./wire/messages";
import { mountWorkersTab } from "./workers/tab";
import type { SnapshotRef } from "./workers/view";

// The Memory and Workers tabs' traits; the Snapshot tab watches the drilldown ones itself.
const TRAITS: readonly TraitName[] = ["devices", "status", "cells", "cells_tail", "cell_bands", "ledger_extent", "timeline_base", "timeline_tail", "workers"];

/** A kernel speaking another protocol version than this bundle reads: say so, once. */
function protocolMismatch(kernel: number | null): string | null {
  if (kernel === null || kernel === PROTOCOL_VERSION) return null;
  return `the kernel speaks wire protocol ${kernel}, this page's gpumem_widget ${PROTOCOL_VERSION}: reinstall the package and reload the page`;
}

type TabKey = "memory" | "snapshot" | "workers";
const TABS: readonly { key: TabKey; label: string; className: string }[] = [
  { key: "memory", label: "Memory", className: "gpumem-tab-panel" },
  { key: "snapshot", label: "Snapshot", className: "gpumem-tab-panel gpumem-drilldown" },
  { key: "workers", label: "Workers", className: "gpumem-tab-panel" },
];

// The class @jupyter-widgets/base puts on a view whose model has no live comm: a widget drawn
// from a notebook's saved state, or one whose kernel went away.
const DISCONNECTED = "jupyter-widgets-disconnected";

function tabPanel(key: TabKey, className: string, hidden: boolean): HTMLElement {
  const panel = document.createElement("div");
  panel.className = className;
  panel.dataset["tab"] = key;
  panel.hidden = hidden;
  return panel;
}

/** The host of the tabs: the header, the tab strip, and the model's wiring (one frame per burst
 * of trait changes, the devices and status every tab reads, the problems the header lists). */
class WidgetView implements TabHost {
  readonly model: AnyModel<Traits>;
  readonly root: HTMLElement;
  private readonly header = new Header();
  private readonly panels: Record<TabKey, HTMLElement>;
  private readonly memory: MemoryTab;
  private readonly tabs = new Map<TabKey, Tab>(); // mounted, in the order a frame updates them
  private readonly listeners: [string, () => void][] = [];
  private readonly stale = new Set<TraitName>(TRAITS);
  private readonly problems = new Map<string, string>();
  private frameId = 0;
  private devices: DeviceInfo[] = [];
  private status: Status;
  // "live": a kernel feeds it; "saved": drawn from the notebook's saved state (no comm since it
  // was drawn); "gone": its kernel went away while shown. Only "live" shows live controls.
  private session: Session;
  private problemsChanged = true;

  constructor(model: AnyModel<Traits>, host: HTMLElement) {
    this.model = model;
    this.root = document.createElement("div");
    this.root.className = "gpumem-widget";
    this.session = host.classList.contains(DISCONNECTED) ? "saved" : "live";
    this.root.dataset["session"] = this.session;
    this.status = parseStatus(undefined, []);
    this.panels = Object.fromEntries(TABS.map(({ key, className }, i) => [key, tabPanel(key, className, i > 0)])) as Record<TabKey, HTMLElement>;
    // The Memory tab first: the Workers tab draws its bands, and a frame updates them in this order.
    this.memory = mountMemoryTab(this.panels.memory, this);
    this.tabs.set("memory", this.memory);
    this.tabs.set(
      "workers",
      mountWorkersTab(
        this.panels.workers,
        this,
        () => this.memory.bands,
        (key, index) => this.openWorkerSnapshot(key, index),
        (a, b) => this.compareWorkerSnapshots(a, b),
      ),
    );
    this.root.append(this.header.el, this.tabStrip(), ...TABS.map(({ key }) => this.panels[key]));
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
    // The kernel's custom messages (a ledger page it was asked for): the tabs read them.
    const onMessage = (content: unknown): void => this.onMessage(content);
    model.on("msg:custom", onMessage);
    this.listeners.push(["msg:custom", onMessage as () => void]);
    // The kernel went away (a restart, a shutdown) or closed the widget: say so. A saved widget
    // whose comm comes alive (a live session took it over) is live again.
    const onComm = (event: string): void => {
      const connected = event === "comm_live_update" && this.session !== "live" && !host.classList.contains(DISCONNECTED);
      this.setSession(connected ? "live" : this.session === "saved" ? "saved" : "gone");
      if (connected) this.announceShown();
    };
    for (const event of ["comm:close", "comm_live_update"]) {
      const listener = (): void => onComm(event);
      model.on(event, listener);
      this.listeners.push([event, listener]);
    }
    if (this.session === "live") this.announceShown();
    this.requestFrame();
  }

  /** Tell the kernel a front end shows this widget and keeps its state: a cell's row then rides
   * with the kernel's next publish instead of a message of the cell's own. */
  private announceShown(): void {
    sendToKernel(this.model, { type: "shown" });
  }

  destroy(): void {
    cancelAnimationFrame(this.frameId);
    for (const [event, callback] of this.listeners) this.model.off(event, callback);
    for (const tab of this.tabs.values()) tab.dispose();
    this.root.remove();
  }

  get kernelGone(): boolean {
    return this.session !== "live";
  }

  private setSession(session: Session): void {
    this.session = session;
    this.root.dataset["session"] = session;
    this.stale.add("status"); // the header, and no running band
    this.stale.add("cells"); // the ledger's footer: no kernel to ask
    this.requestFrame();
  }

  /** The newest time the state holds (its last sample): when a saved widget was last fed. */
  private newestTime(): number | null {
    for (const name of ["timeline_tail", "timeline_base"] as const) {
      try {
        const t = decodeTable(this.model.get(name), name).columns.get(TIME_COLUMN);
        const last = t?.[t.length - 1];
        if (last !== undefined && Number.isFinite(last)) return last;
      } catch (e) {
        if (!(e instanceof ProtocolError)) throw e;
      }
    }
    return null;
  }

  requestFrame(): void {
    if (this.frameId === 0) this.frameId = requestAnimationFrame(() => this.frame());
  }

  private frame(): void {
    this.frameId = 0;
    const stale = new Set(this.stale);
    this.stale.clear();
    const layout = stale.has("devices") || stale.has("status");
    if (layout) {
      this.attempt("devices", () => (this.devices = parseDevices(this.model.get("devices"))));
      this.status = parseStatus(this.model.get("status"), this.devices);
      if (this.kernelGone) this.status = { ...this.status, running_cell: null, running_started: null };
      this.setProblem("protocol", protocolMismatch(this.status.protocol));
    }
    const frame = { stale, devices: this.devices, status: this.status };
    for (const tab of this.tabs.values()) tab.update?.(frame);
    if (layout || stale.has("cells") || this.problemsChanged) {
      this.problemsChanged = false;
      this.header.update(this.devices, this.status, [...this.problems.values()], this.session, this.session === "saved" ? this.newestTime() : null);
    }
  }

  setProblem(source: string, message: string | null): void {
    const before = this.problems.get(source) ?? null;
    if (before === message) return;
    if (message === null) this.problems.delete(source);
    else this.problems.set(source, message);
    this.problemsChanged = true;
  }

  /** Run one decoding step; a malformed trait keeps the last good state and says why in the header. */
  attempt(source: string, step: () => unknown): boolean {
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

  /** A custom message: the tab it is for reads it (the others ignore it). */
  private onMessage(content: unknown): void {
    for (const tab of this.tabs.values()) tab.receive?.(content);
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

  private tabStrip(): HTMLElement {
    const nav = document.createElement("nav");
    nav.className = "gpumem-tabs";
    nav.setAttribute("role", "tablist");
    const buttons = TABS.map(({ key, label }, i) => {
      const b = document.createElement("button");
      b.type = "button";
      b.setAttribute("role", "tab");
      b.dataset["tab"] = key;
      b.textContent = label;
      b.setAttribute("aria-selected", String(i === 0));
      b.addEventListener("click", () => {
        for (const other of TABS) this.panels[other.key].hidden = other.key !== key;
        buttons.forEach((other) => other.setAttribute("aria-selected", String(other === b)));
        this.show(key);
      });
      return b;
    });
    nav.append(...buttons);
    return nav;
  }

  private show(key: TabKey): void {
    // The Snapshot tab is mounted when first shown: it costs nothing until the user opens it.
    if (key === "snapshot" && !this.tabs.has(key)) this.tabs.set(key, mountSnapshotTab(this.panels.snapshot, this));
    this.tabs.get(key)?.shown?.();
  }
}

export default {
  render({ model, el }: { model: AnyModel<Traits>; el: HTMLElement }): () => void {
    const view = new WidgetView(model, el);
    return () => view.destroy();
  },
};

