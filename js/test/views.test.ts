// @vitest-environment happy-dom
import { describe, expect, it, vi } from "vitest";
import { yTop } from "../src/memory/chart";
import { Details } from "../src/memory/details";
import { Header, processSummary } from "../src/header";
import { Ledger } from "../src/memory/ledger";
import { NO_NOTES, parseNotes } from "../src/wire/notes";
import { joinCells, parseCells, parseDevices, parseStatus, type CellRecord, type DeviceCellUsage, type DeviceInfo } from "../src/wire/protocol";
import { received } from "./wire";

const GiB = 1024 ** 3;
const HOSTILE = '<img src=x onerror="window.pwned=1"><b>bold</b>';

function usage(peak: number, over: Partial<DeviceCellUsage> = {}): DeviceCellUsage {
  return {
    device: 0,
    allocated_before: GiB,
    allocated_after: 2 * GiB,
    reserved_before: 2 * GiB,
    reserved_after: 4 * GiB,
    peak_allocated: peak,
    peak_reserved: 5 * GiB,
    peak_exact: true,
    alloc_retries: 0,
    ooms: 0,
    process_used_after: 4.5 * GiB,
    device_used_after: 6 * GiB,
    others_used_after: 0,
    delta_allocated: GiB,
    delta_reserved: 2 * GiB,
    outside_pytorch: 0.5 * GiB,
    ...over,
  };
}

function cell(n: number, peak: number, over: Partial<CellRecord> = {}): CellRecord {
  return {
    execution_count: n,
    cell_id: null,
    source: `${HOSTILE}\nsecond line`,
    started: 1000 + n,
    duration: n / 10,
    error: null,
    oom: false,
    host_rss_before: null,
    host_rss_after: null,
    host_rss_peak: null,
    devices: [usage(peak)],
    notes: NO_NOTES,
    missing: {},
    ...over,
  };
}

const H200: DeviceInfo = { index: 0, name: "NVIDIA H200", uuid: "GPU-1", total: 140 * GiB, nvml: true };
const rowNumbers = (ledger: Ledger): string[] =>
  [...ledger.el.querySelectorAll<HTMLElement>("tbody tr")].map((r) => r.dataset["executionCount"] ?? "");

describe("ledger", () => {
  it("has one row per cell, keyed by execution count, newest first", () => {
    const ledger = new Ledger(() => undefined);
    ledger.update([cell(1, GiB), cell(2, 3 * GiB), cell(3, 2 * GiB)], "cuda");
    expect(rowNumbers(ledger)).toEqual(["3", "2", "1"]);
  });

  it("sorts by peak, costliest first, in one click", () => {
    const ledger = new Ledger(() => undefined);
    ledger.update([cell(1, GiB), cell(2, 3 * GiB), cell(3, 2 * GiB)], "cuda");
    ledger.el.querySelector<HTMLButtonElement>('button[data-sort="peak"]')?.click();
    expect(rowNumbers(ledger)).toEqual(["2", "3", "1"]);
    expect(ledger.el.querySelector('button[data-sort="peak"]')?.closest("th")?.getAttribute("aria-sort")).toBe("descending");
    ledger.el.querySelector<HTMLButtonElement>('button[data-sort="peak"]')?.click();
    expect(rowNumbers(ledger)).toEqual(["1", "3", "2"]);
  });

  it("reports the clicked row and marks the selection", () => {
    const onSelect = vi.fn();
    const ledger = new Ledger(onSelect);
    ledger.update([cell(1, GiB), cell(2, GiB)], "cuda");
    ledger.el.querySelector<HTMLElement>('tr[data-execution-count="1"] td')?.click();
    expect(onSelect).toHaveBeenCalledWith(1);
    ledger.setSelected(1);
    expect(ledger.el.querySelector('tr[data-execution-count="1"]')?.getAttribute("aria-selected")).toBe("true");
    expect(ledger.el.querySelector('tr[data-execution-count="2"]')?.getAttribute("aria-selected")).toBe("false");
  });

  it("shows source as text, never as markup", () => {
    const ledger = new Ledger(() => undefined);
    ledger.update([cell(1, GiB)], "cuda");
    expect(ledger.el.querySelector("img, b")).toBeNull();
    expect(ledger.el.querySelector("td.gpumem-col-source")?.textContent).toBe(HOSTILE);
  });

  it("marks OOM and error rows, and drops the reserved column in host mode", () => {
    const ledger = new Ledger(() => undefined);
    ledger.update([cell(1, GiB, { oom: true, error: "OutOfMemoryError" }), cell(2, GiB, { error: "KeyError" })], "cuda");
    expect(ledger.el.querySelector<HTMLElement>('tr[data-execution-count="1"]')?.dataset["outcome"]).toBe("oom");
    expect(ledger.el.querySelector<HTMLElement>('tr[data-execution-count="2"]')?.dataset["outcome"]).toBe("error");
    expect(ledger.el.querySelectorAll("th.gpumem-col-reserved").length).toBe(1);
    ledger.update([cell(1, GiB)], "host");
    expect(ledger.el.querySelectorAll(".gpumem-col-reserved").length).toBe(0);
  });
});

describe("details", () => {
  it("says which figures a reader could not give, and why, and marks an interrupted cell", () => {
    const details = new Details(() => undefined);
    const missing = { host_rss_before: "memory_info raised PermissionError: denied" };
    details.show(cell(5, GiB, { error: "KeyboardInterrupt", missing }), [H200], "cuda");
    const items = [...details.el.querySelectorAll(".gpumem-details-missing li")].map((li) => li.textContent);
    expect(items).toEqual(["host_rss_before missing: memory_info raised PermissionError: denied"]);
    expect(details.el.dataset["outcome"]).toBe("interrupted");
    expect(details.el.textContent).toContain("interrupted");
  });

  it("shows per-device figures, memory outside PyTorch and the source as text", () => {
    const details = new Details(() => undefined);
    details.show(cell(4, 3 * GiB, { oom: true, error: "OutOfMemoryError" }), [H200], "cuda");
    const text = details.el.textContent ?? "";
    expect(details.el.hidden).toBe(false);
    expect(details.el.dataset["executionCount"]).toBe("4");
    expect(text).toContain("out of memory");
    expect(text).toContain("1.00 GiB \u2192 2.00 GiB (+1.00 GiB)");
    expect(text).toContain("outside PyTorch512 MiB");
    expect(details.el.querySelector("img, b")).toBeNull();
    expect(details.el.querySelector("pre")?.textContent).toBe(`${HOSTILE}\nsecond line`);
  });

  it("says when a figure is a lower bound or missing", () => {
    const details = new Details(() => undefined);
    details.show(cell(1, 3 * GiB, { devices: [usage(3 * GiB, { peak_exact: false, outside_pytorch: null, process_used_after: null })] }), [H200], "cuda");
    const text = details.el.textContent ?? "";
    expect(text).toContain("\u2265 3.00 GiB");
    expect(text).toContain("n/a (no NVML process figure)");
  });

  it("closes through its button", () => {
    const onClose = vi.fn();
    const details = new Details(onClose);
    details.show(cell(1, GiB), [H200], "cuda");
    details.el.querySelector<HTMLButtonElement>(".gpumem-details-close")?.click();
    expect(onClose).toHaveBeenCalledOnce();
  });
});

describe("header", () => {
  it("shows devices, mode, sampler state and why a reader is unavailable", () => {
    const header = new Header();
    const status = parseStatus(
      { mode: "cuda", sampler: "running", busy_interval: 0.01, idle_interval: 0.5, readers: { nvml: { ok: false, reason: HOSTILE } }, running_cell: 9 },
      [H200],
    );
    header.update([H200], status, ["timeline_tail: bad"]);
    const text = header.el.textContent ?? "";
    expect(text).toContain("CUDA");
    expect(text).toContain("cuda:0 NVIDIA H200 \u00b7 140 GiB");
    expect(text).toContain("sampler running (every 10 ms in a cell, 500 ms idle)");
    expect(text).toContain("running [9]");
    expect(text).toContain(`nvml unavailable: ${HOSTILE}`);
    expect(text).toContain("display: timeline_tail: bad");
    expect(header.el.querySelector("img, b")).toBeNull();
  });

  it("shows the kernel's hints as text, and drops malformed ones", () => {
    const header = new Header();
    const hint = `cuda:1: this kernel holds a CUDA context (540 MiB) ${HOSTILE}`;
    header.update([H200], parseStatus({ mode: "cuda", readers: {}, hints: [hint, 7] }, [H200]), []);
    const items = [...header.el.querySelectorAll('li[data-kind="hint"]')].map((li) => li.textContent);
    expect(items).toEqual([hint]);
    expect(header.el.querySelector("img, b")).toBeNull();
  });

  it("names host mode, and never calls it GPU memory", () => {
    const header = new Header();
    const readers = { torch: { ok: false, reason: "torch is not imported yet: GPU memory is read once the notebook imports it" } };
    header.update([], parseStatus({ mode: "host", sampler: "stopped", readers }, []), []);
    expect(header.el.querySelector(".gpumem-title")?.textContent).toBe("Host memory");
    const mode = header.el.querySelector<HTMLElement>(".gpumem-mode");
    expect(mode?.textContent).toBe("host mode");
    expect(mode?.title).toMatch(/^torch is not imported yet: .*Not measured: GPU memory\.$/); // the kernel's reason, not a guess
    expect(header.el.textContent).toContain("sampler stopped");
    header.update([H200], parseStatus({ mode: "cuda", sampler: "running", readers: {} }, [H200]), []);
    expect(header.el.querySelector(".gpumem-title")?.textContent).toBe("GPU memory");
    expect(header.el.querySelector(".gpumem-mode")?.textContent).toBe("CUDA");
  });

  it("says in host mode what is measured and what is not, in place of the GPU readers' failures", () => {
    const header = new Header();
    const readers = {
      torch: { ok: false, reason: "no CUDA device: host-memory mode" },
      nvml: { ok: false, reason: "NVML could not start: NVMLError_LibraryNotFound" },
      host: { ok: true, reason: null },
    };
    header.update([], parseStatus({ mode: "host", sampler: "running", readers }, []), []);
    const items = [...header.el.querySelectorAll("li")].map((li) => [li.dataset["kind"], li.textContent]);
    expect(items).toEqual([
      ["mode", "no CUDA device: host-memory mode. Measured: this process's host memory (RSS), sampled, so a cell's peak is at least the figure shown. Not measured: GPU memory."],
    ]);
    expect(header.el.textContent).not.toContain("torch unavailable");
    expect(header.el.textContent).not.toContain("is_available");
  });
});

describe("with several devices", () => {
  const two = (n: number, d0: number, d1: number): CellRecord =>
    cell(n, GiB, { devices: [usage(d0, { device: 0, delta_allocated: d0 }), usage(d1, { device: 1, delta_allocated: d1 })] });
  const figures = (ledger: Ledger, n: number): string[] =>
    [...ledger.el.querySelectorAll(`tr[data-execution-count="${n}"] td.gpumem-col-num`)].map((td) => td.textContent ?? "");
  const titleOf = (ledger: Ledger, key: string): string => ledger.el.querySelector(`button[data-sort="${key}"]`)?.closest("th")?.title ?? "";

  it("sums changes and takes the largest peak across all devices, and says so", () => {
    const ledger = new Ledger(() => undefined);
    ledger.update([two(1, GiB, 3 * GiB)], "cuda", null, true);
    expect(figures(ledger, 1).slice(1, 3)).toEqual(["+4.00 GiB", "3.00 GiB"]);
    expect(titleOf(ledger, "delta")).toContain("the sum over all devices");
    expect(titleOf(ledger, "peak")).toContain("the largest of any device");
    const peak = ledger.el.querySelectorAll<HTMLElement>('tr[data-execution-count="1"] td.gpumem-col-num')[2];
    expect(peak?.title).toBe("cuda:0 1.00 GiB\ncuda:1 3.00 GiB");
  });

  it("shows one device's figures when it is chosen", () => {
    const ledger = new Ledger(() => undefined);
    ledger.update([two(1, GiB, 3 * GiB), two(2, 2 * GiB, 0)], "cuda", 0, true);
    expect(figures(ledger, 1).slice(1, 3)).toEqual(["+1.00 GiB", "1.00 GiB"]);
    expect(titleOf(ledger, "peak")).toBe("Peak allocated during the cell on cuda:0");
    ledger.el.querySelector<HTMLButtonElement>('button[data-sort="peak"]')?.click();
    expect(rowNumbers(ledger)).toEqual(["2", "1"]);
    ledger.update([two(1, GiB, 3 * GiB), two(2, 2 * GiB, 0)], "cuda", 1, true);
    expect(rowNumbers(ledger)).toEqual(["1", "2"]);
    expect(figures(ledger, 1).slice(1, 3)).toEqual(["+3.00 GiB", "3.00 GiB"]);
  });

  it("keeps plain titles with one device", () => {
    const ledger = new Ledger(() => undefined);
    ledger.update([cell(1, GiB)], "cuda", null, false);
    expect(titleOf(ledger, "peak")).toBe("Peak allocated during the cell");
  });
});

describe("the recorded state (test/fixtures/wire.json)", () => {
  const state = received();
  const devices = parseDevices(state["devices"]);
  const status = parseStatus(state["status"], devices);
  const { cells } = parseCells(joinCells(state["cells"], state["cells_tail"]));
  const shown = (n: number): string => {
    const details = new Details(() => undefined);
    details.show(cells.find((c) => c.execution_count === n) as CellRecord, devices, "cuda");
    expect(details.el.querySelector("img, b, script")).toBeNull();
    return details.el.textContent ?? "";
  };
  const note = (n: number, kind: string): HTMLElement => {
    const details = new Details(() => undefined);
    details.show(cells.find((c) => c.execution_count === n) as CellRecord, devices, "cuda");
    return details.el.querySelector(`.gpumem-note[data-note="${kind}"]`) as HTMLElement;
  };

  it("marks ledger rows with the estimate's error and leak hints, as text", () => {
    const ledger = new Ledger(() => undefined);
    ledger.update(cells, "cuda", null, true);
    const markers = (n: number): string[][] =>
      [...ledger.el.querySelectorAll<HTMLElement>(`tr[data-execution-count="${n}"] .gpumem-marker`)].map((m) => [m.dataset["note"] ?? "", m.textContent ?? "", String("warn" in m.dataset)]);
    expect(markers(4)).toEqual([["estimate", "est +2.9%", "false"]]);
    expect(markers(6)).toEqual([["estimate", "est +28.6%", "true"]]);
    expect(markers(3)).toEqual([["leak", "\u26a0 leak", "true"]]);
    expect(markers(1)).toEqual([]);
    expect(ledger.el.querySelector('tr[data-execution-count="6"] .gpumem-marker')?.getAttribute("title")).toContain("28.6% above the estimate");
    expect(ledger.el.querySelector('tr[data-execution-count="4"] .gpumem-source-text')?.textContent).toBe(
      "train_step(model, opt, batch)  # <img src=x onerror=alert(1)><b>bold</b>",
    );
    expect(ledger.el.querySelector("img, b")).toBeNull();
  });

  it("sets the estimate beside the measured peak, with its terms", () => {
    const section = note(4, "estimate");
    expect(section.querySelector(".gpumem-note-verdict")?.textContent).toBe("predicted 2.75 GiB \u00b7 measured 2.83 GiB (+2.9%) \u00b7 within \u00b110%");
    expect(section.querySelector<HTMLElement>(".gpumem-note-verdict")?.dataset["within"]).toBe("true");
    expect(section.textContent).toContain("Sequential: batch 64, float32, AdamW");
    const terms = [...section.querySelectorAll(".gpumem-note-terms tbody tr")].map((tr) => [...tr.children].map((c) => c.textContent));
    expect(terms[0]).toEqual(["parameters", "128 MiB", "N \u00d7 P = 33,562,624 \u00d7 4 B [counted]"]);
    expect(terms.map((t) => t[0])).toContain("activations");
    expect(terms.map((t) => t[0])).toContain("optimizer step phase (peak)");
    expect(terms.at(-1)?.[0]).toBe("+ other memory on the device");
  });

  it("names the term most likely off when the estimate misses", () => {
    const text = note(6, "estimate").textContent ?? "";
    expect(text).toContain("outside \u00b110%");
    expect(text).toContain("most likely off: optimizer state (AdamW) (rule)");
    expect(text).toContain("measured 3.85 GiB is 28.6% above the estimate 2.75 GiB");
  });

  it("shows the OOM post-mortem: figures, what holds memory, what to do", () => {
    const section = note(5, "postmortem");
    const text = section.textContent ?? "";
    expect(text).toContain("OutOfMemoryError on cuda:0: asked for 6.00 GiB, 4.00 GiB free of 140 GiB, short by 2.00 GiB");
    const rows = new Map([...section.querySelectorAll(".gpumem-note-oom tbody tr")].map((tr) => [tr.children[0]?.textContent, tr.children[1]?.textContent]));
    const place = section.querySelector<HTMLElement>("[data-place]");
    expect(place?.textContent).toBe("While running: backward of model.layers.3.mlp (from the failing thread's tag)");
    expect(place?.dataset["place"]).toBe("cell:5 backward model.layers.3.mlp");
    expect(rows.get("reserved but unallocated")).toBe("8.00 GiB");
    expect(rows.get("allocator retries")).toBe("1");
    expect(rows.get("allocated at the OOM")).toBe("127 GiB");
    expect(rows.get("figures from")).toBe("the OOM observer");
    expect(rows.has("other processes")).toBe(false); // none on this device: no empty row
    const groups = [...section.querySelectorAll<HTMLElement>(".gpumem-note-holders")].map((g) => g.dataset["section"]);
    expect(groups).toEqual(["user", "output_cache", "traceback"]);
    expect(section.querySelector('[data-section="traceback"] li')?.textContent).toContain("activations (train.py:12): frame \u00b7 3.00 GiB on cuda:0");
    expect(section.querySelector('[data-section="output_cache"] li')?.textContent).toContain("Out[3] (_3)");
    expect(text).toContain("Held only by the traceback and the output cache (released by %gpumem free): 3.50 GiB on cuda:0 (traceback 3.00 GiB, output cache 512 MiB)");
    const suggestions = [...section.querySelectorAll<HTMLElement>(".gpumem-note-suggestions > li")];
    expect(suggestions.map((s) => s.dataset["key"])).toEqual([
      "expandable_segments",
      "free_notebook",
      "del_variables",
      "autograd_graph",
      "smaller_batch",
      "gradient_checkpointing",
      "mixed_precision",
    ]);
    expect(suggestions[0]?.textContent).toContain("(frees 8.00 GiB, enough for the request)");
    expect(suggestions[1]?.querySelector("code")?.textContent).toBe("%gpumem free");
  });

  it("lists leak hints", () => {
    const items = [...note(3, "leaks").querySelectorAll("li")].map((li) => li.textContent);
    expect(items).toHaveLength(2);
    expect(items[0]).toMatch(/^cuda:0, 1\.50 GiB: This cell ran 3 times/);
    expect(items[1]).toMatch(/^cuda:0, 512 MiB: Out\[3\] \(_3\) keeps 512.00 MiB/);
  });

  it("shows a note it does not know as text, collapsed", () => {
    const other = note(4, "future_feature");
    expect(other.tagName).toBe("DETAILS");
    expect((other as HTMLDetailsElement).open).toBe(false);
    expect(other.querySelector("summary")?.textContent).toBe("note: future_feature");
    expect(other.querySelector("pre")?.textContent).toContain('"verdict": "<img src=x onerror=alert(1)><b>bold</b>"');
    expect(shown(4)).toContain("note: future_feature");
  });

  it("says why a known note could not be read", () => {
    const bad = cell(9, GiB, { notes: parseNotes({ postmortem: { devices: "none" } }) });
    const details = new Details(() => undefined);
    details.show(bad, [H200], "cuda");
    expect(details.el.querySelector('[data-note="postmortem"] summary')?.textContent).toBe(
      "note: postmortem (not readable by this version: notes.postmortem.devices: expected a list)",
    );
  });

  it("shows who uses each device in the header: this kernel, other processes, each on expand", () => {
    const header = new Header();
    header.update(devices, status, []);
    const lists = [...header.el.querySelectorAll<HTMLDetailsElement>("details.gpumem-processes")];
    expect(lists.map((d) => d.querySelector("summary")?.textContent)).toEqual([
      "this kernel 9.00 GiB \u00b7 other processes 1.00 GiB (1)",
      "this kernel 540 MiB \u00b7 other processes n/a (1)",
    ]);
    expect([...(lists[0]?.querySelectorAll("li") ?? [])].map((li) => li.textContent)).toEqual([
      "pid 4242  9.00 GiB  this kernel",
      "pid 777  1.00 GiB  python train.py <img src=x onerror=alert(1)><b>bold</b>",
    ]);
    expect(lists[1]?.querySelector("summary")?.title).toBe("pid 4242  540 MiB  this kernel\npid 9001  n/a  (name not visible)");
    expect(header.el.querySelector("img, b")).toBeNull();
    expect(header.el.textContent).toContain("running [7] since");
  });

  it("keeps a process list open across status updates", async () => {
    const header = new Header();
    header.update(devices, status, []);
    const first = header.el.querySelector<HTMLDetailsElement>('details.gpumem-processes[data-device="1"]') as HTMLDetailsElement;
    first.open = true;
    await new Promise((r) => setTimeout(r, 0)); // the toggle event is queued
    header.update(devices, status, []);
    const again = header.el.querySelector<HTMLDetailsElement>('details.gpumem-processes[data-device="1"]');
    expect(again).not.toBe(first);
    expect(again?.open).toBe(true);
    expect(header.el.querySelector<HTMLDetailsElement>('details.gpumem-processes[data-device="0"]')?.open).toBe(false);
  });

  it("says when NVML does not list this kernel on a device", () => {
    expect(processSummary([{ pid: 5, used: GiB, self: false, name: null }])).toBe("this kernel not listed \u00b7 other processes 1.00 GiB (1)");
    expect(processSummary([])).toBe("this kernel not listed \u00b7 other processes 0 B (0)");
  });
});

describe("the memory chart's y axis", () => {
  it("ends at a round value just above the data, the capacity once the data nears it", () => {
    const GiB = 2 ** 30;
    expect(yTop(3.9 * GiB, null)).toBe(4.5 * GiB); // 4.29 GiB wanted: not 5 or 8
    expect(yTop(3.9 * GiB, 139 * GiB)).toBe(4.5 * GiB);
    expect(yTop(100 * GiB, 139 * GiB)).toBe(139 * GiB * 1.04);
  });
});
