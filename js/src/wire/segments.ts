// The segment map view (gpumem_widget/snapshot/segment_views.py `segment_map(...).to_wire()`) as the
// browser reads it: checked field by field, each failure a ProtocolError naming the field. Mirrors
// gpumem_widget/wire/segments.py.

import { ProtocolError, field, isArray, isBool, isNumber, isNumberOrNull, isObject, isString, type Json } from "./json";

export type BlockState = "allocated" | "pending_free" | "free";

export interface SegBlock {
  offset: number;
  size: number;
  requested_size: number;
  state: BlockState;
  stream: number;
  stack: number;
  tag: string;
  count: number;
}

export interface SegSegment {
  address: number;
  size: number;
  stream: number;
  pool: string;
  expandable: boolean;
  stack: number;
  blocks: SegBlock[];
}

export interface SegFigure {
  key: string;
  label: string;
  value: number | boolean;
  unit: string;
  meaning: string;
}

export interface SegAdvice {
  setting: string;
  why: string;
  figure: string;
  value: number;
  how: string;
}

export interface SegmentMapView {
  device: number;
  x_unit: string;
  event: number;
  t: number | null;
  segments: SegSegment[];
  stacks: { site: string; frames: string[] }[];
  hidden: { segments: number; bytes: number; merged_blocks: number };
  figures: SegFigure[];
  advice: SegAdvice[];
}

const STATES: Record<string, BlockState> = {
  allocated: "allocated",
  pending_free: "pending_free",
  free: "free",
  inactive: "free", // torch's name for a free block
};
const isNumberOrBool = (v: unknown): v is number | boolean => isNumber(v) || isBool(v);

function list<T>(obj: Json, key: string, what: string, each: (v: Json, where: string) => T): T[] {
  return field(obj, key, what, isArray, "a list").map((v, i) => {
    const where = `${what}.${key}[${i}]`;
    if (!isObject(v)) throw new ProtocolError(`${where}: expected an object`);
    return each(v, where);
  });
}

/** The view as sent by the kernel, checked field by field; throws ProtocolError naming the field. */
export function parseSegmentMap(raw: unknown): SegmentMapView {
  if (!isObject(raw) || raw["view"] !== "segment_map") throw new ProtocolError("segment map: expected a segment_map view");
  const w = "segment_map";
  const stacks = list(raw, "stacks", w, (s, where) => ({
    site: field(s, "site", where, isString, "a string"),
    frames: field(s, "frames", where, isArray, "a list").filter(isString),
  }));
  const segments = list(raw, "segments", w, (s, where) => ({
    address: field(s, "address", where, isNumber, "a number"),
    size: field(s, "size", where, isNumber, "a number"),
    stream: field(s, "stream", where, isNumber, "a number"),
    pool: field(s, "pool", where, isString, "a string"),
    expandable: field(s, "expandable", where, isBool, "a boolean"),
    stack: field(s, "stack", where, isNumber, "a number"),
    blocks: list(s, "blocks", where, (b, at) => {
      const state = STATES[field(b, "state", at, isString, "a string")];
      if (state === undefined) throw new ProtocolError(`${at}.state: unknown block state`);
      return {
        offset: field(b, "offset", at, isNumber, "a number"),
        size: field(b, "size", at, isNumber, "a number"),
        requested_size: field(b, "requested_size", at, isNumber, "a number"),
        state,
        stream: field(b, "stream", at, isNumber, "a number"),
        stack: field(b, "stack", at, isNumber, "a number"),
        tag: field(b, "tag", at, isString, "a string"),
        count: field(b, "count", at, isNumber, "a number"),
      };
    }),
  }));
  const frag = field(raw, "fragmentation", w, isObject, "an object");
  const hidden = field(raw, "hidden", w, isObject, "an object");
  return {
    device: field(raw, "device", w, isNumber, "a number"),
    x_unit: field(raw, "x_unit", w, isString, "a string"),
    event: field(raw, "event", w, isNumber, "a number"),
    t: field(raw, "t", w, isNumberOrNull, "a number or null"),
    segments,
    stacks,
    hidden: {
      segments: field(hidden, "segments", `${w}.hidden`, isNumber, "a number"),
      bytes: field(hidden, "bytes", `${w}.hidden`, isNumber, "a number"),
      merged_blocks: field(hidden, "merged_blocks", `${w}.hidden`, isNumber, "a number"),
    },
    figures: list(frag, "figures", `${w}.fragmentation`, (f, where) => ({
      key: field(f, "key", where, isString, "a string"),
      label: field(f, "label", where, isString, "a string"),
      value: field(f, "value", where, isNumberOrBool, "a number or boolean"),
      unit: field(f, "unit", where, isString, "a string"),
      meaning: field(f, "meaning", where, isString, "a string"),
    })),
    advice: list(raw, "advice", w, (a, where) => ({
      setting: field(a, "setting", where, isString, "a string"),
      why: field(a, "why", where, isString, "a string"),
      figure: field(a, "figure", where, isString, "a string"),
      value: field(a, "value", where, isNumber, "a number"),
      how: field(a, "how", where, isString, "a string"),
    })),
  };
}
