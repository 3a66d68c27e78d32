import { describe, expect, it } from "vitest";
import { byteTicks, byteUnitFor, clockPrecision, formatBytes, formatBytesIn, formatClock, formatDelta, formatDuration, formatTick, niceCeiling, sourcePreview } from "../src/common/format";

const KiB = 1024;
const MiB = 1024 ** 2;
const GiB = 1024 ** 3;

describe("bytes", () => {
  it("picks the largest binary unit that keeps the value at 1 or more", () => {
    expect(byteUnitFor(0).name).toBe("B");
    expect(byteUnitFor(1023).name).toBe("B");
    expect(byteUnitFor(1024).name).toBe("KiB");
    expect(byteUnitFor(-3 * GiB).name).toBe("GiB");
    expect(byteUnitFor(2 * 1024 ** 4).name).toBe("TiB");
    expect(byteUnitFor(5000 * 1024 ** 4).name).toBe("TiB");
  });

  it("shows about three significant digits", () => {
    expect(formatBytes(0)).toBe("0 B");
    expect(formatBytes(512)).toBe("512 B");
    expect(formatBytes(1.5 * KiB)).toBe("1.50 KiB");
    expect(formatBytes(21.25 * MiB)).toBe("21.3 MiB");
    expect(formatBytes(150754820096)).toBe("140 GiB");
    expect(formatBytes(1023 * MiB)).toBe("1023 MiB");
  });

  it("shows a dash where a reader had nothing", () => {
    expect(formatBytes(null)).toBe("\u2014");
    expect(formatBytes(undefined)).toBe("\u2014");
    expect(formatBytes(NaN)).toBe("\u2014");
    expect(formatDelta(NaN)).toBe("\u2014");
  });

  it("signs changes with a real minus", () => {
    expect(formatDelta(2 * GiB)).toBe("+2.00 GiB");
    expect(formatDelta(-512 * MiB)).toBe("\u2212512 MiB");
    expect(formatDelta(0)).toBe("0 B");
  });

  it("formats in a given unit", () => {
    expect(formatBytesIn(GiB / 2, byteUnitFor(GiB))).toBe("0.50 GiB");
    expect(formatBytesIn(3, byteUnitFor(1))).toBe("3 B");
  });
});

describe("axis ticks", () => {
  it("steps in round amounts of one unit, within the tick budget", () => {
    const { unit, ticks, step } = byteTicks(37 * GiB, 5);
    expect(unit.name).toBe("GiB");
    expect(step).toBe(10 * GiB);
    expect(ticks).toEqual([0, 10, 20, 30].map((g) => g * GiB));
  });

  it("keeps at least one tick above zero on short panels", () => {
    const { ticks } = byteTicks(4 * GiB, 2);
    expect(ticks.length).toBe(2);
    expect(ticks[1]).toBe(2.5 * GiB);
  });

  it("never steps by fractions of a byte", () => {
    const { ticks } = byteTicks(5, 4);
    expect(ticks.every(Number.isInteger)).toBe(true);
  });

  it("labels ticks without trailing zeros", () => {
    const unit = byteUnitFor(GiB);
    expect(formatTick(0, unit)).toBe("0");
    expect(formatTick(7.5 * GiB, unit)).toBe("7.5 GiB");
    expect(formatTick(10 * GiB, unit)).toBe("10 GiB");
    expect(formatTick(2.25 * GiB, unit)).toBe("2.25 GiB");
  });
});

describe("durations", () => {
  it.each([
    [0.00085, "850 \u00b5s"],
    [0.012, "12 ms"],
    [0.1, "100 ms"],
    [0.0015, "1.5 ms"],
    [1.234, "1.23 s"],
    [59.4, "59.4 s"],
    [123, "2 min 03 s"],
    [3720, "1 h 02 min"],
  ])("%s s reads %s", (s, text) => {
    expect(formatDuration(s)).toBe(text);
  });

  it("shows a dash for nothing and never a negative time", () => {
    expect(formatDuration(null)).toBe("\u2014");
    expect(formatDuration(-1)).toBe("0 \u00b5s");
  });

  it("shows local clock time", () => {
    const t = new Date(2025, 0, 2, 3, 4, 5).getTime() / 1000;
    expect(formatClock(t)).toBe("03:04:05");
    expect(formatClock(t, "minutes")).toBe("03:04");
    expect(formatClock(t + 0.44, "tenths")).toBe("03:04:05.4");
    expect(formatClock(t + 0.96, "seconds")).toBe("03:04:06");
  });

  it("labels ticks precisely enough to tell them apart", () => {
    expect(clockPrecision(0.5)).toBe("tenths");
    expect(clockPrecision(10)).toBe("seconds");
    expect(clockPrecision(300)).toBe("minutes");
  });
});

describe("source preview", () => {
  it("keeps the first lines, cuts long ones and says what was left out", () => {
    const src = "a = 1\n" + "b".repeat(100) + "\nc\nd\n\n";
    expect(sourcePreview(src, 2, 10)).toEqual(["a = 1", "bbbbbbbbb\u2026", "\u2026 2 more lines"]);
    expect(sourcePreview("x\r\ny", 5, 80)).toEqual(["x", "y"]);
  });
});

describe("niceCeiling", () => {
  it("ends an axis at a round value just above the data", () => {
    const GiB = 2 ** 30;
    expect(niceCeiling(4.21 * GiB)).toBe(4.5 * GiB);
    expect(niceCeiling(4 * GiB)).toBe(4 * GiB);
    expect(niceCeiling(5.73 * GiB)).toBe(6 * GiB);
    expect(niceCeiling(700)).toBe(700); // whole bytes
    expect(niceCeiling(3)).toBe(3);
    for (const want of [1, 3, 999, 1.2e6, 4.21 * GiB, 7.3 * GiB, 10.2 * GiB, 150 * GiB]) {
      const top = niceCeiling(want);
      expect(top).toBeGreaterThanOrEqual(want);
      expect(top).toBeLessThanOrEqual(want * 1.4 + 1);
    }
  });
});
