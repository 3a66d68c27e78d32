// The Memory tab as a user sees it, in a real JupyterLab (plan.theme: its light or dark theme):
// runs the notebook's cells one by one, opens one cell's details from the ledger, hovers its
// band, and records what the widget shows (its texts, the ledger's rows, the details, the
// tooltip, the contrast of every text), the last cell's output (the kernel's own ledger, the
// truth the test compares with) and a screenshot of the widget. It asserts nothing:
// test_memory_tab.py does.
//
// Usage: node drive_memory_tab.mjs PLAN.json   (PLAN: see test_memory_tab.py)

import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { measureContrast } from "./browser.mjs";
import { cellOutput, drive, openNotebook, runCell, selectCell, settled, tooltipGone } from "./lab_page.mjs";

const SEL = {
  widget: ".gpumem-widget",
  chart: ".gpumem-widget .gpumem-chart",
  ledgerRow: ".gpumem-widget tr[data-execution-count]",
  ledgerHead: ".gpumem-widget thead th",
  band: ".gpumem-widget .gpumem-band[data-execution-count]",
  tooltip: ".gpumem-widget .gpumem-tooltip",
  details: ".gpumem-widget .gpumem-details",
  showAll: ".gpumem-widget button",
};

const plan = JSON.parse(await readFile(process.argv[2], "utf8"));
const result = { blocked: [], pageErrors: [], truth: null, shown: null, contrast: [], screenshot: null, error: null };

await drive(plan, result, { failureShot: `memory-${plan.theme}-failure.png` }, async (page) => {
  const n = plan.cells.length;
  await openNotebook(page, plan, n);
  // Every cell but the last, which prints the kernel's ledger (the truth) once the picture is
  // taken, so that its own row is not in it.
  let last = 0;
  for (let i = 0; i < n - 1; i++) last = await runCell(page, i, n);
  await page.waitForSelector(`${SEL.ledgerRow}[data-execution-count="${last}"]`);
  await page.waitForFunction(({ sel, n }) => document.querySelectorAll(`${sel}[data-execution-count="${n}"]`).length === 1, { sel: SEL.band, n: last });

  // One cell's details (selecting its row zooms the chart to it), then the whole session again.
  const chosen = plan.detailsCell;
  await page.locator(`${SEL.ledgerRow}[data-execution-count="${chosen}"]`).click();
  await page.locator(`${SEL.details}[data-execution-count="${chosen}"]`).waitFor({ state: "visible" });
  await page.locator(`${SEL.band}[data-execution-count="${chosen}"]`).hover();
  await page.locator(SEL.tooltip).waitFor({ state: "visible" });
  const tooltip = await page.locator(SEL.tooltip).innerText();
  await page.locator(SEL.showAll, { hasText: "Show all" }).click();
  await page.mouse.move(0, 0); // the tooltip off the picture
  await tooltipGone(page);
  await settled(page, `${SEL.chart}, ${SEL.band}`); // the whole session drawn

  result.shown = await page.evaluate((SEL) => {
    const text = (el) => (el ? el.innerText.trim() : null);
    const root = document.querySelector(SEL.widget);
    return {
      title: text(root.querySelector(".gpumem-title")),
      mode: text(root.querySelector(".gpumem-mode")),
      modeTooltip: root.querySelector(".gpumem-mode")?.title ?? null,
      legend: [...root.querySelectorAll(".gpumem-legend-title")].map(text),
      head: [...document.querySelectorAll(SEL.ledgerHead)].map((th) => ({ text: text(th), title: th.title })),
      rows: [...document.querySelectorAll(SEL.ledgerRow)].map((tr) => ({
        n: Number(tr.dataset.executionCount),
        cells: [...tr.children].map(text),
      })),
      details: text(root.querySelector(SEL.details)),
      all: root.innerText,
      // Anything cut off: a text wider than its box that does not scroll or wrap (a band too
      // narrow for its label hides it: transparent text is not shown, so not cut).
      clipped: [...root.querySelectorAll("*")]
        .filter((el) => {
          if (!el.getClientRects().length || el.scrollWidth <= el.clientWidth + 1) return false;
          if (![...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim())) return false; // text only
          const style = getComputedStyle(el);
          return style.overflowX === "hidden" && style.textOverflow !== "ellipsis" && style.color !== "rgba(0, 0, 0, 0)";
        })
        .map((el) => `${el.tagName.toLowerCase()}.${String(el.className).slice(0, 40)}: ${el.innerText.slice(0, 60)}`),
    };
  }, SEL);
  result.shown.tooltip = tooltip;
  for (const f of await measureContrast(page)) result.contrast.push({ ...f, where: plan.theme });
  result.screenshot = join(plan.artifacts, `memory-${plan.theme}.png`);
  await page.locator(SEL.widget).screenshot({ path: result.screenshot });
  const truthCell = n - 1;
  await selectCell(page, truthCell);
  await runCell(page, truthCell, n);
  result.truth = JSON.parse(await cellOutput(page, truthCell));
});
