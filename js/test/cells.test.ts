import { describe, expect, it } from "vitest";
import { firstCodeLine, formatPeak, outcome, sortCells, summarize, tooltipLines } from "../src/cells";
import type { CellRecord, DeviceCellUsage } from "../src/protocol";

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
    ...over,
  };
}

describe("summaries", () => {
  it("sums changes and takes the largest peak across devices", () => {
    const c = cell(1, { devices: [device(0, 0, 2 * GiB, 3 * GiB), device(1, GiB, 0, 5 * GiB)] });
    expect(summarize(c, "cuda")).toEqual({ delta: GiB, peak: 5 * GiB, peakExact: true, deltaReserved: 3 * GiB });
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

  it("finds the first line of code", () => {
    expect(firstCodeLine("\n\n   import torch\nx = 1")).toBe("import torch");
    expect(firstCodeLine("")).toBe("");
  });
});
