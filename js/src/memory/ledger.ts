// The ledger table: one row per executed cell, sortable by change, peak and duration, so "which
// cell cost the most" is one click. Rows carry data-execution-count; selecting one (click, Enter)
// asks the widget to select that cell. With several devices the figures are the chosen device's,
// or across all of them the sum of the changes and the largest peak (the column titles say which).
// Markers before the source flag what features noted: an estimate's error, a leak hint, a peak
// above the previous run's; the peak column shows the previous run's peak beside this one.

import { firstCodeLine, formatPeak, noteMarkers, outcome, outcomeLabel, previousRunText, sortCells, summarize, type DeviceChoice, type Mode, type SortKey } from "./cells";
import { formatBytes, formatDelta, formatDuration } from "../common/format";
import type { CellRecord } from "../wire/protocol";

/** What the figure columns cover: the mode, and in CUDA mode the device choice. */
interface Scope {
  mode: Mode;
  device: DeviceChoice;
  multiDevice: boolean; // the kernel sees more than one device
}

interface ColumnSpec {
  key: SortKey | null; // null: not sortable
  label: (mode: Mode) => string;
  title: (scope: Scope) => string;
  className: string;
  cudaOnly?: boolean;
}

/** "allocated" on the chosen device, or across all of them (sum or largest). */
function across(scope: Scope, what: string, all: string): string {
  if (scope.mode === "host" || !scope.multiDevice) return what;
  return scope.device === null ? `${what}: ${all}` : `${what} on cuda:${scope.device}`;
}

const COLUMNS: readonly ColumnSpec[] = [
  { key: "execution_count", label: () => "#", title: () => "Execution count", className: "gpumem-col-n" },
  { key: null, label: () => "cell", title: () => "The cell's first line of code", className: "gpumem-col-source" },
  { key: "duration", label: () => "time", title: () => "How long the cell ran", className: "gpumem-col-num" },
  {
    key: "delta",
    label: (m) => (m === "host" ? "\u0394 RSS" : "\u0394 alloc"),
    title: (s) =>
      s.mode === "host" ? "Change in host RSS over the cell" : across(s, "Change in allocated memory over the cell", "the sum over all devices"),
    className: "gpumem-col-num",
  },
  {
    key: "peak",
    label: () => "peak",
    title: (s) => (s.mode === "host" ? "Highest sampled host RSS (a lower bound)" : across(s, "Peak allocated during the cell", "the largest of any device")),
    className: "gpumem-col-num",
  },
  {
    key: "delta_reserved",
    label: () => "\u0394 reserved",
    title: (s) => across(s, "Change in memory PyTorch reserved over the cell", "the sum over all devices"),
    className: "gpumem-col-num gpumem-col-reserved",
    cudaOnly: true,
  },
];

export class Ledger {
  readonly el: HTMLElement;
  private readonly onSelect: (executionCount: number) => void;
  private readonly head: HTMLTableRowElement;
  private readonly body: HTMLTableSectionElement;
  private cells: CellRecord[] = [];
  private scope: Scope = { mode: "host", device: null, multiDevice: false };
  private sortKey: SortKey = "execution_count";
  private descending = true; // newest first until the user sorts
  private selected: number | null = null;
  private readonly footer: HTMLElement;
  private readonly footerText: HTMLElement;
  private readonly olderButton: HTMLButtonElement;
  private unanswered = false;

  /** `onOlder`: ask for the next older page of records (the kernel keeps them all). */
  constructor(onSelect: (executionCount: number) => void, onOlder: () => void = () => undefined) {
    this.onSelect = onSelect;
    this.el = document.createElement("div");
    this.el.className = "gpumem-ledger";
    const table = document.createElement("table");
    const thead = document.createElement("thead");
    this.head = document.createElement("tr");
    thead.append(this.head);
    this.body = document.createElement("tbody");
    table.append(thead, this.body);
    this.footer = document.createElement("div");
    this.footer.className = "gpumem-ledger-more";
    this.footer.hidden = true;
    this.footerText = document.createElement("span");
    this.olderButton = document.createElement("button");
    this.olderButton.type = "button";
    this.olderButton.textContent = "Load older cells";
    this.olderButton.addEventListener("click", () => onOlder());
    this.footer.append(this.footerText, " ", this.olderButton);
    this.el.append(table, this.footer);
    // Scrolled to the bottom (the oldest rows, newest first): fetch the next older page.
    this.el.addEventListener("scroll", () => {
      const nearEnd = this.el.scrollTop + this.el.clientHeight >= this.el.scrollHeight - 4;
      if (nearEnd && !this.footer.hidden && !this.olderButton.hidden && !this.olderButton.disabled) onOlder();
    });

    this.body.addEventListener("click", (e) => {
      const row = (e.target as Element).closest<HTMLTableRowElement>("tr[data-execution-count]");
      if (row) this.onSelect(Number(row.dataset["executionCount"]));
    });
    this.body.addEventListener("keydown", (e) => this.onKey(e));
    this.renderHead();
  }

  /** `device`: whose figures to show (null: all); `multiDevice`: whether there is a choice. */
  update(cells: CellRecord[], mode: Mode, device: DeviceChoice = null, multiDevice = false): void {
    const scope: Scope = { mode, device: mode === "cuda" ? device : null, multiDevice };
    const scopeChanged = JSON.stringify(scope) !== JSON.stringify(this.scope);
    this.cells = cells;
    this.scope = scope;
    if (scopeChanged) this.renderHead();
    this.renderBody();
  }

  /** What the table does not show: `missing` older records the kernel keeps (of `total`);
   * `canAsk`: a kernel is there to ask; `asking`: a page was asked for and has not come. */
  setMore(missing: number, total: number, canAsk: boolean, asking: boolean): void {
    this.footer.hidden = missing === 0;
    this.footer.dataset["missing"] = String(missing);
    this.footerText.textContent = canAsk
      ? `${missing.toLocaleString("en-US")} older of ${total.toLocaleString("en-US")} cells are in the kernel's ledger.`
      : `${missing.toLocaleString("en-US")} older of ${total.toLocaleString("en-US")} cells are not in this widget's saved state (the kernel that held them is gone).`;
    this.olderButton.hidden = !canAsk;
    this.olderButton.disabled = asking;
    this.olderButton.textContent = asking ? "Loading\u2026 (the kernel answers once no cell runs)" : this.unanswered ? "Ask again" : "Load older cells";
    this.olderButton.title = this.unanswered ? "No answer came: the kernel may be busy, or this notebook was reopened without the kernel that holds them" : "";
  }

  /** Whether the last request got no answer in time (see `setMore`). */
  noAnswer(unanswered = true): void {
    this.unanswered = unanswered;
  }

  setSelected(n: number | null): void {
    this.selected = n;
    for (const row of this.body.querySelectorAll<HTMLTableRowElement>("tr")) {
      const on = row.dataset["executionCount"] === String(n);
      row.classList.toggle("gpumem-row--selected", on);
      row.setAttribute("aria-selected", String(on));
    }
  }

  private columns(): ColumnSpec[] {
    return COLUMNS.filter((c) => !c.cudaOnly || this.scope.mode === "cuda");
  }

  private sortBy(key: SortKey): void {
    // First click on a figure puts the largest first; a second click reverses.
    this.descending = key === this.sortKey ? !this.descending : true;
    this.sortKey = key;
    this.renderHead();
    this.renderBody();
  }

  private renderHead(): void {
    this.head.replaceChildren(
      ...this.columns().map((col) => {
        const th = document.createElement("th");
        th.className = col.className;
        th.scope = "col";
        th.title = col.title(this.scope);
        const { key } = col;
        const label = col.label(this.scope.mode);
        if (key === null) {
          th.textContent = label;
          return th;
        }
        const sortButton = document.createElement("button");
        sortButton.type = "button";
        sortButton.dataset["sort"] = key;
        const active = key === this.sortKey;
        sortButton.textContent = label + (active ? (this.descending ? " \u25be" : " \u25b4") : "");
        sortButton.title = `${th.title}. Click to sort.`;
        sortButton.addEventListener("click", () => this.sortBy(key));
        th.setAttribute("aria-sort", active ? (this.descending ? "descending" : "ascending") : "none");
        th.append(sortButton);
        return th;
      }),
    );
  }

  private renderBody(): void {
    const columns = this.columns();
    if (this.cells.length === 0) {
      const row = document.createElement("tr");
      const td = document.createElement("td");
      td.colSpan = columns.length;
      td.className = "gpumem-ledger-empty";
      td.textContent = "No cells recorded yet: run a cell.";
      row.append(td);
      this.body.replaceChildren(row);
      return;
    }
    const { mode, device } = this.scope;
    const rows = sortCells(this.cells, mode, this.sortKey, this.descending, device).map((cell) => this.row(cell));
    this.body.replaceChildren(...rows);
  }

  private row(cell: CellRecord): HTMLTableRowElement {
    const { mode, device, multiDevice } = this.scope;
    const s = summarize(cell, mode, device);
    const tr = document.createElement("tr");
    const n = cell.execution_count;
    tr.dataset["executionCount"] = String(n);
    tr.dataset["outcome"] = outcome(cell);
    tr.tabIndex = 0;
    tr.setAttribute("aria-selected", String(n === this.selected));
    if (n === this.selected) tr.classList.add("gpumem-row--selected");

    const num = td("gpumem-col-n", `[${n}]`);
    const label = outcomeLabel(cell);
    if (label) {
      const badge = document.createElement("span");
      badge.className = "gpumem-badge";
      badge.textContent = cell.oom ? "OOM" : cell.error === "KeyboardInterrupt" ? "interrupted" : "error";
      badge.title = label;
      num.append(" ", badge);
    }
    const source = td("gpumem-col-source", "");
    source.title = cell.source.split(/\r?\n/).slice(0, 8).join("\n");
    for (const marker of noteMarkers(cell)) {
      const m = document.createElement("span");
      m.className = "gpumem-marker";
      m.dataset["note"] = marker.kind;
      if (marker.warn) m.dataset["warn"] = "";
      m.textContent = marker.text;
      m.title = marker.title;
      source.append(m);
    }
    const code = document.createElement("span");
    code.className = "gpumem-source-text";
    code.textContent = firstCodeLine(cell.source);
    source.append(code);
    const figures = [
      td("gpumem-col-num", formatDelta(s.delta)),
      td("gpumem-col-num", formatPeak(s)),
      ...(mode === "cuda" ? [td("gpumem-col-num gpumem-col-reserved", formatDelta(s.deltaReserved))] : []),
    ];
    // The same source's peak in the previous run, beside this one (the figure the note compares:
    // the busiest device's, or host RSS, so not shown for one device picked out of several).
    const prev = cell.notes.history;
    const peakCell = figures[1];
    if (prev && peakCell && (prev.metric === "host_rss") === (mode === "host") && (device === null || !multiDevice)) {
      const was = document.createElement("span");
      was.className = "gpumem-prev";
      if (prev.regression) was.dataset["warn"] = "";
      was.textContent = `was ${formatBytes(prev.previous_peak)}`;
      was.title = previousRunText(prev);
      peakCell.append(was);
    }
    // Across several devices, each device's own figure is one hover away.
    if (mode === "cuda" && multiDevice && device === null && cell.devices.length > 1) {
      const perDevice = (pick: (d: CellRecord["devices"][number]) => string): string =>
        cell.devices.map((d) => `cuda:${d.device} ${pick(d)}`).join("\n");
      const [delta, peak, reserved] = figures;
      if (delta) delta.title = perDevice((d) => formatDelta(d.delta_allocated));
      if (peak) peak.title = perDevice((d) => formatPeak({ peak: d.peak_allocated, peakExact: d.peak_exact, delta: null, deltaReserved: null }));
      if (reserved) reserved.title = perDevice((d) => formatDelta(d.delta_reserved));
    }
    tr.append(num, source, td("gpumem-col-num", formatDuration(cell.duration)), ...figures);
    return tr;
  }

  private onKey(e: KeyboardEvent): void {
    const row = (e.target as Element).closest<HTMLTableRowElement>("tr[data-execution-count]");
    if (!row) return;
    if (e.key === "Enter" || e.key === " ") {
      e.preventDefault();
      this.onSelect(Number(row.dataset["executionCount"]));
    } else if (e.key === "ArrowDown" || e.key === "ArrowUp") {
      e.preventDefault();
      const next = e.key === "ArrowDown" ? row.nextElementSibling : row.previousElementSibling;
      if (next instanceof HTMLElement) next.focus();
    }
  }
}

function td(className: string, text: string): HTMLTableCellElement {
  const cell = document.createElement("td");
  cell.className = className;
  cell.textContent = text;
  return cell;
}
