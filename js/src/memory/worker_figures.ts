// A cell's per-rank figures in its details: each worker's change, peaks and host RSS over the
// cell, as the workers reported them (the Workers tab shows the workers themselves).

import { tableCell } from "../common/dom";
import { formatBytes, formatDelta } from "../common/format";
import type { WorkerCellUsage } from "../wire/worker_rows";

/** A cell's per-rank figures for its details (none: nothing). */
export function workerSection(rows: readonly WorkerCellUsage[] | undefined): HTMLElement[] {
  if (!rows || rows.length === 0) return [];
  const section = document.createElement("div");
  section.className = "gpumem-details-workers";
  const title = document.createElement("h4");
  title.textContent = `Workers (${new Set(rows.map((r) => `${r.host}:${r.pid}`)).size})`;
  const table = document.createElement("table");
  const head = document.createElement("tr");
  for (const h of ["host", "rank", "device", "allocated", "peak allocated", "peak reserved", "host RSS", "state"]) {
    const th = document.createElement("th");
    th.scope = "col";
    th.textContent = h;
    head.append(th);
  }
  table.append(head);
  for (const r of rows) {
    const tr = document.createElement("tr");
    tr.dataset["rank"] = String(r.rank ?? "");
    const peak = (v: number): string => (r.peak_exact ? formatBytes(v) : `\u2265 ${formatBytes(v)}`);
    const gpu = r.device !== null;
    const rss =
      r.rss_after !== null
        ? `${formatBytes(r.rss_after)}${r.rss_peak !== null ? `, peak \u2265 ${formatBytes(r.rss_peak)}` : ""}`
        : "n/a";
    const state = [r.state, r.ooms > 0 ? `${r.ooms} OOM` : "", r.final ? "" : "last sample"].filter(Boolean).join(", ");
    tr.append(
      tableCell(r.host),
      tableCell(r.rank !== null ? String(r.rank) : `pid ${r.pid}`, undefined, `pid ${r.pid}`),
      tableCell(gpu ? `cuda:${r.device}` : "host"),
      tableCell(gpu ? `${formatBytes(r.allocated_before)} \u2192 ${formatBytes(r.allocated_after)} (${formatDelta(r.delta_allocated)})` : ""),
      tableCell(gpu ? peak(r.peak_allocated) : "", undefined, r.peak_exact ? undefined : "a lower bound: the worker's counters were not reset at the cell's start"),
      tableCell(gpu ? peak(r.peak_reserved) : ""),
      tableCell(rss),
      tableCell(state, r.ooms > 0 ? "gpumem-details-problem" : undefined, r.final ? undefined : "the worker did not answer the cell's end in time: its last sample"),
    );
    table.append(tr);
  }
  section.append(title, table);
  return [section];
}
