// Opens one standalone report in Debian's Chromium with every non-local request aborted, and
// records what rendered: Bokeh documents, canvases, tables, errors, blocked requests. Optionally
// picks each rank's tab in turn. It asserts nothing: test_report_browser.py does.
//
// Usage: node open_report.mjs PLAN.json   PLAN: {browser, html, screenshot, result, selectRanks}
//   (browser: the endpoint of the run's Chromium, from browser_server.mjs)

import { readFile, writeFile } from "node:fs/promises";
import { pathToFileURL } from "node:url";
import { chromium } from "playwright-core";
import { isLocal } from "./browser.mjs";
import { pageState, rankTitles, showRank } from "./report_page.mjs";

// A report draws its plots within a second or two; generous for a loaded 2-core machine.
const RENDER_TIMEOUT_MS = 30000;

const plan = JSON.parse(await readFile(process.argv[2], "utf8"));
const result = {
  blocked: [],
  consoleErrors: [],
  pageErrors: [],
  dialogs: [],
  documents: 0,
  plotViews: 0,
  canvases: 0,
  paintedCanvases: 0,
  tableRows: 0,
  ranks: [],
  error: null,
};

const browser = await chromium.connect(plan.browser);
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 1800 } });
  await page.route("**/*", (route) => {
    const url = route.request().url();
    if (isLocal(url)) return route.continue();
    result.blocked.push(url);
    return route.abort();
  });
  page.on("console", (m) => {
    if (m.type() === "error") result.consoleErrors.push(m.text());
  });
  page.on("pageerror", (e) => result.pageErrors.push(String(e)));
  page.on("dialog", async (d) => {
    result.dialogs.push(d.message());
    await d.dismiss();
  });
  await page.goto(pathToFileURL(plan.html).href, { waitUntil: "load" });
  // BokehJS calls a document idle once every view has been built, laid out and painted.
  await page
    .waitForFunction(() => window.Bokeh?.documents?.[0]?.is_idle === true, null, {
      timeout: RENDER_TIMEOUT_MS,
    })
    .catch(() => {});
  Object.assign(result, await page.evaluate(pageState));
  await page.screenshot({ path: plan.screenshot, fullPage: true });
  if (plan.selectRanks) {
    // Each tab in turn, last to first: its heading must show and its plots paint.
    const titles = await rankTitles(page);
    for (let i = titles.length - 1; i >= 0; i--) {
      await showRank(page, i, titles[i], RENDER_TIMEOUT_MS);
      result.ranks.push({ title: titles[i], ...(await page.evaluate(pageState)) });
    }
    await page.screenshot({ path: plan.screenshot.replace(/\.png$/, "-rank.png"), fullPage: true });
  }
} catch (e) {
  result.error = String(e?.stack ?? e);
} finally {
  await browser.close();
  await writeFile(plan.result, JSON.stringify(result, null, 2));
}
