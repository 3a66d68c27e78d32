// The Workers tab in headless Chromium (its canvas draws there; happy-dom has none): the built
// widget on the dev page, a workers trait set as the kernel sends it. Skipped without Chromium.
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

// A real browser: on a loaded 2-core machine (load 14) some tests took over vitest's 5 s default.
describe.skipIf(!existsSync(CHROMIUM))("the Workers tab in a browser", { timeout: 30_000 }, () => {
  let browser: Browser;
  let server: Server;
  let page: Page;
  const errors: string[] = [];

  beforeAll(async () => {
    execFileSync(process.execPath, ["build.mjs"], { cwd: JS_DIR, stdio: "ignore" });
    const started = (await serve()) as { server: Server; url: string };
    server = started.server;
    browser = await chromium.launch({ executablePath: CHROMIUM, args: ["--headless", "--no-sandbox", "--disable-gpu"] });
    page = await browser.newPage({ viewport: { width: 1000, height: 1200 } });
    page.on("pageerror", (e) => errors.push(e.message));
    await page.goto(`${started.url}/js/dev/index.html?manual`);
    await page.waitForFunction(() => "gpumemDev" in window);
  }, 60_000);

  afterAll(async () => {
    await browser?.close();
    server?.close();
  });

  it("draws a line per rank under the cell bands and marks the OOM and gone ones", async () => {
    await page.evaluate(() => {
      const dev = (window as unknown as { gpumemDev: { mount(o: object): { set(n: string, v: unknown): void } } }).gpumemDev;
      const model = dev.mount({ samples: 2000, devices: 1, cells: 6 });
      const GiB = 1024 ** 3;
      const now = Date.now() / 1000;
      const table = (n: number, r: number): object => {
        const t = new Float64Array(n).map((_, i) => now - 20 + (i * 20) / n);
        const a = new Float32Array(n).map((_, i) => (r + 1) * GiB * (1 + Math.sin(i / 10)));
        const res = new Float32Array(n).map(() => (r + 1) * 2.2 * GiB);
        const rss = new Float32Array(n).fill(GiB);
        return { n, columns: ["t", "allocated", "reserved", "rss"], dtypes: ["f8", "f4", "f4", "f4"], buffers: [t, a, res, rss].map((x) => new DataView(x.buffer)) };
      };
      const rank = (r: number, host: string, over: object = {}): object => ({
        key: `${host}:${100 + r}`, label: `rank ${r}`, rank: r, local_rank: r % 2, world_size: 4, host, pid: 100 + r,
        state: "live", last_seen: now, errors: 0, rss: GiB,
        devices: [{ index: r % 2, uuid: null, allocated: GiB, reserved: 2 * GiB, peak_allocated: 3 * GiB, peak_reserved: 4 * GiB, nvml_used: null }],
        oom: null, snapshots: [], series: table(400, r), ...over,
      });
      model.set("workers", {
        address: "tcp://127.0.0.1:5555", received: 100, accepted: 100, dropped: {},
        ranks: [
          rank(0, "node-a"),
          rank(1, "node-a", {
            oom: { device: 1, requested: 2 ** 44, limit: 80 * GiB, free: GiB, allocated: 70 * GiB, reserved: 75 * GiB },
            snapshots: ["/tmp/gpumem-workers/rank1-oom.pickle"],
          }),
          rank(2, "node-b", { state: "gone", snapshots: ["/tmp/gpumem-workers/rank2.pickle"] }),
          rank(3, "node-b", { state: "exited" }),
        ],
      });
    });
    await page.click('nav.gpumem-tabs button[data-tab="workers"]');
    await page.waitForSelector(".gpumem-workers-chart[data-lines]");
    expect(errors).toEqual([]);
    expect(await page.locator(".gpumem-workers-chart").getAttribute("data-lines")).toBe("8");
    expect(await page.locator(".gpumem-workers-host").count()).toBe(2);
    expect(await page.locator('.gpumem-workers tr[data-oom="true"]').count()).toBe(1);
    expect(await page.locator('.gpumem-workers tr[data-state="gone"]').count()).toBe(1);
    // Something was drawn: the canvas holds more than one colour.
    const colours = await page.locator(".gpumem-workers-chart").evaluate((c) => {
      const canvas = c as HTMLCanvasElement;
      const data = canvas.getContext("2d")!.getImageData(0, 0, canvas.width, canvas.height).data;
      const seen = new Set<number>();
      for (let i = 0; i < data.length; i += 4 * 97) seen.add((data[i]! << 16) | (data[i + 1]! << 8) | data[i + 2]!);
      return seen.size;
    });
    expect(colours).toBeGreaterThan(3);
    // The rank selector: the kernel is asked for rank 1's snapshot, the Snapshot tab comes up.
    await page.click(".gpumem-workers-open");
    const sent = await page.evaluate(
      () => (window as unknown as { gpumemDev: { model: { sent?: unknown[] } } }).gpumemDev.model.sent ?? [],
    );
    expect(sent).toContainEqual({ type: "worker_snapshot", key: "node-a:101", index: 0 });
    expect(await page.locator('nav.gpumem-tabs button[data-tab="snapshot"]').getAttribute("aria-selected")).toBe("true");
    // Two ranks' snapshots side by side: by default the two ranks' newest, sent by reference.
    await page.click('nav.gpumem-tabs button[data-tab="workers"]');
    expect(await page.locator(".gpumem-workers-compare").isVisible()).toBe(true);
    expect(await page.locator(".gpumem-workers-compare select").first().locator("option").allTextContents()).toEqual([
      "rank 1/4 (local 1) \u00b7 rank1-oom.pickle",
      "rank 2/4 (local 0) \u00b7 rank2.pickle",
    ]);
    await page.click(".gpumem-workers-compare button");
    const sentAfter = await page.evaluate(
      () => (window as unknown as { gpumemDev: { model: { sent?: unknown[] } } }).gpumemDev.model.sent ?? [],
    );
    expect(sentAfter[sentAfter.length - 1]).toEqual({
      type: "worker_compare",
      a: { key: "node-a:101", index: 0 },
      b: { key: "node-b:102", index: 0 },
    });
    expect(await page.locator('nav.gpumem-tabs button[data-tab="snapshot"]').getAttribute("aria-selected")).toBe("true");
    expect(errors).toEqual([]);
  }, 60_000);
});
