// The module tracer's phase spans on the live chart and its modules in a cell's details, in a
// real JupyterLab (plan.theme: light or dark): runs the notebook's cells one by one, looks at the
// running training cell's spans while it runs (plan.liveCell), then at the finished one's
// (plan.detailsCell): each drawn span (phase, position, tooltip), the details' module tree with
// its figures, and a screenshot of each (the chart zoomed to the cell; the details). The last
// cell prints the kernel's own notes, the truth the test compares with. It asserts nothing:
// test_phase_spans_e2e.py does.
//
// Usage: node drive_phase_spans.mjs PLAN.json

import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { measureContrast } from "./browser.mjs";
import { cellDone, cellOutput, drive, openNotebook, runCell, selectCell, settled, startCell, tooltipGone } from "./lab_page.mjs";

const SEL = {
  widget: ".gpumem-widget",
  chart: ".gpumem-widget .gpumem-chart",
  ledgerRow: ".gpumem-widget tr[data-execution-count]",
  band: ".gpumem-widget .gpumem-band[data-execution-count]",
  phase: ".gpumem-widget .gpumem-phase:not([hidden])",
  legend: ".gpumem-widget .gpumem-phase-legend",
  tooltip: ".gpumem-widget .gpumem-tooltip",
  details: ".gpumem-widget .gpumem-details",
};

const plan = JSON.parse(await readFile(process.argv[2], "utf8"));
const result = { blocked: [], pageErrors: [], truth: null, live: null, spans: null, band: null, tooltips: [], legend: null, modules: null, details: null, contrast: [], screenshots: [], error: null };

const drawn = ({ sel, n }) =>
  [...document.querySelectorAll(sel)]
    .filter((e) => n === null || e.dataset.cell === String(n))
    .map((e) => {
      const r = e.getBoundingClientRect();
      return { cell: Number(e.dataset.cell), phase: e.dataset.phase, open: e.dataset.open === "true", merged: Number(e.dataset.merged), left: r.left, right: r.right, index: Number(e.dataset.index) };
    });

await drive(plan, result, { failureShot: `phases-${plan.theme}-failure.png` }, async (page) => {
  const count = plan.cells.length;
  await openNotebook(page, plan, count);
  for (let i = 0; i < count - 1; i++) {
    await startCell(page, i, count);
    if (i === plan.liveCell) {
      // While it runs: the running band, and under it the spans so far (the last one open).
      await page.waitForSelector(".gpumem-widget .gpumem-band[data-running]:not([hidden])");
      await page.waitForFunction((sel) => document.querySelectorAll(sel).length >= 3, SEL.phase);
      const running = await page.locator(".gpumem-widget .gpumem-band[data-running]").getAttribute("data-execution-count");
      result.live = { running: Number(running), spans: await page.evaluate(drawn, { sel: SEL.phase, n: null }) };
    }
    await cellDone(page, i);
  }

  // The training cell: its row selected (the chart zooms to its band), its spans and details.
  const n = plan.detailsCell;
  await page.waitForSelector(`${SEL.ledgerRow}[data-execution-count="${n}"]`);
  await page.locator(`${SEL.ledgerRow}[data-execution-count="${n}"]`).click();
  await page.locator(`${SEL.details}[data-execution-count="${n}"]`).waitFor({ state: "visible" });
  await page.mouse.move(0, 0);
  await settled(page, `${SEL.chart}, ${SEL.band}, ${SEL.phase}`); // the zoom drawn
  result.spans = await page.evaluate(drawn, { sel: SEL.phase, n });
  result.band = await page.evaluate((sel) => {
    const r = document.querySelector(sel).getBoundingClientRect();
    return { left: r.left, right: r.right };
  }, `${SEL.band}[data-execution-count="${n}"]`);
  result.legend = await page.evaluate((sel) => [...document.querySelectorAll(`${sel} .gpumem-legend-item:not([hidden])`)].map((e) => e.innerText.trim()), SEL.legend);
  const spanEls = page.locator(`${SEL.phase}[data-cell="${n}"]`);
  for (let i = 0; i < (await spanEls.count()); i++) {
    await spanEls.nth(i).hover();
    await page.locator(SEL.tooltip).waitFor({ state: "visible" });
    result.tooltips.push(await page.locator(SEL.tooltip).innerText());
  }
  await page.mouse.move(0, 0);
  await tooltipGone(page);
  result.modules = await page.evaluate((sel) =>
    [...document.querySelectorAll(`${sel} tr[data-module]`)].map((tr) => ({
      path: tr.dataset.module,
      name: tr.querySelector("th").innerText.trim(),
      figures: Object.fromEntries([...tr.querySelectorAll("td")].map((td) => [td.dataset.column, { bytes: Number(td.dataset.bytes), text: td.innerText.trim() }])),
    })), SEL.details);
  result.details = await page.locator(SEL.details).innerText();
  for (const f of await measureContrast(page)) result.contrast.push({ ...f, where: plan.theme });
  const chartShot = join(plan.artifacts, `phases-${plan.theme}.png`);
  await page.locator(".gpumem-widget .gpumem-chart").screenshot({ path: chartShot });
  const detailsShot = join(plan.artifacts, `modules-${plan.theme}.png`);
  await page.locator(SEL.details).screenshot({ path: detailsShot });
  result.screenshots.push(chartShot, detailsShot);

  const truthCell = count - 1;
  await selectCell(page, truthCell);
  await runCell(page, truthCell, count);
  result.truth = JSON.parse(await cellOutput(page, truthCell));
});
