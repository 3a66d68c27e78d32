// @vitest-environment happy-dom
// A widget drawn from a notebook's saved state (its view's element carries @jupyter-widgets/base's
// "disconnected" class: no comm) says so in its header, with what the state holds, and shows no
// live control; a live one is unchanged; one whose kernel goes away says "kernel gone".
import { describe, expect, it } from "vitest";
import type { AnyModel } from "@anywidget/types";
import widget from "../src/widget";
import { savedText } from "../src/header";
import { parseDevices, parseStatus, type Traits } from "../src/wire/protocol";
import { decodeTable } from "../src/wire/table";
import { received } from "./wire";

// happy-dom has no Option constructor (the Memory tab's device picker uses it).
if (typeof globalThis.Option === "undefined") {
  (globalThis as { Option?: unknown }).Option = function Option(text = "", value = text): HTMLOptionElement {
    const o = document.createElement("option");
    o.textContent = text;
    o.value = value;
    return o;
  };
}

class FakeModel {
  private handlers = new Map<string, Set<() => void>>();
  constructor(public state: Record<string, unknown>) {}
  get(name: string): unknown {
    return this.state[name];
  }
  on(event: string, h: () => void): void {
    if (!this.handlers.has(event)) this.handlers.set(event, new Set());
    this.handlers.get(event)?.add(h);
  }
  off(event: string, h: () => void): void {
    this.handlers.get(event)?.delete(h);
  }
  trigger(event: string): void {
    for (const h of this.handlers.get(event) ?? []) h();
  }
  send(): void {}
}

const frame = (): Promise<void> => new Promise((r) => requestAnimationFrame(() => r()));

async function draw(saved: boolean): Promise<{ host: HTMLElement; model: FakeModel; stop: () => void }> {
  const host = document.createElement("div");
  if (saved) host.classList.add("jupyter-widgets-disconnected");
  document.body.append(host);
  const model = new FakeModel(received());
  const stop = widget.render({ model: model as unknown as AnyModel<Traits>, el: host });
  await frame();
  return { host, model, stop };
}

describe("a widget drawn from saved state", () => {
  it("says it is saved, when and from which kernel and device, and drops the live controls", async () => {
    const { host, stop } = await draw(true);
    const root = host.querySelector<HTMLElement>(".gpumem-widget");
    expect(root?.dataset["session"]).toBe("saved");
    const sampler = host.querySelector<HTMLElement>(".gpumem-sampler");
    expect(sampler?.dataset["state"]).toBe("saved");
    const state = received();
    const devices = parseDevices(state["devices"]);
    const t = decodeTable(state["timeline_tail"], "timeline_tail").columns.get("t") as Float64Array;
    const expected = savedText(devices, parseStatus(state["status"], devices), t[t.length - 1] as number);
    expect(sampler?.textContent).toBe(expected);
    expect(expected).toMatch(/^saved state \(last sample \d{4}-\d\d-\d\d \d\d:\d\d UTC\)/);
    expect(expected).toContain(`cuda:0 ${devices[0]?.name}`);
    expect(expected).toMatch(/: not live$/);
    expect(host.textContent).not.toContain("sampler running");
    expect(host.querySelector(".gpumem-running")).toBeNull();
    stop();
  });

  it("names the kernel by the process NVML listed as it", () => {
    const devices = parseDevices(received()["devices"]);
    const status = parseStatus({ mode: "cuda", readers: {}, processes: { "0": [{ pid: 4242, used: 1, self: true, name: "python" }, { pid: 7, used: 1, self: false, name: null }] } }, devices);
    expect(savedText(devices, status, null)).toContain("from kernel pid 4242 on cuda:0");
  });

  it("a live widget keeps its sampler line; one whose kernel goes away says so", async () => {
    const { host, model, stop } = await draw(false);
    const sampler = (): HTMLElement | null => host.querySelector<HTMLElement>(".gpumem-sampler");
    expect(host.querySelector<HTMLElement>(".gpumem-widget")?.dataset["session"]).toBe("live");
    expect(sampler()?.textContent).toMatch(/^sampler /);
    host.classList.add("jupyter-widgets-disconnected");
    model.trigger("comm_live_update");
    await frame();
    expect(sampler()?.dataset["state"]).toBe("gone");
    expect(host.querySelector<HTMLElement>(".gpumem-widget")?.dataset["session"]).toBe("gone");
    stop();
  });

  it("becomes live when a kernel's comm takes the saved widget over", async () => {
    const { host, model, stop } = await draw(true);
    host.classList.remove("jupyter-widgets-disconnected");
    model.trigger("comm_live_update");
    await frame();
    expect(host.querySelector<HTMLElement>(".gpumem-widget")?.dataset["session"]).toBe("live");
    expect(host.querySelector<HTMLElement>(".gpumem-sampler")?.textContent).toMatch(/^sampler /);
    stop();
  });
});
