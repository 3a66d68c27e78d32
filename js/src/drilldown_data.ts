// Decodes the `drilldown` and `drilldown_alive` traits (see gpumem_widget/protocol.py). The kernel
// reduced everything to screen size already; this only checks shapes and unpacks the float64
// columns. Any malformed part raises ProtocolError, which the panel shows instead of drawing.

import { describe, field, isNumber, isNumberOrNull, isObject, isString, isStringOrNull, optional, ProtocolError, type Json } from "./json";

export type Columns = Map<string, Float64Array>;

function bytesOf(buf: unknown, what: string): Uint8Array {
  if (buf instanceof ArrayBuffer) return new Uint8Array(buf);
  if (ArrayBuffer.isView(buf)) return new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength);
  throw new ProtocolError(`${what}: expected binary data, got ${describe(buf)}`);
}

/** A packed table's columns as float64 (f4 columns are widened), little-endian on any host. */
export function decodeColumns(raw: unknown, what: string): { n: number; columns: Columns } {
  if (!isObject(raw)) throw new ProtocolError(`${what}: expected a table, got ${describe(raw)}`);
  const n = field(raw, "n", what, isNumber, "a row count");
  const names = raw["columns"];
  const dtypes = raw["dtypes"];
  const buffers = raw["buffers"];
  if (!Array.isArray(names) || !Array.isArray(dtypes) || !Array.isArray(buffers) || dtypes.length !== names.length || buffers.length !== names.length) {
    throw new ProtocolError(`${what}: columns, dtypes and buffers must be lists of one length`);
  }
  const columns: Columns = new Map();
  names.forEach((name, i) => {
    const dtype = dtypes[i];
    if (!isString(name) || (dtype !== "f8" && dtype !== "f4")) throw new ProtocolError(`${what}.columns[${i}]: bad name or dtype`);
    const size = dtype === "f8" ? 8 : 4;
    const bytes = bytesOf(buffers[i], `${what}.${name}`);
    if (bytes.byteLength !== n * size) throw new ProtocolError(`${what}.${name}: ${bytes.byteLength} bytes for ${n} rows of ${dtype}`);
    const data = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    const out = new Float64Array(n);
    for (let k = 0; k < n; k++) out[k] = size === 8 ? data.getFloat64(k * 8, true) : data.getFloat32(k * 4, true);
    columns.set(name, out);
  });
  return { n, columns };
}

function column(cols: Columns, name: string, what: string): Float64Array {
  const c = cols.get(name);
  if (!c) throw new ProtocolError(`${what}: no column ${JSON.stringify(name)}`);
  return c;
}

const isArray = (v: unknown): v is unknown[] => Array.isArray(v);
const isObj = (v: unknown): v is Json => isObject(v);

export interface Series {
  column: string;
  label: string;
  detail: string; // file:line, or the same as label
  peak: number;
  values: Float64Array;
}

/** A stacked view over time: active memory by site, or by category. */
export interface Stacked {
  unit: "s" | "entry";
  t0: number;
  t1: number;
  t: Float64Array; // column start times
  total: Float64Array;
  reserved: Float64Array | null;
  series: Series[]; // bottom first
  peak: { bytes: number; t: number | null };
  entries: number;
  allocations: number;
  overflowed: boolean;
  ooms: { t: number; requested: number }[];
}

function parseStacked(raw: unknown, what: string, withOther: boolean): Stacked {
  if (!isObject(raw)) throw new ProtocolError(`${what}: expected a view, got ${describe(raw)}`);
  const { columns } = decodeColumns(raw["table"], `${what}.table`);
  const groups = field(raw, "groups", what, isArray, "a list");
  const series: Series[] = groups.map((g, i) => {
    if (!isObject(g)) throw new ProtocolError(`${what}.groups[${i}]: expected an object`);
    const col = field(g, "column", `${what}.groups[${i}]`, isString, "a column name");
    const label = field(g, "label", `${what}.groups[${i}]`, isString, "a label");
    const file = optional(g, "filename", isStringOrNull, null);
    const line = optional(g, "line", isNumberOrNull, null);
    return { column: col, label, detail: file ? `${file}:${line ?? "?"}` : label, peak: optional(g, "peak_bytes", isNumber, 0), values: column(columns, col, what) };
  });
  if (withOther && columns.has("other")) {
    const values = column(columns, "other", what);
    series.push({ column: "other", label: "other", detail: "every smaller site", peak: values.reduce((a, b) => Math.max(a, b), 0), values });
  }
  const peak = field(raw, "peak", what, isObj, "an object");
  const ooms = optional(raw, "ooms", isArray, []);
  return {
    unit: raw["x_unit"] === "entry" ? "entry" : "s",
    t0: field(raw, "t0", what, isNumber, "a time"),
    t1: field(raw, "t1", what, isNumber, "a time"),
    t: column(columns, "t", what),
    total: column(columns, "total", what),
    reserved: columns.get("reserved") ?? null,
    series,
    peak: { bytes: optional(peak, "bytes", isNumber, 0), t: optional(peak, "t", isNumberOrNull, null) },
    entries: optional(raw, "entries", isNumber, 0),
    allocations: optional(raw, "allocations", isNumber, 0),
    overflowed: raw["overflowed"] === true,
    ooms: ooms.filter(isObj).map((o) => ({ t: optional(o, "t", isNumber, 0), requested: optional(o, "requested", isNumber, 0) })),
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

/** Reserved (cached segments) beside active (live blocks) over time: each column's highest and
 * lowest, so the cache's growth and its gap to the live set show at any zoom. */
export interface ReservedOverTime {
  t: Float64Array; // column start times
  t1: number;
  reserved: Float64Array;
  reservedMin: Float64Array;
  active: Float64Array;
  peakReserved: number;
  largestGap: number; // the most reserved beyond active at any instant
}

function parseReserved(raw: unknown, what: string): ReservedOverTime | null {
  if (raw === undefined || raw === null) return null; // a kernel that does not send it
  if (!isObject(raw)) throw new ProtocolError(`${what}: expected a view, got ${describe(raw)}`);
  const { columns } = decodeColumns(raw["table"], `${what}.table`);
  const gap = raw["largest_gap"];
  return {
    t: column(columns, "t", what),
    t1: field(raw, "t1", what, isNumber, "a time"),
    reserved: column(columns, "reserved", what),
    reservedMin: column(columns, "reserved_min", what),
    active: column(columns, "active", what),
    peakReserved: field(raw, "peak_reserved", what, isNumber, "bytes"),
    largestGap: isObject(gap) ? optional(gap, "bytes", isNumber, 0) : 0,
  };
}

export interface DeviceOverview {
  device: number;
  sites: Stacked;
  categories: Stacked;
  reserved: ReservedOverTime | null;
  atPeak: SiteBytes[]; // bytes per category at the peak
  cells: CellSlice[];
}

export interface Overview {
  source: string;
  takenAt: number | null;
  cellsBy: string;
  devices: DeviceOverview[];
}

export type DrilldownState = { kind: "empty" } | { kind: "pending"; source: string } | { kind: "ready"; overview: Overview };

export function parseDrilldown(raw: unknown): DrilldownState {
  if (raw == null || (isObject(raw) && Object.keys(raw).length === 0)) return { kind: "empty" };
  if (!isObject(raw)) throw new ProtocolError(`drilldown: expected an object, got ${describe(raw)}`);
  if (isString(raw["pending"])) return { kind: "pending", source: raw["pending"] };
  const devices = field(raw, "devices", "drilldown", isArray, "a list").map((d, i): DeviceOverview => {
    const what = `drilldown.devices[${i}]`;
    if (!isObject(d)) throw new ProtocolError(`${what}: expected an object`);
    const cats = d["categories"];
    const atPeak = isObject(cats) && isObject(cats["at_peak"]) ? cats["at_peak"] : {};
    const cells = isObject(d["cells"]) ? optional(d["cells"], "cells", isArray, []) : [];
    return {
      device: field(d, "device", what, isNumber, "a device index"),
      sites: parseStacked(d["active"], `${what}.active`, true),
      categories: parseStacked(cats, `${what}.categories`, false),
      reserved: parseReserved(d["reserved"], `${what}.reserved`),
      atPeak: Object.entries(atPeak)
        .filter((e): e is [string, number] => isNumber(e[1]))
        .map(([label, bytes]) => ({ label, bytes })),
      cells: cells.map((c, k) => parseCellSlice(c, `${what}.cells[${k}]`)),
    };
  });
  return {
    kind: "ready",
    overview: {
      source: optional(raw, "source", isString, "snapshot"),
      takenAt: optional(raw, "taken_at", isNumberOrNull, null),
      cellsBy: optional(raw, "cells_by", isString, "none"),
      devices,
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

export interface Alive {
  device: number;
  t: number | null;
  total: number;
  count: number;
  reserved: number;
  root: TreeNode;
  largest: Allocation[];
  segments: unknown; // the segment map, where the kernel computed one
}

export type AliveState = { kind: "none" } | { kind: "error"; message: string } | { kind: "ready"; alive: Alive };

function buildTree(raw: unknown, labels: unknown[]): TreeNode {
  const { n, columns } = decodeColumns(raw, "drilldown_alive.tree");
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
      t: optional(raw, "t", isNumberOrNull, null),
      total: field(raw, "total_bytes", "drilldown_alive", isNumber, "bytes"),
      count: optional(raw, "count", isNumber, 0),
      reserved: optional(raw, "reserved_bytes", isNumber, 0),
      root: buildTree(raw["tree"], labels),
      largest,
      segments: raw["segments"] ?? null,
    },
  };
}
