// @vitest-environment happy-dom
import { describe, expect, it, vi } from "vitest";
import { Details } from "../src/details";
import { Header } from "../src/header";
import { Ledger } from "../src/ledger";
import { parseStatus, type CellRecord, type DeviceCellUsage, type DeviceInfo } from "../src/protocol";

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

  it("names host mode", () => {
    const header = new Header();
    header.update([], parseStatus({ mode: "host", sampler: "stopped" }, []), []);
    expect(header.el.querySelector(".gpumem-mode")?.textContent).toBe("host memory");
    expect(header.el.textContent).toContain("sampler stopped");
  });
});
