import { describe, expect, it } from "vitest";
import { firstCodeLine, formatPeak, noteMarkers, outcome, sortCells, summarize, tooltipLines } from "../src/memory/cells";
import { NO_NOTES, parseNotes } from "../src/wire/notes";
import type { CellRecord, DeviceCellUsage } from "../src/wire/protocol";

const GiB = 1024 ** 3;

function device(d: number, before: number, after: number, peak: number, exact = true): DeviceCellUsage {
  return {
    device: d,
    allocated_before: before,
    allocated_after: after,
    reserved_before: before,
    reserved_after: after + GiB,
    peak_allocated: peak,
    peak_reserved: peak + GiB,
    peak_exact: exact,
    alloc_retries: 0,
    ooms: 0,
    process_used_after: null,
    device_used_after: null,
    others_used_after: null,
    delta_allocated: after - before,
    delta_reserved: after + GiB - before,
    outside_pytorch: null,
  };
}

function cell(n: number, over: Partial<CellRecord> = {}): CellRecord {
  return {
    execution_count: n,
    cell_id: null,
    source: `x${n} = 1`,
    started: n * 10,
    duration: n,
    error: null,
    oom: false,
    host_rss_before: GiB,
    host_rss_after: GiB + n,
    host_rss_peak: 2 * GiB,
    devices: [],
    notes: NO_NOTES,
    missing: {},
    ...over,
  };
}

describe("summaries", () => {
  it("sums changes and takes the largest peak across devices", () => {
    const c = cell(1, { devices: [device(0, 0, 2 * GiB, 3 * GiB), device(1, GiB, 0, 5 * GiB)] });
    expect(summarize(c, "cuda")).toEqual({ delta: GiB, peak: 5 * GiB, peakExact: true, deltaReserved: 3 * GiB });
  });

  it("gives one device's own figures when a device is chosen", () => {
    const c = cell(1, { devices: [device(0, 0, 2 * GiB, 3 * GiB), device(1, GiB, 0, 5 * GiB, false)] });
    expect(summarize(c, "cuda", 0)).toEqual({ delta: 2 * GiB, peak: 3 * GiB, peakExact: true, deltaReserved: 3 * GiB });
    expect(summarize(c, "cuda", 1)).toEqual({ delta: -GiB, peak: 5 * GiB, peakExact: false, deltaReserved: 0 });
    expect(summarize(c, "cuda", 2)).toEqual({ delta: null, peak: null, peakExact: true, deltaReserved: null });
  });

  it("marks a peak as a lower bound when any device's is", () => {
    const c = cell(1, { devices: [device(0, 0, 0, GiB), device(1, 0, 0, GiB, false)] });
    const s = summarize(c, "cuda");
    expect(s.peakExact).toBe(false);
    expect(formatPeak(s)).toBe("\u2265 1.00 GiB");
  });

  it("uses host RSS in host mode (a sampled peak, so a lower bound)", () => {
    const s = summarize(cell(4), "host");
    expect(s).toEqual({ delta: 4, peak: 2 * GiB, peakExact: false, deltaReserved: null });
    expect(summarize(cell(4, { host_rss_before: null }), "host").delta).toBeNull();
  });

  it("has no figures for a CUDA cell without devices", () => {
    expect(summarize(cell(1), "cuda")).toEqual({ delta: null, peak: null, peakExact: true, deltaReserved: null });
  });

  it("tells OOM from other errors", () => {
    expect(outcome(cell(1))).toBe("ok");
    expect(outcome(cell(1, { error: "ValueError" }))).toBe("error");
    expect(outcome(cell(1, { error: "OutOfMemoryError", oom: true }))).toBe("oom");
  });
});

describe("sorting", () => {
  const cells = [
    cell(1, { devices: [device(0, 0, 3 * GiB, 3 * GiB)] }),
    cell(2, { devices: [device(0, 0, GiB, 9 * GiB)] }),
    cell(3, { devices: [] }),
    cell(4, { devices: [device(0, 0, 3 * GiB, GiB)] }),
  ];
  const order = (key: Parameters<typeof sortCells>[2], desc: boolean): number[] =>
    sortCells(cells, "cuda", key, desc).map((c) => c.execution_count);

  it("puts the costliest first, ties in execution order, missing figures last", () => {
    expect(order("delta", true)).toEqual([1, 4, 2, 3]);
    expect(order("peak", true)).toEqual([2, 1, 4, 3]);
    expect(order("peak", false)).toEqual([4, 1, 2, 3]);
    expect(order("duration", true)).toEqual([4, 3, 2, 1]);
    expect(order("execution_count", false)).toEqual([1, 2, 3, 4]);
  });

  it("sorts by the chosen device's figures", () => {
    const two = [
      cell(1, { devices: [device(0, 0, 0, 9 * GiB), device(1, 0, 0, GiB)] }),
      cell(2, { devices: [device(0, 0, 0, GiB), device(1, 0, 0, 4 * GiB)] }),
      cell(3, { devices: [device(0, 0, 0, 2 * GiB)] }),
    ];
    const byPeak = (d: number | null): number[] => sortCells(two, "cuda", "peak", true, d).map((c) => c.execution_count);
    expect(byPeak(null)).toEqual([1, 2, 3]);
    expect(byPeak(1)).toEqual([2, 1, 3]); // cell 3 has no figure on cuda:1: last
  });

  it("does not reorder its input", () => {
    order("peak", true);
    expect(cells.map((c) => c.execution_count)).toEqual([1, 2, 3, 4]);
  });
});

describe("text", () => {
  it("builds the band's hover text from figures and the first lines of source", () => {
    const c = cell(7, { duration: 1.5, error: "ValueError", source: "a\nb", devices: [device(0, 0, GiB, 2 * GiB)] });
    expect(tooltipLines(c, "cuda")).toEqual([
      "[7]  1.50 s  raised ValueError",
      "a",
      "b",
      "\u0394 allocated +1.00 GiB  \u00b7  peak 2.00 GiB  \u00b7  \u0394 reserved +2.00 GiB",
    ]);
    expect(tooltipLines(cell(2), "host").at(-1)).toBe("\u0394 RSS +2 B  \u00b7  peak \u2265 2.00 GiB");
  });

  it("names the device in the hover text when one is chosen, and adds the notes' markers", () => {
    const notes = parseNotes({ estimate: { device: 0, estimate: {}, comparison: { predicted: 100, measured: 150, within_tolerance: false, explanation: "too high" } } });
    const c = cell(3, { source: "a", devices: [device(0, 0, GiB, 2 * GiB), device(1, 0, 0, 0)], notes });
    expect(tooltipLines(c, "cuda", 1)).toEqual(["[3]  3.00 s  est +33.3%", "a", "cuda:1 \u0394 allocated 0 B  \u00b7  peak 0 B  \u00b7  \u0394 reserved +1.00 GiB"]);
  });

  it("marks an estimate's error (a warning outside its tolerance) and leak hints", () => {
    const within = parseNotes({ estimate: { device: 0, estimate: {}, comparison: { predicted: 100, measured: 97, error_bytes: -3, tolerance: 0.1, within_tolerance: true, explanation: "ok" } } });
    expect(noteMarkers(cell(1, { notes: within }))).toEqual([
      { kind: "estimate", text: "est \u22123.1%", title: "Estimate 100 B, measured 97 B: ok", warn: false },
    ]);
    const leaks = parseNotes({ leaks: [{ message: "grows" }, { message: "cached" }] });
    expect(noteMarkers(cell(1, { notes: leaks }))).toEqual([{ kind: "leak", text: "\u26a0 leak", title: "grows\n\ncached", warn: true }]);
    expect(noteMarkers(cell(1))).toEqual([]);
  });

  it("finds the first line of code", () => {
    expect(firstCodeLine("\n\n   import torch\nx = 1")).toBe("import torch");
    expect(firstCodeLine("")).toBe("");
  });
});
