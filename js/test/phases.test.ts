import { describe, expect, it } from "vitest";
import { phaseTotals, spansIn, spanTooltip } from "../src/memory/phases";
import { parseNotes, parsePhaseSpans, type PhaseSpans } from "../src/wire/notes";
import { joinCells, parseCells, parseStatus } from "../src/wire/protocol";
import { fixture } from "./wire";

// As `PhaseLog.wire()` makes them (gpumem_widget/live/modules/phases.py).
const STEP = {
  cell: 12,
  spans: [
    { phase: "forward", start: 100, end: 100.25, merged: 1, seconds: { forward: 0.25 } },
    { phase: "backward", start: 100.25, end: 100.75, merged: 1, seconds: { backward: 0.5 } },
    { phase: "optimizer", start: 100.8, end: 101, merged: 1, seconds: { optimizer: 0.2 } },
  ],
  seconds: { forward: 0.25, backward: 0.5, optimizer: 0.2 },
  counts: { forward: 1, backward: 1, optimizer: 1 },
  merged: false,
};

describe("phase spans", () => {
  it("are read from a note and from the status, and bad spans are left out", () => {
    const notes = parseNotes({
      modules: {
        phases: { ...STEP, spans: [...STEP.spans, { phase: "dancing", start: 1, end: 2 }, { phase: "forward", start: "x", end: 2 }] },
        modules: [{ path: "gpt", depth: 0, calls: 2, forward_kept: 1024, recompute_kept: 0, backward_added: -5, backward_high: 4096, parameters: 10, gradients: 10, compiled: false }, { depth: 1 }],
        modules_left_out: 3,
        allocator: true,
        hint: null,
      },
    });
    const note = notes.modules;
    expect(note?.phases?.spans.map((s) => s.phase)).toEqual(["forward", "backward", "optimizer"]);
    expect(note?.modules).toHaveLength(1);
    expect(note?.modules?.[0]?.backward_added).toBe(-5);
    expect(note?.modules_left_out).toBe(3);
    expect(notes.other).toEqual([]);
    const status = parseStatus({ running_cell: 12, running_phases: { ...STEP, spans: [{ phase: "backward", start: 102, end: null, merged: 1, seconds: {} }] } }, []);
    expect(status.running_phases?.spans[0]?.end).toBeNull();
    expect(parseStatus({ running_phases: "nonsense" }, []).running_phases).toBeNull();
    expect(parseStatus({}, []).running_phases).toBeNull();
  });

  it("on screen: those in the range, in time order, an open one reaching now", () => {
    const step = parsePhaseSpans(STEP) as PhaseSpans;
    const running = parsePhaseSpans({ ...STEP, cell: 13, spans: [{ phase: "forward", start: 103, end: null, merged: 1, seconds: {} }], counts: {}, seconds: {} }) as PhaseSpans;
    const all = spansIn([[13, running], [12, step]], 0, 1000, 104.5);
    expect(all.map((d) => [d.cell, d.phase, d.start, d.end])).toEqual([
      [12, "forward", 100, 100.25],
      [12, "backward", 100.25, 100.75],
      [12, "optimizer", 100.8, 101],
      [13, "forward", 103, 104.5],
    ]);
    expect(spansIn([[12, step]], 100.5, 100.7, 0).map((d) => d.phase)).toEqual(["backward"]);
    expect(spansIn([[12, step]], 101.5, 102, 0)).toEqual([]);
  });

  it("tooltips: the span's phase and length, the cell's exact totals; a merged span's mix", () => {
    const step = parsePhaseSpans(STEP) as PhaseSpans;
    const [, backward] = spansIn([[12, step]], 0, 1000, 0);
    const lines = spanTooltip(backward as ReturnType<typeof spansIn>[number]);
    expect(lines[0]).toBe("[12] backward 500 ms");
    expect(lines[lines.length - 1]).toBe("cell [12]: forward 250 ms (1 span) \u00b7 backward 500 ms (1 span) \u00b7 optimizer 200 ms (1 span)");
    const merged = parsePhaseSpans({
      ...STEP,
      spans: [{ phase: "backward", start: 100, end: 110, merged: 30, seconds: { forward: 2.5, backward: 5, optimizer: 1.5 } }],
      counts: { forward: 10, backward: 10, optimizer: 10 },
      seconds: { forward: 2.5, backward: 5, optimizer: 1.5 },
      merged: true,
    }) as PhaseSpans;
    const m = spanTooltip(spansIn([[12, merged]], 0, 1000, 0)[0] as ReturnType<typeof spansIn>[number]);
    expect(m[0]).toBe("[12] 30 phase spans merged, mostly backward");
    expect(m[2]).toBe("forward 2.50 s \u00b7 backward 5.00 s \u00b7 optimizer 1.50 s");
    expect(phaseTotals(merged)).toBe("forward 2.50 s (10 spans) \u00b7 backward 5.00 s (10 spans) \u00b7 optimizer 1.50 s (10 spans)");
    const open = parsePhaseSpans({ cell: 13, spans: [{ phase: "forward", start: 103, end: null, merged: 1, seconds: {} }], seconds: {}, counts: {}, merged: false }) as PhaseSpans;
    const o = spanTooltip(spansIn([[13, open]], 0, 1000, 103.5)[0] as ReturnType<typeof spansIn>[number]);
    expect(o[0]).toBe("[13] forward 500 ms so far");
    expect(o[1]).toMatch(/\u2013now$/);
    expect(o[o.length - 1]).toBe("cell [13]: no phase finished yet");
  });
});

describe("the kernel's real output (test/fixtures/wire.json)", () => {
  it("the running cell's spans: two steps done, the third's forward open; a record's note", () => {
    const status = parseStatus(fixture.state["status"], []);
    const running = status.running_phases as PhaseSpans;
    expect(running.cell).toBe(status.running_cell);
    expect(running.spans.map((s) => s.phase)).toEqual(["forward", "backward", "optimizer", "forward", "backward", "optimizer", "forward"]);
    expect(running.spans.map((s) => s.end === null)).toEqual([false, false, false, false, false, false, true]);
    expect(running.counts).toEqual({ forward: 2, backward: 2, optimizer: 2 });
    const drawn = spansIn([[running.cell as number, running]], 0, Infinity, (status.running_started ?? 0) + 10);
    expect(drawn[drawn.length - 1]?.end).toBe((status.running_started ?? 0) + 10);
    const { cells } = parseCells(joinCells(fixture.state["cells"], fixture.state["cells_tail"]));
    const training = cells.find((c) => c.notes.modules !== null);
    const rows = training?.notes.modules?.modules ?? [];
    expect(rows.map((r) => [r.path, r.depth])).toEqual([
      ["gpt", 0],
      ["gpt.h", 1],
      ["gpt.h.0", 2],
      ["gpt.h.0.attn", 3],
      ["gpt.h.0.mlp", 3],
      ["gpt.h.1", 2],
      ["gpt.h.1.attn", 3],
      ["gpt.h.1.mlp", 3],
      ["gpt.h.2", 2],
      ["gpt.h.2.attn", 3],
      ["gpt.h.2.mlp", 3],
    ]);
    const mib = 2 ** 20;
    expect(rows.find((r) => r.path === "gpt.h.2.mlp")?.forward_kept).toBe(3 * 64 * mib);
    expect(rows.find((r) => r.path === "gpt")?.forward_kept).toBe((64 + 128 + 192 + 3 * 32) * mib);
    expect(rows.find((r) => r.path === "gpt")?.backward_added).toBe(3 * 16 * mib);
  });
});
