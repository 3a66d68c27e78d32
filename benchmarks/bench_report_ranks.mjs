// A standalone report with several snapshots (ranks), in Debian's Chromium: opening it until the
// Bokeh document is idle, then each rank's tab, last to first, until its heading shows and its
// plots have painted (tests/e2e/report_page.mjs, as the e2e test waits). Wall time, and the CPU
// time of the page's renderer processes, which moves less with a shared machine's load.
//
//   gpumem-widget report A.pickle B.pickle C.pickle -o /tmp/ranks.html
//   node benchmarks/bench_report_ranks.mjs /tmp/ranks.html [--chromium /usr/bin/chromium]
//
// Prints one JSON line. Needs tests/e2e/node_modules (npm ci in tests/e2e).

import { readFileSync, readdirSync } from "node:fs";
import { createRequire } from "node:module";
import { fileURLToPath, pathToFileURL } from "node:url";
import { BROWSER_ARGS } from "../tests/e2e/browser.mjs";
import { rankTitles, showRank } from "../tests/e2e/report_page.mjs";

const require = createRequire(fileURLToPath(new URL("../tests/e2e/package.json", import.meta.url)));
const { chromium } = require("playwright-core");

const html = process.argv[2];
const exe = process.argv.includes("--chromium")
  ? process.argv[process.argv.indexOf("--chromium") + 1]
  : "/usr/bin/chromium";
const TICKS = 100; // clock ticks per second (USER_HZ) on Linux

// CPU seconds of every renderer process descended from this one (Chromium's page processes).
function rendererCpu() {
  const parent = new Map();
  const stats = new Map();
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = readFileSync(`/proc/${name}/stat`, "utf8");
      const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      parent.set(Number(name), Number(fields[1]));
      stats.set(Number(name), (Number(fields[11]) + Number(fields[12])) / TICKS);
    } catch {
      // the process ended while listing
    }
  }
  let total = 0;
  for (const [pid, cpu] of stats) {
    let p = pid;
    while (p > 1 && p !== process.pid) p = parent.get(p) ?? 1;
    if (p !== process.pid) continue;
    try {
      if (readFileSync(`/proc/${pid}/cmdline`, "utf8").includes("--type=renderer")) total += cpu;
    } catch {
      // ended
    }
  }
  return total;
}

const clock = () => ({ wall: performance.now() / 1e3, cpu: rendererCpu() });
const since = (a) => {
  const b = clock();
  return { wall_s: +(b.wall - a.wall).toFixed(2), cpu_s: +(b.cpu - a.cpu).toFixed(2) };
};

const browser = await chromium.launch({ executablePath: exe, headless: true, args: BROWSER_ARGS });
const out = { html, bokeh: null, open: null, switches: [] };
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 1800 } });
  const t0 = clock();
  await page.goto(pathToFileURL(html).href, { waitUntil: "load" });
  await page.waitForFunction(() => window.Bokeh?.documents?.[0]?.is_idle === true, null, {
    timeout: 120000,
    polling: 100,
  });
  out.open = since(t0);
  out.bokeh = await page.evaluate(() => window.Bokeh.version);
  const titles = await rankTitles(page);
  for (let i = titles.length - 1; i >= 0; i--) {
    const title = titles[i];
    const t = clock();
    await showRank(page, i, title, 120000);
    out.switches.push({ title, ...since(t) });
  }
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
