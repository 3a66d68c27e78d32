// The module tracer's phase spans on the live chart and its modules in a cell's details, in a
// real JupyterLab (plan.theme: light or dark): runs the notebook's cells one by one, looks at the
// running training cell's spans while it runs (plan.liveCell), then at the finished one's
// (plan.detailsCell): each drawn span (phase, position, tooltip), the details' module tree with
// its figures, and a screenshot of each (the chart zoomed to the cell; the details). The last
// cell prints the kernel's own notes, the truth the test compares with. It asserts nothing:
// test_phase_spans_e2e.py does.
//
// Usage: node drive_phase_spans.mjs PLAN.json

import { readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { blockNonLocal, launchLab, measureContrast } from "./browser.mjs";

const SEL = {
  cell: ".jp-Notebook .jp-Cell",
  prompt: ".jp-InputPrompt",
  output: ".jp-OutputArea-output",
  kernelStatus: "#jp-main-statusbar .jp-StatusBar-TextItem",
  widget: ".gpumem-widget",
  ledgerRow: ".gpumem-widget tr[data-execution-count]",
  band: ".gpumem-widget .gpumem-band[data-execution-count]",
  phase: ".gpumem-widget .gpumem-phase:not([hidden])",
  legend: ".gpumem-widget .gpumem-phase-legend",
  tooltip: ".gpumem-widget .gpumem-tooltip",
  details: ".gpumem-widget .gpumem-details",
};

const plan = JSON.parse(await readFile(process.argv[2], "utf8"));
const result = { blocked: [], pageErrors: [], truth: null, live: null, spans: null, band: null, tooltips: [], legend: null, modules: null, details: null, contrast: [], screenshots: [], error: null };
const context = await launchLab(plan);

const drawn = ({ sel, n }) =>
  [...document.querySelectorAll(sel)]
    .filter((e) => n === null || e.dataset.cell === String(n))
    .map((e) => {
      const r = e.getBoundingClientRect();
      return { cell: Number(e.dataset.cell), phase: e.dataset.phase, open: e.dataset.open === "true", merged: Number(e.dataset.merged), left: r.left, right: r.right, index: Number(e.dataset.index) };
    });

try {
  await blockNonLocal(context, result.blocked);
  const page = context.pages()[0] ?? (await context.newPage());
  page.on("pageerror", (e) => result.pageErrors.push(`${e.name}: ${e.message}`));
  await page.goto(`${plan.url}/lab/tree/${plan.notebook}?token=${plan.token}`);
  await page.waitForFunction(({ sel, n }) => document.querySelectorAll(sel).length === n, { sel: SEL.cell, n: plan.cells.length });
  await page.waitForFunction(
    (sel) => [...document.querySelectorAll(sel)].some((e) => /\|\s*Idle$/.test(e.textContent.trim())),
    SEL.kernelStatus,
  );
  const cells = page.locator(SEL.cell);
  await cells.nth(0).locator(SEL.prompt).click();
  await page.keyboard.press("Escape");
  const finished = async (i) => {
    await page.waitForFunction(
      ({ sel, prompt, i }) => /^\[\d+\]:$/.test(document.querySelectorAll(sel)[i]?.querySelector(prompt)?.textContent.trim() ?? ""),
      { sel: SEL.cell, prompt: SEL.prompt, i },
    );
    return Number((await cells.nth(i).locator(SEL.prompt).innerText()).match(/\d+/)[0]);
  };
  for (let i = 0; i < plan.cells.length - 1; i++) {
    await page.keyboard.press("Shift+Enter");
    if (i === plan.liveCell) {
      // While it runs: the running band, and under it the spans so far (the last one open).
      await page.waitForSelector(".gpumem-widget .gpumem-band[data-running]:not([hidden])");
      await page.waitForFunction((sel) => document.querySelectorAll(sel).length >= 3, SEL.phase);
      const running = await page.locator(".gpumem-widget .gpumem-band[data-running]").getAttribute("data-execution-count");
      result.live = { running: Number(running), spans: await page.evaluate(drawn, { sel: SEL.phase, n: null }) };
    }
    await finished(i);
  }

  // The training cell: its row selected (the chart zooms to its band), its spans and details.
  const n = plan.detailsCell;
  await page.waitForSelector(`${SEL.ledgerRow}[data-execution-count="${n}"]`);
  await page.locator(`${SEL.ledgerRow}[data-execution-count="${n}"]`).click();
  await page.locator(`${SEL.details}[data-execution-count="${n}"]`).waitFor({ state: "visible" });
  await page.mouse.move(0, 0);
  await page.waitForTimeout(800); // the zoom drawn
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
  await page.waitForTimeout(300);
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

  const truthCell = plan.cells.length - 1;
  await cells.nth(truthCell).locator(SEL.prompt).click();
  await page.keyboard.press("Escape");
  await page.keyboard.press("Shift+Enter");
  await finished(truthCell);
  result.truth = JSON.parse(await cells.nth(truthCell).locator(SEL.output).innerText());
} catch (e) {
  result.error = String(e?.stack ?? e);
  const page = context.pages()[0];
  if (page) await page.screenshot({ path: join(plan.artifacts, `phases-${plan.theme}-failure.png`), fullPage: true }).catch(() => {});
} finally {
  await writeFile(plan.result, JSON.stringify(result, null, 1));
  await context.close();
}
