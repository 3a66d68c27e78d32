// Screen-sized series for the chart: the samples in view, reduced to one point per pixel column
// carrying that column's minimum and maximum. The chart strokes the maxima (so a short spike, the
// peak that matters in a memory chart, stays on screen however many samples share its pixel) and
// shades the band down to the minima: a few thousand vertices that never cross, cheap to draw.

export interface Envelope {
  /** x values (unix seconds), shared by every series. */
  x: number[];
  /** Per input column, aligned with `x`: the largest value at each point; null is a gap. */
  hi: (number | null)[][];
  /** Per input column: the smallest value at each point (equal to `hi` where one sample). */
  lo: (number | null)[][];
}

/** First index whose time is >= `x` (or > `x` when `strict`); `t` ascending. */
export function lowerBound(t: ArrayLike<number>, x: number, strict = false): number {
  let lo = 0;
  let hi = t.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    const v = t[mid] as number;
    if (v < x || (strict && v === x)) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/** Index of the sample nearest to `x`, or -1 when there are none. */
export function nearestIndex(t: ArrayLike<number>, x: number): number {
  const n = t.length;
  if (n === 0) return -1;
  const i = lowerBound(t, x);
  if (i === 0) return 0;
  if (i >= n) return n - 1;
  return x - (t[i - 1] as number) <= (t[i] as number) - x ? i - 1 : i;
}

const finiteOrNull = (v: number): number | null => (Number.isNaN(v) ? null : v);

/**
 * The samples of `columns` (aligned with `t`) between `xMin` and `xMax`, plus the nearest sample
 * beyond each edge so lines run to the plot's borders. With more samples than `buckets` (pixel
 * columns), each bucket becomes one point at its first sample's time. A null column is all gaps.
 */
export function decimate(
  t: Float64Array,
  columns: readonly (Float32Array | null)[],
  xMin: number,
  xMax: number,
  buckets: number,
): Envelope {
  const first = Math.max(0, lowerBound(t, xMin) - 1);
  const last = Math.min(t.length - 1, lowerBound(t, xMax, true));
  const count = last - first + 1;
  const x: number[] = [];
  const hi: (number | null)[][] = columns.map(() => []);
  if (count <= 0) return { x, hi, lo: columns.map(() => []) };

  if (count <= buckets || xMax <= xMin) {
    for (let i = first; i <= last; i++) x.push(t[i] as number);
    columns.forEach((col, s) => {
      const out = hi[s] as (number | null)[];
      for (let i = first; i <= last; i++) out.push(col ? finiteOrNull(col[i] as number) : null);
    });
    return { x, hi, lo: hi };
  }

  const lo: (number | null)[][] = columns.map(() => []);
  const k = columns.length;
  const min = new Float64Array(k);
  const max = new Float64Array(k);
  const scale = buckets / (xMax - xMin);
  let bucket = NaN;

  const flush = (): void => {
    for (let s = 0; s < k; s++) {
      const empty = Number.isNaN(min[s] as number);
      (lo[s] as (number | null)[]).push(empty ? null : (min[s] as number));
      (hi[s] as (number | null)[]).push(empty ? null : (max[s] as number));
    }
  };

  for (let i = first; i <= last; i++) {
    const ti = t[i] as number;
    // Samples beyond the view's edges fall in buckets -1 and `buckets`, each flushed on its own.
    const b = Math.min(buckets, Math.max(-1, Math.floor((ti - xMin) * scale)));
    if (b !== bucket) {
      if (i > first) flush();
      bucket = b;
      x.push(ti);
      min.fill(NaN);
      max.fill(NaN);
    }
    for (let s = 0; s < k; s++) {
      const col = columns[s];
      if (!col) continue;
      const v = col[i] as number;
      if (Number.isNaN(v)) continue;
      // Also true while the bucket's min and max are still NaN (nothing seen yet).
      if (!(v >= (min[s] as number))) min[s] = v;
      if (!(v <= (max[s] as number))) max[s] = v;
    }
  }
  flush();
  return { x, hi, lo };
}

/** The largest finite value of the plotted series (0 when there is none). */
export function seriesMax(ys: readonly (readonly (number | null)[])[]): number {
  let max = 0;
  for (const y of ys) for (const v of y) if (v !== null && v > max) max = v;
  return max;
}
