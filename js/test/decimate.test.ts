import { describe, expect, it } from "vitest";
import { decimate, lowerBound, nearestIndex, seriesMax } from "../src/memory/decimate";

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
    expect(out.hi[0]).toEqual([20, 30, 40, 50, 60, 70]);
    expect(out.lo[0]).toEqual(out.hi[0]);
  });

  it("turns NaN into gaps and a missing column into all gaps", () => {
    const t = times(3);
    const out = decimate(t, [Float32Array.from([1, NaN, 3]), null], 0, 2, 100);
    expect(out.hi[0]).toEqual([1, null, 3]);
    expect(out.hi[1]).toEqual([null, null, null]);
  });

  it("keeps a one-sample spike among 100,000 samples on a 500-pixel plot", () => {
    const n = 100_000;
    const t = times(n, 0.01);
    const spikeAt = 61_234;
    const v = values(n, (i) => (i === spikeAt ? 9e9 : 1e9 + (i % 7)));
    const out = decimate(t, [v], 0, t[n - 1] as number, 500);
    expect(out.x.length).toBeLessThanOrEqual(502);
    expect(seriesMax(out.hi)).toBe(Math.fround(9e9));
    expect(Math.min(...(out.lo[0] as number[]))).toBe(1e9);
  });

  it("gives each pixel column its minimum and maximum, at its first sample's time", () => {
    // Two buckets of three samples each.
    const v = Float32Array.from([5, 1, 8, 5, 9, 2]);
    const out = decimate(times(6), [v], 0, 6, 2);
    expect(out.x).toEqual([0, 3]);
    expect(out.hi[0]).toEqual([8, 9]);
    expect(out.lo[0]).toEqual([1, 2]);
  });

  it("ignores NaN within a bucket and leaves a gap where a bucket has no number", () => {
    const v = Float32Array.from([NaN, 4, NaN, NaN, NaN, NaN]);
    const out = decimate(times(6), [v], 0, 6, 2);
    expect(out.hi[0]).toEqual([4, null]);
    expect(out.lo[0]).toEqual([4, null]);
  });

  it("aligns every series with the shared x values", () => {
    const n = 10_000;
    const a = values(n, (i) => i);
    const b = values(n, (i) => -i);
    const out = decimate(times(n), [a, b, null], 0, n, 50);
    expect([...out.hi, ...out.lo].map((y) => y.length)).toEqual(Array(6).fill(out.x.length));
    expect(Math.max(...(out.hi[0] as number[]))).toBe(n - 1);
    expect(Math.min(...(out.lo[1] as number[]))).toBe(-(n - 1));
  });

  it("returns nothing for an empty timeline, only the nearest sample for a range past the data", () => {
    expect(decimate(new Float64Array(0), [null], 0, 1, 10)).toEqual({ x: [], hi: [[]], lo: [[]] });
    const out = decimate(times(5), [values(5, (i) => i)], 100, 200, 10);
    expect(out.x).toEqual([4]);
  });
});
