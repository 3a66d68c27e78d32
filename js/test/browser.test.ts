// The built widget in headless Chromium, on the dev page (dev/index.html) with a fake model:
// contract selectors, live updates, several views, cleanup, bad input, selection, theme, width.
// Skipped where /usr/bin/chromium (or $CHROMIUM) is absent.
import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import type { Server } from "node:http";
import { fileURLToPath } from "node:url";
import { chromium, type Browser, type Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
// @ts-expect-error: a plain JS module without types
import { serve } from "../dev/serve.mjs";

const CHROMIUM = process.env["CHROMIUM"] ?? "/usr/bin/chromium";
const JS_DIR = fileURLToPath(new URL("..", import.meta.url));

interface DevWindow {
  gpumemDev: {
    mount(opts: object): void;
    mountRecorded(path: string, opts?: object): Promise<void>;
    startCell(): number;
    addCell(opts?: object): number;
    addView(): void;
    unmount(): void;
    publishTail(k?: number): number;
    attachDevices(n: number): void;
    model: { set(name: string, value: unknown): void; listenerCount(): number; trigger(event: string, ...args: unknown[]): void; sent?: Record<string, unknown>[] };
  };
}

// A real browser: on a loaded 2-core machine (load 14) some tests took over vitest's 5 s default.
describe.skipIf(!existsSync(CHROMIUM))("the widget in a browser", { timeout: 60_000 }, () => {
  let browser: Browser;
  let server: Server;
  let page: Page;
  const external: string[] = [];
  const errors: string[] = [];

  beforeAll(async () => {
    execFileSync(process.execPath, ["build.mjs"], { cwd: JS_DIR, stdio: "ignore" });
    const started = (await serve()) as { server: Server; url: string };
    server = started.server;
    browser = await chromium.launch({
      executablePath: CHROMIUM,
      args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"],
    });
    page = await browser.newPage({ viewport: { width: 1000, height: 1200 } });
    page.on("request", (r) => {
      if (!r.url().startsWith(started.url)) external.push(r.url());
    });
    page.on("pageerror", (e) => errors.push(e.message));
    await page.goto(`${started.url}/js/dev/index.html?manual`);
    await page.waitForFunction(() => "gpumemDev" in window);
  }, 60_000);

  afterAll(async () => {
    await browser?.close();
    server?.close();
  });

  const mount = async (opts: object): Promise<void> => {
    await page.evaluate((o) => (window as unknown as DevWindow).gpumemDev.mount(o), opts);
    await page.waitForSelector(".gpumem-chart[data-samples]");
  };
  const drawnUntil = (nth = 0): Promise<number> =>
    page.locator(".gpumem-chart").nth(nth).evaluate((el) => Number((el as HTMLElement).dataset["drawnUntil"]));

  it("renders the contract: root, canvas in the chart, a row and a band per cell", async () => {
    await mount({ samples: 5000, devices: 2, cells: 6 });
    expect(await page.locator(".gpumem-widget").count()).toBe(1);
    expect(await page.locator(".gpumem-chart canvas").count()).toBe(3); // two devices and host RSS
    for (let n = 1; n <= 6; n++) {
      expect(await page.locator(`.gpumem-ledger tr[data-execution-count="${n}"]`).count()).toBe(1);
      expect(await page.locator(`.gpumem-band[data-execution-count="${n}"]`).count()).toBe(1);
    }
    expect(await page.locator(".gpumem-header").innerText()).toContain("cuda:1 NVIDIA H200");
    expect(await page.locator('.gpumem-band[data-execution-count="11"], .gpumem-band[data-outcome="oom"]').count()).toBe(0);
  });

  it("draws a new sample within a frame or two of the model change", async () => {
    await mount({ samples: 100_000, devices: 1, cells: 20 });
    const latency = await page.evaluate(async () => {
      const dev = (window as unknown as DevWindow).gpumemDev;
      const chart = document.querySelector<HTMLElement>(".gpumem-chart") as HTMLElement;
      const t0 = performance.now();
      const t = dev.publishTail(3);
      while (Number(chart.dataset["drawnUntil"]) !== t) {
        if (performance.now() - t0 > 2000) return Infinity;
        await new Promise((r) => setTimeout(r, 1));
      }
      return performance.now() - t0;
    });
    expect(latency).toBeLessThan(500);
    expect(await page.locator(".gpumem-chart").getAttribute("data-samples")).toBe("100003");
  });

  it("cuts no clock label at the chart's right edge, whatever the width", async () => {
    await mount({ samples: 2000, devices: 0, cells: 3 });
    const inkAtRightEdge: Record<number, number> = {};
    try {
      for (let width = 560; width <= 1000; width += 20) {
        await page.setViewportSize({ width, height: 1200 });
        await page.waitForFunction((w) => {
          const c = document.querySelector<HTMLCanvasElement>(".gpumem-panel--host canvas");
          return c !== null && Math.abs(c.getBoundingClientRect().right - w) < 60; // redrawn at this width
        }, width);
        await page.evaluate(() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r))));
        // Text pixels in the last 2 CSS px of the clock labels' row (the bottom panel's axis).
        inkAtRightEdge[width] = await page.evaluate(() => {
          const c = document.querySelector<HTMLCanvasElement>(".gpumem-panel--host canvas") as HTMLCanvasElement;
          const r = c.width / c.clientWidth;
          const [w, h] = [Math.round(2 * r), Math.round(16 * r)];
          const px = (c.getContext("2d") as CanvasRenderingContext2D).getImageData(c.width - w, c.height - h - Math.round(2 * r), w, h).data;
          let n = 0;
          for (let i = 3; i < px.length; i += 4) if ((px[i] as number) > 0) n++;
          return n;
        });
      }
    } finally {
      await page.setViewportSize({ width: 1000, height: 1200 });
    }
    expect(Object.values(inkAtRightEdge).filter((n) => n > 0), JSON.stringify(inkAtRightEdge)).toEqual([]);
  });

  it("draws the very first sample, alone, as a point", async () => {
    await mount({ samples: 1, devices: 0, cells: 0 });
    await page.waitForFunction(() => document.querySelector<HTMLElement>(".gpumem-chart")?.dataset["samples"] === "1");
    // Pixels of the host RSS line's colour (#2e9e6b) on the host panel's canvas.
    const inked = await page.evaluate(() => {
      const canvas = document.querySelector<HTMLCanvasElement>(".gpumem-panel--host canvas");
      const ctx = canvas?.getContext("2d");
      if (!canvas || !ctx) return -1;
      const px = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
      let n = 0;
      for (let i = 0; i < px.length; i += 4) {
        const [r, g, b] = [px[i] as number, px[i + 1] as number, px[i + 2] as number];
        if (Math.abs(r - 46) < 40 && Math.abs(g - 158) < 40 && Math.abs(b - 107) < 40 && g > r + 50) n++;
      }
      return n;
    });
    expect(inked).toBeGreaterThan(5);
  });

  it("gains a device's panel when the notebook imports torch after loading", async () => {
    await mount({ samples: 200, devices: 0, cells: 2 });
    expect(await page.locator(".gpumem-chart canvas").count()).toBe(1); // host RSS only
    expect(await page.locator(".gpumem-mode").innerText()).toBe("host mode");
    expect(await page.locator(".gpumem-title").innerText()).toBe("Host memory");
    await page.evaluate(() => (window as unknown as DevWindow).gpumemDev.attachDevices(1));
    await page.waitForFunction(() => document.querySelectorAll(".gpumem-chart canvas").length === 2);
    expect(await page.locator(".gpumem-header").innerText()).toContain("cuda:0 NVIDIA H200");
    expect(await page.locator(".gpumem-mode").innerText()).toBe("CUDA");
    expect(await page.locator(".gpumem-title").innerText()).toBe("GPU memory");
    expect(await page.locator(".gpumem-chart").getAttribute("data-samples")).toBe("200"); // host samples kept
    expect(await page.locator('.gpumem-problems li[data-kind="display"]').count()).toBe(0);
  });

  it("keeps several views in sync, and a closed view stops listening", async () => {
    await mount({ samples: 2000, devices: 1, cells: 3 });
    const listeners = await page.evaluate(() => (window as unknown as DevWindow).gpumemDev.model.listenerCount());
    await page.evaluate(() => (window as unknown as DevWindow).gpumemDev.addView());
    expect(await page.evaluate(() => (window as unknown as DevWindow).gpumemDev.model.listenerCount())).toBe(2 * listeners);
    const t = await page.evaluate(() => (window as unknown as DevWindow).gpumemDev.publishTail(5));
    await expect.poll(() => drawnUntil(0)).toBe(t);
    await expect.poll(() => drawnUntil(1)).toBe(t);
    await page.evaluate(() => (window as unknown as DevWindow).gpumemDev.unmount());
    expect(await page.evaluate(() => (window as unknown as DevWindow).gpumemDev.model.listenerCount())).toBe(0);
    expect(await page.locator(".gpumem-widget").count()).toBe(0);
  });

  it("says why a malformed trait was ignored and keeps the last good chart", async () => {
    await mount({ samples: 2000, devices: 1, cells: 3 });
    const before = await drawnUntil();
    await page.evaluate(() =>
      (window as unknown as DevWindow).gpumemDev.model.set("timeline_tail", { n: 3, columns: ["t"], dtypes: ["f8"], buffers: [new DataView(new ArrayBuffer(5))] }),
    );
    const problem = page.locator('.gpumem-problems li[data-kind="display"]');
    await problem.waitFor();
    expect(await problem.innerText()).toContain("timeline_tail.t: 5 bytes for 3 rows");
    expect(await drawnUntil()).toBe(before);
    const t = await page.evaluate(() => (window as unknown as DevWindow).gpumemDev.publishTail(1));
    await expect.poll(() => drawnUntil()).toBe(t);
    expect(await problem.count()).toBe(0);
  });

  it("selects a cell from its row: details open, the chart zooms to it, its band's hover shows text", async () => {
    await mount({ samples: 20_000, devices: 1, cells: 12 });
    await page.click('.gpumem-ledger tr[data-execution-count="3"]');
    const details = page.locator('.gpumem-details[data-execution-count="3"]');
    await details.waitFor();
    expect(await details.innerText()).toContain("outside PyTorch");
    expect(await page.locator(".gpumem-follow input").isChecked()).toBe(false);
    const band = page.locator('.gpumem-band[data-execution-count="3"]');
    const box = await band.boundingBox();
    const chartBox = await page.locator(".gpumem-strip").boundingBox();
    expect(box && chartBox && box.width / chartBox.width).toBeGreaterThan(0.6);
    await band.hover();
    const tooltip = page.locator(".gpumem-tooltip");
    await tooltip.waitFor();
    expect(await tooltip.innerText()).toContain("<b>not html</b>");
    expect(await page.locator(".gpumem-widget b").count()).toBe(0);
    await page.click(".gpumem-details-close");
    await details.waitFor({ state: "hidden" });
  });

  it("sorts the ledger by peak in one click", async () => {
    await mount({ samples: 20_000, devices: 1, cells: 12 });
    await page.click('button[data-sort="peak"]');
    const peaks = await page.locator(".gpumem-ledger tbody tr td:nth-child(5)").allInnerTexts();
    const gib = peaks.map((p) => parseFloat(p.replace(/[^\d.]/g, "")));
    expect(gib).toEqual([...gib].sort((a, b) => b - a));
  });

  it("zooms by dragging, and 'Show all' goes back to following live", async () => {
    await mount({ samples: 20_000, devices: 1, cells: 12 });
    const over = (await page.locator(".gpumem-panel .u-over").first().boundingBox()) as { x: number; y: number; width: number; height: number };
    await page.mouse.move(over.x + over.width * 0.3, over.y + 20);
    await page.mouse.down();
    await page.mouse.move(over.x + over.width * 0.5, over.y + 20, { steps: 5 });
    await page.mouse.up();
    await expect.poll(() => page.locator(".gpumem-follow input").isChecked()).toBe(false);
    await page.getByRole("button", { name: "Show all" }).click();
    await expect.poll(() => page.locator(".gpumem-follow input").isChecked()).toBe(true);
  });

  it("pans by shift-dragging", async () => {
    await mount({ samples: 20_000, devices: 1, cells: 12 });
    const view = (): Promise<[number, number]> =>
      page.locator(".gpumem-chart").evaluate((el) => [Number((el as HTMLElement).dataset["viewFrom"]), Number((el as HTMLElement).dataset["viewTo"])]);
    const [from, to] = await view();
    const over = (await page.locator(".gpumem-panel .u-over").first().boundingBox()) as { x: number; y: number; width: number };
    await page.keyboard.down("Shift");
    await page.mouse.move(over.x + over.width * 0.2, over.y + 20);
    await page.mouse.down();
    await page.mouse.move(over.x + over.width * 0.7, over.y + 20, { steps: 5 });
    await page.mouse.up();
    await page.keyboard.up("Shift");
    await expect.poll(async () => (await view())[0]).toBeLessThan(from);
    const [panFrom, panTo] = await view();
    expect(panTo - panFrom).toBeCloseTo(to - from, 3); // moved, not zoomed
    expect(await page.locator(".gpumem-follow input").isChecked()).toBe(false);
  });

  it("hides a line from its legend entry", async () => {
    await mount({ samples: 2000, devices: 1, cells: 2 });
    const item = page.locator(".gpumem-legend-item", { hasText: "reserved" }).first();
    await item.click();
    expect(await item.getAttribute("class")).toContain("gpumem-legend-item--off");
    await item.click();
    expect(await item.getAttribute("class")).not.toContain("gpumem-legend-item--off");
  });

  it("follows JupyterLab's dark theme and fits 400 px", async () => {
    await mount({ samples: 5000, devices: 1, cells: 5, width: 400 });
    const swatch = (): Promise<string> =>
      page.locator(".gpumem-legend .gpumem-legend-item .gpumem-swatch").first().evaluate((el) => getComputedStyle(el).backgroundColor);
    const light = await swatch();
    await page.evaluate(() => (document.body.dataset["jpThemeLight"] = "false"));
    await expect.poll(swatch).not.toBe(light);
    await page.evaluate(() => (document.body.dataset["jpThemeLight"] = "true"));
    const fits = await page.locator(".gpumem-widget").evaluate((el) => el.scrollWidth <= el.clientWidth + 1);
    expect(fits).toBe(true);
    expect(await page.locator(".gpumem-ledger td.gpumem-col-source").first().isVisible()).toBe(true);
  });

  it("has a Snapshot tab for the drill-down", async () => {
    await mount({ samples: 1000, devices: 1, cells: 2 });
    await page.getByRole("tab", { name: "Snapshot" }).click();
    expect(await page.locator(".gpumem-drilldown").innerText()).toContain("No snapshot loaded");
    await page.getByRole("tab", { name: "Memory" }).click();
    expect(await page.locator(".gpumem-chart").isVisible()).toBe(true);
  });

  it("draws the running cell's band live, then hands it to the cell's record", async () => {
    await mount({ samples: 2000, devices: 1, cells: 3 });
    const n = await page.evaluate(() => (window as unknown as DevWindow).gpumemDev.startCell());
    const running = page.locator(`.gpumem-band[data-execution-count="${n}"][data-running]`);
    await page.evaluate(() => (window as unknown as DevWindow).gpumemDev.publishTail(100));
    await running.waitFor({ state: "visible" });
    expect(await running.innerText()).toBe(`[${n}] running`);
    const width = async (): Promise<number> => (await running.boundingBox())?.width ?? 0;
    const before = await width();
    const t = await page.evaluate(() => (window as unknown as DevWindow).gpumemDev.publishTail(300));
    await expect.poll(() => drawnUntil()).toBe(t);
    expect(await width()).toBeGreaterThan(before);
    // It ends at the newest sample: the strip's right edge while following live.
    const strip = (await page.locator(".gpumem-strip").boundingBox()) as { x: number; width: number };
    const box = (await running.boundingBox()) as { x: number; width: number };
    expect(Math.abs(box.x + box.width - (strip.x + strip.width))).toBeLessThan(2);
    expect(await page.locator(".gpumem-header").innerText()).toContain(`running [${n}] since`);
    await running.hover();
    await expect.poll(() => page.locator(".gpumem-tooltip").innerText()).toContain("so far");

    await page.evaluate(() => (window as unknown as DevWindow).gpumemDev.addCell());
    await running.waitFor({ state: "detached" });
    const done = page.locator(`.gpumem-band[data-execution-count="${n}"]`);
    expect(await done.count()).toBe(1);
    expect(await done.getAttribute("data-running")).toBeNull();
    expect(await page.locator(`.gpumem-ledger tr[data-execution-count="${n}"]`).count()).toBe(1);
  });

  it("switches between all devices and one, in the chart and the ledger", async () => {
    await mount({ samples: 5000, devices: 2, cells: 4, width: 400 });
    const select = page.locator(".gpumem-device-select select");
    expect(await select.isVisible()).toBe(true);
    expect(await page.locator(".gpumem-device-select option").allInnerTexts()).toEqual(["All devices", "cuda:0", "cuda:1"]);
    const panels = (): Promise<string[]> => page.locator(".gpumem-panel").evaluateAll((els) => els.map((e) => (e as HTMLElement).dataset["device"] ?? "host"));
    const peakTitle = (): Promise<string | null> => page.locator('button[data-sort="peak"]').locator("xpath=..").getAttribute("title");
    expect(await panels()).toEqual(["0", "1", "host"]);
    expect(await peakTitle()).toContain("the largest of any device");
    await select.selectOption("1");
    await expect.poll(panels).toEqual(["1", "host"]);
    expect(await page.locator(".gpumem-chart canvas").count()).toBe(2);
    expect(await peakTitle()).toBe("Peak allocated during the cell on cuda:1");
    const fits = await page.locator(".gpumem-widget").evaluate((el) => el.scrollWidth <= el.clientWidth + 1);
    expect(fits).toBe(true);
    await select.selectOption("all");
    await expect.poll(panels).toEqual(["0", "1", "host"]);
    await mount({ samples: 1000, devices: 1, cells: 2 });
    expect(await page.locator(".gpumem-device-select").isVisible()).toBe(false);
  });

  it("renders a recorded state: the estimate as a line on its device's panel, notes in the details", async () => {
    await page.evaluate(() => (window as unknown as DevWindow).gpumemDev.mountRecorded("js/test/fixtures/wire.json", { width: 700 }));
    await page.waitForSelector('.gpumem-panel[data-device="0"][data-estimates]');
    expect(await page.locator('.gpumem-panel[data-device="0"]').getAttribute("data-estimates")).toBe("4 6");
    expect(await page.locator('.gpumem-panel[data-device="1"]').getAttribute("data-estimates")).toBe("");
    // The line's colour is on device 0's canvas, within the estimate cells' bands, and nowhere on device 1's.
    const estimatePixels = (device: string): Promise<number> =>
      page.locator(`.gpumem-panel[data-device="${device}"] canvas`).evaluate((c) => {
        const canvas = c as HTMLCanvasElement;
        const color = getComputedStyle(document.querySelector(".gpumem-widget") as Element).getPropertyValue("--gpumem-estimate").trim();
        const [r, g, b] = [1, 3, 5].map((i) => parseInt(color.slice(i, i + 2), 16));
        const { data } = (canvas.getContext("2d") as CanvasRenderingContext2D).getImageData(0, 0, canvas.width, canvas.height);
        let hits = 0;
        for (let i = 0; i < data.length; i += 4) {
          if (Math.abs((data[i] as number) - (r as number)) + Math.abs((data[i + 1] as number) - (g as number)) + Math.abs((data[i + 2] as number) - (b as number)) < 30) hits++;
        }
        return hits;
      });
    expect(await estimatePixels("0")).toBeGreaterThan(20);
    expect(await estimatePixels("1")).toBe(0);
    // The recorded status has cell 7 running.
    expect(await page.locator('.gpumem-band[data-execution-count="7"][data-running]').isVisible()).toBe(true);
    await page.click('.gpumem-ledger tr[data-execution-count="5"]');
    const details = page.locator('.gpumem-details[data-execution-count="5"]');
    await details.waitFor();
    expect(await details.locator('[data-note="postmortem"]').innerText()).toContain("What to do, most useful first");
    await page.locator(".gpumem-device-select select").selectOption("1");
    await expect.poll(() => page.locator(".gpumem-panel[data-device]").evaluateAll((els) => els.map((e) => [(e as HTMLElement).dataset["device"], (e as HTMLElement).dataset["estimates"]]))).toEqual([["1", ""]]);
  });

  it("holds a window of the ledger: a band per cell, older rows by page, an old band's record on request", async () => {
    await mount({ samples: 20_000, devices: 1, cells: 380, windowed: 100 });
    const rows = page.locator(".gpumem-ledger tbody tr[data-execution-count]");
    await expect.poll(() => rows.count()).toBe(100);
    const footer = page.locator(".gpumem-ledger-more");
    expect(await footer.getAttribute("data-missing")).toBe("280");
    expect(await footer.innerText()).toContain("280 older of 380 cells");
    // Every cell has a band, from the compact table, the oldest too.
    await page.click(".gpumem-toolbar button:has-text('Show all')");
    await page.locator('.gpumem-band[data-execution-count="1"]').waitFor({ state: "attached" });
    await footer.locator("button").click();
    await expect.poll(() => rows.count()).toBe(300);
    expect(await footer.getAttribute("data-missing")).toBe("80");
    // Selecting the band of a cell no page brought asks for it, and its details open when it comes.
    await page.locator('.gpumem-band[data-execution-count="1"]').dispatchEvent("click");
    await page.locator('.gpumem-details[data-execution-count="1"]').waitFor();
    const sent = await page.evaluate(() => (window as unknown as DevWindow).gpumemDev.model.sent ?? []);
    // The view first tells the kernel it is shown (the kernel then stops sending per-cell rows).
    expect(sent).toEqual([
      { type: "shown" },
      { type: "cells_page", before: 280, limit: 200 },
      { type: "cells_page", execution_count: 1, limit: 20 },
    ]);
  });

  it("says the kernel went away when the model's comm does", async () => {
    await mount({ samples: 2000, devices: 1, cells: 300, windowed: 100 });
    const sampler = page.locator(".gpumem-sampler");
    expect(await sampler.innerText()).toContain("sampler running");
    await page.evaluate(() => (window as unknown as DevWindow).gpumemDev.model.trigger("comm_live_update"));
    await expect.poll(() => sampler.getAttribute("data-state")).toBe("gone");
    expect(await sampler.innerText()).toContain("kernel gone");
    const footer = page.locator(".gpumem-ledger-more");
    expect(await footer.innerText()).toContain("not in this widget's saved state");
    expect(await footer.locator("button").isHidden()).toBe(true);
  });

  it("made no request off this machine and raised no page error", () => {
    expect(external).toEqual([]);
    expect(errors).toEqual([]);
  });
});
