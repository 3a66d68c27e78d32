// The one decoder of packed tables (gpumem_widget/wire/table.py `pack_table`):
// {"n", "columns", "dtypes": ["f8"|"f4"], "buffers"}, one little-endian buffer per column.
// ipywidgets hands binary buffers over as DataViews, which may start at any byte offset.

import { describe, isNumber, isObject, isString, ProtocolError } from "./json";

export const TIME_COLUMN = "t";

export type Column = Float64Array | Float32Array;

export interface DecodedTable<C extends Column = Column> {
  n: number;
  columns: Map<string, C>;
}

export const EMPTY_TABLE: DecodedTable = { n: 0, columns: new Map() };

const LITTLE_ENDIAN_HOST = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

function bytesOf(buf: unknown, what: string): { buffer: ArrayBufferLike; offset: number; length: number } {
  if (buf instanceof ArrayBuffer) return { buffer: buf, offset: 0, length: buf.byteLength };
  if (ArrayBuffer.isView(buf)) return { buffer: buf.buffer, offset: buf.byteOffset, length: buf.byteLength };
  throw new ProtocolError(`${what}: expected binary data, got ${describe(buf)}`);
}

function decodeColumn(buf: unknown, dtype: unknown, n: number, what: string): Column {
  if (dtype !== "f8" && dtype !== "f4") throw new ProtocolError(`${what}: unknown dtype ${describe(dtype)}`);
  const size = dtype === "f8" ? 8 : 4;
  const { buffer, offset, length } = bytesOf(buf, what);
  if (length !== n * size) {
    throw new ProtocolError(`${what}: ${length} bytes for ${n} rows of ${dtype} (expected ${n * size})`);
  }
  const view = (b: ArrayBufferLike, at: number): Column => (size === 8 ? new Float64Array(b, at, n) : new Float32Array(b, at, n));
  if (!LITTLE_ENDIAN_HOST) {
    const data = new DataView(buffer, offset, length);
    const out = size === 8 ? new Float64Array(n) : new Float32Array(n);
    for (let i = 0; i < n; i++) out[i] = size === 8 ? data.getFloat64(i * 8, true) : data.getFloat32(i * 4, true);
    return out;
  }
  if (offset % size === 0) return view(buffer, offset);
  // Unaligned: a typed array cannot view it, so copy the bytes to a fresh (aligned) buffer.
  return view(new Uint8Array(buffer, offset, length).slice().buffer, 0);
}

/** Decode one packed table: each column viewed in place where its bytes are aligned. */
export function decodeColumns(raw: unknown, what: string): DecodedTable {
  if (!isObject(raw)) throw new ProtocolError(`${what}: expected a table, got ${describe(raw)}`);
  const n = raw["n"];
  if (!isNumber(n) || n < 0 || !Number.isInteger(n)) throw new ProtocolError(`${what}.n: expected a row count, got ${describe(n)}`);
  const names = raw["columns"];
  const dtypes = raw["dtypes"];
  const buffers = raw["buffers"];
  if (!Array.isArray(names) || !Array.isArray(dtypes) || !Array.isArray(buffers)) {
    throw new ProtocolError(`${what}: columns, dtypes and buffers must be lists`);
  }
  if (dtypes.length !== names.length || buffers.length !== names.length) {
    throw new ProtocolError(`${what}: ${names.length} columns but ${dtypes.length} dtypes and ${buffers.length} buffers`);
  }
  const columns = new Map<string, Column>();
  names.forEach((name, i) => {
    if (!isString(name)) throw new ProtocolError(`${what}.columns[${i}]: expected a name, got ${describe(name)}`);
    columns.set(name, decodeColumn(buffers[i], dtypes[i], n, `${what}.${name}`));
  });
  return { n, columns };
}

/** A column the table must have: a ProtocolError names it where it is missing. */
export function column<C extends Column>(columns: Map<string, C>, name: string, what: string): C {
  const c = columns.get(name);
  if (!c) throw new ProtocolError(`${what}: no column ${JSON.stringify(name)}`);
  return c;
}

/** A table whose every column is read as float64 (f4 columns widened): the snapshot views. */
export function decodeF64Columns(raw: unknown, what: string): DecodedTable<Float64Array> {
  const { n, columns } = decodeColumns(raw, what);
  const wide = new Map<string, Float64Array>();
  for (const [name, col] of columns) wide.set(name, col instanceof Float64Array ? col : Float64Array.from(col));
  return { n, columns: wide };
}

/** A timeline table (a time column first of all); `{}` or null (a trait not yet set) is empty. */
export function decodeTable(raw: unknown, what: string): DecodedTable {
  if (raw == null || (isObject(raw) && Object.keys(raw).length === 0)) return EMPTY_TABLE;
  const table = decodeColumns(raw, what);
  if (table.n > 0 && !table.columns.has(TIME_COLUMN)) throw new ProtocolError(`${what}: no "${TIME_COLUMN}" column`);
  return table;
}
