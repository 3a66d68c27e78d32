// The browser's half of the kernel contract: mirrors gpumem_widget/wire/protocol.py (trait
// contents) and ledger.CellRecord.to_wire(); packed tables are decoded by ./table. Change both
// sides together: js/test/fixtures are written by scripts/make_js_fixtures.py from the kernel's
// real output, and a pytest fails when they are out of date.
//
// Everything here validates what the model holds, because a malformed trait must cost one clear
// message in the header, never a broken view.

import {
  describe,
  field,
  isBool,
  isNumber,
  isNumberOrNull,
  isObject,
  isString,
  isStringOrNull,
  optional,
  ProtocolError,
} from "./json";
import type { CellUsageFigures } from "./cell_usage";
import { parseNotes, parsePhaseSpans, type CellNotes, type PhaseSpans } from "./notes";
import { decodeTable, TIME_COLUMN, type Column } from "./table";
import { parseWorkerRows, type WorkerCellUsage } from "./worker_rows";

export { ProtocolError, TIME_COLUMN };

/** gpumem_widget/wire/protocol.py PROTOCOL_VERSION: the shapes this frontend reads. The kernel
 * sends its own in `status.protocol`; a different one is named in the header (reinstall, then
 * reload the page). */
export const PROTOCOL_VERSION = 1;
export const HOST_RSS_COLUMN = "host/rss";
// allocated/reserved/active from the torch allocator; process_used (this kernel), others_used
// (every other process NVML lists) and device_used (the whole device) from NVML.
export const DEVICE_FIELDS = ["allocated", "reserved", "active", "process_used", "others_used", "device_used"] as const;
export type DeviceField = (typeof DEVICE_FIELDS)[number];

export function deviceColumn(device: number, field: DeviceField): string {
  return `cuda:${device}/${field}`;
}

/** Every synced trait of the model (wire/widget.py `GpuMemWidget`). The kernel writes them and
 * the browser only reads them, as `unknown`: each is validated by its parser before use. */
export type Traits = {
  devices: unknown; // parseDevices
  status: unknown; // parseStatus
  cells: unknown; // parseCells(joinCells(cells, cells_tail))
  cells_tail: unknown;
  cell_bands: unknown; // decodeBands
  ledger_extent: unknown; // parseExtent
  timeline_base: unknown; // decodeTable
  timeline_tail: unknown;
  drilldown: unknown; // ./drilldown parseDrilldown
  drilldown_alive: unknown; // ./drilldown parseAlive
  drilldown_view: unknown; // ./drilldown parseRangeView (a zoom, or another axis)
  drilldown_search: unknown; // ./drilldown parseSearch
  drilldown_compare: unknown; // ./drilldown parseCompare
  workers: unknown; // ./workers parseWorkers
};

// The custom messages the browser sends are declared in ./messages (sent with `sendToKernel`).
export type { BrowserMessage } from "./messages";


// ---------------------------------------------------------------------------------------------
// JSON traits

export interface DeviceInfo {
  index: number;
  name: string;
  uuid: string | null;
  total: number | null; // bytes
  nvml: boolean; // false when NVML could not be matched to this device
}

export interface ReaderState {
  ok: boolean;
  reason: string | null;
}

export interface SessionPeak {
  device: number;
  allocated: number;
  reserved: number;
}

/** One process NVML lists on a device. */
export interface ProcessUse {
  pid: number;
  used: number | null; // bytes; null where NVML reports N/A (containers, MIG)
  self: boolean; // this kernel
  name: string | null; // command line, short; null where it cannot be seen
}

export interface Status {
  protocol: number | null; // the kernel's PROTOCOL_VERSION; null before the first status
  mode: "cuda" | "host";
  sampler: "running" | "paused" | "stopped" | null; // null: no status published yet
  busy_interval: number | null;
  idle_interval: number | null;
  peak_mode: "exact" | "passive" | null;
  readers: Record<string, ReaderState>;
  error: string | null;
  running_cell: number | null;
  running_started: number | null; // unix seconds (kernel clock), null when idle
  running_phases: PhaseSpans | null; // the running cell's phase spans (module tracer on)
  session_peak: SessionPeak[];
  processes: Map<number, ProcessUse[]>; // by device index; absent where NVML has no list
  hints: string[]; // sentences for the user, e.g. a stray CUDA context on a device
  history: HistoryState | null; // the on-disk ledger (gpumem_widget/live/history/); null: not sent
}

/** Whether this kernel writes its ledger to disk, where, and why not. */
export interface HistoryState {
  on: boolean;
  path: string | null;
  reason: string | null; // why it is off
  message: string | null; // worth telling once, e.g. a corrupt file moved aside
}

export interface DeviceCellUsage extends CellUsageFigures {
  device: number;
  process_used_after: number | null;
  device_used_after: number | null;
  others_used_after: number | null; // every other process on this device (NVML)
  delta_reserved: number;
  outside_pytorch: number | null;
}

export interface CellRecord {
  execution_count: number;
  cell_id: string | null;
  source: string;
  started: number; // unix seconds
  duration: number; // seconds
  error: string | null; // exception type name when the cell raised
  oom: boolean;
  host_rss_before: number | null;
  host_rss_after: number | null;
  host_rss_peak: number | null; // sampled: a lower bound
  devices: DeviceCellUsage[];
  notes: CellNotes;
  workers?: WorkerCellUsage[]; // per worker process and device, when workers reported
  missing?: Record<string, string>; // figures a reader could not give for this cell, and why
}

export function parseDevices(raw: unknown): DeviceInfo[] {
  if (raw == null) return [];
  if (!Array.isArray(raw)) throw new ProtocolError(`devices: expected a list, got ${describe(raw)}`);
  return raw.map((d, i): DeviceInfo => {
    const what = `devices[${i}]`;
    if (!isObject(d)) throw new ProtocolError(`${what}: expected an object, got ${describe(d)}`);
    return {
      index: field(d, "index", what, isNumber, "a number"),
      name: optional(d, "name", isString, `cuda:${String(d["index"])}`),
      uuid: optional(d, "uuid", isStringOrNull, null),
      total: optional(d, "total", isNumberOrNull, null),
      nvml: optional(d, "nvml", isBool, false),
    };
  });
}

function oneOf<T extends string>(values: readonly T[]): (v: unknown) => v is T {
  return (v: unknown): v is T => typeof v === "string" && (values as readonly string[]).includes(v);
}

/** `devices` decides the mode when the kernel has not published a status yet. */
export function parseStatus(raw: unknown, devices: readonly DeviceInfo[]): Status {
  const s = isObject(raw) ? raw : {};
  const readers: Record<string, ReaderState> = {};
  const rawReaders = s["readers"];
  if (isObject(rawReaders)) {
    for (const [name, r] of Object.entries(rawReaders)) {
      if (!isObject(r)) continue;
      readers[name] = { ok: optional(r, "ok", isBool, false), reason: optional(r, "reason", isStringOrNull, null) };
    }
  }
  const peaks: SessionPeak[] = [];
  const rawPeaks = s["session_peak"];
  if (Array.isArray(rawPeaks)) {
    for (const p of rawPeaks) {
      if (isObject(p) && isNumber(p["device"]) && isNumber(p["allocated"]) && isNumber(p["reserved"])) {
        peaks.push({ device: p["device"], allocated: p["allocated"], reserved: p["reserved"] });
      }
    }
  }
  return {
    protocol: optional(s, "protocol", isNumberOrNull, null),
    mode: optional(s, "mode", oneOf(["cuda", "host"] as const), devices.length > 0 ? "cuda" : "host"),
    sampler: optional(s, "sampler", oneOf(["running", "paused", "stopped"] as const), null),
    busy_interval: optional(s, "busy_interval", isNumberOrNull, null),
    idle_interval: optional(s, "idle_interval", isNumberOrNull, null),
    peak_mode: optional(s, "peak_mode", oneOf(["exact", "passive"] as const), null),
    readers,
    error: optional(s, "error", isStringOrNull, null),
    running_cell: optional(s, "running_cell", isNumberOrNull, null),
    running_started: optional(s, "running_started", isNumberOrNull, null),
    running_phases: isObject(s["running_phases"]) ? parsePhaseSpans(s["running_phases"]) : null,
    session_peak: peaks,
    processes: parseProcesses(s["processes"]),
    hints: Array.isArray(s["hints"]) ? s["hints"].filter((h): h is string => typeof h === "string") : [],
    history: parseHistoryState(s["history"]),
  };
}

function parseHistoryState(raw: unknown): HistoryState | null {
  if (!isObject(raw)) return null;
  return {
    on: optional(raw, "on", isBool, false),
    path: optional(raw, "path", isStringOrNull, null),
    reason: optional(raw, "reason", isStringOrNull, null),
    message: optional(raw, "message", isStringOrNull, null),
  };
}

/** `{"<device>": [{pid, used, self, name}]}`; malformed entries are left out. */
function parseProcesses(raw: unknown): Map<number, ProcessUse[]> {
  const out = new Map<number, ProcessUse[]>();
  if (!isObject(raw)) return out;
  for (const [key, list] of Object.entries(raw)) {
    const device = Number(key);
    if (!Number.isInteger(device) || device < 0 || !Array.isArray(list)) continue;
    const procs: ProcessUse[] = [];
    for (const p of list) {
      if (!isObject(p) || !isNumber(p["pid"])) continue;
      procs.push({
        pid: p["pid"],
        used: optional(p, "used", isNumberOrNull, null),
        self: optional(p, "self", isBool, false),
        name: optional(p, "name", isStringOrNull, null),
      });
    }
    out.set(device, procs);
  }
  return out;
}

function parseDeviceUsage(d: unknown, what: string): DeviceCellUsage {
  if (!isObject(d)) throw new ProtocolError(`${what}: expected an object, got ${describe(d)}`);
  const n = (key: string): number => field(d, key, what, isNumber, "a number");
  const allocatedBefore = n("allocated_before");
  const allocatedAfter = n("allocated_after");
  const reservedBefore = n("reserved_before");
  const reservedAfter = n("reserved_after");
  const processUsed = optional(d, "process_used_after", isNumberOrNull, null);
  return {
    device: n("device"),
    allocated_before: allocatedBefore,
    allocated_after: allocatedAfter,
    reserved_before: reservedBefore,
    reserved_after: reservedAfter,
    peak_allocated: n("peak_allocated"),
    peak_reserved: n("peak_reserved"),
    peak_exact: optional(d, "peak_exact", isBool, true),
    alloc_retries: optional(d, "alloc_retries", isNumber, 0),
    ooms: optional(d, "ooms", isNumber, 0),
    process_used_after: processUsed,
    device_used_after: optional(d, "device_used_after", isNumberOrNull, null),
    others_used_after: optional(d, "others_used_after", isNumberOrNull, null),
    // The kernel sends the derived figures; recomputing them only covers an older kernel.
    delta_allocated: optional(d, "delta_allocated", isNumber, allocatedAfter - allocatedBefore),
    delta_reserved: optional(d, "delta_reserved", isNumber, reservedAfter - reservedBefore),
    outside_pytorch: optional(
      d,
      "outside_pytorch",
      isNumberOrNull,
      processUsed === null ? null : processUsed - reservedAfter,
    ),
  };
}

export function parseCell(c: unknown, what: string): CellRecord {
  if (!isObject(c)) throw new ProtocolError(`${what}: expected an object, got ${describe(c)}`);
  const devices = optional(c, "devices", Array.isArray, []);
  return {
    execution_count: field(c, "execution_count", what, isNumber, "a number"),
    cell_id: optional(c, "cell_id", isStringOrNull, null),
    source: optional(c, "source", isString, ""),
    started: field(c, "started", what, isNumber, "a number"),
    duration: field(c, "duration", what, isNumber, "a number"),
    error: optional(c, "error", isStringOrNull, null),
    oom: optional(c, "oom", isBool, false),
    host_rss_before: optional(c, "host_rss_before", isNumberOrNull, null),
    host_rss_after: optional(c, "host_rss_after", isNumberOrNull, null),
    host_rss_peak: optional(c, "host_rss_peak", isNumberOrNull, null),
    devices: devices.map((d, i) => parseDeviceUsage(d, `${what}.devices[${i}]`)),
    notes: parseNotes(c["notes"]),
    ...(c["workers"] !== undefined ? { workers: parseWorkerRows(c["workers"]) } : {}),
    missing: parseMissing(c["missing"]),
  };
}

/** `missing`: figure -> why; absent (an older kernel) or malformed entries are left out. */
function parseMissing(raw: unknown): Record<string, string> {
  if (!isObject(raw)) return {};
  return Object.fromEntries(Object.entries(raw).filter((e): e is [string, string] => isString(e[1])));
}

/** Every well-formed record, plus one message per malformed one (which is left out). */
export function parseCells(raw: unknown): { cells: CellRecord[]; problems: string[] } {
  if (raw == null) return { cells: [], problems: [] };
  if (!Array.isArray(raw)) return { cells: [], problems: [`cells: expected a list, got ${describe(raw)}`] };
  const cells: CellRecord[] = [];
  const problems: string[] = [];
  raw.forEach((c, i) => {
    try {
      cells.push(parseCell(c, `cells[${i}]`));
    } catch (e) {
      if (!(e instanceof ProtocolError)) throw e;
      problems.push(e.message);
    }
  });
  return { cells, problems };
}

/** `cells` and `cells_tail` arrive as one JSON text each (cheap for the kernel's per-cell hook to
 * send); from an older kernel, as lists. Text that does not parse is left as it is, for parseCells
 * to report. */
export function recordList(raw: unknown): unknown {
  if (typeof raw !== "string") return raw;
  try {
    return JSON.parse(raw) as unknown;
  } catch {
    return raw;
  }
}

/** `cells` (whole blocks of records) followed by `cells_tail` (the newest); a tail from an older
 * kernel that had none is simply absent. */
export function joinCells(rawBase: unknown, rawTail: unknown): unknown {
  const base = recordList(rawBase);
  const tail = recordList(rawTail);
  if (!Array.isArray(base) || tail == null) return base;
  return Array.isArray(tail) ? [...base, ...tail] : tail;
}

// ---------------------------------------------------------------------------------------------
// The ledger as a window: the kernel keeps every record; the widget carries the newest ones
// (`cells` + `cells_tail`), a compact band per cell (`cell_bands`), and says what it does not
// carry (`ledger_extent`). Older records come by page, on request (`cells_page` messages).

export interface LedgerExtent {
  total: number; // records in the kernel's ledger
  first: number; // the record index of cells[0]: this many older records are not carried
  bands_first: number; // the record index of cell_bands' first row
  epoch: number; // bumps when the ledger is cleared
}

/** `ledger_extent`; from a kernel that had none, the window is the whole ledger. */
export function parseExtent(raw: unknown, windowLength: number): LedgerExtent {
  if (raw == null || (isObject(raw) && Object.keys(raw).length === 0)) return { total: windowLength, first: 0, bands_first: 0, epoch: 0 };
  if (!isObject(raw)) throw new ProtocolError(`ledger_extent: expected an object, got ${describe(raw)}`);
  const index = (key: string): number => {
    const v = field(raw, key, "ledger_extent", isNumber, "a record index");
    if (!Number.isInteger(v) || v < 0) throw new ProtocolError(`ledger_extent.${key}: expected a record index, got ${describe(v)}`);
    return v;
  };
  const extent = { total: index("total"), first: index("first"), bands_first: index("bands_first"), epoch: index("epoch") };
  if (extent.first + windowLength !== extent.total) {
    throw new ProtocolError(`ledger_extent: ${extent.total} records, but the window holds ${windowLength} from record ${extent.first}`);
  }
  return extent;
}

export type Outcome = "ok" | "error" | "oom" | "interrupted";
const OUTCOMES: readonly Outcome[] = ["ok", "error", "oom", "interrupted"]; // the wire's codes 0..3

export function outcome(cell: Pick<CellRecord, "oom" | "error">): Outcome {
  if (cell.oom) return "oom";
  if (cell.error === "KeyboardInterrupt") return "interrupted";
  return cell.error !== null ? "error" : "ok";
}

/** What the chart needs of a cell to draw its band. */
export interface Band {
  execution_count: number;
  started: number; // unix seconds
  duration: number; // seconds
  outcome: Outcome;
}

export function bandOf(cell: CellRecord): Band {
  return { execution_count: cell.execution_count, started: cell.started, duration: cell.duration, outcome: outcome(cell) };
}

/** `cell_bands`: one band per row. */
export function decodeBands(raw: unknown): Band[] {
  const table = decodeTable(raw, "cell_bands");
  if (table.n === 0) return [];
  const col = (name: string): Column => {
    const c = table.columns.get(name);
    if (!c) throw new ProtocolError(`cell_bands: no "${name}" column`);
    return c;
  };
  const [t, duration, count, code] = [col(TIME_COLUMN), col("duration"), col("execution_count"), col("outcome")];
  const bands: Band[] = new Array<Band>(table.n);
  for (let i = 0; i < table.n; i++) {
    bands[i] = {
      execution_count: count[i] as number,
      started: t[i] as number,
      duration: duration[i] as number,
      outcome: OUTCOMES[code[i] as number] ?? "error",
    };
  }
  return bands;
}

export type CellsPage = { epoch: number; first: number; records: CellRecord[]; problems: string[] } | { error: string };

/** A `cells_page` reply; null for any other custom message. */
export function parseCellsPage(raw: unknown): CellsPage | null {
  if (!isObject(raw) || raw["type"] !== "cells_page") return null;
  if (isString(raw["error"])) return { error: raw["error"] };
  const epoch = field(raw, "epoch", "cells_page", isNumber, "a number");
  const first = field(raw, "first", "cells_page", isNumber, "a record index");
  const { cells, problems } = parseCells(raw["records"]);
  return { epoch, first, records: cells, problems };
}
