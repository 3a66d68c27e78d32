// What the chart bands, the ledger and the details panel say about one cell. The kernel sends
// per-device figures; for one device they are that device's, across all devices a cell's change
// is the sum and its peak the largest.

import { formatBytes, formatDelta, formatDuration, formatPercent, sourcePreview } from "../common/format";
import { estimateError, type PreviousRun } from "../wire/notes";
import { outcome, type CellRecord, type Outcome, type Status } from "../wire/protocol";

export { outcome, type Outcome };

export type Mode = Status["mode"];
/** The device the view shows: an index, or null for all of them. */
export type DeviceChoice = number | null;

export interface CellSummary {
  delta: number | null; // allocated (CUDA) or host RSS (host mode)
  peak: number | null;
  peakExact: boolean; // false: the peak is a lower bound
  deltaReserved: number | null; // CUDA only
}

export function summarize(cell: CellRecord, mode: Mode, device: DeviceChoice = null): CellSummary {
  if (mode === "host") {
    const { host_rss_before: before, host_rss_after: after } = cell;
    return {
      delta: before !== null && after !== null ? after - before : null,
      peak: cell.host_rss_peak,
      peakExact: false, // sampled
      deltaReserved: null,
    };
  }
  const usage = device === null ? cell.devices : cell.devices.filter((d) => d.device === device);
  if (usage.length === 0) return { delta: null, peak: null, peakExact: true, deltaReserved: null };
  let delta = 0;
  let deltaReserved = 0;
  let peak = -Infinity;
  let peakExact = true;
  for (const d of usage) {
    delta += d.delta_allocated;
    deltaReserved += d.delta_reserved;
    peak = Math.max(peak, d.peak_allocated);
    peakExact &&= d.peak_exact;
  }
  return { delta, peak, peakExact, deltaReserved };
}

export function outcomeLabel(cell: CellRecord): string {
  if (cell.oom) return "out of memory";
  if (cell.error === "KeyboardInterrupt") return "interrupted";
  return cell.error !== null ? `raised ${cell.error}` : "";
}

/** "≥ 3.20 GiB" for a lower bound. */
export function formatPeak(summary: CellSummary): string {
  const text = formatBytes(summary.peak);
  return summary.peak !== null && !summary.peakExact ? `\u2265 ${text}` : text;
}

export type SortKey = "execution_count" | "duration" | "delta" | "peak" | "delta_reserved";

function sortValue(cell: CellRecord, s: CellSummary, key: SortKey): number | null {
  switch (key) {
    case "execution_count":
      return cell.execution_count;
    case "duration":
      return cell.duration;
    case "delta":
      return s.delta;
    case "peak":
      return s.peak;
    case "delta_reserved":
      return s.deltaReserved;
  }
}

/** A sorted copy; cells without the figure go last either way, ties keep execution order. */
export function sortCells(cells: readonly CellRecord[], mode: Mode, key: SortKey, descending: boolean, device: DeviceChoice = null): CellRecord[] {
  const keyed = cells.map((cell) => ({ cell, v: sortValue(cell, summarize(cell, mode, device), key) }));
  keyed.sort((a, b) => {
    if (a.v === null || b.v === null) {
      if (a.v === b.v) return a.cell.execution_count - b.cell.execution_count;
      return a.v === null ? 1 : -1;
    }
    const order = descending ? b.v - a.v : a.v - b.v;
    return order !== 0 ? order : a.cell.execution_count - b.cell.execution_count;
  });
  return keyed.map((k) => k.cell);
}

export const TOOLTIP_SOURCE_LINES = 6;

/** The band's hover text, one string per line (shown as text, never parsed as HTML). */
export function tooltipLines(cell: CellRecord, mode: Mode, device: DeviceChoice = null): string[] {
  const s = summarize(cell, mode, device);
  const what = mode === "host" ? "RSS" : "allocated";
  const head = [`[${cell.execution_count}]`, formatDuration(cell.duration), outcomeLabel(cell), ...noteMarkers(cell).map((m) => m.text)].filter(Boolean);
  const figures = [`${mode === "cuda" && device !== null ? `cuda:${device} ` : ""}\u0394 ${what} ${formatDelta(s.delta)}`, `peak ${formatPeak(s)}`];
  if (mode === "cuda") figures.push(`\u0394 reserved ${formatDelta(s.deltaReserved)}`);
  return [head.join("  "), ...sourcePreview(cell.source, TOOLTIP_SOURCE_LINES, 80), figures.join("  \u00b7  ")];
}

/** The first line of code worth showing in a one-line ledger cell. */
export function firstCodeLine(source: string): string {
  for (const line of source.split(/\r?\n/)) {
    const trimmed = line.trim();
    if (trimmed !== "") return trimmed;
  }
  return "";
}

export interface NoteMarker {
  kind: "estimate" | "leak" | "history";
  text: string;
  title: string;
  warn: boolean; // worth the user's attention: an estimate off by more than its tolerance, a leak
}

/** The short markers a cell's notes put on its ledger row and its band's hover text. */
export function noteMarkers(cell: CellRecord): NoteMarker[] {
  const markers: NoteMarker[] = [];
  const est = cell.notes.estimate;
  if (est) {
    const c = est.comparison;
    markers.push({
      kind: "estimate",
      text: `est ${formatPercent(estimateError(c))}`,
      title: `Estimate ${formatBytes(c.predicted)}, measured ${formatBytes(c.measured)}: ${c.explanation}`,
      warn: !c.within_tolerance,
    });
  }
  const prev = cell.notes.history;
  if (prev?.regression) {
    markers.push({
      kind: "history",
      text: prev.change !== null ? `\u25b2 ${formatPercent(prev.change)} vs last run` : "\u25b2 vs last run",
      title: previousRunText(prev),
      warn: true,
    });
  }
  if (cell.notes.leaks.length > 0) {
    markers.push({ kind: "leak", text: "\u26a0 leak", title: cell.notes.leaks.map((h) => h.message).join("\n\n"), warn: true });
  }
  return markers;
}

/** "peak 3.40 GiB, last run 2.10 GiB (+61.9%, cell [12]): a regression (beyond +20% and 64.00 MiB)". */
export function previousRunText(prev: PreviousRun): string {
  const what = prev.metric === "host_rss" ? "host RSS peak" : "peak";
  const change = prev.change !== null ? `${formatPercent(prev.change)}, ` : "";
  const where = prev.previous_execution_count !== null ? `cell [${prev.previous_execution_count}]` : "the same source";
  const verdict = prev.regression
    ? `: a regression (beyond ${formatPercent(prev.threshold_ratio)} and ${formatBytes(prev.threshold_bytes)})`
    : "";
  return `${what} ${formatBytes(prev.peak)}, last run ${formatBytes(prev.previous_peak)} (${change}${where})${verdict}`;
}
