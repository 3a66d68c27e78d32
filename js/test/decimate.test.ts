import { describe, expect, it } from "vitest";
import { decimate, lowerBound, nearestIndex, seriesMax } from "../src/decimate";

const times = (n: number, dt = 1, t0 = 0): Float64Array => Float64Array.from({ length: n }, (_, i) => t0 + i * dt);
const values = (n: number, f: (i: number) => number): Float32Array => Float32Array.from({ length: n }, (_, i) => f(i));

describe("search", () => {
  it("finds the first index at or after a time", () => {
    const t = Float64Array.from([1, 2, 2, 5]);
    expect(lowerBound(t, 0)).toBe(0);
    expect(lowerBound(t, 2)).toBe(1);
    expect(lowerBound(t, 3)).toBe(3);
    expect(lowerBound(t, 9)).toBe(4);
    expect(lowerBound(t, 2, true)).toBe(3);
  });

  it("finds the nearest sample", () => {
    const t = Float64Array.from([1, 2, 5]);
    expect(nearestIndex(t, -3)).toBe(0);
    expect(nearestIndex(t, 3.4)).toBe(1);
    expect(nearestIndex(t, 3.6)).toBe(2);
    expect(nearestIndex(t, 99)).toBe(2);
    expect(nearestIndex(new Float64Array(0), 1)).toBe(-1);
  });
});

describe("decimate", () => {
  it("passes few samples through, with one sample beyond each edge", () => {
    const t = times(10);
    const v = values(10, (i) => i * 10);
    const out = decimate(t, [v], 3, 6, 100);
    expect(out.x).toEqual([2, 3, 4, 5, 6, 7]);
    expect(out.ys[0]).toEqual([20, 30, 40, 50, 60, 70]);
  });

  it("turns NaN into gaps and a missing column into all gaps", () => {
    const t = times(3);
    const out = decimate(t, [Float32Array.from([1, NaN, 3]), null], 0, 2, 100);
    expect(out.ys[0]).toEqual([1, null, 3]);
    expect(out.ys[1]).toEqual([null, null, null]);
  });

  it("keeps a one-sample spike among 100,000 samples on a 500-pixel plot", () => {
    const n = 100_000;
    const t = times(n, 0.01);
    const spikeAt = 61_234;
    const v = values(n, (i) => (i === spikeAt ? 9e9 : 1e9 + (i % 7)));
    const out = decimate(t, [v], 0, t[n - 1] as number, 500);
    expect(out.x.length).toBeLessThanOrEqual(2 * 502);
    expect(seriesMax(out.ys)).toBe(Math.fround(9e9));
    expect(Math.min(...(out.ys[0] as number[]))).toBe(1e9);
  });

  it("keeps each bucket's extremes in time order", () => {
    // Two buckets of three samples: the first dips then peaks, the second peaks then dips.
    const v = Float32Array.from([5, 1, 8, 5, 9, 2]);
    const out = decimate(times(6), [v], 0, 6, 2);
    expect(out.x).toEqual([0, 2, 3, 5]);
    expect(out.ys[0]).toEqual([1, 8, 9, 2]);
  });

  it("aligns every series with the shared x values", () => {
    const n = 10_000;
    const a = values(n, (i) => i);
    const b = values(n, (i) => -i);
    const out = decimate(times(n), [a, b, null], 0, n, 50);
    expect(out.ys.map((y) => y.length)).toEqual([out.x.length, out.x.length, out.x.length]);
    expect(Math.max(...(out.ys[0] as number[]))).toBe(n - 1);
    expect(Math.min(...(out.ys[1] as number[]))).toBe(-(n - 1));
  });

  it("returns nothing for an empty timeline or a range with no samples near it", () => {
    expect(decimate(new Float64Array(0), [null], 0, 1, 10)).toEqual({ x: [], ys: [[]] });
    const out = decimate(times(5), [values(5, (i) => i)], 100, 200, 10);
    expect(out.x).toEqual([4]); // only the last sample, just before the range
  });
});
