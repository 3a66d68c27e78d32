// Drives a running JupyterLab (widget state saving on) in Debian's Chromium: runs the notebook's
// cells, saves it with Ctrl+S, closes it, ends its kernel session through the REST API, reopens
// it with a fresh kernel and records what the widget shows then.
// It asserts nothing itself: test_saved_state.py reads the JSON it writes and decides.
//
// Usage: node drive_saved_state.mjs PLAN.json   (PLAN: see test_saved_state.py, `plan`)

import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { LAB, cellDone, drive, kernelIdle, openNotebook, startCell } from "./lab_page.mjs";

// The page's DOM, as in drive_lab.mjs.
const SEL = {
  dirtyTab: ".lm-TabBar-tab.jp-mod-dirty",
  widget: ".gpumem-widget",
  chartCanvas: ".gpumem-widget .gpumem-chart canvas",
  ledgerRow: ".gpumem-widget tr[data-execution-count]",
  // Finished cells' bands; the running-cell band (data-running) is not one of them.
  band: ".gpumem-widget .gpumem-band[data-execution-count]:not([data-running])",
  sampler: ".gpumem-widget .gpumem-sampler",
  // "Follow live", the chart's "live" word, a running cell.
  liveControls: ".gpumem-widget .gpumem-follow, .gpumem-widget .gpumem-hover-time, .gpumem-widget .gpumem-running",
};
const ROW_TIMEOUT_MS = 15000;

const plan = JSON.parse(await readFile(process.argv[2], "utf8"));
const started = Date.now();
const result = {
  steps: {},
  blocked: [],
  dialogs: [],
  pageErrors: [],
  prompts: [],
  live: null, // the widget while the kernel ran
  endedKernels: [], // kernel ids whose sessions the driver ended
  reopened: null, // the widget after reopening, with a fresh kernel
  screenshots: [],
  error: null,
};
const step = (name) => {
  result.steps[name] = (Date.now() - started) / 1000;
};

async function api(method, path) {
  const r = await fetch(`${plan.url}${path}`, {
    method,
    headers: { Authorization: `token ${plan.token}` },
  });
  if (!r.ok) throw new Error(`${method} ${path}: ${r.status}`);
  return r.status === 204 ? null : r.json();
}

async function shoot(page, name) {
  const path = join(plan.artifacts, name);
  await page.screenshot({ path, fullPage: true });
  result.screenshots.push(path);
}

const widgetView = (page) =>
  page.evaluate((SEL) => {
    const counts = (sel) =>
      [...document.querySelectorAll(sel)].map((e) => Number(e.getAttribute("data-execution-count")));
    return {
      widgets: document.querySelectorAll(SEL.widget).length,
      widgetVisible: !!document.querySelector(SEL.widget)?.getClientRects().length,
      canvases: document.querySelectorAll(SEL.chartCanvas).length,
      rows: counts(SEL.ledgerRow),
      bands: counts(SEL.band),
      // Who feeds it, as the header says, and whether any live control shows.
      session: document.querySelector(SEL.widget)?.dataset.session ?? null,
      sampler: document.querySelector(SEL.sampler)?.textContent ?? null,
      samplerState: document.querySelector(SEL.sampler)?.dataset.state ?? null,
      liveControls: [...document.querySelectorAll(SEL.liveControls)]
        .filter((e) => e.getClientRects().length > 0)
        .map((e) => e.textContent.trim()),
    };
  }, SEL);

await drive(plan, result, { failureShot: "saved-state-failure.png" }, async (page) => {
  page.on("dialog", (d) => {
    result.dialogs.push(`${d.type()}: ${d.message()}`);
    void d.dismiss();
  });
  const count = plan.cells.length;
  await openNotebook(page, plan, count);
  step("notebook open");
  for (let i = 0; i < count; i++) {
    await startCell(page, i, count);
    await cellDone(page, i);
    result.prompts.push(await page.locator(LAB.cell).nth(i).locator(LAB.prompt).innerText());
  }
  const recorded = result.prompts.slice(1).map((p) => Number(p.match(/\d+/)[0]));
  for (const n of recorded) {
    await page.waitForSelector(`${SEL.ledgerRow}[data-execution-count="${n}"]`, { timeout: ROW_TIMEOUT_MS });
  }
  result.live = await widgetView(page);
  step("cells ran");

  await page.keyboard.press("Control+s");
  await page.waitForFunction((sel) => document.querySelector(sel) === null, SEL.dirtyTab);
  step("saved");

  // Close the page and end the notebook's session (the server shuts its kernel down), then
  // reopen it: Lab starts a fresh kernel that never ran the widget, so what the widget shows can
  // only come from the file. (Lab cannot show it with no kernel at all: the widget manager of
  // @jupyter-widgets/jupyterlab-manager 5.0 loads the saved state only after loading a kernel's.)
  await page.goto("about:blank");
  const sessions = async () => (await api("GET", "/api/sessions")).filter((s) => s.path === plan.notebook);
  for (const s of await sessions()) {
    result.endedKernels.push(s.kernel.id);
    await api("DELETE", `/api/sessions/${s.id}`);
  }
  step("kernel ended");
  await page.goto(plan.page);
  await page.waitForFunction(({ sel, n }) => document.querySelectorAll(sel).length === n, { sel: LAB.cell, n: count });
  await kernelIdle(page, plan);
  await page.waitForSelector(SEL.widget, { state: "visible" });
  await page.waitForSelector(SEL.chartCanvas, { state: "attached" });
  for (const n of recorded) {
    await page.waitForSelector(`${SEL.ledgerRow}[data-execution-count="${n}"]`, { timeout: ROW_TIMEOUT_MS });
  }
  result.reopened = {
    ...(await widgetView(page)),
    recorded,
    prompts: await page.locator(`${LAB.cell} ${LAB.prompt}`).allInnerTexts(),
    kernels: (await sessions()).map((s) => s.kernel), // the notebook's (other tests' are not)
  };
  await shoot(page, "saved-state-reopened.png");
  step("done");
});
