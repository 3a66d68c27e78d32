// Drives a running JupyterLab or Jupyter Notebook 7 (plan.app: "lab" or "notebook") in Debian's
// Chromium: opens the notebook, runs its cells one by one with Shift+Enter, and records what the
// page shows (the widget's DOM, requests, dialogs, errors). Notebook 7 is made of JupyterLab's
// components, so the cells, prompts and outputs are the same DOM; only the URL and how to tell
// that the kernel is ready differ. It asserts nothing itself: test_lab_e2e.py reads the JSON it
// writes and decides.
//
// Usage: node drive_lab.mjs PLAN.json   (PLAN: see test_lab_e2e.py, `plan`)

import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { LAB, cellDone, drive, kernelIdle, selectCell, startCell, waitPrompt } from "./lab_page.mjs";

// Everything this script knows about the widget's DOM, in one place (the notebook's: LAB).
const SEL = {
  // gpumem_widget's DOM contract
  widget: ".gpumem-widget",
  chart: ".gpumem-widget .gpumem-chart",
  chartCanvas: ".gpumem-widget .gpumem-chart canvas",
  samplesAttr: "data-samples", // on .gpumem-chart: how many samples the last draw used
  drawnUntilAttr: "data-drawn-until", // on .gpumem-chart: unix seconds of the newest drawn sample
  ledgerRow: ".gpumem-widget tr[data-execution-count]",
  ledgerSource: ".gpumem-col-source", // inside a ledger row
  band: ".gpumem-widget .gpumem-band[data-execution-count]",
  tooltip: ".gpumem-widget .gpumem-tooltip",
  details: ".gpumem-widget .gpumem-details",
};
const POLL_MS = 200;
// The kernel pushes a ledger update within a quarter second of a cell's end.
const ROW_TIMEOUT_MS = 15000;

const plan = JSON.parse(await readFile(process.argv[2], "utf8"));
// Per front end: how its own errors are told from ours. Notebook 7 (7.6.5 here) raises a
// TypeError of its own ("reading 'schema'") while the page loads, before any cell runs, every
// frame in its notebook_core bundle: kept apart from ours.
const OWN_BUNDLE = { lab: null, notebook: /\/static\/notebook\/notebook_core\./ }[plan.app];
const started = Date.now();
const result = {
  steps: {}, // step name -> seconds since start
  blocked: [], // non-local requests the page attempted
  localXssFetches: [], // local requests for the payload's src (only an injected <img> makes one)
  dialogs: [],
  pageErrors: [],
  appErrors: [], // the front end's own page errors (see APP)
  consoleErrors: [],
  firstSampleAfterLoadS: null, // from `%load_ext` returning to the chart's first drawn sample
  prompts: [], // execution prompts after each cell, e.g. "[1]:"
  afterLoad: null,
  during: [], // polls while the long cell runs
  final: null,
  screenshots: [],
  error: null,
  widgetTextAtFailure: null,
};
const step = (name) => {
  result.steps[name] = (Date.now() - started) / 1000;
};

async function shoot(page, name) {
  const path = join(plan.artifacts, name);
  await page.screenshot({ path, fullPage: true });
  result.screenshots.push(path);
}

/** A page error from the front end's own bundle, kept apart in `appErrors`. */
function appError(e) {
  const frames = (e.stack ?? "").split("\n").filter((l) => l.includes("://"));
  const own = OWN_BUNDLE !== null && frames.length > 0 && frames.every((l) => OWN_BUNDLE.test(l));
  if (own) result.appErrors.push(`${e.name}: ${e.message}`);
  return own;
}

async function widgetText(page) {
  result.widgetTextAtFailure = await page
    .locator(SEL.widget)
    .first()
    .innerText({ timeout: 2000 })
    .catch((err) => `(no widget text: ${err.message.split("\n")[0]})`);
}

const onLocal = (url) => {
  if (new URL(url).pathname.endsWith(`/${plan.xssSrc}`)) result.localXssFetches.push(url);
};
await drive(plan, result, { failureShot: `${plan.app}-failure.png`, onLocal, onPageError: appError, onFailure: widgetText }, async (page) => {
  page.on("console", (m) => {
    if (m.type() === "error") result.consoleErrors.push(m.text());
  });
  page.on("dialog", (d) => {
    result.dialogs.push(`${d.type()}: ${d.message()}`);
    void d.dismiss();
  });

  await page.goto(plan.page);
  // Probes: one request and one dialog that the recorders must catch (so an empty list means
  // something, not a listener that never fired).
  await page.evaluate((url) => fetch(url).catch(() => null), plan.probeUrl);
  await page.evaluate((text) => window.alert(text), plan.probeDialog);
  await page.waitForFunction(
    ({ sel, n }) => document.querySelectorAll(sel).length === n,
    { sel: LAB.cell, n: plan.cells.length },
  );
  await kernelIdle(page, plan);
  step("notebook open");

  const promptOf = (i) => page.locator(LAB.cell).nth(i).locator(LAB.prompt).innerText();
  const countOf = async (i) => Number((await promptOf(i)).match(/\d+/)[0]);
  await selectCell(page, 0);

  const long = plan.cells.length - 1; // the long cell comes last
  for (let i = 0; i < long; i++) {
    await startCell(page, i, plan.cells.length);
    await cellDone(page, i);
    result.prompts.push(await promptOf(i));
    if (i === 0) {
      const loaded = Date.now(); // `%load_ext` has returned (its prompt shows its number)
      await page.waitForFunction(
        ({ sel, attr }) => Number(document.querySelector(sel)?.getAttribute(attr) ?? 0) >= 1,
        { sel: SEL.chart, attr: SEL.samplesAttr },
      );
      result.firstSampleAfterLoadS = (Date.now() - loaded) / 1000;
      await page.waitForSelector(SEL.widget, { state: "visible" });
      await page.waitForSelector(SEL.chartCanvas, { state: "attached" });
      result.afterLoad = {
        widgetVisible: await page.locator(SEL.widget).isVisible(),
        widgets: await page.locator(SEL.widget).count(),
        canvases: await page.locator(SEL.chartCanvas).count(),
      };
    }
    step(`cell ${i} done`);
  }
  // The rows of the cells run so far, before the long cell starts (ledger updates are pushed).
  const previous = await Promise.all(plan.cells.slice(1, long).map((_, k) => countOf(k + 1)));
  for (const n of previous) {
    await page.waitForSelector(`${SEL.ledgerRow}[data-execution-count="${n}"]`, { timeout: ROW_TIMEOUT_MS });
  }

  const snapshot = () =>
    page.evaluate(
      ({ SEL, LAB, i }) => {
        const chart = document.querySelector(SEL.chart);
        const prompt = document.querySelectorAll(LAB.cell)[i].querySelector(LAB.prompt);
        const counts = (sel, visibleOnly) =>
          [...document.querySelectorAll(sel)]
            .filter((e) => !visibleOnly || (!e.hidden && e.getClientRects().length > 0))
            .map((e) => Number(e.getAttribute("data-execution-count")));
        return {
          now: Date.now() / 1000,
          prompt: prompt.textContent.trim(),
          samples: Number(chart?.getAttribute(SEL.samplesAttr) ?? NaN),
          drawnUntil: Number(chart?.getAttribute(SEL.drawnUntilAttr) || NaN),
          rows: counts(SEL.ledgerRow, false),
          bands: counts(SEL.band, false),
          visibleBands: counts(SEL.band, true),
          widgetVisible: !!document.querySelector(SEL.widget)?.getClientRects().length,
        };
      },
      { SEL, LAB, i: long },
    );

  await startCell(page, long, plan.cells.length);
  await waitPrompt(page, long, "^\\[\\*\\]:$");
  step("long cell running");
  let shotTaken = false;
  for (;;) {
    const s = await snapshot();
    result.during.push(s);
    if (s.prompt !== "[*]:") break;
    if (!shotTaken && s.now - result.during[0].now > plan.longSeconds / 2) {
      await shoot(page, `${plan.app}-running.png`);
      shotTaken = true;
    }
    await page.waitForTimeout(POLL_MS);
  }
  step("long cell done");
  result.prompts.push(await promptOf(long));

  const recorded = await Promise.all(plan.cells.slice(1).map((_, k) => countOf(k + 1)));
  const lastRow = `${SEL.ledgerRow}[data-execution-count="${recorded.at(-1)}"]`;
  await page.waitForSelector(lastRow, { timeout: ROW_TIMEOUT_MS });
  // The running cell's band hands over to its record's when the idle status arrives (it can
  // trail the record by one update): wait for one band per cell before reading them.
  await page.waitForFunction(
    ({ sel, n }) => document.querySelectorAll(`${sel}[data-execution-count="${n}"]`).length === 1,
    { sel: SEL.band, n: recorded.at(-1) },
    { timeout: ROW_TIMEOUT_MS },
  );
  // Rows and bands now, while the chart follows live: selecting a row below zooms it to that
  // cell, and only the bands in view are in the DOM.
  const afterAll = await snapshot();

  // The payload cell: its source must show as text in the ledger, the tooltip and the details.
  const xssCount = recorded[plan.xssCell - 1];
  const xssRow = page.locator(`${SEL.ledgerRow}[data-execution-count="${xssCount}"]`);
  const xssBand = page.locator(`${SEL.band}[data-execution-count="${xssCount}"]`);
  // Selecting the row opens its details and zooms the chart to the cell, so its band is in view.
  await xssRow.click();
  const details = page.locator(`${SEL.details}[data-execution-count="${xssCount}"]`);
  await details.waitFor({ state: "visible" });
  await xssBand.hover();
  const tooltip = page.locator(SEL.tooltip);
  await tooltip.waitFor({ state: "visible" });
  step("payload cell inspected");
  result.final = {
    ...afterAll,
    canvases: await page.locator(SEL.chartCanvas).count(),
    recorded,
    xss: {
      executionCount: xssCount,
      rowText: await xssRow.locator(SEL.ledgerSource).innerText(),
      rowTitle: await xssRow.locator(SEL.ledgerSource).getAttribute("title"),
      tooltipText: await tooltip.innerText(),
      detailsText: await details.innerText(),
      injectedImages: await page.locator(`img[src="${plan.xssSrc}"]`).count(),
    },
  };
  await shoot(page, `${plan.app}-final.png`);
  step("done");
});
