// The chart's timeline: the `timeline_base` and `timeline_tail` tables (decoded by wire/table)
// joined into columns. The base changes rarely and the tail up to 4 times a second, so the joined
// columns keep spare capacity and a tail update only rewrites the rows after the base.

import { EMPTY_TABLE, TIME_COLUMN, type DecodedTable } from "../wire/table";

export interface Timeline {
  n: number;
  t: Float64Array; // unix seconds, ascending
  values: ReadonlyMap<string, Float32Array>; // bytes; NaN where a reader had nothing
}

export class TimelineStore {
  private base: DecodedTable = EMPTY_TABLE;
  private tail: DecodedTable = EMPTY_TABLE;
  private names: string[] = [];
  private capacity = 0;
  private t = new Float64Array(0);
  private cols = new Map<string, Float32Array>();
  private n = 0;

  setBase(table: DecodedTable): void {
    this.base = table;
    this.rebuild();
  }

  setTail(table: DecodedTable): void {
    this.tail = table;
    const known = new Set(this.names);
    const newColumn = [...table.columns.keys()].some((c) => c !== TIME_COLUMN && !known.has(c));
    if (newColumn || this.base.n + table.n > this.capacity) this.rebuild();
    else this.writeTail();
  }

  get timeline(): Timeline {
    const values = new Map<string, Float32Array>();
    for (const [name, col] of this.cols) values.set(name, col.subarray(0, this.n));
    return { n: this.n, t: this.t.subarray(0, this.n), values };
  }

  private rebuild(): void {
    const names = new Set<string>();
    for (const table of [this.base, this.tail]) {
      for (const c of table.columns.keys()) if (c !== TIME_COLUMN) names.add(c);
    }
    this.names = [...names];
    this.capacity = Math.ceil((this.base.n + this.tail.n) * 1.25) + 1024;
    this.t = new Float64Array(this.capacity);
    this.cols = new Map(this.names.map((c) => [c, new Float32Array(this.capacity)]));
    this.copyRows(this.base, 0, 0);
    this.writeTail();
  }

  private writeTail(): void {
    const baseN = this.base.n;
    // Rows the base already covers are skipped, so the time column stays ascending.
    const lastBase = baseN > 0 ? (this.t[baseN - 1] as number) : -Infinity;
    const tailT = this.tail.columns.get(TIME_COLUMN);
    let skip = 0;
    if (tailT) while (skip < this.tail.n && (tailT[skip] as number) <= lastBase) skip++;
    this.n = baseN + this.copyRows(this.tail, skip, baseN);
  }

  /** Copy `table`'s rows from `from` on to row `at`; returns how many were copied. */
  private copyRows(table: DecodedTable, from: number, at: number): number {
    const count = table.n - from;
    if (count <= 0) return 0;
    const t = table.columns.get(TIME_COLUMN);
    if (t) this.t.set(t.subarray(from), at);
    for (const [name, dest] of this.cols) {
      const src = table.columns.get(name);
      if (src) dest.set(src.subarray(from), at);
      else dest.fill(NaN, at, at + count);
    }
    return count;
  }
}
