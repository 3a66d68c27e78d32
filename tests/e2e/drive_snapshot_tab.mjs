// Draws the Snapshot tab for recorded snapshots in Debian's Chromium, against the real kernel
// code behind snapshot_bridge.py, and records what a user sees: the axis, the tallest drawn
// column in pixels, what a click on it answers, the legend's per-site maxima, OOM labels,
// warnings, and the contrast of every text and button in light and dark themes; screenshots.
// It asserts nothing: test_snapshot_tab.py does.
//
// Usage: node drive_snapshot_tab.mjs PLAN.json
//   PLAN: {url, browser, artifacts, result, scenarios: [name], shots: [{scenario, action, name}]}
//   (browser: the endpoint of the run's Chromium, from browser_server.mjs)

import { readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { chromium } from "playwright-core";
import { isLocal, measureContrast } from "./browser.mjs";

const plan = JSON.parse(await readFile(process.argv[2], "utf8"));
const result = { blocked: [], pageErrors: [], scenarios: {}, replays: {}, narrow: {}, columns: {}, contrast: [], shots: [], error: null };
const TIMEOUT = 30000;
const SERIES = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#86bcb6", "#d37295", "#a0cbe8", "#bab0ac"];

async function settle(page) {
  await page.waitForFunction(() => window.snap.idle(), null, { timeout: TIMEOUT });
  await page.evaluate(() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r))));
}

async function mount(page, scenario, theme) {
  await page.evaluate(([s, t]) => window.snap.mount(s, t), [scenario, theme]);
  await page.waitForSelector(".gpumem-drilldown-chart[data-y-max]", { timeout: TIMEOUT });
  await page.waitForSelector(".gpumem-drilldown-alive-heading", { timeout: TIMEOUT });
  await settle(page);
}

/** The topmost pixel of the stacked series (opaque, one of the series colours or their lighter
 * rise to a column's peak) in the plot. */
async function tallest(page) {
  return page.evaluate((colors) => {
    const chart = document.querySelector(".gpumem-drilldown-chart");
    const canvas = chart.querySelector("canvas");
    const [left, top, w, h] = chart.dataset.plot.split(",").map(Number);
    const ratio = canvas.width / canvas.clientWidth;
    const img = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
    const rgb = [...colors, ...JSON.parse(chart.dataset.riseColors || "[]")].map((c) => [1, 3, 5].map((i) => parseInt(c.slice(i, i + 2), 16)));
    const isSeries = (x, y) => {
      const i = (y * canvas.width + x) * 4;
      if (img[i + 3] !== 255) return false;
      return rgb.some(([r, g, b]) => Math.abs(img[i] - r) <= 2 && Math.abs(img[i + 1] - g) <= 2 && Math.abs(img[i + 2] - b) <= 2);
    };
    let best = null;
    for (let x = Math.ceil(left * ratio); x < Math.floor((left + w) * ratio); x++) {
      for (let y = Math.floor(top * ratio); y < Math.ceil((top + h) * ratio); y++) {
        if (isSeries(x, y)) {
          if (!best || y < best.y) best = { x, y };
          break;
        }
      }
    }
    if (!best) return null;
    return { xCss: best.x / ratio, yCss: best.y / ratio, plot: { left, top, w, h }, yMax: Number(chart.dataset.yMax) };
  }, SERIES);
}

/** Every visible text and every enabled control in the widget: its contrast with what is behind. */
async function contrast(page, label) {
  const found = await measureContrast(page);
  for (const f of found) result.contrast.push({ ...f, where: label });
  return found.length;
}

async function facts(page) {
  return page.evaluate(() => {
    const chart = document.querySelector(".gpumem-drilldown-chart");
    const heading = document.querySelector(".gpumem-drilldown-alive-heading");
    return {
      yMax: Number(chart.dataset.yMax),
      drawnMax: Number(chart.dataset.drawnMax),
      axis: chart.dataset.axis,
      range: chart.dataset.range ?? null,
      legend: [...document.querySelectorAll(".gpumem-drilldown-body > .gpumem-drilldown-legend > .gpumem-drilldown-legend-item")].map((e) => ({ site: e.dataset.site ?? null, peak: Number(e.dataset.peakBytes), text: e.textContent })),
      ooms: [...document.querySelectorAll(".gpumem-drilldown-oom")].map((e) => e.textContent),
      idle: [...document.querySelectorAll(".gpumem-drilldown-idle")].map((e) => e.textContent),
      warnings: [...document.querySelectorAll(".gpumem-drilldown-warnings li")].map((e) => e.textContent),
      summary: document.querySelector(".gpumem-drilldown-summary").textContent,
      reading: document.querySelector(".gpumem-drilldown-reading:not([hidden])")?.textContent ?? null,
      moduleRows: [...document.querySelectorAll(".gpumem-drilldown-modules:not([hidden]) tr[data-module]")].map((r) => ({ module: r.dataset.module, bytes: Number(r.dataset.bytes), depth: Number(r.dataset.depth) })),
      alive: { text: heading.textContent, total: Number(heading.dataset.totalBytes), event: Number(heading.dataset.event) },
    };
  });
}

/** The peak, reserved and OOM labels' boxes (CSS px, relative to the canvas), and for each how
 * many pixels of the data (a series colour, or the reserved line's) lie under it. */
async function labelBoxes(page) {
  return page.evaluate((colors) => {
    const chart = document.querySelector(".gpumem-drilldown-chart");
    const canvas = chart.querySelector("canvas");
    const c = canvas.getBoundingClientRect();
    const ratio = canvas.width / canvas.clientWidth;
    const img = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
    const reserved = getComputedStyle(chart).getPropertyValue("--gpumem-reserved").trim();
    const rgb = [...colors, reserved].filter((h) => /^#[0-9a-f]{6}$/i.test(h)).map((h) => [1, 3, 5].map((i) => parseInt(h.slice(i, i + 2), 16)));
    const isData = (x, y) => {
      const i = (y * canvas.width + x) * 4;
      return img[i + 3] === 255 && rgb.some(([r, g, b]) => Math.abs(img[i] - r) <= 2 && Math.abs(img[i + 1] - g) <= 2 && Math.abs(img[i + 2] - b) <= 2);
    };
    return [...document.querySelectorAll(".gpumem-drilldown-peak, .gpumem-drilldown-reserved-peak, .gpumem-drilldown-oom")].map((e) => {
      const b = e.getBoundingClientRect();
      const box = { left: b.left - c.left, top: b.top - c.top, right: b.right - c.left, bottom: b.bottom - c.top };
      let covered = 0;
      for (let x = Math.max(0, Math.floor(box.left * ratio)); x < Math.min(canvas.width, Math.ceil(box.right * ratio)); x++)
        for (let y = Math.max(0, Math.floor(box.top * ratio)); y < Math.min(canvas.height, Math.ceil(box.bottom * ratio)); y++) if (isData(x, y)) covered++;
      return { cls: e.className, text: e.textContent, ...box, covered };
    });
  }, SERIES);
}

/** At the stage's current width: how many lines each figure takes (sizes, counts, ranges: one),
 * and which names are cut rather than wrapped. */
async function narrow(page) {
  return page.evaluate(() => {
    const lines = (e) => {
      const range = document.createRange();
      range.selectNodeContents(e);
      return new Set([...range.getClientRects()].filter((r) => r.width > 0).map((r) => Math.round(r.top))).size;
    };
    const shown = (e) => e.getClientRects().length > 0;
    const FIGURES = ".gpumem-drilldown .gpumem-figure, .gpumem-drilldown-bytes, .gpumem-alive-bytes, .gpumem-alive-count";
    const figures = [...document.querySelectorAll(FIGURES)].filter(shown).map((e) => ({ text: e.textContent, lines: lines(e) }));
    const NAMES = ".gpumem-drilldown-label, .gpumem-alive-label";
    const cut = [...document.querySelectorAll(NAMES)].filter(shown).filter((e) => e.scrollWidth > e.clientWidth + 1).map((e) => e.textContent);
    const wrapped = [...document.querySelectorAll(NAMES)].filter(shown).filter((e) => lines(e) > 1).map((e) => e.textContent);
    return { width: document.querySelector(".gpumem-widget").getBoundingClientRect().width, figures, cut, wrapped };
  });
}

/** Per pixel column of the plot: the topmost pixel of the stack (the first opaque one that is
 * not the reserved line: only the stack is opaque on the transparent canvas, and an edge pixel
 * the stack covers in part is not) and the topmost of its solid floor (nearer a series colour
 * than a lighter rise colour), in CSS px. */
async function columnEdges(page) {
  return page.evaluate((colors) => {
    const chart = document.querySelector(".gpumem-drilldown-chart");
    const canvas = chart.querySelector("canvas");
    const [left, top, w, h] = chart.dataset.plot.split(",").map(Number);
    const ratio = canvas.width / canvas.clientWidth;
    const img = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
    const hex = (list) => list.map((c) => [1, 3, 5].map((i) => parseInt(c.slice(i, i + 2), 16)));
    const solid = hex(colors);
    const reserved = hex([getComputedStyle(chart).getPropertyValue("--gpumem-reserved").trim()].filter((c) => /^#[0-9a-f]{6}$/i.test(c)));
    const rise = hex(JSON.parse(chart.dataset.riseColors || "[]"));
    // A solid series, or two meeting in a pixel, is nearer a solid colour than any lighter one.
    const nearestIsSolid = (x, y) => {
      const i = (y * canvas.width + x) * 4;
      const d = (set) => Math.min(...set.map(([r, g, b]) => Math.abs(img[i] - r) + Math.abs(img[i + 1] - g) + Math.abs(img[i + 2] - b)));
      return d(solid) < d(rise);
    };
    const opaque = (x, y) => img[(y * canvas.width + x) * 4 + 3] === 255 && !is(reserved, x, y);
    const is = (set, x, y) => {
      const i = (y * canvas.width + x) * 4;
      return img[i + 3] === 255 && set.some(([r, g, b]) => Math.abs(img[i] - r) <= 2 && Math.abs(img[i + 1] - g) <= 2 && Math.abs(img[i + 2] - b) <= 2);
    };
    const columns = [];
    for (let px = Math.ceil(left); px < Math.floor(left + w); px++) {
      const x = Math.round((px + 0.5) * ratio - 0.5);
      let ceil = null;
      let floor = null;
      for (let y = Math.floor(top * ratio); y < Math.ceil((top + h) * ratio); y++) {
        if (ceil === null && opaque(x, y)) ceil = y / ratio;
        if (floor === null && opaque(x, y) && nearestIsSolid(x, y)) floor = y / ratio;
        if (ceil !== null && floor !== null) break;
      }
      columns.push({ px, ceil, floor });
    }
    return {
      plot: { left, top, w, h },
      yMax: Number(chart.dataset.yMax),
      range: chart.dataset.range.split(",").map(Number),
      columns: Number(chart.dataset.columns),
      lines: (chart.dataset.lines || "").split(",").filter(Boolean).map(Number),
      ranged: JSON.parse(chart.dataset.riseColors || "[]").length > 0,
      edges: columns,
    };
  }, SERIES);
}

/** Drag across the whole plot: the kernel answers the whole trace at one column per pixel. */
async function fullZoom(page) {
  const box = await page.locator(".gpumem-drilldown-chart canvas").boundingBox();
  const y = box.y + 60;
  await page.mouse.move(box.x + 2, y);
  await page.mouse.down();
  await page.mouse.move(box.x + box.width / 2, y, { steps: 4 });
  await page.mouse.move(box.x + box.width - 2, y, { steps: 4 });
  await page.mouse.up();
  await page.waitForFunction(() => document.querySelector(".gpumem-drilldown-body").dataset.pending === undefined, null, { timeout: TIMEOUT });
  await settle(page);
}

async function heading(page) {
  return page.evaluate(() => {
    const h = document.querySelector(".gpumem-drilldown-alive-heading");
    return { text: h.textContent, total: Number(h.dataset.totalBytes), event: Number(h.dataset.event) };
  });
}

const actions = {
  async overview() {},
  async modules(page) {
    await page.click(".gpumem-drilldown-mode[data-mode='modules']");
    await page.click(".gpumem-drilldown-subtabs [data-tab='modules']");
    await settle(page);
    const rows = () => page.evaluate(() => [...document.querySelectorAll(".gpumem-drilldown-modules:not([hidden]) tr[data-module]")].map((r) => ({ module: r.dataset.module, bytes: Number(r.dataset.bytes), depth: Number(r.dataset.depth) })));
    result.modulePeak = { heading: await heading(page), rows: await rows() };
    // A click on a column early in the second step: the module tree at that column's peak entry.
    const t = await tallest(page);
    const box = await page.locator(".gpumem-drilldown-chart canvas").boundingBox();
    const before = await heading(page);
    await page.mouse.click(box.x + t.plot.left + t.plot.w * 0.62, box.y + t.plot.top + t.plot.h - 3);
    await page.waitForFunction((e) => Number(document.querySelector(".gpumem-drilldown-alive-heading").dataset.event) !== e, before.event, { timeout: TIMEOUT });
    await settle(page);
    result.moduleClick = { heading: await heading(page), rows: await rows() };
  },
  async categories(page) {
    await page.click(".gpumem-drilldown-mode[data-mode='categories']");
    await settle(page);
  },
  async time(page) {
    await page.click(".gpumem-drilldown-axis[data-axis='time']");
    await page.waitForSelector(".gpumem-drilldown-chart[data-axis='time']", { timeout: TIMEOUT });
    await settle(page);
  },
  async zoom(page) {
    const t = await tallest(page);
    const box = await page.locator(".gpumem-drilldown-chart canvas").boundingBox();
    const y = box.y + t.plot.top + t.plot.h / 2;
    const from = Math.max(t.plot.left + 2, t.xCss - t.plot.w * 0.12);
    const to = Math.min(t.plot.left + t.plot.w - 2, t.xCss + t.plot.w * 0.12);
    const before = await page.evaluate(() => document.querySelector(".gpumem-drilldown-chart").dataset.range);
    await page.mouse.move(box.x + from, y);
    await page.mouse.down();
    await page.mouse.move(box.x + (from + to) / 2, y, { steps: 4 });
    await page.mouse.move(box.x + to, y, { steps: 4 });
    await page.mouse.up();
    await page.waitForFunction((b) => document.querySelector(".gpumem-drilldown-chart").dataset.range !== b && !document.querySelector(".gpumem-drilldown-body").dataset.pending, before, { timeout: TIMEOUT });
    await settle(page);
  },
  async search(page) {
    await page.fill(".gpumem-drilldown-query", plan.searchQuery);
    await page.click(".gpumem-drilldown-go");
    await page.waitForSelector(".gpumem-drilldown-search h4", { timeout: TIMEOUT });
    await settle(page);
  },
  async compare(page) {
    await page.waitForSelector(".gpumem-drilldown-compare:not([hidden]) canvas", { timeout: TIMEOUT });
    await settle(page);
  },
};

const browser = await chromium.connect(plan.browser);
try {
  const context = await browser.newContext({ viewport: { width: 1040, height: 1400 }, deviceScaleFactor: 1 });
  await context.route("**/*", (route) => {
    const url = route.request().url();
    if (!isLocal(url)) {
      result.blocked.push(url);
      return route.abort("blockedbyclient");
    }
    return route.continue();
  });
  const page = await context.newPage();
  page.setDefaultTimeout(TIMEOUT);
  page.on("pageerror", (e) => result.pageErrors.push(String(e)));
  await page.goto(`${plan.url}/tests/e2e/snapshot_tab.html`);
  await page.waitForFunction(() => "snap" in window);

  for (const scenario of plan.scenarios) {
    await mount(page, scenario, "light");
    const r = { facts: await facts(page), tallest: await tallest(page) };
    // Step one event back from the peak shown first, then click the tallest drawn column.
    const stepBack = page.locator(".gpumem-drilldown-step[data-step='-1']");
    if (await stepBack.isEnabled()) {
      const before = await heading(page);
      await stepBack.click();
      await page.waitForFunction((e) => Number(document.querySelector(".gpumem-drilldown-alive-heading").dataset.event) !== e, before.event);
      r.stepped = await heading(page);
    }
    r.peakMark = await page.evaluate(() => {
      const m = document.querySelector(".gpumem-drilldown-peak");
      return m ? { x: Number(m.dataset.x), bytes: Number(m.dataset.bytes), text: m.textContent } : null;
    });
    if (r.tallest && r.peakMark) {
      // The tallest column: the one the chart marks as the peak (several columns can look
      // equally tall to a pixel; the pixels checked above say the mark's height is the peak's).
      const box = await page.locator(".gpumem-drilldown-chart canvas").boundingBox();
      await page.mouse.click(box.x + r.peakMark.x, box.y + r.tallest.plot.top + r.tallest.plot.h - 3);
      await page.waitForFunction(() => document.querySelector(".gpumem-drilldown-alive-heading").textContent.startsWith("Peak within this column"), null, { timeout: TIMEOUT });
      r.clicked = await heading(page);
    }
    r.labels = await labelBoxes(page);
    result.scenarios[scenario] = r;
    for (const theme of ["light", "dark"]) {
      await mount(page, scenario, theme);
      await contrast(page, `${scenario} ${theme}`);
    }
  }

  // At full zoom, one column per pixel: each column's drawn floor and peak.
  for (const scenario of plan.columns ?? []) {
    await mount(page, scenario, "light");
    await fullZoom(page);
    // The stack alone: the reserved band and line (drawn under it, but blending with its top
    // edge where they meet) made transparent, then drawn again (a resize redraws the chart).
    await page.evaluate(async () => {
      document.querySelector(".gpumem-drilldown-chart").style.setProperty("--gpumem-reserved", "rgba(0, 0, 0, 0)");
      const frames = () => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
      const stage = document.getElementById("stage");
      stage.style.width = "1001px";
      await frames();
      stage.style.width = "";
      await frames();
    });
    result.columns[scenario] = await columnEdges(page);
  }

  // The real load's stages, replayed in order: what each left on screen.
  for (const scenario of plan.replay ?? []) {
    result.replays[scenario] = await page.evaluate(([s, t]) => window.snap.replay(s, t), [scenario, "light"]);
  }

  // At 700 px: figures on one line, names wrapped rather than cut.
  for (const scenario of plan.narrow ?? []) {
    await page.evaluate(() => (document.getElementById("stage").style.width = "700px"));
    await mount(page, scenario, "light");
    result.narrow[scenario] = await narrow(page);
    const box = await page.locator(".gpumem-widget").boundingBox();
    const path = join(plan.artifacts, `snapshot-${scenario}-700px-light.png`);
    await page.screenshot({ path, clip: { x: box.x, y: box.y, width: box.width, height: Math.min(box.height, 900) } });
    result.shots.push({ scenario, action: "narrow", name: "700px", theme: "light", path });
    await page.evaluate(() => (document.getElementById("stage").style.width = ""));
  }

  for (const shot of plan.shots) {
    for (const theme of ["light", "dark"]) {
      await mount(page, shot.scenario, theme);
      await actions[shot.action](page);
      const f = await facts(page);
      await contrast(page, `${shot.name} ${theme}`);
      const target = shot.action === "compare" ? ".gpumem-drilldown-compare" : ".gpumem-widget";
      const box = await page.locator(target).boundingBox();
      const path = join(plan.artifacts, `snapshot-${shot.name}-${theme}.png`);
      await page.screenshot({ path, clip: { x: box.x, y: box.y, width: box.width, height: Math.min(box.height, shot.height ?? 640) } });
      result.shots.push({ ...shot, theme, path, facts: f });
    }
  }
} catch (e) {
  result.error = String(e?.stack ?? e);
} finally {
  await browser.close();
  await writeFile(plan.result, JSON.stringify(result, null, 2));
}
