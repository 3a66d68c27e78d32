// Reading JSON traits defensively: every check names the field and what it held, so a malformed
// value costs one clear message, never a broken view. gpumem_widget/wire/json.py is the same on
// the kernel's side, for the browser's custom messages.

export class ProtocolError extends Error {
  override name = "ProtocolError";
}

export type Json = Record<string, unknown>;

export function isObject(x: unknown): x is Json {
  return typeof x === "object" && x !== null && !Array.isArray(x);
}

export function field<T>(obj: Json, key: string, what: string, check: (v: unknown) => v is T, expected: string): T {
  const v = obj[key];
  if (!check(v)) throw new ProtocolError(`${what}.${key}: expected ${expected}, got ${describe(v)}`);
  return v;
}

export function describe(v: unknown): string {
  if (v === undefined) return "nothing";
  if (v === null) return "null";
  if (Array.isArray(v)) return "a list";
  return typeof v === "string" ? `"${v.slice(0, 40)}"` : typeof v;
}

export const isNumber = (v: unknown): v is number => typeof v === "number" && Number.isFinite(v);
export const isNumberOrNull = (v: unknown): v is number | null => v === null || isNumber(v);
export const isString = (v: unknown): v is string => typeof v === "string";
export const isStringOrNull = (v: unknown): v is string | null => v === null || typeof v === "string";
export const isBool = (v: unknown): v is boolean => typeof v === "boolean";
export const isArray = (v: unknown): v is unknown[] => Array.isArray(v);

/** Optional fields: absent or wrong-typed reads as `fallback` (older kernels, partial status). */
export function optional<T>(obj: Json, key: string, check: (v: unknown) => v is T, fallback: T): T {
  const v = obj[key];
  return check(v) ? v : fallback;
}

