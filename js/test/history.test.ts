// @vitest-environment happy-dom
// The on-disk history in the browser: the previous run's peak beside a cell's own, a regression
// marked on its row and in its details, and the header saying when history is off and why.
import { describe, expect, it } from "vitest";
import { noteMarkers, tooltipLines } from "../src/memory/cells";
import { Details } from "../src/memory/details";
import { Header } from "../src/header";
import { Ledger } from "../src/memory/ledger";
import { NO_NOTES, parseNotes } from "../src/wire/notes";
import { parseStatus, type CellRecord, type DeviceInfo } from "../src/wire/protocol";

const GiB = 1024 ** 3;
const MiB = 1024 ** 2;
const HOSTILE = '<img src=x onerror="window.pwned=1">';
const H200: DeviceInfo = { index: 0, name: "NVIDIA H200", uuid: "GPU-1", total: 140 * GiB, nvml: true };

/** What History.compare in gpumem_widget/live/history.py returns. */
function previous(peak: number, previousPeak: number, regression: boolean, metric = "allocated"): Record<string, unknown> {
  return {
    metric,
    peak,
    previous_peak: previousPeak,
    previous_execution_count: 12,
    previous_session: "5346cb82d7ac4d599a710efa892c7db3",
    previous_started: 1_764_550_000,
    change: (peak - previousPeak) / previousPeak,
    regression,
    threshold_ratio: 0.2,
    threshold_bytes: 64 * MiB,
  };
}

function cell(n: number, peak: number, notes: unknown, over: Partial<CellRecord> = {}): CellRecord {
  return {
    execution_count: n,
    cell_id: null,
    source: `train(batch=${n})`,
    started: 1000 + n,
    duration: 1,
    error: null,
    oom: false,
    host_rss_before: 100 * MiB,
    host_rss_after: 200 * MiB,
    host_rss_peak: peak,
    devices: [
      {
        device: 0,
        allocated_before: 0,
        allocated_after: 0,
        reserved_before: 0,
        reserved_after: 0,
        peak_allocated: peak,
        peak_reserved: peak,
        peak_exact: true,
        alloc_retries: 0,
        ooms: 0,
        process_used_after: null,
        device_used_after: null,
        others_used_after: null,
        delta_allocated: 0,
        delta_reserved: 0,
        outside_pytorch: null,
      },
    ],
    notes: parseNotes(notes),
    ...over,
  };
}

const peakCell = (ledger: Ledger, n: number): HTMLElement =>
  ledger.el.querySelector(`tr[data-execution-count="${n}"] td:nth-child(5)`) as HTMLElement;

describe("previous run", () => {
  const grown = cell(7, 3.4 * GiB, { history: previous(3.4 * GiB, 2.1 * GiB, true) });
  const steady = cell(8, 2.1 * GiB, { history: previous(2.1 * GiB, 2.05 * GiB, false) });
  const fresh = cell(9, GiB, {});

  it("parses the note, and leaves a malformed one to `other` with why", () => {
    expect(grown.notes.history?.previous_peak).toBe(2.1 * GiB);
    expect(grown.notes.history?.regression).toBe(true);
    expect(fresh.notes.history).toBeNull();
    const bad = parseNotes({ history: { peak: "lots" } });
    expect(bad.history).toBeNull();
    expect(bad.other[0]?.key).toBe("history");
    expect(bad.other[0]?.problem).toContain("peak");
    expect(NO_NOTES.history).toBeNull();
  });

  it("shows the previous peak beside the new one, and marks only a regression", () => {
    const ledger = new Ledger(() => undefined);
    ledger.update([grown, steady, fresh], "cuda");
    expect(peakCell(ledger, 7).textContent).toBe("3.40 GiBwas 2.10 GiB");
    expect(peakCell(ledger, 7).querySelector(".gpumem-prev")?.hasAttribute("data-warn")).toBe(true);
    expect(peakCell(ledger, 8).textContent).toBe("2.10 GiBwas 2.05 GiB");
    expect(peakCell(ledger, 8).querySelector(".gpumem-prev")?.hasAttribute("data-warn")).toBe(false);
    expect(peakCell(ledger, 9).querySelector(".gpumem-prev")).toBeNull();
    const markers = [...ledger.el.querySelectorAll<HTMLElement>('.gpumem-marker[data-note="history"]')];
    expect(markers.map((m) => m.closest("tr")?.dataset["executionCount"])).toEqual(["7"]);
    expect(markers[0]?.textContent).toBe("\u25b2 +61.9% vs last run");
    expect(markers[0]?.hasAttribute("data-warn")).toBe(true);
    expect(markers[0]?.title).toBe("peak 3.40 GiB, last run 2.10 GiB (+61.9%, cell [12]): a regression (beyond +20.0% and 64.0 MiB)");
    expect(tooltipLines(grown, "cuda")[0]).toContain("\u25b2 +61.9% vs last run");
    expect(noteMarkers(steady)).toEqual([]);
  });

  it("compares like with like: host RSS only in host mode, the busiest device only across all", () => {
    const host = cell(3, 900 * MiB, { history: previous(900 * MiB, 500 * MiB, true, "host_rss") });
    const ledger = new Ledger(() => undefined);
    ledger.update([host], "host");
    expect(peakCell(ledger, 3).querySelector(".gpumem-prev")?.textContent).toBe("was 500 MiB");
    ledger.update([grown], "host");
    expect(peakCell(ledger, 7).querySelector(".gpumem-prev")).toBeNull();
    ledger.update([grown], "cuda", 0, true); // one device picked out of several
    expect(peakCell(ledger, 7).querySelector(".gpumem-prev")).toBeNull();
  });

  it("explains it in the details, as text", () => {
    const details = new Details(() => undefined);
    details.show(cell(7, 3.4 * GiB, { history: { ...previous(3.4 * GiB, 2.1 * GiB, true), previous_session: HOSTILE } }), [H200], "cuda");
    const section = details.el.querySelector('.gpumem-note[data-note="history"]') as HTMLElement;
    expect(section.querySelector("h4")?.textContent).toBe("Above its previous run");
    expect(section.textContent).toContain("last run 2.10 GiB");
    expect(section.textContent).toContain("%gpumem history");
    expect(details.el.querySelector("img")).toBeNull();
  });
});

describe("header", () => {
  it("says when history is off and why, and what happened to the file", () => {
    const header = new Header();
    const off = { on: false, path: "/data/history.sqlite3", reason: `cannot write ${HOSTILE}`, message: null };
    header.update([H200], parseStatus({ mode: "cuda", readers: {}, history: off }, [H200]), []);
    const items = () => [...header.el.querySelectorAll('li[data-kind="history"]')].map((li) => li.textContent);
    expect(items()).toEqual([`history off: cannot write ${HOSTILE}`]);
    expect(header.el.querySelector("img")).toBeNull();
    const moved = { on: true, path: "/h", reason: null, message: "the history file was unreadable; moved it to /h.corrupt-1" };
    header.update([H200], parseStatus({ mode: "cuda", readers: {}, history: moved }, [H200]), []);
    expect(items()).toEqual(["history: the history file was unreadable; moved it to /h.corrupt-1"]);
    header.update([H200], parseStatus({ mode: "cuda", readers: {}, history: { on: true } }, [H200]), []);
    expect(items()).toEqual([]);
    expect(parseStatus({}, []).history).toBeNull();
  });
});
