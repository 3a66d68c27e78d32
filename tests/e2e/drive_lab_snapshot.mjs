// The Snapshot tab as a user sees it, in a real JupyterLab (plan.theme: its light or dark theme):
// runs the notebook's cells (the extension, then `show_snapshot` of a real H200 training
// snapshot), opens the Snapshot tab, waits for the whole view (overview, what is alive at the
// peak, its segment map), and records the chart's axis (its top, the highest value drawn), the
// labels' boxes, the texts, and a screenshot of the widget at full zoom; then drags across a
// stretch of the plot and records and pictures the zoomed view. It asserts nothing:
// test_lab_snapshot.py does.
//
// Usage: node drive_lab_snapshot.mjs PLAN.json   (PLAN: see test_lab_snapshot.py)

import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { drive, openNotebook, runCell, settled } from "./lab_page.mjs";

const SEL = {
  widget: ".gpumem-widget",
  body: ".gpumem-widget .gpumem-drilldown-body",
  snapshotTab: '.gpumem-widget nav.gpumem-tabs button[data-tab="snapshot"]',
  chart: ".gpumem-widget .gpumem-drilldown-chart",
  canvas: ".gpumem-widget .gpumem-drilldown-chart canvas",
  aliveHeading: ".gpumem-widget .gpumem-drilldown-alive-heading",
  segmentsButton: '.gpumem-widget .gpumem-drilldown-subtabs button[data-tab="segments"]',
  labels: ".gpumem-drilldown-peak, .gpumem-drilldown-reserved-peak, .gpumem-drilldown-oom",
};

const plan = JSON.parse(await readFile(process.argv[2], "utf8"));
const result = { blocked: [], pageErrors: [], views: {}, screenshots: [], error: null };

/** The chart as drawn now: its axis, the highest value drawn, its range, the labels' boxes. */
const chartState = (page) =>
  page.evaluate((SEL) => {
    const chart = document.querySelector(SEL.chart);
    const c = chart.querySelector("canvas").getBoundingClientRect();
    const labels = [...document.querySelectorAll(SEL.labels)].map((e) => {
      const b = e.getBoundingClientRect();
      return { cls: e.className, text: e.textContent, left: b.left - c.left, top: b.top - c.top, right: b.right - c.left, bottom: b.bottom - c.top };
    });
    const heading = document.querySelector(SEL.aliveHeading);
    return {
      yMax: Number(chart.dataset.yMax),
      drawnMax: Number(chart.dataset.drawnMax),
      range: chart.dataset.range.split(",").map(Number),
      columns: Number(chart.dataset.columns),
      labels,
      alive: heading ? { text: heading.textContent, total: Number(heading.dataset.totalBytes) } : null,
      text: document.querySelector(SEL.widget).innerText,
    };
  }, SEL);

await drive(plan, result, { failureShot: `lab-snapshot-${plan.theme}-failure.png` }, async (page) => {
  const n = plan.cells.length;
  await openNotebook(page, plan, n);
  for (let i = 0; i < n; i++) await runCell(page, i, n, 120000);
  await page.locator(SEL.snapshotTab).first().click();
  // The whole view: the chart, what is alive at the peak, and its segment map (enabled).
  await page.waitForSelector(SEL.aliveHeading, { timeout: 60000 });
  await page.waitForFunction((sel) => document.querySelector(sel)?.disabled === false, SEL.segmentsButton, { timeout: 60000 });
  await page.mouse.move(0, 0);
  await settled(page, SEL.chart);
  const widget = page.locator(SEL.widget).first();
  // The widget as far as the page shows it (its lower rows run on below the window).
  const picture = async (path) => {
    const b = await widget.boundingBox();
    const bottom = Math.min(b.y + b.height, page.viewportSize().height - 40);
    await page.screenshot({ path, clip: { x: b.x, y: b.y, width: b.width, height: bottom - b.y } });
    result.screenshots.push(path);
  };
  result.views.full = await chartState(page);
  await picture(join(plan.artifacts, `lab-snapshot-full-${plan.theme}.png`));

  // Zoomed in: a drag over a twentieth of the plot, a third of the way in.
  const box = await page.locator(SEL.canvas).first().boundingBox();
  const plotLeft = 64, plotW = box.width - 64 - 12; // drilldown_chart.ts PAD
  const from = plotLeft + plotW / 3, to = from + plotW / 20, y = box.y + box.height / 2;
  const before = result.views.full.range.join(",");
  await page.mouse.move(box.x + from, y);
  await page.mouse.down();
  await page.mouse.move(box.x + (from + to) / 2, y, { steps: 4 });
  await page.mouse.move(box.x + to, y, { steps: 4 });
  await page.mouse.up();
  await page.waitForFunction(({ sel, before }) => document.querySelector(sel)?.dataset.range !== before, { sel: SEL.chart, before });
  // The kernel's re-aggregated answer (no request pending) replaces the stretched columns.
  await page.waitForFunction((sel) => document.querySelector(sel)?.dataset.pending === undefined, SEL.body);
  await page.mouse.move(0, 0);
  await settled(page, SEL.chart);
  result.views.zoomed = await chartState(page);
  await picture(join(plan.artifacts, `lab-snapshot-zoom-${plan.theme}.png`));
});
