// Browser half of bench_drilldown.py: mount the Snapshot tab in headless Chromium on a drill-down
// state the kernel published (a JSON file: state, buffer paths, base64 buffers) and time it from
// receiving the state to the chart's first drawn frame (rasterized: a getImageData reads it back).
//
//   node benchmarks/bench_drilldown.mjs STATE.json   (prints one JSON line)

import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";

const here = (p) => fileURLToPath(new URL(p, import.meta.url));
const require = createRequire(here("../js/package.json"));
const { chromium } = require("playwright-core");
const esbuild = require("esbuild");

const fixture = readFileSync(process.argv[2], "utf8");
const bundle = await esbuild.build({
  stdin: {
    contents: 'import { mountSnapshotTab } from "./src/snapshot/tab"; window.mountSnapshotTab = mountSnapshotTab;',
    resolveDir: here("../js"),
    loader: "ts",
  },
  bundle: true,
  format: "iife",
  write: false,
  loader: { ".css": "empty" },
});
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"],
});
try {
  const page = await browser.newPage({ viewport: { width: 1200, height: 900 } });
  await page.setContent('<div class="gpumem-widget"><div class="gpumem-drilldown"></div></div>');
  await page.addScriptTag({ content: bundle.outputFiles[0].text });
  const result = await page.evaluate(async (text) => {
    const t0 = performance.now();
    const f = JSON.parse(text);
    const state = f.state;
    f.buffer_paths.forEach((path, i) => {
      const bytes = Uint8Array.from(atob(f.buffers[i]), (c) => c.charCodeAt(0));
      let obj = state;
      for (const key of path.slice(0, -1)) obj = obj[key];
      obj[path[path.length - 1]] = new DataView(bytes.buffer);
    });
    const t1 = performance.now();
    const model = { get: (n) => state[n], on() {}, off() {}, send() {} };
    window.mountSnapshotTab(document.querySelector(".gpumem-drilldown"), { model });
    const canvas = document.querySelector(".gpumem-drilldown-chart canvas");
    canvas.getContext("2d").getImageData(0, 0, 1, 1);
    await new Promise((r) => requestAnimationFrame(() => r()));
    const t2 = performance.now();
    return {
      decode_ms: t1 - t0,
      mount_and_draw_ms: t2 - t1,
      canvas_width: canvas.width,
      tree_rows: document.querySelectorAll(".gpumem-alive-node").length,
    };
  }, fixture);
  console.log(JSON.stringify(result));
} finally {
  await browser.close();
}
