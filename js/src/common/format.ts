// Human units for bytes, durations and clock times. Binary units (KiB = 1024 B), as nvidia-smi
// and PyTorch's own memory summaries use.

export interface ByteUnit {
  readonly name: string;
  readonly factor: number;
}

const BYTE_UNITS: readonly ByteUnit[] = [
  { name: "B", factor: 1 },
  { name: "KiB", factor: 1024 },
  { name: "MiB", factor: 1024 ** 2 },
  { name: "GiB", factor: 1024 ** 3 },
  { name: "TiB", factor: 1024 ** 4 },
];
const BYTES: ByteUnit = BYTE_UNITS[0] as ByteUnit;

const MINUS = "\u2212";
const MISSING = "\u2014";

/** The largest unit that keeps `magnitude` at 1 or more of it (bytes below 1 KiB). */
export function byteUnitFor(magnitude: number): ByteUnit {
  const m = Math.abs(magnitude);
  let unit = BYTES;
  for (const u of BYTE_UNITS) {
    if (m >= u.factor) unit = u;
  }
  return unit;
}

/** A number with about three significant digits, as a string. */
function threeDigits(x: number): string {
  const a = Math.abs(x);
  if (a >= 100) return x.toFixed(0);
  if (a >= 10) return x.toFixed(1);
  return x.toFixed(2);
}

/** `bytes` in `unit`, with the unit name; bytes are shown as whole numbers. */
export function formatBytesIn(bytes: number, unit: ByteUnit): string {
  const value = bytes / unit.factor;
  const digits = unit.factor === 1 ? value.toFixed(0) : threeDigits(value);
  return `${digits.replace("-", MINUS)} ${unit.name}`;
}

/** An axis label: "0", "7.5 GiB", "10 GiB" (no trailing zeros, all ticks in one unit). */
export function formatTick(bytes: number, unit: ByteUnit): string {
  if (bytes === 0) return "0";
  const value = Number((bytes / unit.factor).toFixed(2));
  return `${String(value).replace("-", MINUS)} ${unit.name}`;
}

/** "1.50 GiB"; an em dash for null, undefined or NaN (a reader had nothing). */
export function formatBytes(bytes: number | null | undefined): string {
  if (bytes == null || Number.isNaN(bytes)) return MISSING;
  return formatBytesIn(bytes, byteUnitFor(bytes));
}

/** A signed change: "+1.50 GiB", "−512 MiB", "0 B". */
export function formatDelta(bytes: number | null | undefined): string {
  if (bytes == null || Number.isNaN(bytes)) return MISSING;
  const text = formatBytes(bytes);
  return bytes > 0 ? `+${text}` : text;
}

/** A signed share: "+3.1%", "−12.0%", "0.0%". */
export function formatPercent(fraction: number): string {
  if (!Number.isFinite(fraction)) return MISSING;
  const text = `${(Math.abs(fraction) * 100).toFixed(1)}%`;
  if (text === "0.0%") return text;
  return (fraction > 0 ? "+" : MINUS) + text;
}

/** "850 µs", "12 ms", "1.23 s", "2 min 03 s", "1 h 02 min". */
export function formatDuration(seconds: number | null | undefined): string {
  if (seconds == null || Number.isNaN(seconds)) return MISSING;
  const s = Math.max(0, seconds);
  if (s < 1e-3) return `${Math.round(s * 1e6)} \u00b5s`;
  if (s < 1) {
    const ms = threeDigits(s * 1e3);
    return `${ms.includes(".") ? ms.replace(/\.?0+$/, "") : ms} ms`;
  }
  if (s < 60) return `${threeDigits(s)} s`;
  const total = Math.round(s);
  const h = Math.floor(total / 3600);
  const min = Math.floor((total % 3600) / 60);
  const sec = total % 60;
  if (h > 0) return `${h} h ${String(min).padStart(2, "0")} min`;
  return `${min} min ${String(sec).padStart(2, "0")} s`;
}

export type ClockPrecision = "minutes" | "seconds" | "tenths";

/** Local wall-clock time of unix `seconds`: "14:03", "14:03:27" or "14:03:27.4". */
export function formatClock(seconds: number, precision: ClockPrecision = "seconds"): string {
  const d = new Date(Math.round(seconds * 10) * 100);
  const two = (n: number): string => String(n).padStart(2, "0");
  const hm = `${two(d.getHours())}:${two(d.getMinutes())}`;
  if (precision === "minutes") return hm;
  const hms = `${hm}:${two(d.getSeconds())}`;
  return precision === "seconds" ? hms : `${hms}.${Math.floor(d.getMilliseconds() / 100)}`;
}

/** The precision that tells ticks `step` seconds apart from each other. */
export function clockPrecision(step: number): ClockPrecision {
  if (step < 1) return "tenths";
  return step < 60 ? "seconds" : "minutes";
}

const TICK_STEPS = [1, 2, 2.5, 5, 10, 20, 25, 50, 100, 200, 250, 500];

/**
 * Axis ticks from 0 to at least `max` in round steps of one binary unit (0, 10, 20, 30 GiB),
 * at most `maxTicks` of them, plus the unit to label them with.
 */
export function byteTicks(max: number, maxTicks: number): { unit: ByteUnit; step: number; ticks: number[] } {
  const top = Math.max(max, 1);
  const unit = byteUnitFor(top);
  let step = (TICK_STEPS[TICK_STEPS.length - 1] as number) * unit.factor;
  for (const s of TICK_STEPS) {
    const candidate = s * unit.factor;
    // Whole bytes only: never a 2.5-byte step.
    if (unit.factor === 1 && !Number.isInteger(s)) continue;
    if (Math.floor(top / candidate + 1e-9) + 1 <= Math.max(2, maxTicks)) {
      step = candidate;
      break;
    }
  }
  const ticks: number[] = [];
  for (let v = 0; v <= top + step * 1e-9; v += step) ticks.push(v);
  return { unit, step, ticks };
}

/**
 * An axis ceiling just above `want`: a multiple of a round step finer than the labels' (half
 * of a 1, 2, 5 step, a fifth of a 2.5 one), so a 3.9 GiB peak ends its axis at 4.5 GiB rather
 * than at the next whole label; whole bytes in the byte range.
 */
export function niceCeiling(want: number, maxTicks = 5): number {
  const top = Math.max(want, 1);
  const { unit, step } = byteTicks(top, maxTicks);
  const mantissa = step / unit.factor / 10 ** Math.floor(Math.log10(step / unit.factor) + 1e-9);
  let fine = (Math.abs(mantissa - 2.5) < 1e-9 ? step / 5 : step / 2);
  if (unit.factor === 1 && !Number.isInteger(fine)) fine = step;
  return Math.ceil(top / fine - 1e-9) * fine;
}

/** The first `maxLines` lines of a cell's source, each cut to `maxChars`; notes what was left out. */
export function sourcePreview(source: string, maxLines: number, maxChars: number): string[] {
  const lines = source.replace(/\s+$/, "").split(/\r?\n/);
  const shown = lines.slice(0, maxLines).map((l) => (l.length > maxChars ? `${l.slice(0, maxChars - 1)}\u2026` : l));
  if (lines.length > maxLines) shown.push(`\u2026 ${lines.length - maxLines} more line${lines.length - maxLines === 1 ? "" : "s"}`);
  return shown;
}
