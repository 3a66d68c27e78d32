// What features add to a cell's record (`cells[i].notes`, keyed by feature: gpumem_widget/live/
// notes.py): mirrors gpumem_widget/wire/notes.py, the shapes the to_wire() of
// estimator/result.py (Estimate, Comparison), holders/postmortem/ (PostMortem) and
// holders/leaks.py (LeakHint), and History.compare in live/history/writer.py (PreviousRun) build.
// Change both sides together.
//
// A note this version cannot read, or a feature it does not know, is kept as it came (`other`)
// and shown as text, so a newer kernel's features still show something.

import {
  field,
  isBool,
  isNumber,
  isNumberOrNull,
  isObject,
  isString,
  isStringOrNull,
  optional,
  ProtocolError,
  type Json,
} from "./json";

export interface EstimateTerm {
  key: string;
  label: string;
  bytes: number;
  formula: string;
  source: string; // "counted", "rule", "optimizer state", "meta run"
}

export interface EstimatePhase {
  name: string;
  bytes: number;
  at: string;
}

export interface Estimate {
  model: string;
  device: string; // device type trained on
  dtype: string;
  optimizer: string;
  batch: number | null;
  seq: number | null;
  terms: EstimateTerm[];
  phases: EstimatePhase[];
  total: number | null;
  peak_phase: string | null;
  peak_formula: string;
  notes: string[];
}

export interface Comparison {
  predicted: number; // bytes on the device: the estimate plus other_bytes (the chart's line)
  measured: number;
  other_bytes: number;
  error_bytes: number; // measured - predicted
  tolerance: number; // a fraction of measured
  within_tolerance: boolean;
  suspect: string | null; // the term key most likely off
  explanation: string;
}

export interface EstimateNote {
  device: number;
  peak_exact: boolean; // false: the measured peak is a lower bound
  estimate: Estimate;
  comparison: Comparison;
}

export interface OomDevice {
  device: number;
  failed: boolean;
  source: string; // "observer" | "message" | "none": where the at-OOM figures come from
  requested: number | null;
  free: number | null;
  capacity: number | null;
  total: number | null;
  allocated: number | null;
  reserved: number | null;
  reserved_unallocated: number | null;
  inactive_split: number | null;
  alloc_retries: number | null;
  ooms: number | null;
  this_process: number | null;
  outside_pytorch: number | null;
  other_processes: { pid: number; bytes: number }[];
  available: number | null;
  shortfall: number | null;
  allocated_now: number | null;
  reserved_now: number | null;
}

export interface TensorSummary {
  path: string;
  shape: number[];
  dtype: string;
  device: string;
  nbytes: number;
}

export interface Holder {
  name: string;
  aliases: string[];
  section: string; // "user" | "output_cache" | "traceback"
  type: string;
  bytes: Record<string, number>; // by device label ("cuda:0")
  exclusive: Record<string, number>;
  total: number;
  autograd_graphs: number;
  truncated: boolean;
  largest: TensorSummary[];
}

export interface Holders {
  total: Record<string, number>;
  releasable: Record<string, number>; // held only by the output cache and the traceback
  output_cache_only: Record<string, number>;
  traceback_only: Record<string, number>;
  holders: Holder[];
  holders_left_out: number;
  truncated: boolean;
}

export interface Suggestion {
  key: string;
  title: string;
  detail: string;
  recoverable: number | null;
  sufficient: boolean | null; // recoverable covers the shortfall; null: not measurable
  command: string | null;
}

/** What the thread whose allocation failed was running: its allocator tag, read back (with the
 * module tracer on, `cell:12 backward gpt.h.3.mlp`). */
export interface OomPlace {
  tag: string;
  cell: number | null;
  phase: string | null; // forward, backward, optimizer, recompute, other; null: another tool's tag
  module: string | null;
  source: string; // "observer" | "snapshot"
  text: string; // "backward of gpt.h.3.mlp"
}

export interface PostMortem {
  error_type: string;
  message: string;
  events: number;
  snapshot_captured: boolean;
  devices: OomDevice[];
  holders: Holders | null;
  suggestions: Suggestion[];
  place: OomPlace | null; // null: the tracer was off (or an older kernel)
}

export interface LeakHint {
  kind: string; // "growing_rerun" | "output_cache_only"
  message: string;
  device: string;
  bytes: number;
  execution_counts: number[];
}

/** The same source's peak in the previous run of this notebook (the on-disk history). */
export interface PreviousRun {
  metric: "allocated" | "host_rss"; // which peak: allocated (CUDA, busiest device) or host RSS
  peak: number;
  previous_peak: number;
  previous_execution_count: number | null;
  previous_session: string;
  previous_started: number | null; // unix seconds: when that run's kernel started
  change: number | null; // (peak - previous_peak) / previous_peak
  regression: boolean; // beyond both thresholds
  threshold_ratio: number;
  threshold_bytes: number;
}

export interface OtherNote {
  key: string;
  value: unknown;
  problem: string | null; // why a known feature's note could not be read
}

export interface CellNotes {
  estimate: EstimateNote | null;
  postmortem: PostMortem | null;
  leaks: LeakHint[];
  history: PreviousRun | null;
  other: OtherNote[];
}

/** Shared by every record without notes, so frozen throughout. */
export const NO_NOTES: CellNotes = Object.freeze({ estimate: null, postmortem: null, leaks: Object.freeze([]), history: null, other: Object.freeze([]) }) as unknown as CellNotes;

export function parseNotes(raw: unknown): CellNotes {
  if (!isObject(raw) || Object.keys(raw).length === 0) return NO_NOTES;
  const notes: CellNotes = { estimate: null, postmortem: null, leaks: [], history: null, other: [] };
  for (const [key, value] of Object.entries(raw)) {
    try {
      switch (key) {
        case "estimate":
          notes.estimate = parseEstimateNote(value);
          break;
        case "postmortem":
          notes.postmortem = parsePostMortem(value);
          break;
        case "leaks":
          notes.leaks = parseLeaks(value);
          break;
        case "history":
          notes.history = parsePreviousRun(value);
          break;
        default:
          notes.other.push({ key, value, problem: null });
      }
    } catch (e) {
      if (!(e instanceof ProtocolError)) throw e;
      notes.other.push({ key, value, problem: e.message });
    }
  }
  return notes;
}

// ---------------------------------------------------------------------------------------------

function object(v: unknown, what: string): Json {
  if (!isObject(v)) throw new ProtocolError(`${what}: expected an object`);
  return v;
}

/** The well-formed items of a list (a bad item is left out, not the whole note). */
function items<T>(v: unknown, read: (item: Json) => T | null): T[] {
  if (!Array.isArray(v)) return [];
  const out: T[] = [];
  for (const item of v) {
    const parsed = isObject(item) ? read(item) : null;
    if (parsed !== null) out.push(parsed);
  }
  return out;
}

function byteMap(v: unknown): Record<string, number> {
  const out: Record<string, number> = {};
  if (isObject(v)) for (const [k, n] of Object.entries(v)) if (isNumber(n)) out[k] = n;
  return out;
}

const str = (o: Json, key: string, fallback = ""): string => optional(o, key, isString, fallback);
const num = (o: Json, key: string): number | null => optional(o, key, isNumberOrNull, null);

function parseEstimateNote(raw: unknown): EstimateNote {
  const what = "notes.estimate";
  const note = object(raw, what);
  const e = object(note["estimate"], `${what}.estimate`);
  const c = object(note["comparison"], `${what}.comparison`);
  const cw = `${what}.comparison`;
  const predicted = field(c, "predicted", cw, isNumber, "a number");
  const measured = field(c, "measured", cw, isNumber, "a number");
  const errorBytes = optional(c, "error_bytes", isNumber, measured - predicted);
  const tolerance = optional(c, "tolerance", isNumber, 0.1);
  return {
    device: field(note, "device", what, isNumber, "a number"),
    peak_exact: optional(note, "peak_exact", isBool, true),
    estimate: {
      model: str(e, "model", "model"),
      device: str(e, "device"),
      dtype: str(e, "dtype"),
      optimizer: str(e, "optimizer"),
      batch: num(e, "batch"),
      seq: num(e, "seq"),
      terms: items(e["terms"], (t) =>
        isString(t["label"]) && isNumber(t["bytes"])
          ? { key: str(t, "key"), label: t["label"], bytes: t["bytes"], formula: str(t, "formula"), source: str(t, "source") }
          : null,
      ),
      phases: items(e["phases"], (p) => (isString(p["name"]) && isNumber(p["bytes"]) ? { name: p["name"], bytes: p["bytes"], at: str(p, "at") } : null)),
      total: num(e, "total"),
      peak_phase: optional(e, "peak_phase", isStringOrNull, null),
      peak_formula: str(e, "peak_formula"),
      notes: optional(e, "notes", Array.isArray, []).filter(isString),
    },
    comparison: {
      predicted,
      measured,
      other_bytes: optional(c, "other_bytes", isNumber, 0),
      error_bytes: errorBytes,
      tolerance,
      within_tolerance: optional(c, "within_tolerance", isBool, Math.abs(errorBytes) <= tolerance * Math.max(measured, 1)),
      suspect: optional(c, "suspect", isStringOrNull, null),
      explanation: str(c, "explanation"),
    },
  };
}

/** The estimate's error as a share of the measured peak, as the kernel words it (+: above). */
export function estimateError(c: Comparison): number {
  return c.error_bytes / Math.max(c.measured, 1);
}

function parseOomDevice(d: Json): OomDevice | null {
  if (!isNumber(d["device"])) return null;
  return {
    device: d["device"],
    failed: optional(d, "failed", isBool, false),
    source: str(d, "source", "none"),
    requested: num(d, "requested"),
    free: num(d, "free"),
    capacity: num(d, "capacity"),
    total: num(d, "total"),
    allocated: num(d, "allocated"),
    reserved: num(d, "reserved"),
    reserved_unallocated: num(d, "reserved_unallocated"),
    inactive_split: num(d, "inactive_split"),
    alloc_retries: num(d, "alloc_retries"),
    ooms: num(d, "ooms"),
    this_process: num(d, "this_process"),
    outside_pytorch: num(d, "outside_pytorch"),
    other_processes: items(d["other_processes"], (p) => (isNumber(p["pid"]) && isNumber(p["bytes"]) ? { pid: p["pid"], bytes: p["bytes"] } : null)),
    available: num(d, "available"),
    shortfall: num(d, "shortfall"),
    allocated_now: num(d, "allocated_now"),
    reserved_now: num(d, "reserved_now"),
  };
}

function parseHolder(h: Json): Holder | null {
  if (!isString(h["name"])) return null;
  return {
    name: h["name"],
    aliases: optional(h, "aliases", Array.isArray, []).filter(isString),
    section: str(h, "section", "user"),
    type: str(h, "type"),
    bytes: byteMap(h["bytes"]),
    exclusive: byteMap(h["exclusive"]),
    total: optional(h, "total", isNumber, 0),
    autograd_graphs: optional(h, "autograd_graphs", isNumber, 0),
    truncated: optional(h, "truncated", isBool, false),
    largest: items(h["largest"], (t) =>
      isString(t["path"]) && isNumber(t["nbytes"])
        ? { path: t["path"], shape: optional(t, "shape", Array.isArray, []).filter(isNumber), dtype: str(t, "dtype"), device: str(t, "device"), nbytes: t["nbytes"] }
        : null,
    ),
  };
}

function parseHolders(raw: unknown): Holders | null {
  if (!isObject(raw)) return null;
  return {
    total: byteMap(raw["total"]),
    releasable: byteMap(raw["releasable"]),
    output_cache_only: byteMap(raw["output_cache_only"]),
    traceback_only: byteMap(raw["traceback_only"]),
    holders: items(raw["holders"], parseHolder),
    holders_left_out: optional(raw, "holders_left_out", isNumber, 0),
    truncated: optional(raw, "truncated", isBool, false),
  };
}

function parsePostMortem(raw: unknown): PostMortem {
  const what = "notes.postmortem";
  const p = object(raw, what);
  if (!Array.isArray(p["devices"])) throw new ProtocolError(`${what}.devices: expected a list`);
  return {
    error_type: str(p, "error_type", "OutOfMemoryError"),
    message: str(p, "message"),
    events: optional(p, "events", isNumber, 0),
    snapshot_captured: optional(p, "snapshot_captured", isBool, false),
    devices: items(p["devices"], parseOomDevice),
    holders: parseHolders(p["holders"]),
    suggestions: items(p["suggestions"], (s) =>
      isString(s["title"])
        ? {
            key: str(s, "key"),
            title: s["title"],
            detail: str(s, "detail"),
            recoverable: num(s, "recoverable"),
            sufficient: optional(s, "sufficient", (v: unknown): v is boolean | null => v === null || isBool(v), null),
            command: optional(s, "command", isStringOrNull, null),
          }
        : null,
    ),
    place: parsePlace(p["place"]),
  };
}

function parsePlace(raw: unknown): OomPlace | null {
  if (!isObject(raw) || !isString(raw["text"])) return null;
  return {
    tag: str(raw, "tag"),
    cell: num(raw, "cell"),
    phase: optional(raw, "phase", isStringOrNull, null),
    module: optional(raw, "module", isStringOrNull, null),
    source: str(raw, "source"),
    text: raw["text"],
  };
}

function parseLeaks(raw: unknown): LeakHint[] {
  if (!Array.isArray(raw)) throw new ProtocolError("notes.leaks: expected a list");
  return items(raw, (h) =>
    isString(h["message"])
      ? {
          kind: str(h, "kind"),
          message: h["message"],
          device: str(h, "device"),
          bytes: optional(h, "bytes", isNumber, 0),
          execution_counts: optional(h, "execution_counts", Array.isArray, []).filter(isNumber),
        }
      : null,
  );
}

function parsePreviousRun(raw: unknown): PreviousRun {
  const what = "notes.history";
  const h = object(raw, what);
  const metric = h["metric"] === "host_rss" ? "host_rss" : "allocated";
  return {
    metric,
    peak: field(h, "peak", what, isNumber, "a number"),
    previous_peak: field(h, "previous_peak", what, isNumber, "a number"),
    previous_execution_count: num(h, "previous_execution_count"),
    previous_session: str(h, "previous_session"),
    previous_started: num(h, "previous_started"),
    change: num(h, "change"),
    regression: optional(h, "regression", isBool, false),
    threshold_ratio: optional(h, "threshold_ratio", isNumber, 0.2),
    threshold_bytes: optional(h, "threshold_bytes", isNumber, 64 * 2 ** 20),
  };
}
