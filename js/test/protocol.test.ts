import { describe, expect, it } from "vitest";
import { estimateError, NO_NOTES, parseNotes } from "../src/wire/notes";
import { TimelineStore } from "../src/memory/timeline_store";
import { decodeBands, joinCells, parseCells, parseDevices, parseExtent, parseStatus, PROTOCOL_VERSION, ProtocolError } from "../src/wire/protocol";
import { decodeTable, type DecodedTable } from "../src/wire/table";
import { fixture, received } from "./wire";

type Data = Record<string, readonly number[]>;

/** Pack like protocol.pack_table; each buffer a DataView at byte offset `pad` of a larger buffer. */
function pack(data: Data, pad = 0): { n: number; columns: string[]; dtypes: string[]; buffers: DataView[] } {
  const columns = Object.keys(data);
  const n = columns.length > 0 ? (data[columns[0] as string] as number[]).length : 0;
  return {
    n,
    columns,
    dtypes: columns.map((c) => (c === "t" ? "f8" : "f4")),
    buffers: columns.map((c) => {
      const typed = c === "t" ? Float64Array.from(data[c] as number[]) : Float32Array.from(data[c] as number[]);
      const bytes = new Uint8Array(typed.byteLength + pad);
      bytes.set(new Uint8Array(typed.buffer), pad);
      return new DataView(bytes.buffer, pad, typed.byteLength);
    }),
  };
}

const decode = (data: Data, pad = 0): DecodedTable => decodeTable(pack(data, pad), "table");
const list = (x: ArrayLike<number> | undefined): number[] => Array.from(x ?? []);

describe("decodeTable", () => {
  it("decodes aligned and unaligned DataViews to the same numbers", () => {
    const data = { t: [1.5, 2.25, 1e9 + 0.125], "cuda:0/allocated": [0, 1024, 2 ** 35] };
    for (const pad of [0, 1, 3, 8]) {
      const table = decode(data, pad);
      expect(table.n).toBe(3);
      expect(list(table.columns.get("t"))).toEqual(data.t);
      expect(list(table.columns.get("cuda:0/allocated"))).toEqual(data["cuda:0/allocated"]);
      expect(table.columns.get("t")).toBeInstanceOf(Float64Array);
      expect(table.columns.get("cuda:0/allocated")).toBeInstanceOf(Float32Array);
    }
  });

  it("views aligned buffers without copying and copies unaligned ones", () => {
    const aligned = pack({ t: [1, 2] }, 8);
    expect(decodeTable(aligned, "x").columns.get("t")?.buffer).toBe(aligned.buffers[0]?.buffer);
    const unaligned = pack({ t: [1, 2] }, 3);
    expect(decodeTable(unaligned, "x").columns.get("t")?.buffer).not.toBe(unaligned.buffers[0]?.buffer);
  });

  it("accepts ArrayBuffers and typed arrays as buffers too", () => {
    const t = new Float64Array([5, 6]);
    const v = new Float32Array([7, 8]);
    const table = decodeTable({ n: 2, columns: ["t", "host/rss"], dtypes: ["f8", "f4"], buffers: [t.buffer, v] }, "x");
    expect(list(table.columns.get("t"))).toEqual([5, 6]);
    expect(list(table.columns.get("host/rss"))).toEqual([7, 8]);
  });

  it("keeps NaN (a reader had nothing)", () => {
    const table = decode({ t: [1, 2], "host/rss": [NaN, 3] });
    expect(Number.isNaN(table.columns.get("host/rss")?.[0])).toBe(true);
  });

  it("reads an unset trait as the empty table", () => {
    expect(decodeTable({}, "x").n).toBe(0);
    expect(decodeTable(undefined, "x").n).toBe(0);
    expect(decode({ t: [] }).n).toBe(0);
  });

  it.each([
    ["not a table", "nope", /expected a table/],
    ["a bad row count", { n: -1, columns: [], dtypes: [], buffers: [] }, /row count/],
    ["mismatched lists", { n: 0, columns: ["t"], dtypes: [], buffers: [] }, /1 columns but 0 dtypes/],
    ["an unknown dtype", { n: 1, columns: ["t"], dtypes: ["i8"], buffers: [new ArrayBuffer(8)] }, /unknown dtype/],
    ["a short buffer", { n: 2, columns: ["t"], dtypes: ["f8"], buffers: [new ArrayBuffer(12)] }, /12 bytes for 2 rows/],
    ["JSON instead of bytes", { n: 1, columns: ["t"], dtypes: ["f8"], buffers: [[1]] }, /expected binary data/],
    ["no time column", { n: 1, columns: ["host/rss"], dtypes: ["f4"], buffers: [new ArrayBuffer(4)] }, /no "t" column/],
  ])("rejects %s with one clear error", (_what, raw, message) => {
    expect(() => decodeTable(raw, "timeline_tail")).toThrow(ProtocolError);
    expect(() => decodeTable(raw, "timeline_tail")).toThrow(message);
  });
});

describe("TimelineStore", () => {
  const cols = (t: number[], a: number[]): Data => ({ t, "cuda:0/allocated": a, "host/rss": a.map((x) => x * 10) });

  it("joins base and tail", () => {
    const store = new TimelineStore();
    store.setBase(decode(cols([1, 2, 3], [10, 20, 30])));
    store.setTail(decode(cols([4, 5], [40, 50])));
    const tl = store.timeline;
    expect(tl.n).toBe(5);
    expect(list(tl.t)).toEqual([1, 2, 3, 4, 5]);
    expect(list(tl.values.get("cuda:0/allocated"))).toEqual([10, 20, 30, 40, 50]);
    expect(list(tl.values.get("host/rss"))).toEqual([100, 200, 300, 400, 500]);
  });

  it("replaces the tail on each update and keeps the base", () => {
    const store = new TimelineStore();
    store.setBase(decode(cols([1, 2], [10, 20])));
    store.setTail(decode(cols([3, 4, 5], [30, 40, 50])));
    store.setTail(decode(cols([3], [33])));
    expect(list(store.timeline.t)).toEqual([1, 2, 3]);
    expect(list(store.timeline.values.get("cuda:0/allocated"))).toEqual([10, 20, 33]);
  });

  it("grows past its spare capacity", () => {
    const store = new TimelineStore();
    store.setBase(decode(cols([0], [0])));
    const big = Array.from({ length: 5000 }, (_, i) => i + 1);
    store.setTail(decode(cols(big, big)));
    expect(store.timeline.n).toBe(5001);
    expect(store.timeline.t[5000]).toBe(5000);
    expect(store.timeline.values.get("cuda:0/allocated")?.[4999]).toBe(4999);
  });

  it("starts over from a new base", () => {
    const store = new TimelineStore();
    store.setBase(decode(cols([1, 2], [10, 20])));
    store.setTail(decode(cols([3], [30])));
    store.setBase(decode(cols([1, 2, 3, 4], [11, 21, 31, 41])));
    store.setTail(decode(cols([], [])));
    expect(list(store.timeline.values.get("cuda:0/allocated"))).toEqual([11, 21, 31, 41]);
  });

  it("drops tail rows the base already covers, so time stays ascending", () => {
    const store = new TimelineStore();
    store.setBase(decode(cols([1, 2, 3], [10, 20, 30])));
    store.setTail(decode(cols([2, 3, 4], [0, 0, 40])));
    expect(list(store.timeline.t)).toEqual([1, 2, 3, 4]);
    expect(list(store.timeline.values.get("cuda:0/allocated"))).toEqual([10, 20, 30, 40]);
  });

  it("fills a column one part lacks with NaN", () => {
    const store = new TimelineStore();
    store.setBase(decode({ t: [1, 2], "host/rss": [5, 6] }));
    store.setTail(decode({ t: [3], "host/rss": [7], "cuda:0/allocated": [9] }));
    const alloc = list(store.timeline.values.get("cuda:0/allocated"));
    expect(alloc.slice(0, 2).every(Number.isNaN)).toBe(true);
    expect(alloc[2]).toBe(9);
    expect(list(store.timeline.values.get("host/rss"))).toEqual([5, 6, 7]);
  });
});

describe("JSON traits", () => {
  it("parses devices and fills optional fields", () => {
    expect(parseDevices([{ index: 0, name: "H200", uuid: "GPU-x", total: 100, nvml: true }, { index: 1 }])).toEqual([
      { index: 0, name: "H200", uuid: "GPU-x", total: 100, nvml: true },
      { index: 1, name: "cuda:1", uuid: null, total: null, nvml: false },
    ]);
    expect(parseDevices(undefined)).toEqual([]);
    expect(() => parseDevices([{ name: "no index" }])).toThrow(/devices\[0\]\.index/);
    expect(() => parseDevices("x")).toThrow(ProtocolError);
  });

  it("reads an empty status as not started, in the mode the devices imply", () => {
    const s = parseStatus({}, []);
    expect(s.mode).toBe("host");
    expect(s.sampler).toBeNull();
    expect(parseStatus(undefined, [{ index: 0, name: "", uuid: null, total: null, nvml: false }]).mode).toBe("cuda");
  });

  it("keeps only well-formed readers and peaks", () => {
    const s = parseStatus(
      { mode: "cuda", sampler: "paused", readers: { nvml: { ok: false, reason: "no driver" }, bad: 3 }, session_peak: [{ device: 0, allocated: 1, reserved: 2 }, { device: 1 }] },
      [],
    );
    expect(s.sampler).toBe("paused");
    expect(s.readers).toEqual({ nvml: { ok: false, reason: "no driver" } });
    expect(s.session_peak).toEqual([{ device: 0, allocated: 1, reserved: 2 }]);
  });

  it("keeps only well-formed process lists, and reads no running cell as idle", () => {
    const s = parseStatus(
      { processes: { "0": [{ pid: 1, used: 10, self: true, name: "k" }, { used: 5 }, 7], x: [{ pid: 2 }], "1": "none" }, running_cell: 3 },
      [],
    );
    expect([...s.processes]).toEqual([[0, [{ pid: 1, used: 10, self: true, name: "k" }]]]);
    expect(s.running_started).toBeNull();
    expect(parseStatus({}, []).processes.size).toBe(0);
  });

  it("leaves out a malformed cell record and says which", () => {
    const good = { execution_count: 1, source: "x", started: 10, duration: 1, devices: [] };
    const { cells, problems } = parseCells([good, { execution_count: 2, started: "soon", duration: 1 }]);
    expect(cells.map((c) => c.execution_count)).toEqual([1]);
    expect(problems).toEqual(['cells[1].started: expected a number, got "soon"']);
  });

  it("derives a device's figures only when an older kernel left them out", () => {
    const device = { device: 0, allocated_before: 10, allocated_after: 30, reserved_before: 40, reserved_after: 45, peak_allocated: 50, peak_reserved: 60, process_used_after: 100 };
    const [cell] = parseCells([{ execution_count: 1, started: 0, duration: 1, devices: [device] }]).cells;
    expect(cell?.devices[0]).toMatchObject({ delta_allocated: 20, delta_reserved: 5, outside_pytorch: 55, peak_exact: true, device_used_after: null });
  });
});

describe("the Python side's real output (test/fixtures/wire.json)", () => {
  const approx = (expected: (number | null)[], name: string): number[] =>
    expected.map((v) => (v === null ? NaN : name === "t" ? v : Math.fround(v)));

  it("decodes base + tail to the numbers Python packed", () => {
    const state = received();
    const store = new TimelineStore();
    store.setBase(decodeTable(state["timeline_base"], "timeline_base"));
    store.setTail(decodeTable(state["timeline_tail"], "timeline_tail"));
    const tl = store.timeline;
    const { base, tail } = fixture.expected;
    expect(tl.n).toBe((base["t"] as number[]).length + (tail["t"] as number[]).length);
    expect(list(tl.t)).toEqual(approx([...(base["t"] ?? []), ...(tail["t"] ?? [])], "t"));
    for (const name of Object.keys(base)) {
      if (name === "t") continue;
      expect(list(tl.values.get(name)), name).toEqual(approx([...(base[name] ?? []), ...(tail[name] ?? [])], name));
    }
  });

  it("parses devices, status and cells without loss", () => {
    const state = received();
    const devices = parseDevices(state["devices"]);
    expect(devices.map((d) => [d.index, d.nvml])).toEqual([
      [0, true],
      [1, false],
    ]);
    const status = parseStatus(state["status"], devices);
    expect(status.readers["nvml"]).toEqual({ ok: false, reason: "NVML Shared Library Not Found" });
    expect(status.running_cell).toBe(7);
    expect(status.running_started).toBe(1_750_000_000.25 + 0.49);
    // The kernel's protocol version is this bundle's; the fixture is rewritten from the kernel's
    // code (scripts/make_js_fixtures.py), so a change on one side shows here.
    expect(status.protocol).toBe(PROTOCOL_VERSION);
    expect(status.hints).toEqual([expect.stringContaining("cuda:1: this kernel holds a CUDA context")]);
    // Fewer cells than a band block: the table is empty, the bands come from the records.
    expect(decodeBands(state["cell_bands"])).toEqual([]);
    expect(parseExtent(state["ledger_extent"], fixture.expected.cells.length)).toMatchObject({ total: fixture.expected.cells.length, first: 0 });
    const { cells, problems } = parseCells(joinCells(state["cells"], state["cells_tail"]));
    expect(problems).toEqual([]);
    expect(cells.map(({ notes: _notes, ...rest }) => rest)).toEqual(fixture.expected.cells.map(({ notes: _notes, ...rest }) => rest));
  });

  it("reads each device's process list: this kernel, the others, a figure NVML did not have", () => {
    const status = parseStatus(received()["status"], []);
    expect([...status.processes.keys()]).toEqual([0, 1]);
    expect(status.processes.get(0)?.map((p) => [p.pid, p.self])).toEqual([
      [4242, true],
      [777, false],
    ]);
    expect(status.processes.get(1)?.[1]).toEqual({ pid: 9001, used: null, self: false, name: null });
  });

  it("reads every feature's note as the kernel wrote it", () => {
    const state = received();
    const { cells } = parseCells(joinCells(state["cells"], state["cells_tail"]));
    const wire = (n: number): Record<string, Record<string, unknown>> =>
      fixture.expected.cells.find((c) => c["execution_count"] === n)?.["notes"] as Record<string, Record<string, unknown>>;
    const byCount = new Map(cells.map((c) => [c.execution_count, c.notes]));

    const close = byCount.get(4)?.estimate;
    const closeWire = wire(4)["estimate"] as { comparison: Record<string, unknown>; estimate: { terms: unknown[]; total: number } };
    expect(close?.device).toBe(0);
    expect(close?.comparison).toMatchObject({
      predicted: closeWire.comparison["predicted"],
      measured: closeWire.comparison["measured"],
      within_tolerance: true,
      suspect: null,
    });
    expect(close?.estimate.terms.map((t) => t.key)).toEqual(closeWire.estimate.terms.map((t) => (t as { key: string }).key));
    expect(close?.estimate.total).toBe(closeWire.estimate.total);
    expect(byCount.get(6)?.estimate?.comparison).toMatchObject({ within_tolerance: false, suspect: "optimizer_state" });

    const pm = byCount.get(5)?.postmortem;
    const pmWire = wire(5)["postmortem"] as { devices: Record<string, unknown>[]; suggestions: { key: string }[] };
    expect(pm?.devices[0]).toEqual(pmWire.devices[0]);
    expect(pm?.suggestions.map((s) => s.key)).toEqual(pmWire.suggestions.map((s) => s.key));
    expect(pm?.place).toEqual((wire(5)["postmortem"] as { place: unknown }).place);
    expect(pm?.place?.text).toBe("backward of model.layers.3.mlp");
    expect(pm?.holders?.holders.map((h) => [h.name, h.section])).toEqual([
      ["activations (train.py:12)", "traceback"],
      ["model", "user"],
      ["old_batch", "user"],
      ["Out[3]", "output_cache"],
    ]);

    expect(byCount.get(3)?.leaks).toEqual(wire(3)["leaks"]);
    expect(byCount.get(4)?.other).toEqual([{ key: "future_feature", value: wire(4)["future_feature"], problem: null }]);
    expect(byCount.get(1)).toBe(NO_NOTES);
  });
});

describe("notes", () => {
  it("keeps a note this version cannot read as it came, with the reason", () => {
    const notes = parseNotes({ estimate: { device: 0, comparison: { measured: 5 } }, leaks: "three", postmortem: null });
    expect(notes.estimate).toBeNull();
    expect(notes.other.map((o) => [o.key, o.problem])).toEqual([
      ["estimate", "notes.estimate.estimate: expected an object"],
      ["leaks", "notes.leaks: expected a list"],
      ["postmortem", "notes.postmortem: expected an object"],
    ]);
  });

  it("leaves out a malformed item, not the whole note", () => {
    const notes = parseNotes({ leaks: [{ message: "grows" }, { message: 3 }, "x"] });
    expect(notes.leaks).toEqual([{ kind: "", message: "grows", device: "", bytes: 0, execution_counts: [] }]);
  });

  it("derives a comparison's verdict when an older kernel left it out", () => {
    const est = parseNotes({ estimate: { device: 1, estimate: {}, comparison: { predicted: 100, measured: 105 } } }).estimate;
    expect(est?.comparison).toMatchObject({ error_bytes: 5, within_tolerance: true, tolerance: 0.1 });
    expect(estimateError(est!.comparison)).toBeCloseTo(5 / 105);
  });

  it("reads a record without notes (an older kernel) as having none", () => {
    const { cells } = parseCells([{ execution_count: 1, started: 0, duration: 1 }]);
    expect(cells[0]?.notes).toBe(NO_NOTES);
  });
});

describe("joinCells", () => {
  it("shows the blocks then the newest records, in order", () => {
    const a = { execution_count: 1 };
    const b = { execution_count: 2 };
    const c = { execution_count: 3 };
    expect(joinCells([a, b], [c])).toEqual([a, b, c]);
    expect(joinCells([a], [])).toEqual([a]);
    expect(joinCells([], [a])).toEqual([a]);
  });

  it("takes a state with no tail (an older kernel) and passes bad input on to be reported", () => {
    const a = { execution_count: 1 };
    expect(joinCells([a], undefined)).toEqual([a]);
    expect(joinCells("nonsense", [a])).toBe("nonsense");
    expect(joinCells([a], 7)).toBe(7);
  });

  it("reads both parts as the JSON texts the kernel sends, and lists from an older kernel", () => {
    const a = { execution_count: 1 };
    const b = { execution_count: 2 };
    expect(joinCells(JSON.stringify([a]), JSON.stringify([b]))).toEqual([a, b]);
    expect(joinCells(JSON.stringify([a]), [b])).toEqual([a, b]);
    expect(joinCells([a], JSON.stringify([b]))).toEqual([a, b]);
    expect(joinCells("[not json", [b])).toBe("[not json");
  });
});

