// Screen-sized series for the chart: the samples in view, reduced to about two points per pixel
// column. Each column keeps its minimum and maximum in time order, so a short spike (the peak
// that matters in a memory chart) stays on screen however many samples share its pixel.

export interface PlotSeries {
  /** x values (unix seconds), shared by every series. */
  x: number[];
  /** One array per input column, aligned with `x`; null where a reader had nothing (a gap). */
  ys: (number | null)[][];
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
 * beyond each edge so lines run to the plot's borders, reduced to at most ~2 points per bucket.
 * A column given as null is all gaps.
 */
export function decimate(
  t: Float64Array,
  columns: readonly (Float32Array | null)[],
  xMin: number,
  xMax: number,
  buckets: number,
): PlotSeries {
  const first = Math.max(0, lowerBound(t, xMin) - 1);
  const last = Math.min(t.length - 1, lowerBound(t, xMax, true));
  const count = last - first + 1;
  const x: number[] = [];
  const ys: (number | null)[][] = columns.map(() => []);
  if (count <= 0) return { x, ys };

  if (count <= 2 * buckets || xMax <= xMin) {
    for (let i = first; i <= last; i++) x.push(t[i] as number);
    columns.forEach((col, s) => {
      const out = ys[s] as (number | null)[];
      for (let i = first; i <= last; i++) out.push(col ? finiteOrNull(col[i] as number) : null);
    });
    return { x, ys };
  }

  const k = columns.length;
  const lo = new Float64Array(k);
  const hi = new Float64Array(k);
  const loAt = new Int32Array(k);
  const hiAt = new Int32Array(k);
  const scale = buckets / (xMax - xMin);
  let bucket = NaN;
  let bucketFirst = first;

  const flush = (end: number): void => {
    const single = end === bucketFirst;
    x.push(t[bucketFirst] as number);
    if (!single) x.push(t[end] as number);
    for (let s = 0; s < k; s++) {
      const out = ys[s] as (number | null)[];
      if ((loAt[s] as number) < 0) {
        out.push(null);
        if (!single) out.push(null);
      } else if (single) {
        out.push(lo[s] as number);
      } else {
        const minFirst = (loAt[s] as number) <= (hiAt[s] as number);
        out.push(minFirst ? (lo[s] as number) : (hi[s] as number), minFirst ? (hi[s] as number) : (lo[s] as number));
      }
    }
  };

  for (let i = first; i <= last; i++) {
    // Samples beyond the view's edges fall in buckets -1 and `buckets`, each flushed on its own.
    const b = Math.min(buckets, Math.max(-1, Math.floor(((t[i] as number) - xMin) * scale)));
    if (b !== bucket) {
      if (i > first) flush(i - 1);
      bucket = b;
      bucketFirst = i;
      loAt.fill(-1);
      hiAt.fill(-1);
    }
    for (let s = 0; s < k; s++) {
      const col = columns[s];
      if (!col) continue;
      const v = col[i] as number;
      if (Number.isNaN(v)) continue;
      if (loAt[s] === -1) {
        lo[s] = hi[s] = v;
        loAt[s] = hiAt[s] = i;
      } else if (v < (lo[s] as number)) {
        lo[s] = v;
        loAt[s] = i;
      } else if (v > (hi[s] as number)) {
        hi[s] = v;
        hiAt[s] = i;
      }
    }
  }
  flush(last);
  return { x, ys };
}

/** The largest finite value of the plotted series (0 when there is none). */
export function seriesMax(ys: readonly (readonly (number | null)[])[]): number {
  let max = 0;
  for (const y of ys) for (const v of y) if (v !== null && v > max) max = v;
  return max;
}
