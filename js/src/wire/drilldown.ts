// Decodes the Snapshot tab's traits (`drilldown`, `drilldown_alive`, ...; the alive answer's
// module tree in ./module_tree): mirrors gpumem_widget/wire/drilldown.py. The kernel reduced
// everything to screen size already; this only checks shapes and reads the tables (through
// ./table, as float64). Any malformed part raises ProtocolError, which the panel shows instead
// of drawing.

import { describe, field, isArray, isBool, isNumber, isNumberOrNull, isObject, isString, isStringOrNull, optional, ProtocolError, type Json } from "./json";
import { parseModuleTree, type ModuleTree } from "./module_tree";
import { column, decodeF64Columns } from "./table";

/** A series' column at each screen column's lowest instant: its name and this suffix. */
export const FLOOR = "_floor";

const isObj = (v: unknown): v is Json => isObject(v);

export interface Series {
  column: string;
  label: string;
  detail: string; // file:line, or the same as label
  peak: number; // exact, from the replay; for the summed rest, its highest on screen
  values: Float64Array; // at each column's highest instant (the column's peak)
  floor: Float64Array | null; // at each column's lowest instant (its floor); null: not computed
  summed?: boolean; // the sites not shown one by one, summed ("other")
}

export interface Oom {
  t: number; // position on the view's x axis
  event: number;
  time: number | null; // unix seconds
  requested: number;
  deviceFree: number;
  tag: string;
  cell: number | null;
}

export interface Idle {
  x: number;
  width: number;
  seconds: number;
}

/** A stacked view over an x axis (event order or wall-clock): active memory by site, or by
 * category. Each column is shown as its range: at its highest instant (the trace entry in
 * `event`; `values`, `total`) and at its lowest (`floor`, `min`). */
export interface Stacked {
  axis: "event" | "time";
  unit: "s" | "entry";
  t0: number;
  t1: number;
  t: Float64Array; // column start positions
  event: Float64Array; // the entry each column shows (its peak): what a click on it asks about
  time: Float64Array | null; // unix seconds of that entry
  total: Float64Array; // active at each column's highest instant
  min: Float64Array | null; // active at each column's lowest instant
  reserved: Float64Array | null;
  reservedMax: Float64Array | null;
  reservedMin: Float64Array | null;
  series: Series[]; // bottom first
  peak: { bytes: number; t: number | null; event: number; time: number | null };
  peakReserved: number;
  entries: number;
  allocations: number;
  overflowed: boolean;
  warnings: string[];
  idle: Idle[];
  ooms: Oom[];
}

function parseStacked(raw: unknown, what: string, withOther: boolean): Stacked {
  if (!isObject(raw)) throw new ProtocolError(`${what}: expected a view, got ${describe(raw)}`);
  const { columns } = decodeF64Columns(raw["table"], `${what}.table`);
  const groups = field(raw, "groups", what, isArray, "a list");
  // Floors computed: a series without its floor column never moved within a column.
  const ranged = optional(raw, "ranged", isBool, false);
  const floorOf = (col: string, values: Float64Array): Float64Array | null => columns.get(`${col}${FLOOR}`) ?? (ranged ? values : null);
  const series: Series[] = groups.map((g, i) => {
    if (!isObject(g)) throw new ProtocolError(`${what}.groups[${i}]: expected an object`);
    const col = field(g, "column", `${what}.groups[${i}]`, isString, "a column name");
    const label = field(g, "label", `${what}.groups[${i}]`, isString, "a label");
    const file = optional(g, "filename", isStringOrNull, null);
    const line = optional(g, "line", isNumberOrNull, null);
    const values = column(columns, col, what);
    const s: Series = { column: col, label, detail: file ? `${file}:${line ?? "?"}` : label, peak: optional(g, "peak_bytes", isNumber, 0), values, floor: floorOf(col, values) };
    if (g["summed"] === true) s.summed = true;
    return s;
  });
  if (withOther && columns.has("other")) {
    const values = column(columns, "other", what);
    series.push({ column: "other", label: "other", detail: "every smaller site, summed", peak: values.reduce((a, b) => Math.max(a, b), 0), values, floor: floorOf("other", values), summed: true });
  }
  const peak = field(raw, "peak", what, isObj, "an object");
  const ooms = optional(raw, "ooms", isArray, []);
  const total = column(columns, "total", what);
  return {
    axis: raw["axis"] === "time" ? "time" : "event",
    unit: raw["x_unit"] === "entry" ? "entry" : "s",
    t0: field(raw, "t0", what, isNumber, "a time"),
    t1: field(raw, "t1", what, isNumber, "a time"),
    t: column(columns, "t", what),
    event: columns.get("event") ?? new Float64Array(total.length).fill(-1),
    time: columns.get("time") ?? null,
    total,
    min: columns.get("min") ?? null,
    reserved: columns.get("reserved") ?? null,
    reservedMax: columns.get("reserved_max") ?? null,
    reservedMin: columns.get("reserved_min") ?? null,
    series,
    peak: {
      bytes: optional(peak, "bytes", isNumber, 0),
      t: optional(peak, "t", isNumberOrNull, null),
      event: optional(peak, "event", isNumber, -1),
      time: optional(peak, "time", isNumberOrNull, null),
    },
    peakReserved: optional(raw, "peak_reserved", isNumber, 0),
    entries: optional(raw, "entries", isNumber, 0),
    allocations: optional(raw, "allocations", isNumber, 0),
    overflowed: raw["overflowed"] === true,
    warnings: optional(raw, "warnings", isArray, []).filter(isString),
    idle: optional(raw, "idle", isArray, [])
      .filter(isObj)
      .map((g) => ({ x: optional(g, "x", isNumber, 0), width: optional(g, "width", isNumber, 0), seconds: optional(g, "seconds", isNumber, 0) })),
    ooms: ooms.filter(isObj).map((o) => ({
      t: optional(o, "t", isNumber, 0),
      event: optional(o, "event", isNumber, -1),
      time: optional(o, "time", isNumberOrNull, null),
      requested: optional(o, "requested", isNumber, 0),
      deviceFree: optional(o, "device_free", isNumber, 0),
      tag: optional(o, "tag", isString, ""),
      cell: optional(o, "cell", isNumberOrNull, null),
    })),
  };
}

/** Active memory by module (`snapshot/views/modules.py`): modules at one level of the module
 * tree, then what no module holds. `traced`: the module tracer wrote the tags; `reason` says why
 * there is no module where there is none; `reading` is the peak in one line. */
export interface ModulesStacked extends Stacked {
  traced: boolean;
  reason: string | null;
  reading: string | null;
  level: number;
  kinds: string[]; // each series': module, phase, no_module, untagged, metadata, before_recording
}

function parseModules(raw: unknown, what: string): ModulesStacked | null {
  if (raw === undefined || raw === null) return null; // a kernel before the view existed
  const r = raw as Json;
  const groups = field(r, "groups", what, isArray, "a list");
  return {
    ...parseStacked(raw, what, false),
    traced: r["traced"] === true,
    reason: optional(r, "reason", isStringOrNull, null),
    reading: optional(r, "reading", isStringOrNull, null),
    level: optional(r, "level", isNumber, 0),
    kinds: groups.map((g) => (isObject(g) ? optional(g, "kind", isString, "module") : "module")),
  };
}

export interface Band {
  executionCount: number;
  x0: number;
  x1: number;
}

function parseBands(raw: unknown): Band[] {
  return (isArray(raw) ? raw : []).filter(isObj).map((b) => ({
    executionCount: optional(b, "execution_count", isNumber, 0),
    x0: optional(b, "x0", isNumber, 0),
    x1: optional(b, "x1", isNumber, 0),
  }));
}

/** A zoomed range or another x axis, re-aggregated in the kernel (`drilldown_view`). */
export interface RangeView {
  id: number | null;
  device: number;
  axis: "event" | "time";
  sites: Stacked;
  categories: Stacked;
  modules: ModulesStacked | null;
  bands: Band[];
}

export function parseRangeView(raw: unknown): RangeView | null {
  if (raw == null || (isObject(raw) && Object.keys(raw).length === 0)) return null;
  if (!isObject(raw)) throw new ProtocolError(`drilldown_view: expected an object, got ${describe(raw)}`);
  return {
    id: optional(raw, "id", isNumberOrNull, null),
    device: field(raw, "device", "drilldown_view", isNumber, "a device index"),
    axis: raw["axis"] === "time" ? "time" : "event",
    sites: parseStacked(raw["sites"], "drilldown_view.sites", true),
    categories: parseStacked(raw["categories"], "drilldown_view.categories", false),
    modules: parseModules(raw["modules"], "drilldown_view.modules"),
    bands: parseBands(raw["bands"]),
  };
}

export interface SearchAllocation {
  addr: number;
  size: number;
  site: string;
  stack: string[];
  startEvent: number;
  endEvent: number;
}

export type SearchAnswer =
  | { kind: "none" }
  | { kind: "error"; query: string; message: string }
  | { kind: "ready"; device: number; query: string; by: string; matches: number; bytesAllocated: number; peakBytes: number; frames: string[]; allocations: SearchAllocation[]; axis: "event" | "time"; t: Float64Array; matched: Float64Array };

export function parseSearch(raw: unknown): SearchAnswer {
  if (raw == null || (isObject(raw) && Object.keys(raw).length === 0)) return { kind: "none" };
  if (!isObject(raw)) throw new ProtocolError(`drilldown_search: expected an object, got ${describe(raw)}`);
  const query = optional(raw, "query", isString, "");
  if (isString(raw["error"])) return { kind: "error", query, message: raw["error"] };
  const { columns } = decodeF64Columns(raw["table"], "drilldown_search.table");
  return {
    kind: "ready",
    device: field(raw, "device", "drilldown_search", isNumber, "a device index"),
    query,
    by: optional(raw, "kind", isString, "frame"),
    matches: optional(raw, "matches", isNumber, 0),
    bytesAllocated: optional(raw, "bytes_allocated", isNumber, 0),
    peakBytes: optional(raw, "peak_bytes", isNumber, 0),
    frames: optional(raw, "frames", isArray, []).filter(isString),
    allocations: optional(raw, "allocations", isArray, [])
      .filter(isObj)
      .map((a) => ({
        addr: optional(a, "addr", isNumber, 0),
        size: optional(a, "size", isNumber, 0),
        site: optional(a, "site", isString, "?"),
        stack: optional(a, "stack", isArray, []).filter(isString),
        startEvent: optional(a, "start_event", isNumber, -1),
        endEvent: optional(a, "end_event", isNumber, -1),
      })),
    axis: raw["axis"] === "time" ? "time" : "event",
    t: column(columns, "t", "drilldown_search"),
    matched: column(columns, "matched", "drilldown_search"),
  };
}

export interface CompareRow {
  label: string;
  a: number;
  b: number;
  delta: number;
}

export interface CompareSide {
  device: number;
  entries: number;
  peakBytes: number;
  peakReserved: number;
}

export interface Compare {
  labels: [string, string];
  unit: "s" | "entry";
  a: CompareSide;
  b: CompareSide;
  peakDelta: number;
  bySite: CompareRow[];
  byCategory: CompareRow[];
  t0: number;
  t1: number;
  t: Float64Array;
  aActive: Float64Array;
  aReserved: Float64Array;
  bActive: Float64Array;
  bReserved: Float64Array;
}

function compareRows(raw: unknown): CompareRow[] {
  return (isArray(raw) ? raw : []).filter(isObj).map((r) => ({ label: optional(r, "label", isString, "?"), a: optional(r, "a", isNumber, 0), b: optional(r, "b", isNumber, 0), delta: optional(r, "delta", isNumber, 0) }));
}

function compareSide(raw: unknown): CompareSide {
  const o = isObject(raw) ? raw : {};
  return { device: optional(o, "device", isNumber, 0), entries: optional(o, "entries", isNumber, 0), peakBytes: optional(o, "peak_bytes", isNumber, 0), peakReserved: optional(o, "peak_reserved", isNumber, 0) };
}

export function parseCompare(raw: unknown): Compare | null {
  if (raw == null || (isObject(raw) && Object.keys(raw).length === 0)) return null;
  if (!isObject(raw)) throw new ProtocolError(`drilldown_compare: expected an object, got ${describe(raw)}`);
  const { columns } = decodeF64Columns(raw["table"], "drilldown_compare.table");
  const labels = optional(raw, "labels", isArray, []).filter(isString);
  const what = "drilldown_compare";
  return {
    labels: [labels[0] ?? "A", labels[1] ?? "B"],
    unit: raw["x_unit"] === "s" ? "s" : "entry",
    a: compareSide(raw["a"]),
    b: compareSide(raw["b"]),
    peakDelta: optional(raw, "peak_delta", isNumber, 0),
    bySite: compareRows(raw["by_site"]),
    byCategory: compareRows(raw["by_category"]),
    t0: optional(raw, "t0", isNumber, 0),
    t1: optional(raw, "t1", isNumber, 1),
    t: column(columns, "t", what),
    aActive: column(columns, "a_active", what),
    aReserved: column(columns, "a_reserved", what),
    bActive: column(columns, "b_active", what),
    bReserved: column(columns, "b_reserved", what),
  };
}

export interface SiteBytes {
  label: string;
  bytes: number;
}

export interface CellSlice {
  execution_count: number;
  start: number;
  end: number;
  active_before: number;
  active_after: number;
  peak_bytes: number;
  peak_t: number | null;
  allocated_bytes: number;
  freed_bytes: number;
  left_behind_bytes: number;
  top_at_peak: SiteBytes[];
  tagged_alive_bytes: number | null; // by tag: what it allocated that is still alive at the snapshot
}

function siteBytes(raw: unknown): SiteBytes[] {
  return (isArray(raw) ? raw : []).filter(isObj).map((s) => ({ label: optional(s, "label", isString, "?"), bytes: optional(s, "bytes", isNumber, 0) }));
}

function parseCellSlice(raw: unknown, what: string): CellSlice {
  if (!isObject(raw)) throw new ProtocolError(`${what}: expected an object`);
  const num = (key: string): number => field(raw, key, what, isNumber, "a number");
  const tagged = raw["tagged"];
  return {
    execution_count: num("execution_count"),
    start: num("start"),
    end: num("end"),
    active_before: num("active_before"),
    active_after: num("active_after"),
    peak_bytes: num("peak_bytes"),
    peak_t: optional(raw, "peak_t", isNumberOrNull, null),
    allocated_bytes: num("allocated_bytes"),
    freed_bytes: num("freed_bytes"),
    left_behind_bytes: num("left_behind_bytes"),
    top_at_peak: siteBytes(raw["top_at_peak"]),
    tagged_alive_bytes: isObject(tagged) ? optional(tagged, "alive_at_snapshot_bytes", isNumber, 0) : null,
  };
}

/** Reserved (cached segments) beside active (live blocks): the figures the summary states; the
 * chart draws reserved from the stacked view's own columns. */
export interface ReservedOverTime {
  peakReserved: number;
  largestGap: number; // the most reserved beyond active at any instant
}

function parseReserved(raw: unknown, what: string): ReservedOverTime | null {
  if (raw === undefined || raw === null) return null; // a kernel that does not send it
  if (!isObject(raw)) throw new ProtocolError(`${what}: expected a view, got ${describe(raw)}`);
  const gap = raw["largest_gap"];
  return {
    peakReserved: field(raw, "peak_reserved", what, isNumber, "bytes"),
    largestGap: isObject(gap) ? optional(gap, "bytes", isNumber, 0) : 0,
  };
}

export interface DeviceOverview {
  device: number;
  sites: Stacked;
  categories: Stacked | null; // null while the kernel is still computing it (a partial overview)
  modules: ModulesStacked | null; // as categories
  reserved: ReservedOverTime | null;
  atPeak: SiteBytes[]; // bytes per category at the peak
  cells: CellSlice[];
  bands: Band[]; // each cell's span on the event axis
}

export interface Overview {
  source: string;
  takenAt: number | null;
  cellsBy: string;
  devices: DeviceOverview[];
  partial: boolean; // the first view only: categories, reserved and per-cell slices follow
  preview: boolean; // drawn before the stacks were read: one series, every allocation
}

/** A file being converted in the kernel's child process: stage "reading" (fraction of the file
 * read), "converting", "writing", "mapping". */
export interface Loading {
  source: string;
  stage: string;
  fraction: number | null;
}

export type DrilldownState =
  | { kind: "empty" }
  | { kind: "pending"; source: string }
  | { kind: "loading"; loading: Loading }
  | { kind: "ready"; overview: Overview };

export function parseDrilldown(raw: unknown): DrilldownState {
  if (raw == null || (isObject(raw) && Object.keys(raw).length === 0)) return { kind: "empty" };
  if (!isObject(raw)) throw new ProtocolError(`drilldown: expected an object, got ${describe(raw)}`);
  if (isString(raw["pending"])) return { kind: "pending", source: raw["pending"] };
  if (isString(raw["loading"])) {
    const fraction = optional(raw, "fraction", isNumberOrNull, null);
    return {
      kind: "loading",
      loading: { source: raw["loading"], stage: optional(raw, "stage", isString, "reading"), fraction: fraction === null ? null : Math.min(1, Math.max(0, fraction)) },
    };
  }
  const devices = field(raw, "devices", "drilldown", isArray, "a list").map((d, i): DeviceOverview => {
    const what = `drilldown.devices[${i}]`;
    if (!isObject(d)) throw new ProtocolError(`${what}: expected an object`);
    const cats = d["categories"];
    const atPeak = isObject(cats) && isObject(cats["at_peak"]) ? cats["at_peak"] : {};
    const cells = isObject(d["cells"]) ? optional(d["cells"], "cells", isArray, []) : [];
    return {
      device: field(d, "device", what, isNumber, "a device index"),
      sites: parseStacked(d["active"], `${what}.active`, true),
      categories: cats === undefined ? null : parseStacked(cats, `${what}.categories`, false),
      modules: parseModules(d["modules"], `${what}.modules`),
      reserved: parseReserved(d["reserved"], `${what}.reserved`),
      atPeak: Object.entries(atPeak)
        .filter((e): e is [string, number] => isNumber(e[1]))
        .map(([label, bytes]) => ({ label, bytes })),
      cells: cells.map((c, k) => parseCellSlice(c, `${what}.cells[${k}]`)),
      bands: parseBands(d["bands"]),
    };
  });
  return {
    kind: "ready",
    overview: {
      source: optional(raw, "source", isString, "snapshot"),
      takenAt: optional(raw, "taken_at", isNumberOrNull, null),
      cellsBy: optional(raw, "cells_by", isString, "none"),
      devices,
      partial: optional(raw, "partial", isBool, false),
      preview: optional(raw, "preview", isBool, false),
    },
  };
}

export interface TreeNode {
  id: number;
  label: string;
  bytes: number;
  count: number;
  selfBytes: number;
  depth: number;
  children: TreeNode[]; // largest first
}

export interface Allocation {
  size: number;
  site: string;
  stack: string[];
  tag: string;
  allocatedAt: number | null;
}

export interface Entry {
  action: string;
  size: number;
  addr: number;
  site: string | null;
}

export interface Alive {
  device: number;
  event: number;
  x: { event: number; time: number } | null; // the entry's position on each x axis
  entry: Entry | null;
  t: number | null;
  total: number;
  count: number;
  reserved: number;
  root: TreeNode;
  largest: Allocation[];
  segments: unknown; // the segment map, where the kernel computed one
  modules: ModuleTree | null; // the module tree at the same entry
  segmentsPending: boolean; // the map follows in a second answer for the same instant
}

export type AliveState = { kind: "none" } | { kind: "error"; message: string } | { kind: "ready"; alive: Alive };

function buildTree(raw: unknown, labels: unknown[]): TreeNode {
  const { n, columns } = decodeF64Columns(raw, "drilldown_alive.tree");
  const parent = column(columns, "parent", "drilldown_alive.tree");
  const bytes = column(columns, "bytes", "drilldown_alive.tree");
  const count = column(columns, "count", "drilldown_alive.tree");
  const self = column(columns, "self_bytes", "drilldown_alive.tree");
  if (n === 0) throw new ProtocolError("drilldown_alive.tree: no root");
  const nodes: TreeNode[] = [];
  for (let i = 0; i < n; i++) {
    const label = labels[i];
    nodes.push({ id: i, label: isString(label) ? label : "?", bytes: bytes[i] ?? 0, count: count[i] ?? 0, selfBytes: self[i] ?? 0, depth: 0, children: [] });
  }
  for (let i = 1; i < n; i++) {
    const p = parent[i] ?? -1;
    const node = nodes[i] as TreeNode;
    const up = nodes[p];
    if (!up || p >= i) throw new ProtocolError(`drilldown_alive.tree: node ${i} has parent ${p}`);
    node.depth = up.depth + 1;
    up.children.push(node);
  }
  for (const node of nodes) node.children.sort((a, b) => b.bytes - a.bytes);
  return nodes[0] as TreeNode;
}

export function parseAlive(raw: unknown): AliveState {
  if (raw == null || (isObject(raw) && Object.keys(raw).length === 0)) return { kind: "none" };
  if (!isObject(raw)) throw new ProtocolError(`drilldown_alive: expected an object, got ${describe(raw)}`);
  if (isString(raw["error"])) return { kind: "error", message: raw["error"] };
  const labels = field(raw, "labels", "drilldown_alive", isArray, "a list");
  const largest = optional(raw, "largest", isArray, [])
    .filter(isObj)
    .map((a) => ({
      size: optional(a, "size", isNumber, 0),
      site: optional(a, "site", isString, "?"),
      stack: optional(a, "stack", isArray, []).filter(isString),
      tag: optional(a, "tag", isString, ""),
      allocatedAt: optional(a, "allocated_at", isNumberOrNull, null),
    }));
  return {
    kind: "ready",
    alive: {
      device: field(raw, "device", "drilldown_alive", isNumber, "a device index"),
      event: optional(raw, "event", isNumber, -1),
      x: isObject(raw["x"]) ? { event: optional(raw["x"], "event", isNumber, -1), time: optional(raw["x"], "time", isNumber, 0) } : null,
      entry: isObject(raw["entry"])
        ? {
            action: optional(raw["entry"], "action", isString, "?"),
            size: optional(raw["entry"], "size", isNumber, 0),
            addr: optional(raw["entry"], "addr", isNumber, 0),
            site: optional(raw["entry"], "site", isStringOrNull, null),
          }
        : null,
      t: optional(raw, "t", isNumberOrNull, null),
      total: field(raw, "total_bytes", "drilldown_alive", isNumber, "bytes"),
      count: optional(raw, "count", isNumber, 0),
      reserved: optional(raw, "reserved_bytes", isNumber, 0),
      root: buildTree(raw["tree"], labels),
      largest,
      segments: raw["segments"] ?? null,
      modules: parseModuleTree(raw["modules"]),
      segmentsPending: optional(raw, "segments_pending", isBool, false),
    },
  };
}
