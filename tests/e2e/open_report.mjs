// Opens one standalone report in Debian's Chromium with every non-local request aborted, and
// records what rendered: Bokeh documents, canvases, tables, errors, blocked requests. Optionally
// picks each entry of the rank selector in turn. It asserts nothing: test_report_browser.py does.
//
// Usage: node open_report.mjs PLAN.json   PLAN: {browser, html, screenshot, result, selectRanks}
//   (browser: the endpoint of the run's Chromium, from browser_server.mjs)

import { readFile, writeFile } from "node:fs/promises";
import { pathToFileURL } from "node:url";
import { chromium } from "playwright-core";
import { isLocal } from "./browser.mjs";

// A report draws its plots within a second or two; generous for a loaded 2-core machine.
const RENDER_TIMEOUT_MS = 30000;
// What is drawn counts as done once it reads the same this long apart.
const STEADY_MS = 200;

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

// What the page shows now: Bokeh's documents, its plot views with a canvas, painted pixels.
async function rendered(page) {
  return page.evaluate(() => {
    const views = [...(window.Bokeh?.index?.values?.() ?? [])];
    const all = [];
    const walk = (root) => {
      for (const el of root.querySelectorAll("*")) {
        all.push(el);
        if (el.shadowRoot) walk(el.shadowRoot);
      }
    };
    walk(document);
    const visible = (el) => el.getClientRects().length > 0;
    const canvases = all.filter((el) => el.tagName === "CANVAS" && visible(el));
    const painted = canvases.filter((c) => {
      const ctx = c.getContext("2d");
      if (!ctx || !c.width || !c.height) return false;
      const data = ctx.getImageData(0, 0, c.width, c.height).data;
      for (let i = 3; i < data.length; i += 4 * 97) if (data[i] !== 0) return true;
      return false;
    });
    return {
      documents: window.Bokeh?.documents?.length ?? 0,
      plotViews: all.filter((el) => el.classList?.contains("bk-Canvas") && visible(el)).length,
      canvases: canvases.length,
      paintedCanvases: painted.length,
      tableRows: all.filter((el) => el.classList?.contains("slick-row") && visible(el)).length,
    };
  });
}

/** What `rendered` reads, once two readings STEADY_MS apart agree (Bokeh has drawn). */
async function steady(page) {
  let last = await rendered(page);
  for (const deadline = Date.now() + RENDER_TIMEOUT_MS; Date.now() < deadline; ) {
    await new Promise((r) => setTimeout(r, STEADY_MS));
    const now = await rendered(page);
    if (JSON.stringify(now) === JSON.stringify(last)) return now;
    last = now;
  }
  return last;
}

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
  await page.waitForFunction(
    () => (window.Bokeh?.documents?.length ?? 0) > 0 && document.querySelector(".bk-Canvas, div.bk-Column") !== null,
    null,
    { timeout: RENDER_TIMEOUT_MS },
  ).catch(() => {});
  // Bokeh paints after layout; wait until some canvas has pixels (or give up and report zero).
  await page.waitForFunction(
    () => {
      const find = (root) => {
        for (const el of root.querySelectorAll("*")) {
          if (el.tagName === "CANVAS" && el.width && el.getContext("2d")) return true;
          if (el.shadowRoot && find(el.shadowRoot)) return true;
        }
        return false;
      };
      return find(document);
    },
    null,
    { timeout: RENDER_TIMEOUT_MS },
  ).catch(() => {});
  Object.assign(result, await steady(page));
  await page.screenshot({ path: plan.screenshot, fullPage: true });
  if (plan.selectRanks) {
    const select = page.locator("select").first();
    const values = await select.locator("option").evaluateAll((os) => os.map((o) => o.value));
    for (const value of values.reverse()) {
      await select.selectOption(value);
      const now = await steady(page);
      const heading = await page.evaluate(() => {
        const texts = [];
        const walk = (root) => {
          for (const el of root.querySelectorAll("h2")) {
            if (el.getClientRects().length > 0) texts.push(el.textContent);
          }
          for (const el of root.querySelectorAll("*")) if (el.shadowRoot) walk(el.shadowRoot);
        };
        walk(document);
        return texts;
      });
      result.ranks.push({ value, headings: heading, ...now });
    }
    await page.screenshot({ path: plan.screenshot.replace(/\.png$/, "-rank.png"), fullPage: true });
  }
} catch (e) {
  result.error = String(e?.stack ?? e);
} finally {
  await browser.close();
  await writeFile(plan.result, JSON.stringify(result, null, 2));
}
