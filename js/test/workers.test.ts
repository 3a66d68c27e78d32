// @vitest-environment happy-dom
import { describe, expect, it } from "vitest";
import { Details } from "../src/memory/details";
import { parseCell } from "../src/wire/protocol";
import { parseWorkerRows } from "../src/wire/worker_rows";
import { workerSection } from "../src/memory/worker_figures";
import { byHost, chartMetric, WorkersView } from "../src/workers/view";
import { parseWorkers } from "../src/wire/workers";

const GiB = 1024 ** 3;

/** A packed table as the kernel sends it (one little-endian buffer per column). */
function table(cols: Record<string, number[]>): Record<string, unknown> {
  const names = Object.keys(cols);
  const n = (cols[names[0] as string] as number[]).length;
  return {
    n,
    columns: names,
    dtypes: names.map((c) => (c === "t" ? "f8" : "f4")),
    buffers: names.map((c) => {
      const values = cols[c] as number[];
      const arr = c === "t" ? new Float64Array(values) : new Float32Array(values);
      return new DataView(arr.buffer);
    }),
  };
}

function rank(over: Record<string, unknown> = {}): Record<string, unknown> {
  const r = (over["rank"] as number | undefined) ?? 0;
  return {
    key: `node-a:${100 + r}`,
    label: `rank ${r}`,
    rank: r,
    local_rank: r,
    world_size: 2,
    host: "node-a",
    pid: 100 + r,
    state: "live",
    last_seen: 1000,
    errors: 0,
    rss: 2 * GiB,
    devices: [{ index: r, uuid: `u${r}`, allocated: GiB, reserved: 2 * GiB, peak_allocated: 3 * GiB, peak_reserved: 4 * GiB, nvml_used: null }],
    oom: null,
    snapshots: [],
    series: table({ t: [1000, 1001, 1002], allocated: [0, GiB, 0.5 * GiB], reserved: [0, 2 * GiB, 2 * GiB], rss: [GiB, GiB, GiB] }),
    ...over,
  };
}

function trait(ranks: unknown[]): Record<string, unknown> {
  return { address: "tcp://127.0.0.1:5555", received: 10, accepted: 9, dropped: { forged: 1 }, ranks };
}

describe("the workers trait", () => {
  it("decodes every rank with its series", () => {
    const s = parseWorkers(trait([rank(), rank({ rank: 1, host: "node-b", key: "node-b:101" })]));
    expect(s.ranks).toHaveLength(2);
    expect(s.problems).toEqual([]);
    const r0 = s.ranks[0]!;
    expect(r0.series.n).toBe(3);
    expect(Array.from(r0.series.allocated)).toEqual([0, GiB, 0.5 * GiB]);
    expect(s.dropped).toEqual({ forged: 1 });
    expect(chartMetric(s)).toBe("gpu");
    expect([...byHost(s.ranks).keys()]).toEqual(["node-a", "node-b"]);
  });

  it("leaves a malformed rank out and says why; an empty trait is no workers", () => {
    const s = parseWorkers(trait([rank(), { key: "x" }, rank({ state: "exploded", key: "y" })]));
    expect(s.ranks).toHaveLength(1);
    expect(s.problems).toHaveLength(2);
    expect(parseWorkers({}).ranks).toEqual([]);
    expect(() => parseWorkers([1, 2])).toThrow(/workers/);
  });

  it("host-only workers chart their RSS", () => {
    expect(chartMetric(parseWorkers(trait([rank({ devices: [] })])))).toBe("host");
  });
});

describe("the Workers view", () => {
  it("groups ranks by host and marks gone and out-of-memory ranks", () => {
    const view = new WorkersView();
    document.body.append(view.el);
    const oom = { device: 1, requested: 16 * GiB, limit: 80 * GiB, free: GiB, allocated: 70 * GiB, reserved: 75 * GiB };
    view.update(
      parseWorkers(
        trait([
          rank(),
          rank({ rank: 1, key: "node-a:101", pid: 101, oom, state: "exited", snapshots: ["/tmp/rank1.pickle"] }),
          rank({ rank: 2, key: "node-b:102", host: "node-b", pid: 102, state: "gone" }),
        ]),
      ),
      [],
    );
    expect(view.el.dataset["ranks"]).toBe("3");
    const hosts = [...view.el.querySelectorAll<HTMLElement>(".gpumem-workers-host")].map((h) => h.dataset["host"]);
    expect(hosts).toEqual(["node-a", "node-b"]);
    const oomRow = view.el.querySelector<HTMLElement>('tr[data-key="node-a:101"]')!;
    expect(oomRow.dataset["oom"]).toBe("true");
    expect(oomRow.textContent).toContain("OOM on cuda:1: asked 16.0 GiB with 1.00 GiB free of 80.0 GiB");
    expect(oomRow.textContent).toContain("/tmp/rank1.pickle");
    const gone = view.el.querySelector<HTMLElement>('tr[data-key="node-b:102"]')!;
    expect(gone.dataset["state"]).toBe("gone");
    expect(gone.textContent).toContain("gone (silent since");
    expect(view.el.querySelector(".gpumem-workers-summary")!.textContent).toContain("1 live of 3 workers");
    expect(view.el.querySelector(".gpumem-workers-summary")!.textContent).toContain("1 forged");
  });

  it("says how to attach when no worker reported", () => {
    const view = new WorkersView();
    expect(view.el.textContent).toContain("gpumem_widget.attach()");
  });
});

describe("a cell's per-rank figures", () => {
  const rows = [
    {
      rank: 0, local_rank: 0, host: "node-a", pid: 100, state: "exited", final: true, device: 0, uuid: "u0",
      allocated_before: 0, allocated_after: GiB, reserved_before: 0, reserved_after: 2 * GiB,
      peak_allocated: 3 * GiB, peak_reserved: 4 * GiB, peak_exact: true, alloc_retries: 0, ooms: 0,
      rss_before: null, rss_after: GiB, rss_peak: GiB, delta_allocated: GiB,
    },
    {
      rank: 1, local_rank: 1, host: "node-a", pid: 101, state: "live", final: false, device: 1, uuid: "u1",
      allocated_before: GiB, allocated_after: GiB, reserved_before: GiB, reserved_after: GiB,
      peak_allocated: 5 * GiB, peak_reserved: 6 * GiB, peak_exact: false, alloc_retries: 0, ooms: 1,
      rss_before: null, rss_after: null, rss_peak: null, delta_allocated: 0,
    },
    { rank: "bad" },
  ];

  it("parses the rows a ledger record carries, leaving a malformed one out", () => {
    expect(parseWorkerRows(rows)).toHaveLength(2);
    expect(parseWorkerRows(undefined)).toEqual([]);
    const cell = parseCell({ execution_count: 3, started: 1, duration: 2, workers: rows }, "c");
    expect(cell.workers).toHaveLength(2);
    expect(parseCell({ execution_count: 3, started: 1, duration: 2 }, "c").workers).toBeUndefined();
  });

  it("shows each rank's peak in the cell's details, marking lower bounds and OOMs", () => {
    const [section] = workerSection(parseWorkerRows(rows));
    expect(section!.querySelectorAll("tr[data-rank]")).toHaveLength(2);
    const r1 = section!.querySelector<HTMLElement>('tr[data-rank="1"]')!;
    expect(r1.textContent).toContain("\u2265 5.00 GiB");
    expect(r1.textContent).toContain("1 OOM");
    expect(r1.textContent).toContain("last sample");
    expect(workerSection([])).toEqual([]);
    const details = new Details(() => undefined);
    const cell = parseCell({ execution_count: 3, started: 1, duration: 2, workers: rows }, "c");
    details.show(cell, [], "cuda");
    expect(details.el.querySelector(".gpumem-details-workers")).not.toBeNull();
  });
});

describe("the rank selector", () => {
  it("asks for a rank's snapshot by key and index, never by path", () => {
    const asked: [string, number][] = [];
    const view = new WorkersView((key, index) => asked.push([key, index]));
    view.update(parseWorkers(trait([rank({ rank: 1, key: "node-a:101", snapshots: ["/tmp/a.pickle", "/tmp/b.pickle"] })])), []);
    const buttons = view.el.querySelectorAll<HTMLButtonElement>(".gpumem-workers-open");
    expect([...buttons].map((b) => b.textContent)).toEqual(["open a.pickle", "open b.pickle"]);
    buttons[1]!.click();
    expect(asked).toEqual([["node-a:101", 1]]);
  });
});

describe("comparing two ranks' snapshots", () => {
  const r0 = (snapshots: string[]): Record<string, unknown> => rank({ rank: 0, key: "node-a:100", snapshots });
  const r1 = (snapshots: string[]): Record<string, unknown> => rank({ rank: 1, key: "node-a:101", snapshots });

  it("appears with the second snapshot and defaults to the two ranks' newest", () => {
    const asked: unknown[] = [];
    const view = new WorkersView(null, (a, b) => asked.push([a, b]));
    const bar = view.el.querySelector<HTMLElement>(".gpumem-workers-compare")!;
    view.update(parseWorkers(trait([r0(["/w/r0-a.pickle"]), r1([])])), []);
    expect(bar.hidden).toBe(true);
    view.update(parseWorkers(trait([r0(["/w/r0-a.pickle", "/w/r0-b.pickle"]), r1(["/w/r1-a.pickle"])])), []);
    expect(bar.hidden).toBe(false);
    const [a] = [...bar.querySelectorAll("select")];
    expect([...a!.options].map((o) => o.textContent)).toEqual([
      "rank 0/2 (local 0) \u00b7 r0-a.pickle",
      "rank 0/2 (local 0) \u00b7 r0-b.pickle",
      "rank 1/2 (local 1) \u00b7 r1-a.pickle",
    ]);
    bar.querySelector("button")!.click();
    expect(asked).toEqual([[{ key: "node-a:100", index: 1 }, { key: "node-a:101", index: 0 }]]);
  });

  it("keeps the user's choice while samples arrive, and will not compare a snapshot with itself", () => {
    const asked: unknown[] = [];
    const view = new WorkersView(null, (a, b) => asked.push([a, b]));
    const state = parseWorkers(trait([r0(["/w/r0-a.pickle", "/w/r0-b.pickle"]), r1(["/w/r1-a.pickle"])]));
    view.update(state, []);
    const bar = view.el.querySelector<HTMLElement>(".gpumem-workers-compare")!;
    const [a, b] = [...bar.querySelectorAll("select")];
    a!.value = "0";
    a!.dispatchEvent(new Event("change"));
    view.update(parseWorkers(trait([r0(["/w/r0-a.pickle", "/w/r0-b.pickle"]), r1(["/w/r1-a.pickle"])])), []);
    expect(a!.value).toBe("0");
    b!.value = "0";
    b!.dispatchEvent(new Event("change"));
    const button = bar.querySelector("button")!;
    expect(button.disabled).toBe(true);
    b!.value = "1";
    b!.dispatchEvent(new Event("change"));
    expect(button.disabled).toBe(false);
    button.click();
    expect(asked).toEqual([[{ key: "node-a:100", index: 0 }, { key: "node-a:100", index: 1 }]]);
  });
});
