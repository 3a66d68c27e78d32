// The module tracer's phase spans on the live chart: where each cell's forward, backward,
// recompute and optimizer ran (a finished cell's from its record's notes.modules, the running
// cell's from the status), as thin coloured bars under the cell bands, with their tooltips.

import { formatClock, formatDuration } from "../common/format";
import { PHASES, type PhaseName, type PhaseSpan, type PhaseSpans } from "../wire/notes";

/** A span as drawn: its end resolved (an open span reaches `now`), with its cell. */
export interface DrawnSpan {
  cell: number;
  phase: PhaseName;
  start: number;
  end: number;
  span: PhaseSpan;
  phases: PhaseSpans;
}

/** Each cell's spans that overlap [min, max], in time order; an open span ends at `now`. */
export function spansIn(cells: ReadonlyArray<readonly [cell: number, phases: PhaseSpans]>, min: number, max: number, now: number): DrawnSpan[] {
  const out: DrawnSpan[] = [];
  for (const [cell, phases] of cells) {
    for (const span of phases.spans) {
      const end = span.end ?? Math.max(now, span.start);
      if (end < min || span.start > max) continue;
      out.push({ cell, phase: span.phase, start: span.start, end, span, phases });
    }
  }
  return out.sort((a, b) => a.start - b.start);
}

/** "forward 1.2 s (1000 spans) · backward 2.3 s (1000) · optimizer 0.41 s (1000)". */
export function phaseTotals(phases: PhaseSpans): string {
  return PHASES.filter((p) => phases.counts[p])
    .map((p) => {
      const n = phases.counts[p] ?? 0;
      return `${p} ${formatDuration(phases.seconds[p] ?? 0)} (${n} ${n === 1 ? "span" : "spans"})`;
    })
    .join(" \u00b7 ");
}

/** The tooltip of one span: what it is, when, and the cell's totals. */
export function spanTooltip(d: DrawnSpan): string[] {
  const { span } = d;
  const when = `${formatClock(d.start, "tenths")}\u2013${span.end === null ? "now" : formatClock(d.end, "tenths")}`;
  const head =
    span.merged > 1
      ? `[${d.cell}] ${span.merged} phase spans merged, mostly ${span.phase}`
      : `[${d.cell}] ${span.phase} ${formatDuration(d.end - d.start)}${span.end === null ? " so far" : ""}`;
  const lines = [head, when];
  if (span.merged > 1) {
    lines.push(
      PHASES.filter((p) => span.seconds[p])
        .map((p) => `${p} ${formatDuration(span.seconds[p] ?? 0)}`)
        .join(" \u00b7 "),
    );
  }
  const totals = phaseTotals(d.phases);
  lines.push(`cell [${d.cell}]: ${totals || "no phase finished yet"}`);
  return lines;
}
