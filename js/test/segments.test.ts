// @vitest-environment happy-dom
// The segment map renderer on views made by the Python side from real snapshots
// (test/fixtures/segments.json, written by scripts/make_js_fixtures.py).
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { renderSegmentMap } from "../src/snapshot/segments";
import { parseSegmentMap } from "../src/wire/segments";

const PATH = join(dirname(fileURLToPath(import.meta.url)), "fixtures", "segments.json");
const views = JSON.parse(readFileSync(PATH, "utf8")) as Record<string, Record<string, unknown>>;
const view = (name: string): Record<string, unknown> => structuredClone(views[name] as Record<string, unknown>);
const HOSTILE = '<img src=x onerror="window.pwned=1">';

function mount(v: unknown): { el: HTMLElement; dispose: () => void } {
  const el = document.createElement("div");
  document.body.append(el);
  return { el, dispose: renderSegmentMap(el, v) };
}

describe("segment map", () => {
  it("draws one bar per segment and one element per block in use", () => {
    const v = parseSegmentMap(view("train_tagged"));
    const { el, dispose } = mount(view("train_tagged"));
    expect(el.querySelectorAll(".gpumem-segment")).toHaveLength(v.segments.length);
    const inUse = v.segments.flatMap((s) => s.blocks).filter((b) => b.state !== "free");
    expect(el.querySelectorAll(".gpumem-block")).toHaveLength(inUse.length);
    expect(el.querySelector(".gpumem-segments-legend")?.textContent).toContain("rounding waste");
    dispose();
    expect(el.children).toHaveLength(0);
  });

  it("shows a block's size, request, stream, tag and stack on hover", () => {
    const { el } = mount(view("train_tagged"));
    const blocks = [...el.querySelectorAll<HTMLElement>(".gpumem-block")];
    const tagged = blocks.find((b) => {
      b.dispatchEvent(new Event("mouseover", { bubbles: true }));
      return el.querySelector(".gpumem-segments-details")?.textContent?.includes("tag cell:");
    });
    expect(tagged).toBeDefined();
    const text = el.querySelector(".gpumem-segments-details")?.textContent ?? "";
    expect(text).toMatch(/size .+, requested .+/);
    expect(text).toContain("stream 0");
    expect(text).toContain("allocated at make_snapshot_fixtures.py:");
  });

  it("lists fragmentation figures with their meanings, and the advice with its trigger", () => {
    const { el } = mount(view("fragmented"));
    const row = el.querySelector<HTMLElement>('tr[data-key="oom_fragmented"]');
    expect(row?.textContent).toContain("yes");
    expect(row?.textContent).toContain("not in one piece");
    const largest = el.querySelector<HTMLElement>('tr[data-key="largest_free"]');
    expect(largest?.textContent).toContain("1.00 GiB");
    const settings = [...el.querySelectorAll<HTMLElement>(".gpumem-advice li")].map((li) => li.dataset["setting"]);
    expect(settings).toEqual(["expandable_segments:True", "max_split_size_mb:2048"]);
    expect(el.querySelector(".gpumem-advice-trigger")?.textContent).toBe("because reserved but unallocated = 7.00 GiB");
  });

  it("marks expandable mappings and says when no advice applies", () => {
    const { el } = mount(view("expandable"));
    const labels = [...el.querySelectorAll(".gpumem-segment-label")].map((l) => l.textContent);
    expect(labels.every((l) => l?.includes("expandable"))).toBe(true);
    expect(el.textContent).toContain("No allocator setting is called for");
  });

  it("renders hostile strings as text", () => {
    const v = view("train_tagged");
    const stacks = v["stacks"] as { site: string; frames: string[] }[];
    stacks.forEach((s) => {
      s.site = HOSTILE;
      s.frames = [HOSTILE];
    });
    const { el } = mount(v);
    for (const b of el.querySelectorAll<HTMLElement>(".gpumem-block")) b.dispatchEvent(new Event("mouseover", { bubbles: true }));
    expect(el.querySelector("img")).toBeNull();
    expect(el.querySelector(".gpumem-segments-details")?.textContent).toContain(HOSTILE);
  });

  it("turns a malformed view into one message naming the field", () => {
    const v = view("train_tagged");
    ((v["segments"] as Record<string, unknown>[])[0] as Record<string, unknown>)["size"] = "big";
    const { el, dispose } = mount(v);
    expect(el.querySelector(".gpumem-segments-error")?.textContent).toBe("segment_map.segments[0].size: expected a number, got \"big\"");
    dispose();
    expect(mount(null).el.textContent).toContain("expected a segment_map view");
  });
});
