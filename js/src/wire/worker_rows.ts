// A ledger row's per-rank figures (`workers`): mirrors gpumem_widget/live/workers.py
// (WorkerCellUsage). The shared readers of the Workers view (./workers) live here too. No
// counterpart in gpumem_widget/wire/: the kernel's side is that dataclass's `to_wire()`, in the
// live layer that fills it, and a ledger row carries it untyped (`Cell.workers`).

import type { CellUsageFigures } from "./cell_usage";
import { ProtocolError } from "./json";

export type WorkerState = "live" | "exited" | "gone";
const STATES: readonly WorkerState[] = ["live", "exited", "gone"];

/** One worker process's memory across one cell (a ledger row's `workers`). */
export interface WorkerCellUsage extends CellUsageFigures {
  rank: number | null;
  local_rank: number | null;
  host: string;
  pid: number;
  state: WorkerState;
  final: boolean; // the worker's own figures at the cell's end; false: its last sample
  device: number | null; // null: a worker without CUDA (host memory only)
  uuid: string | null;
  rss_before: number | null;
  rss_after: number | null;
  rss_peak: number | null;
}

export type Obj = Record<string, unknown>;
export const isObj = (v: unknown): v is Obj => typeof v === "object" && v !== null && !Array.isArray(v);
export const isNum = (v: unknown): v is number => typeof v === "number" && Number.isFinite(v);

export function num(o: Obj, key: string, what: string): number {
  const v = o[key];
  if (!isNum(v)) throw new ProtocolError(`${what}.${key}: expected a number`);
  return v;
}

export function numOrNull(o: Obj, key: string, what: string): number | null {
  const v = o[key];
  if (v === null || v === undefined) return null;
  if (!isNum(v)) throw new ProtocolError(`${what}.${key}: expected a number or null`);
  return v;
}

export function str(o: Obj, key: string, what: string): string {
  const v = o[key];
  if (typeof v !== "string") throw new ProtocolError(`${what}.${key}: expected a string`);
  return v;
}

export function strOrNull(o: Obj, key: string, what: string): string | null {
  const v = o[key];
  if (v === null || v === undefined) return null;
  if (typeof v !== "string") throw new ProtocolError(`${what}.${key}: expected a string or null`);
  return v;
}

export function state(o: Obj, what: string): WorkerState {
  const v = o["state"];
  if (!STATES.includes(v as WorkerState)) throw new ProtocolError(`${what}.state: unknown ${String(v)}`);
  return v as WorkerState;
}

/** A ledger row's `workers` (absent: none); malformed rows are left out. */
export function parseWorkerRows(raw: unknown): WorkerCellUsage[] {
  if (!Array.isArray(raw)) return [];
  const out: WorkerCellUsage[] = [];
  raw.forEach((r, i) => {
    const what = `workers[${i}]`;
    if (!isObj(r)) return;
    try {
      const allocatedBefore = num(r, "allocated_before", what);
      const allocatedAfter = num(r, "allocated_after", what);
      out.push({
        rank: numOrNull(r, "rank", what),
        local_rank: numOrNull(r, "local_rank", what),
        host: str(r, "host", what),
        pid: num(r, "pid", what),
        state: state(r, what),
        final: r["final"] === true,
        device: numOrNull(r, "device", what),
        uuid: strOrNull(r, "uuid", what),
        allocated_before: allocatedBefore,
        allocated_after: allocatedAfter,
        reserved_before: num(r, "reserved_before", what),
        reserved_after: num(r, "reserved_after", what),
        peak_allocated: num(r, "peak_allocated", what),
        peak_reserved: num(r, "peak_reserved", what),
        peak_exact: r["peak_exact"] !== false,
        alloc_retries: numOrNull(r, "alloc_retries", what) ?? 0,
        ooms: numOrNull(r, "ooms", what) ?? 0,
        rss_before: numOrNull(r, "rss_before", what),
        rss_after: numOrNull(r, "rss_after", what),
        rss_peak: numOrNull(r, "rss_peak", what),
        delta_allocated: numOrNull(r, "delta_allocated", what) ?? allocatedAfter - allocatedBefore,
      });
    } catch (e) {
      if (!(e instanceof ProtocolError)) throw e;
    }
  });
  return out;
}
