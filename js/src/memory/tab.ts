// The Memory tab: the live chart, the selected cell's details and the ledger, with their state (the
// timeline, the ledger's window and pages, the selection, the device chosen). The host's frame
// hands it the changed traits; it decodes them and redraws what they touch. Older records come
// by asking the kernel for a page (a custom message answered with one).

import "uplot/dist/uPlot.min.css"; // uPlot's own styles first: memory.css overrides some
import "./memory.css";
import { watchTheme } from "../common/theme";
import type { Frame, Tab, TabHost } from "../common/mount";
import {
  decodeBands,
  joinCells,
  parseCells,
  parseCellsPage,
  parseExtent,
  parseStatus,
  ProtocolError,
  type Band,
  type CellRecord,
  type DeviceInfo,
  type Status,
} from "../wire/protocol";
import { sendToKernel } from "../wire/messages";
import { decodeTable } from "../wire/table";
import type { DeviceChoice } from "./cells";
import { Chart } from "./chart";
import { Details } from "./details";
import { DeviceSelect } from "./device_select";
import { Ledger } from "./ledger";
import { cellRequest, LedgerStore } from "./ledger_store";
import { TimelineStore } from "./timeline_store";

const NO_ANSWER_MS = 15_000;

export class MemoryTab implements Tab {
  private readonly host: TabHost;
  private readonly chart: Chart;
  private readonly deviceSelect: DeviceSelect;
  private readonly ledger: Ledger;
  private readonly details: Details;
  private readonly store = new TimelineStore();
  private readonly ledgerStore = new LedgerStore();
  private readonly stopWatchingTheme: () => void;
  private devices: DeviceInfo[] = [];
  private status: Status;
  private cells: CellRecord[] = [];
  private asking = false; // a page was asked for and has not come
  private wanted: number | null = null; // a selected cell whose record was asked for
  private selected: number | null = null;
  private deviceChoice: DeviceChoice = null;

  constructor(panel: HTMLElement, host: TabHost) {
    this.host = host;
    this.status = parseStatus(undefined, []);
    this.deviceSelect = new DeviceSelect((choice) => this.chooseDevice(choice));
    this.chart = new Chart({
      root: host.root,
      requestFrame: () => host.requestFrame(),
      onSelectCell: (n) => this.select(n),
      toolbarStart: this.deviceSelect.el,
    });
    this.ledger = new Ledger(
      (n) => this.select(n),
      () => this.askOlder(),
    );
    this.details = new Details(() => this.select(null));
    panel.append(this.chart.el, this.details.el, this.ledger.el);
    this.stopWatchingTheme = watchTheme(() => this.chart.themeChanged());
  }

  /** One band per cell the widget knows of (the Workers tab draws them too). */
  get bands(): Band[] {
    return this.ledgerStore.bands;
  }

  update({ stale, devices, status }: Frame): void {
    const host = this.host;
    const mode = this.status.mode;
    const multiDevice = this.devices.length > 1;
    const choice = this.deviceChoice;
    if (stale.has("devices") || stale.has("status")) {
      this.devices = devices;
      this.status = status;
      if (!this.devices.some((d) => d.index === this.deviceChoice)) this.deviceChoice = null;
      this.deviceSelect.update(this.devices, this.status.mode, this.deviceChoice);
      this.chart.setLayout(this.devices, this.status.mode, this.deviceChoice);
      this.chart.setRunning(this.status.running_cell, this.status.running_started, this.status.running_phases);
    }
    if (stale.has("cells")) {
      const { cells, problems } = parseCells(joinCells(host.model.get("cells"), host.model.get("cells_tail")));
      host.setProblem("cells", problems.length > 0 ? `${problems.length} cell record(s) left out: ${problems[0]}` : null);
      host.attempt("ledger_extent", () => this.ledgerStore.setWindow(parseExtent(host.model.get("ledger_extent"), cells.length), cells));
      host.attempt("cell_bands", () => this.ledgerStore.setBands(decodeBands(host.model.get("cell_bands"))));
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
      timeline = host.attempt("timeline_base", () => this.store.setBase(decodeTable(host.model.get("timeline_base"), "timeline_base"))) || timeline;
    }
    if (stale.has("timeline_tail")) {
      timeline = host.attempt("timeline_tail", () => this.store.setTail(decodeTable(host.model.get("timeline_tail"), "timeline_tail"))) || timeline;
    }
    if (timeline) this.chart.setTimeline(this.store.timeline);
    this.chart.draw();
  }

  /** A page of older records (or the kernel's refusal), answering `askOlder` or `refreshDetails`. */
  receive(content: unknown): void {
    const host = this.host;
    let page;
    try {
      page = parseCellsPage(content);
    } catch (e) {
      if (!(e instanceof ProtocolError)) throw e;
      host.setProblem("cells_page", e.message);
      host.requestFrame();
      return;
    }
    if (page === null) return; // another feature's message
    this.asking = false;
    this.ledger.noAnswer(false);
    if ("error" in page) {
      host.setProblem("cells_page", page.error);
    } else {
      host.setProblem("cells_page", page.problems.length > 0 ? `${page.problems.length} record(s) left out: ${page.problems[0]}` : null);
      if (this.ledgerStore.addPage(page)) this.refreshCells();
    }
    this.updateLedger();
    if (this.wanted !== null && this.wanted === this.selected) this.refreshDetails();
    this.wanted = null;
    host.requestFrame();
  }

  dispose(): void {
    this.stopWatchingTheme();
    this.chart.destroy();
  }

  private updateLedger(): void {
    this.ledger.update(this.cells, this.status.mode, this.deviceChoice, this.devices.length > 1);
    this.ledger.setMore(this.ledgerStore.olderMissing, this.ledgerStore.total, !this.host.kernelGone, this.asking);
  }

  /** The records and bands changed (a trait, or a page came). */
  private refreshCells(): void {
    this.cells = this.ledgerStore.cells;
    this.chart.setCells(this.cells);
    this.chart.setBands(this.ledgerStore.bands);
  }

  private askOlder(): void {
    const request = this.ledgerStore.olderRequest();
    if (request === null || this.asking || this.host.kernelGone) return;
    this.asking = true;
    sendToKernel(this.host.model, request);
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
    if (!cell && n !== null && this.wanted !== n && !this.host.kernelGone) {
      this.wanted = n;
      sendToKernel(this.host.model, cellRequest(n));
    }
  }
}

export function mountMemoryTab(panel: HTMLElement, host: TabHost): MemoryTab {
  return new MemoryTab(panel, host);
}
