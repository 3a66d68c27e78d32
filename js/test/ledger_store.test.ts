import { describe, expect, it } from "vitest";
import { LedgerStore, PAGE_SIZE } from "../src/memory/ledger_store";
import { NO_NOTES } from "../src/wire/notes";
import { decodeBands, parseCellsPage, parseExtent, ProtocolError, type CellRecord } from "../src/wire/protocol";

function cell(n: number, error: string | null = null): CellRecord {
  return {
    execution_count: n,
    cell_id: null,
    source: `v = ${n}`,
    started: 1000 + n,
    duration: 0.5,
    error,
    oom: false,
    host_rss_before: null,
    host_rss_after: null,
    host_rss_peak: null,
    devices: [],
    notes: NO_NOTES,
    missing: {},
  };
}

/** The band table as the kernel packs it (protocol.pack_table). */
function bandTable(cells: CellRecord[], outcome: (c: CellRecord) => number = () => 0): Record<string, unknown> {
  const col = (values: number[], f8: boolean): DataView => {
    const typed = f8 ? Float64Array.from(values) : Float32Array.from(values);
    return new DataView(typed.buffer);
  };
  return {
    n: cells.length,
    columns: ["t", "duration", "execution_count", "outcome"],
    dtypes: ["f8", "f4", "f4", "f4"],
    buffers: [col(cells.map((c) => c.started), true), col(cells.map((c) => c.duration), false), col(cells.map((c) => c.execution_count), false), col(cells.map(outcome), false)],
  };
}

const range = (from: number, to: number): CellRecord[] => Array.from({ length: to - from }, (_, i) => cell(from + i + 1));

describe("ledger window", () => {
  it("reads the extent, and takes a missing one (an older kernel) as the whole ledger", () => {
    expect(parseExtent({ total: 500, first: 400, bands_first: 0, epoch: 2 }, 100)).toEqual({ total: 500, first: 400, bands_first: 0, epoch: 2 });
    expect(parseExtent(undefined, 7)).toEqual({ total: 7, first: 0, bands_first: 0, epoch: 0 });
    expect(() => parseExtent({ total: 500, first: 10, bands_first: 0, epoch: 0 }, 100)).toThrow(ProtocolError);
    expect(() => parseExtent({ total: -1, first: 0, bands_first: 0, epoch: 0 }, 0)).toThrow(ProtocolError);
  });

  it("decodes the band table, outcomes included", () => {
    const cells = [cell(1), cell(2, "ValueError"), cell(3), cell(4, "KeyboardInterrupt")];
    const bands = decodeBands(bandTable(cells, (c) => [0, 1, 2, 3][c.execution_count - 1] as number));
    expect(bands.map((b) => [b.execution_count, b.started, b.outcome])).toEqual([
      [1, 1001, "ok"],
      [2, 1002, "error"],
      [3, 1003, "oom"],
      [4, 1004, "interrupted"],
    ]);
    expect(decodeBands({})).toEqual([]);
    expect(() => decodeBands({ n: 1, columns: ["t"], dtypes: ["f8"], buffers: [new DataView(new ArrayBuffer(8))] })).toThrow(/no "duration" column/);
  });

  it("joins the band table with the window's newer records, one band per cell", () => {
    const all = range(0, 300);
    const store = new LedgerStore();
    store.setWindow({ total: 300, first: 200, bands_first: 0, epoch: 0 }, all.slice(200));
    store.setBands(decodeBands(bandTable(all.slice(0, 256))));
    expect(store.bands.map((b) => b.execution_count)).toEqual(all.map((c) => c.execution_count));
    expect(store.cells).toHaveLength(100);
  });

  it("adds pages below the window, asks for the next one, and drops pages of a cleared ledger", () => {
    const all = range(0, 500);
    const store = new LedgerStore();
    store.setWindow({ total: 500, first: 400, bands_first: 0, epoch: 0 }, all.slice(400));
    expect(store.olderMissing).toBe(400);
    expect(store.olderRequest()).toEqual({ type: "cells_page", before: 400, limit: PAGE_SIZE });
    expect(store.addPage({ epoch: 0, first: 200, records: all.slice(200, 400), problems: [] })).toBe(true);
    expect(store.cells.map((c) => c.execution_count)).toEqual(all.slice(200).map((c) => c.execution_count));
    expect(store.olderMissing).toBe(200);
    // One old cell asked for by itself: kept, but "load older" still continues from 200.
    store.addPage({ epoch: 0, first: 4, records: [all[4] as CellRecord], problems: [] });
    expect(store.find(5)?.source).toBe("v = 5");
    expect(store.olderMissing).toBe(200);
    // The window moves on: a record of a page that the window now holds is not doubled.
    store.setWindow({ total: 520, first: 416, bands_first: 0, epoch: 0 }, [...all.slice(416), ...range(500, 520)]);
    expect(new Set(store.cells.map((c) => c.execution_count)).size).toBe(store.cells.length);
    // A page from before a reset is stale.
    store.setWindow({ total: 3, first: 0, bands_first: 0, epoch: 1 }, range(0, 3));
    expect(store.addPage({ epoch: 0, first: 0, records: all.slice(0, 10), problems: [] })).toBe(false);
    expect(store.cells).toHaveLength(3);
    expect(store.olderRequest()).toBeNull();
  });

  it("reads page replies and errors, and ignores other messages", () => {
    const page = parseCellsPage({ type: "cells_page", epoch: 0, first: 3, records: [cell(4), { bad: true }] });
    expect(page).not.toBeNull();
    expect(page && "first" in page ? [page.first, page.records.length, page.problems.length] : null).toEqual([3, 1, 1]);
    expect(parseCellsPage({ type: "cells_page", error: "ValueError: no cell [9]" })).toEqual({ error: "ValueError: no cell [9]" });
    expect(parseCellsPage({ type: "load" })).toBeNull();
  });
});
