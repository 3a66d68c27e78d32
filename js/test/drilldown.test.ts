// @vitest-environment happy-dom
// The Snapshot tab against a real drill-down state (fixtures/drilldown.json: a training run
// recorded on an H200, published by gpumem_widget.drilldown.controller, with its segment map and reserved
// memory over time), as the browser receives it.
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import type { AnyModel } from "@anywidget/types";
import { mountSnapshotTab } from "../src/snapshot/tab";
import { axisTop, columnAt, columnText, HEADROOM, oomText, rangeText } from "../src/snapshot/drilldown_chart";
import { parseAlive, parseCompare, parseDrilldown, parseRangeView, parseSearch } from "../src/wire/drilldown";
import { parseStatus, type Traits } from "../src/wire/protocol";
import { decodeColumns } from "../src/wire/table";

interface Fixture {
  state: Record<string, unknown>;
  buffer_paths: (string | number)[][];
  buffers: string[];
  expected: {
    device: number;
    peak_bytes: number;
    peak_t: number;
    groups: string[];
    alive_total: number;
    largest: number[];
    largest_site: string;
    cells: number[];
    at_peak: Record<string, number>;
    peak_reserved: number;
    segments: number;
    allocated_blocks: number;
    figures: Record<string, number | boolean>;
    compare: { peak_delta: number; sites: string[] };
    site_peaks: number[];
  };
}

const PATH = join(dirname(fileURLToPath(import.meta.url)), "fixtures", "drilldown.json");
const fixture = JSON.parse(readFileSync(PATH, "utf8")) as Fixture;
const HOSTILE = '<img src=x onerror="window.pwned=1">';

/** The state with each buffer put back as a DataView at an odd offset, as ipywidgets may. */
function received(): Record<string, unknown> {
  const state = structuredClone(fixture.state);
  fixture.buffer_paths.forEach((path, i) => {
    const bytes = Buffer.from(fixture.buffers[i] as string, "base64");
    const padded = new Uint8Array(bytes.length + 1);
    padded.set(bytes, 1);
    let obj = state as Record<string | number, unknown>;
    for (const key of path.slice(0, -1)) obj = obj[key] as Record<string | number, unknown>;
    obj[path[path.length - 1] as string | number] = new DataView(padded.buffer, 1, bytes.length);
  });
  return state;
}

class FakeModel {
  sent: Record<string, unknown>[] = [];
  private handlers = new Map<string, Set<() => void>>();
  constructor(public state: Record<string, unknown>) {}
  get(name: string): unknown {
    return this.state[name];
  }
  set(name: string, value: unknown): void {
    this.state[name] = value;
    for (const h of this.handlers.get(`change:${name}`) ?? []) h();
  }
  on(event: string, h: () => void): void {
    if (!this.handlers.has(event)) this.handlers.set(event, new Set());
    this.handlers.get(event)?.add(h);
  }
  off(event: string, h: () => void): void {
    this.handlers.get(event)?.delete(h);
  }
  send(msg: Record<string, unknown>): void {
    this.sent.push(msg);
  }
}

function mount(state: Record<string, unknown>, host: { kernelGone: boolean } = { kernelGone: false }): { el: HTMLElement; model: FakeModel; stop: () => void; update: () => void } {
  const el = document.createElement("div");
  el.className = "gpumem-drilldown";
  document.body.append(el);
  const model = new FakeModel(state);
  const tab = mountSnapshotTab(el, {
    model: model as unknown as AnyModel<Traits>,
    get kernelGone() {
      return host.kernelGone;
    },
  });
  return { el, model, stop: tab.dispose, update: () => tab.update?.({ stale: new Set(), devices: [], status: parseStatus(undefined, []) }) };
}

describe("drill-down data", () => {
  it("decodes the real overview and alive traits", () => {
    const state = received();
    const d = parseDrilldown(state["drilldown"]);
    expect(d.kind).toBe("ready");
    if (d.kind !== "ready") return;
    const dev = d.overview.devices[0];
    expect(dev?.sites.peak.bytes).toBe(fixture.expected.peak_bytes);
    expect(dev?.sites.series.map((s) => s.label)).toEqual([...fixture.expected.groups, "other"]);
    // The stacked series add up to the active total in every column.
    const sites = dev?.sites;
    if (!sites) return;
    for (let k = 0; k < sites.t.length; k++) {
      const sum = sites.series.reduce((a, s) => a + (s.values[k] ?? 0), 0);
      expect(sum).toBeCloseTo(sites.total[k] ?? NaN, 0);
    }
    expect(Math.max(...sites.total)).toBe(fixture.expected.peak_bytes);
    expect(dev?.cells.map((c) => c.execution_count)).toEqual(fixture.expected.cells);
    const alive = parseAlive(state["drilldown_alive"]);
    expect(alive.kind).toBe("ready");
    if (alive.kind !== "ready") return;
    expect(alive.alive.root.bytes).toBe(fixture.expected.alive_total);
    // Rolled up: each node holds its children's bytes plus its own.
    const check = (n: typeof alive.alive.root): void => {
      expect(n.children.reduce((a, c) => a + c.bytes, 0) + n.selfBytes).toBeCloseTo(n.bytes, 0);
      n.children.forEach(check);
    };
    check(alive.alive.root);
    expect(alive.alive.largest.map((a) => a.size)).toEqual(fixture.expected.largest);
  });

  it("decodes reserved beside active: never below it, peaking where the allocator did", () => {
    const parsed = parseDrilldown(received()["drilldown"]);
    if (parsed.kind !== "ready") throw new Error("not ready");
    const dev = parsed.overview.devices[0];
    const r = dev?.reserved;
    const s = dev?.sites;
    if (!r || !s?.reservedMax || !s.reservedMin || !s.reserved) throw new Error("no reserved columns");
    expect(Math.max(...s.reservedMax)).toBe(fixture.expected.peak_reserved);
    expect(r.peakReserved).toBe(fixture.expected.peak_reserved);
    for (let k = 0; k < s.t.length; k++) {
      expect(s.reservedMax[k]).toBeGreaterThanOrEqual(s.reserved[k] as number);
      expect(s.reserved[k]).toBeGreaterThanOrEqual(s.reservedMin[k] as number);
      expect(s.reserved[k]).toBeGreaterThanOrEqual(s.total[k] as number); // at the column's peak
    }
    expect(r.largestGap).toBeGreaterThan(0);
    expect(columnAt(s.t, s.t[3] as number)).toBe(3);
    expect(columnAt(s.t, (s.t[0] as number) - 1)).toBe(-1);
    expect(columnAt(s.t, s.t1)).toBe(s.t.length - 1);
  });

  it("decodes each column's range: every series at its floor, summing to the column's lowest total", () => {
    const state = parseDrilldown(received()["drilldown"]);
    if (state.kind !== "ready") throw new Error(state.kind);
    for (const d of state.overview.devices) {
      for (const view of [d.sites, d.categories]) {
        if (!view) continue;
        expect(view.series.every((s) => s.floor !== null)).toBe(true);
        const min = d.sites.min as Float64Array;
        let rose = 0;
        for (let k = 0; k < view.t.length; k++) {
          const floor = view.series.reduce((sum, s) => sum + (s.floor?.[k] ?? 0), 0);
          expect(floor).toBe(min[k]);
          expect(floor).toBeLessThanOrEqual(view.total[k] as number);
          for (const s of view.series) expect(s.floor?.[k] ?? 0).toBeGreaterThanOrEqual(0);
          if ((view.total[k] as number) > floor) rose++;
        }
        expect(rose).toBeGreaterThan(0); // some column rises above its floor
      }
    }
  });

  it("rejects a malformed table with one clear error", () => {
    expect(() => decodeColumns({ n: 2, columns: ["t"], dtypes: ["f8"], buffers: [new Uint8Array(8)] }, "x")).toThrow(/8 bytes for 2 rows/);
    expect(() => parseDrilldown({ devices: "no" })).toThrow(/drilldown\.devices/);
  });
});

describe("drill-down panel", () => {
  it("draws the chart, legend, tree, cells and categories from the real state", () => {
    const { el, stop } = mount(received());
    expect(el.querySelector(".gpumem-drilldown-chart canvas")).not.toBeNull();
    const legend = [...el.querySelectorAll<HTMLElement>(".gpumem-drilldown-legend-item")].map((e) => e.dataset["site"]);
    expect(legend).toContain(fixture.expected.groups[0]);
    const tree = el.querySelector(".gpumem-alive-tree");
    expect(tree?.querySelector("[data-site='all']")?.textContent).toContain("GiB");
    const largest = el.querySelectorAll<HTMLElement>(".gpumem-drilldown-largest tbody tr");
    expect(largest.length).toBe(fixture.expected.largest.length);
    expect(largest[0]?.dataset["site"]).toBe(fixture.expected.largest_site);
    const cells = [...el.querySelectorAll<HTMLElement>("tr[data-cell]")].map((r) => Number(r.dataset["cell"]));
    expect(cells).toEqual(fixture.expected.cells);
    const cats = [...el.querySelectorAll<HTMLElement>("tr[data-category]")].map((r) => r.dataset["category"]);
    expect(cats).toEqual(Object.entries(fixture.expected.at_peak).filter(([, b]) => b > 0).map(([c]) => c));
    stop();
    expect(el.querySelector(".gpumem-drilldown-body")).toBeNull();
  });

  it("says why By module is off for a snapshot recorded without the module tracer", () => {
    const state = received();
    const d = parseDrilldown(state["drilldown"]);
    if (d.kind !== "ready") throw new Error("not ready");
    const modules = d.overview.devices[0]?.modules;
    expect(modules?.traced).toBe(false);
    expect(modules?.reading).toBeNull();
    // Still every byte, in what no module holds: the columns add up to the active total.
    for (let k = 0; k < (modules?.t.length ?? 0); k++) expect(modules?.series.reduce((a, s) => a + (s.values[k] ?? 0), 0)).toBeCloseTo(modules?.total[k] ?? NaN, 0);
    const { el, stop } = mount(state);
    const button = el.querySelector<HTMLButtonElement>(".gpumem-drilldown-mode[data-mode='modules']");
    expect(button?.disabled).toBe(true);
    expect(button?.title).toContain("recorded without the module tracer");
    const alive = parseAlive(state["drilldown_alive"]);
    if (alive.kind !== "ready") throw new Error("not ready");
    expect(alive.alive.modules?.root.bytes).toBe(fixture.expected.alive_total);
    expect(el.querySelector<HTMLButtonElement>(".gpumem-drilldown-subtabs [data-tab='modules']")?.disabled).toBe(true);
    stop();
  });

  it("asks the kernel what was alive when a cell is clicked, and shows the answer", () => {
    const { el, model, stop } = mount(received());
    const row = el.querySelector<HTMLElement>(`tr[data-cell='${fixture.expected.cells[0]}']`);
    row?.click();
    const asked = model.sent.filter((m) => m["type"] === "alive_at");
    expect(asked).toHaveLength(1);
    expect(asked[0]).toMatchObject({ type: "alive_at", device: fixture.expected.device });
    expect(typeof asked[0]?.["t"]).toBe("number");
    // and the cell's span, zoomed in the kernel at screen resolution
    expect(model.sent.filter((m) => m["type"] === "view")).toHaveLength(1);
    model.set("drilldown_alive", { error: `ValueError: ${HOSTILE}` });
    expect(el.textContent).toContain(HOSTILE); // as text, never as markup
    expect(el.querySelector("img")).toBeNull();
    stop();
  });

  it("says why an allocation has no tag, and drops the tag column where none has one", () => {
    const { el, model, stop } = mount(received());
    const tagCells = (): HTMLTableCellElement[] => [...el.querySelectorAll<HTMLTableRowElement>(".gpumem-drilldown-largest tbody tr")].map((r) => r.cells[2] as HTMLTableCellElement);
    const heads = (): string[] => [...el.querySelectorAll(".gpumem-drilldown-largest th")].map((h) => h.textContent ?? "");
    // The real answer: tagged allocations, and one made with no tag set.
    expect(heads()).toEqual(["size", "site", "tag"]);
    const untagged = tagCells().filter((c) => c.classList.contains("gpumem-drilldown-untagged"));
    expect(untagged.length).toBeGreaterThan(0);
    for (const c of untagged) {
      expect(c.textContent).toMatch(/^\u2014 \(/);
      expect(c.title).toMatch(/^No tag: /);
    }
    expect(tagCells().every((c) => c.textContent !== "")).toBe(true);
    // The same answer recorded without tags: no column of blanks.
    const alive = structuredClone(received()["drilldown_alive"]) as Record<string, unknown>;
    alive["largest"] = (alive["largest"] as Record<string, unknown>[]).map((a) => ({ ...a, tag: "" }));
    model.set("drilldown_alive", alive);
    expect(heads()).toEqual(["size", "site"]);
    expect(el.querySelector(".gpumem-drilldown-largest tbody tr")?.childElementCount).toBe(2);
    stop();
  });

  it("keeps every figure on one line while names may wrap", () => {
    const { el, stop } = mount(received());
    const summary = el.querySelector<HTMLElement>(".gpumem-drilldown-summary");
    const figures = [...(summary?.querySelectorAll(".gpumem-figure") ?? [])].map((f) => f.textContent ?? "");
    expect(figures.some((f) => /^\d[\d.]* [KMG]iB$/.test(f))).toBe(true); // number and unit together
    const heading = el.querySelector<HTMLElement>(".gpumem-drilldown-alive-heading");
    expect([...(heading?.querySelectorAll(".gpumem-figure") ?? [])].some((f) => /iB$/.test(f.textContent ?? ""))).toBe(true);
    const sizes = [...el.querySelectorAll<HTMLTableRowElement>(".gpumem-drilldown-largest tbody tr")].map((r) => r.cells[0]);
    expect(sizes.length).toBeGreaterThan(0);
    expect(sizes.every((c) => c?.classList.contains("gpumem-figure"))).toBe(true);
    stop();
  });

  it("with no kernel behind it, asks nothing and says why; a live session turns it back on", () => {
    const host = { kernelGone: true };
    const { el, model, stop, update } = mount(received(), host);
    const note = el.querySelector<HTMLElement>(".gpumem-drilldown-offline");
    expect(note?.hidden).toBe(false);
    expect(note?.textContent).toContain("need a live session");
    el.querySelector<HTMLElement>(`tr[data-cell='${fixture.expected.cells[0]}']`)?.click();
    el.querySelector<HTMLButtonElement>(".gpumem-drilldown-step[data-step='-1']")?.click();
    expect(model.sent).toEqual([]);
    expect(el.dataset["pending"] ?? el.querySelector<HTMLElement>(".gpumem-drilldown-body")?.dataset["pending"]).toBeUndefined();
    expect(el.querySelector<HTMLButtonElement>(".gpumem-drilldown-axis[data-axis='time']")?.disabled).toBe(true);
    expect(el.querySelector<HTMLInputElement>(".gpumem-drilldown-query")?.disabled).toBe(true);
    expect(el.querySelector<HTMLButtonElement>(".gpumem-drilldown-step[data-step='-1']")?.disabled).toBe(true);
    // What needs no kernel still works: the stacking.
    el.querySelector<HTMLButtonElement>("button[data-mode='categories']")?.click();
    expect(el.querySelector<HTMLButtonElement>("button[data-mode='categories']")?.getAttribute("aria-pressed")).toBe("true");
    host.kernelGone = false;
    update();
    expect(note?.hidden).toBe(true);
    el.querySelector<HTMLElement>(`tr[data-cell='${fixture.expected.cells[0]}']`)?.click();
    expect(model.sent.map((m) => m["type"]).sort()).toEqual(["alive_at", "view"]);
    stop();
  });

  it("collapses and expands tree nodes", () => {
    const { el, stop } = mount(received());
    const open = el.querySelector<HTMLElement>(".gpumem-alive-node[aria-expanded='true']");
    const kids = open?.querySelector<HTMLElement>(".gpumem-alive-children");
    expect(kids?.children.length).toBeGreaterThan(0);
    open?.querySelector<HTMLElement>(".gpumem-alive-row")?.click();
    expect(open?.getAttribute("aria-expanded")).toBe("false");
    expect(kids?.hidden).toBe(true);
    stop();
  });

  it("shows reserved memory in the summary and the legend", () => {
    const { el, stop } = mount(received());
    const reserved = el.querySelector(".gpumem-drilldown-legend-reserved");
    expect(reserved?.textContent).toContain("reserved (cached segments)");
    expect(el.querySelector(".gpumem-drilldown-summary")?.textContent).toMatch(/GiB reserved \(up to .+ beyond active\)/);
    stop();
  });

  it("draws the segment map of the alive-at answer in its sub-tab", () => {
    const { el, model, stop } = mount(received());
    const tab = el.querySelector<HTMLButtonElement>(".gpumem-drilldown-subtabs button[data-tab='segments']");
    expect(tab?.disabled).toBe(false);
    expect(el.querySelector(".gpumem-segment")).toBeNull(); // drawn when its tab shows
    tab?.click();
    expect(tab?.getAttribute("aria-selected")).toBe("true");
    expect(el.querySelector<HTMLElement>(".gpumem-alive-tree")?.closest<HTMLElement>(".gpumem-drilldown-pane")?.hidden).toBe(true);
    expect(el.querySelectorAll(".gpumem-segment")).toHaveLength(fixture.expected.segments);
    expect(el.querySelectorAll(".gpumem-block")).toHaveLength(fixture.expected.allocated_blocks);
    const free = el.querySelector('tr[data-key="free_blocks"]');
    expect(free?.textContent).toContain(String(fixture.expected.figures["free_blocks"]));
    expect(el.querySelector('tr[data-key="reserved"]')?.textContent).toContain("GiB");
    // A new answer keeps the Segments tab, with one map: the previous one is gone.
    model.set("drilldown_alive", structuredClone(model.state["drilldown_alive"]));
    expect(el.querySelectorAll(".gpumem-segments")).toHaveLength(1);
    expect(el.querySelectorAll(".gpumem-segment")).toHaveLength(fixture.expected.segments);
    const withMap = structuredClone(model.state["drilldown_alive"]);
    // An answer without a map falls back to what is alive, its Segments tab disabled.
    const bare = { ...(model.state["drilldown_alive"] as Record<string, unknown>) };
    delete bare["segments"];
    model.set("drilldown_alive", bare);
    expect(el.querySelector(".gpumem-segments")).toBeNull();
    expect(el.querySelector<HTMLButtonElement>(".gpumem-drilldown-subtabs button[data-tab='segments']")?.disabled).toBe(true);
    expect(el.querySelector<HTMLElement>(".gpumem-alive-tree")?.closest<HTMLElement>(".gpumem-drilldown-pane")?.hidden).toBe(false);
    // A first open's answer whose map follows says so, then the map arrives for the same entry.
    model.set("drilldown_alive", { ...bare, segments_pending: true });
    const waiting = el.querySelector<HTMLButtonElement>(".gpumem-drilldown-subtabs button[data-tab='segments']");
    expect(waiting?.disabled).toBe(true);
    expect(waiting?.title).toContain("computing");
    const alive = parseAlive({ ...bare, segments_pending: true });
    expect(alive.kind === "ready" && alive.alive.segmentsPending).toBe(true);
    model.set("drilldown_alive", withMap);
    expect(el.querySelector<HTMLButtonElement>(".gpumem-drilldown-subtabs button[data-tab='segments']")?.disabled).toBe(false);
    stop();
    expect(el.children).toHaveLength(0);
  });

  it("asks once for a pending snapshot, and says when there is none", () => {
    const { el, model, stop } = mount({ drilldown: {}, drilldown_alive: {} });
    expect(el.textContent).toContain("No snapshot loaded");
    model.set("drilldown", { pending: "OOM in cell 4" });
    model.set("drilldown", { pending: "OOM in cell 4" });
    expect(model.sent).toEqual([{ type: "load" }]);
    expect(el.textContent).toContain("OOM in cell 4");
    model.set("drilldown", { devices: [{ device: 0, active: 3 }] });
    expect(el.textContent).toContain("Snapshot view unavailable");
    stop();
  });

  it("says in host mode that recording needs CUDA, and how a file recorded elsewhere opens", () => {
    const { el, model, stop } = mount({ drilldown: {}, drilldown_alive: {}, status: { mode: "host" } });
    const text = (): string => el.querySelector(".gpumem-drilldown-empty")?.textContent ?? "";
    expect(text()).toContain("Recording one needs a CUDA device, and this kernel has none (host-memory mode)");
    expect(text()).toContain("gpumem_widget.show_snapshot(path)");
    expect(text()).not.toContain("%gpumem record on");
    model.set("status", { mode: "cuda" }); // the notebook imported torch on a GPU machine
    expect(text()).toContain("`%gpumem record on` then `%gpumem record off`");
    model.set("drilldown", { pending: "OOM in cell 4" });
    model.set("status", { mode: "host" }); // a snapshot on its way is left as it is
    expect(el.textContent).toContain("OOM in cell 4");
    stop();
  });

  it("steps event by event from the answer shown, and says where a column's peak is", () => {
    const { el, model, stop } = mount(received());
    const heading = el.querySelector<HTMLElement>(".gpumem-drilldown-alive-heading");
    const event = Number(heading?.dataset["event"]);
    expect(heading?.textContent).toMatch(/^At the peak, entry /);
    expect(Number(heading?.dataset["totalBytes"])).toBe(fixture.expected.alive_total);
    el.querySelector<HTMLButtonElement>(".gpumem-drilldown-step[data-step='1']")?.click();
    el.querySelector<HTMLButtonElement>(".gpumem-drilldown-step[data-step='-1']")?.click();
    const steps = model.sent.filter((m) => m["type"] === "alive_at").map((m) => m["event"]);
    expect(steps).toEqual([event + 1, event - 1]);
    stop();
  });

  it("states each site's exact maximum in the legend, and labels nothing as 'other' at 0 B", () => {
    const { el, stop } = mount(received());
    const items = [...el.querySelectorAll<HTMLElement>(".gpumem-drilldown-body > .gpumem-drilldown-legend > .gpumem-drilldown-legend-item:not(.gpumem-drilldown-legend-reserved)")];
    const peaks = items.filter((i) => i.dataset["site"] !== "other").map((i) => Number(i.dataset["peakBytes"]));
    expect(peaks).toEqual(fixture.expected.site_peaks.filter((p) => p > 0));
    expect(items.every((i) => Number(i.dataset["peakBytes"]) > 0)).toBe(true);
    stop();
  });

  it("asks the kernel to re-aggregate the time axis, and draws its answer only if it is the latest", () => {
    const { el, model, stop } = mount(received());
    el.querySelector<HTMLButtonElement>(".gpumem-drilldown-axis[data-axis='time']")?.click();
    const asked = model.sent.filter((m) => m["type"] === "view");
    expect(asked).toHaveLength(1);
    expect(asked[0]).toMatchObject({ type: "view", axis: "time", t0: null, t1: null });
    expect(parseRangeView({})).toBeNull();
    // An answer to an older request is ignored: the chart keeps the event axis.
    const overview = parseDrilldown(model.state["drilldown"]);
    if (overview.kind !== "ready") throw new Error("not ready");
    const sites = (model.state["drilldown"] as { devices: { active: unknown; categories: unknown }[] }).devices[0];
    model.set("drilldown_view", { id: 999, device: 0, axis: "time", sites: sites?.active, categories: sites?.categories, bands: [] });
    expect(el.querySelector<HTMLElement>(".gpumem-drilldown-chart")?.dataset["axis"] ?? "event").toBe("event");
    stop();
  });

  it("shows a comparison of two real snapshots: the peaks' change by site and category", () => {
    const state = received();
    const c = parseCompare(state["drilldown_compare"]);
    expect(c?.peakDelta).toBe(fixture.expected.compare.peak_delta);
    expect(c?.bySite.map((r) => r.label)).toEqual(fixture.expected.compare.sites);
    for (const r of c?.bySite ?? []) expect(r.delta).toBe(r.b - r.a);
    const { el, stop } = mount(state);
    const section = el.querySelector<HTMLElement>(".gpumem-drilldown-compare");
    expect(section?.hidden).toBe(false);
    expect(section?.textContent).toContain("two_snapshots_first.pickle.gz (A)");
    expect(el.querySelectorAll(".gpumem-drilldown-compare-sites tbody tr")).toHaveLength(fixture.expected.compare.sites.length);
    expect(Number(el.querySelector<HTMLElement>(".gpumem-drilldown-compare-facts")?.dataset["peakDelta"])).toBe(fixture.expected.compare.peak_delta);
    stop();
  });

  it("reports a search's error as text", () => {
    expect(parseSearch({})).toEqual({ kind: "none" });
    expect(parseSearch({ error: "a search needs 1 to 200 characters", query: "" })).toMatchObject({ kind: "error" });
  });
});

describe("the chart's axis and labels", () => {
  it("always puts the axis top above the highest value, with headroom", () => {
    for (const max of [1, 1023, 1.56 * 2 ** 30, 1.78 * 2 ** 30, 15032385536, 2 ** 50, 0]) {
      const { top, ticks } = axisTop(max);
      expect(top).toBeGreaterThanOrEqual(max * HEADROOM);
      expect(ticks[ticks.length - 1]).toBe(top);
      expect(ticks.every((t, i) => i === 0 || t > (ticks[i - 1] as number))).toBe(true);
    }
  });

  it("ends the axis at a round value just above the data, not at the next whole label", () => {
    const GiB = 2 ** 30;
    expect(axisTop(3.9 * GiB / HEADROOM).top).toBe(4 * GiB);
    expect(axisTop(3.9 * GiB).top).toBe(4.5 * GiB); // 4.21 GiB wanted: not 5, 6 or 8
    expect(axisTop(5.73 * GiB / HEADROOM).top).toBe(6 * GiB);
    expect(axisTop(10.2 * GiB / HEADROOM).top).toBe(10.5 * GiB);
    for (const max of [1, 700, 1023, 3e5, 1.56 * GiB, 3.9 * GiB, 4.6 * GiB, 7.3 * GiB, 10.2 * GiB, 139 * GiB, 2 ** 50]) {
      const { top, ticks } = axisTop(max);
      const want = Math.max(max * HEADROOM, 1);
      expect(top).toBeGreaterThanOrEqual(want);
      expect(top).toBeLessThanOrEqual(want * 1.4 + 1); // just above, never a doubling
      expect(Number.isInteger(top)).toBe(true);
      // Labels never crowd the top's: the tick below it at least 0.4 of a label step away.
      expect(ticks[ticks.length - 1]).toBe(top);
      if (ticks.length > 2) expect(top - (ticks[ticks.length - 2] as number)).toBeGreaterThanOrEqual(0.4 * ((ticks[1] as number) - (ticks[0] as number)));
    }
  });

  it("says a column's range: its entries, and its floor to its peak in one unit where it can", () => {
    const MiB = 2 ** 20;
    expect(rangeText(118 * MiB, 324 * MiB)).toBe("118\u2013324 MiB");
    expect(rangeText(512 * 1024, 2 * MiB)).toBe("512 KiB\u20132.00 MiB");
    expect(rangeText(null, 324 * MiB)).toBe("324 MiB"); // no floor sent: the peak alone
    expect(rangeText(324 * MiB, 324 * MiB)).toBe("324 MiB");
    const view = { unit: "entry", t: Float64Array.from([41000, 42000.5, 43000]), t0: 41000, t1: 43001 } as unknown as Parameters<typeof columnText>[0];
    expect(columnText(view, 0)).toBe("in entries 41,000\u201342,000");
    expect(columnText(view, 1)).toBe("in entries 42,001\u201342,999");
    expect(columnText(view, 2)).toBe("in entries 43,000\u201343,001"); // the last holds its end
    const one = { unit: "entry", t: Float64Array.from([7, 8]), t0: 7, t1: 9 } as unknown as Parameters<typeof columnText>[0];
    expect(columnText(one, 0)).toBe("at entry 7"); // a column holding one entry
    const none = { unit: "entry", t: Float64Array.from([7.2, 7.6]), t0: 7.2, t1: 8.5 } as unknown as Parameters<typeof columnText>[0];
    expect(columnText(none, 0)).toBe("after entry 7"); // none inside: the one before it shows
    expect(rangeText(770 * MiB, 770 * MiB + 5)).toBe("770 MiB"); // the same figure once
  });

  it("labels an OOM with the request, the free memory and the cell", () => {
    const oom = { t: 1, event: 1, time: null, requested: 3 * 2 ** 30, deviceFree: 2 ** 30, tag: "cell:7", cell: 7 };
    expect(oomText(oom)).toBe("OOM: requested 3.00 GiB, 1.00 GiB free \u00b7 cell [7]");
    expect(oomText({ ...oom, cell: null, tag: "" })).toBe("OOM: requested 3.00 GiB, 1.00 GiB free");
  });
  it("shows the conversion's progress, then the first view, then the rest as it arrives", () => {
    const { el, model, stop } = mount({ drilldown: {}, drilldown_alive: {} });
    model.set("drilldown", { loading: "big.pickle", stage: "reading", fraction: 0.42 });
    const bar = el.querySelector<HTMLProgressElement>(".gpumem-drilldown-progress");
    expect(bar?.hidden).toBe(false);
    expect(bar?.value).toBeCloseTo(0.42);
    expect(el.textContent).toContain("Opening big.pickle: reading 42%");
    model.set("drilldown", { loading: "big.pickle", stage: "converting", fraction: null });
    expect(bar?.hasAttribute("value")).toBe(false); // busy: no fraction known
    expect(el.textContent).toContain("converting");
    // The child's preview (before the stacks are read): one series, every allocation, drawn on
    // the active total's column with the peak it reaches; no "other", categories not ready.
    const full = received()["drilldown"] as Record<string, unknown>;
    const totals = (full["devices"] as Record<string, unknown>[]).map((d) => {
      const active = d["active"] as Record<string, unknown>;
      const peak = (active["peak"] as Record<string, number>)["bytes"];
      const group = { column: "total", label: "all allocations (by site: still reading the stacks)", filename: null, line: null, name: null, peak_bytes: peak };
      return { device: d["device"], active: { ...active, groups: [group] } };
    });
    model.set("drilldown", { source: "big.pickle", taken_at: null, devices: totals, partial: true, preview: true });
    const canvas = el.querySelector("canvas");
    const chart = el.querySelector<HTMLElement>(".gpumem-drilldown-chart");
    expect(canvas).not.toBeNull();
    const stage = el.querySelector<HTMLElement>(".gpumem-drilldown-stage-line");
    expect(stage?.hidden).toBe(false);
    expect(stage?.textContent).toContain("every allocation as one series");
    // The file's last stages (writing, mapping) never take the drawn chart away: the stage line says them.
    for (const next of ["writing", "mapping"]) {
      model.set("drilldown", { loading: "big.pickle", stage: next, fraction: null });
      expect(chart?.hidden).toBe(false);
      expect(chart?.isConnected).toBe(true);
      expect(el.querySelector("canvas")).toBe(canvas);
      expect(el.querySelector<HTMLElement>(".gpumem-drilldown-empty")?.hidden).toBe(true);
      expect(stage?.textContent).toContain(next);
    }
    const shown = [...el.querySelectorAll<HTMLElement>(".gpumem-drilldown-legend-item:not(.gpumem-drilldown-legend-reserved)")];
    expect(shown.map((e) => e.dataset["site"])).toEqual(["all allocations (by site: still reading the stacks)"]);
    expect(Number(shown[0]?.dataset["peakBytes"])).toBe(fixture.expected.peak_bytes);
    expect(el.textContent).toContain("Per cell: computing");
    // The first view: active memory by site alone; categories and cells still computing.
    const devices = (full["devices"] as Record<string, unknown>[]).map((d) => ({ device: d["device"], active: d["active"] }));
    model.set("drilldown", { ...full, devices, partial: true });
    expect(el.querySelector("canvas")).toBe(canvas); // the same chart, redrawn in place
    expect(chart?.hidden).toBe(false);
    expect(stage?.textContent).toContain("active memory by site");
    expect(el.textContent).toContain("Per cell: computing");
    expect(el.querySelector<HTMLButtonElement>("button[data-mode='categories']")?.disabled).toBe(true);
    model.set("drilldown", full);
    expect(el.querySelector("canvas")).toBe(canvas);
    expect(stage?.hidden).toBe(true);
    expect(bar?.hidden).toBe(true);
    expect(el.textContent).not.toContain("computing");
    expect(el.querySelector<HTMLButtonElement>("button[data-mode='categories']")?.disabled).toBe(false);
    stop();
  });
});
