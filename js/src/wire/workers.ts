// The `workers` trait, typed: mirrors gpumem_widget/wire/workers.py. A malformed rank is left out
// and counted; a malformed trait as a whole is a ProtocolError (the header says why).

import { ProtocolError } from "./json";
import { decodeTable, TIME_COLUMN, type Column } from "./table";
import { isNum, isObj, num, numOrNull, state, str, strOrNull, type WorkerState } from "./worker_rows";

export type { WorkerCellUsage, WorkerState } from "./worker_rows";

export const SERIES_COLUMNS = [TIME_COLUMN, "allocated", "reserved", "rss"] as const;

export interface WorkerDevice {
  index: number;
  uuid: string | null;
  allocated: number;
  reserved: number;
  peak_allocated: number;
  peak_reserved: number;
  nvml_used: number | null;
}

export interface WorkerOom {
  device: number;
  requested: number; // 0 where only the allocator's OOM counter saw it
  limit: number;
  free: number;
  allocated: number;
  reserved: number;
}

export interface WorkerSeries {
  n: number;
  t: Column;
  allocated: Column;
  reserved: Column;
  rss: Column;
}

export interface RankInfo {
  key: string; // host:pid
  label: string;
  rank: number | null;
  local_rank: number | null;
  world_size: number | null;
  host: string;
  pid: number;
  state: WorkerState;
  last_seen: number; // unix seconds
  errors: number;
  rss: number | null;
  devices: WorkerDevice[];
  oom: WorkerOom | null;
  snapshots: string[];
  series: WorkerSeries;
}

export interface WorkersState {
  address: string | null;
  received: number;
  accepted: number;
  dropped: Record<string, number>;
  ranks: RankInfo[];
  problems: string[]; // ranks left out, and why
}

export const NO_WORKERS: WorkersState = { address: null, received: 0, accepted: 0, dropped: {}, ranks: [], problems: [] };

function parseSeries(raw: unknown, what: string): WorkerSeries {
  const table = decodeTable(raw, `${what}.series`);
  const col = (name: string): Column => {
    const c = table.columns.get(name);
    if (!c) {
      if (table.n === 0) return new Float64Array(0);
      throw new ProtocolError(`${what}.series: no "${name}" column`);
    }
    return c;
  };
  return { n: table.n, t: col(TIME_COLUMN), allocated: col("allocated"), reserved: col("reserved"), rss: col("rss") };
}

function parseRank(raw: unknown, what: string): RankInfo {
  if (!isObj(raw)) throw new ProtocolError(`${what}: expected an object`);
  const devices = Array.isArray(raw["devices"]) ? raw["devices"] : [];
  const oom = raw["oom"];
  return {
    key: str(raw, "key", what),
    label: str(raw, "label", what),
    rank: numOrNull(raw, "rank", what),
    local_rank: numOrNull(raw, "local_rank", what),
    world_size: numOrNull(raw, "world_size", what),
    host: str(raw, "host", what),
    pid: num(raw, "pid", what),
    state: state(raw, what),
    last_seen: num(raw, "last_seen", what),
    errors: numOrNull(raw, "errors", what) ?? 0,
    rss: numOrNull(raw, "rss", what),
    devices: devices.map((d, i) => {
      const w = `${what}.devices[${i}]`;
      if (!isObj(d)) throw new ProtocolError(`${w}: expected an object`);
      return {
        index: num(d, "index", w),
        uuid: strOrNull(d, "uuid", w),
        allocated: num(d, "allocated", w),
        reserved: num(d, "reserved", w),
        peak_allocated: num(d, "peak_allocated", w),
        peak_reserved: num(d, "peak_reserved", w),
        nvml_used: numOrNull(d, "nvml_used", w),
      };
    }),
    oom: isObj(oom)
      ? {
          device: num(oom, "device", `${what}.oom`),
          requested: num(oom, "requested", `${what}.oom`),
          limit: num(oom, "limit", `${what}.oom`),
          free: num(oom, "free", `${what}.oom`),
          allocated: num(oom, "allocated", `${what}.oom`),
          reserved: num(oom, "reserved", `${what}.oom`),
        }
      : null,
    snapshots: Array.isArray(raw["snapshots"]) ? raw["snapshots"].filter((p): p is string => typeof p === "string") : [],
    series: parseSeries(raw["series"], what),
  };
}

/** The `workers` trait; `{}` (no listener yet) is no workers. */
export function parseWorkers(raw: unknown): WorkersState {
  if (raw === undefined || raw === null || (isObj(raw) && Object.keys(raw).length === 0)) return NO_WORKERS;
  if (!isObj(raw)) throw new ProtocolError("workers: expected an object");
  const ranks: RankInfo[] = [];
  const problems: string[] = [];
  const list = Array.isArray(raw["ranks"]) ? raw["ranks"] : [];
  list.forEach((r, i) => {
    try {
      ranks.push(parseRank(r, `workers.ranks[${i}]`));
    } catch (e) {
      if (!(e instanceof ProtocolError)) throw e;
      problems.push(e.message);
    }
  });
  const dropped: Record<string, number> = {};
  if (isObj(raw["dropped"])) for (const [k, v] of Object.entries(raw["dropped"])) if (isNum(v)) dropped[k] = v;
  return {
    address: typeof raw["address"] === "string" ? raw["address"] : null,
    received: isNum(raw["received"]) ? raw["received"] : 0,
    accepted: isNum(raw["accepted"]) ? raw["accepted"] : 0,
    dropped,
    ranks,
    problems,
  };
}

