// The ledger table: one row per executed cell, sortable by change, peak and duration, so "which
// cell cost the most" is one click. Rows carry data-execution-count; selecting one (click, Enter)
// asks the widget to select that cell.

import { firstCodeLine, formatPeak, outcome, outcomeLabel, sortCells, summarize, type Mode, type SortKey } from "./cells";
import { formatDelta, formatDuration } from "./format";
import type { CellRecord } from "./protocol";

interface ColumnSpec {
  key: SortKey | null; // null: not sortable
  label: (mode: Mode) => string;
  className: string;
  cudaOnly?: boolean;
}

const COLUMNS: readonly ColumnSpec[] = [
  { key: "execution_count", label: () => "#", className: "gpumem-col-n" },
  { key: null, label: () => "cell", className: "gpumem-col-source" },
  { key: "duration", label: () => "time", className: "gpumem-col-num" },
  { key: "delta", label: (m) => (m === "host" ? "\u0394 RSS" : "\u0394 alloc"), className: "gpumem-col-num" },
  { key: "peak", label: () => "peak", className: "gpumem-col-num" },
  { key: "delta_reserved", label: () => "\u0394 reserved", className: "gpumem-col-num gpumem-col-reserved", cudaOnly: true },
];

export class Ledger {
  readonly el: HTMLElement;
  private readonly onSelect: (executionCount: number) => void;
  private readonly head: HTMLTableRowElement;
  private readonly body: HTMLTableSectionElement;
  private cells: CellRecord[] = [];
  private mode: Mode = "host";
  private sortKey: SortKey = "execution_count";
  private descending = true; // newest first until the user sorts
  private selected: number | null = null;

  constructor(onSelect: (executionCount: number) => void) {
    this.onSelect = onSelect;
    this.el = document.createElement("div");
    this.el.className = "gpumem-ledger";
    const table = document.createElement("table");
    const thead = document.createElement("thead");
    this.head = document.createElement("tr");
    thead.append(this.head);
    this.body = document.createElement("tbody");
    table.append(thead, this.body);
    this.el.append(table);

    this.body.addEventListener("click", (e) => {
      const row = (e.target as Element).closest<HTMLTableRowElement>("tr[data-execution-count]");
      if (row) this.onSelect(Number(row.dataset["executionCount"]));
    });
    this.body.addEventListener("keydown", (e) => this.onKey(e));
    this.renderHead();
  }

  update(cells: CellRecord[], mode: Mode): void {
    const modeChanged = mode !== this.mode;
    this.cells = cells;
    this.mode = mode;
    if (modeChanged) this.renderHead();
    this.renderBody();
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
    return COLUMNS.filter((c) => !c.cudaOnly || this.mode === "cuda");
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
        const { key } = col;
        if (key === null) {
          th.textContent = col.label(this.mode);
          return th;
        }
        const sortButton = document.createElement("button");
        sortButton.type = "button";
        sortButton.dataset["sort"] = key;
        const active = key === this.sortKey;
        sortButton.textContent = col.label(this.mode) + (active ? (this.descending ? " \u25be" : " \u25b4") : "");
        sortButton.title = `Sort by ${col.label(this.mode)}`;
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
    const rows = sortCells(this.cells, this.mode, this.sortKey, this.descending).map((cell) => this.row(cell));
    this.body.replaceChildren(...rows);
  }

  private row(cell: CellRecord): HTMLTableRowElement {
    const s = summarize(cell, this.mode);
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
      badge.textContent = cell.oom ? "OOM" : "error";
      badge.title = label;
      num.append(" ", badge);
    }
    const source = td("gpumem-col-source", firstCodeLine(cell.source));
    source.title = cell.source.split(/\r?\n/).slice(0, 8).join("\n");
    tr.append(
      num,
      source,
      td("gpumem-col-num", formatDuration(cell.duration)),
      td("gpumem-col-num", formatDelta(s.delta)),
      td("gpumem-col-num", formatPeak(s)),
    );
    if (this.mode === "cuda") tr.append(td("gpumem-col-num gpumem-col-reserved", formatDelta(s.deltaReserved)));
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
