// What every driver of a notebook page shares (drive_lab, drive_memory_tab, drive_phase_spans,
// drive_lab_snapshot, drive_saved_state): the run's Chromium with every non-local request
// refused, the notebook opened (plan.page) with an idle kernel, its cells run one by one, the
// page waited on until a drawing stops changing, and the result written however the driver ends.
// The drivers assert nothing: their tests read the JSON they write.

import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { blockNonLocal, newContext } from "./browser.mjs";

export const LAB = {
  cell: ".jp-Notebook .jp-Cell",
  prompt: ".jp-InputPrompt",
  output: ".jp-OutputArea-output",
  // The status bar's kernel item reads "<kernel> | Idle" only once a kernel is connected and idle
  // (the toolbar's execution indicator already says "idle" before any kernel exists).
  kernelStatus: "#jp-main-statusbar .jp-StatusBar-TextItem",
  kernelIdlePattern: "\\|\\s*Idle$",
  tooltip: ".gpumem-widget .gpumem-tooltip",
};
const DONE = "^\\[\\d+\\]:$"; // a finished cell's prompt

/**
 * Run `body(page, context)` in a fresh context of the run's browser, with every non-local
 * request refused into `result.blocked` (`onLocal` sees the local ones) and every page error
 * recorded in `result.pageErrors` (`onPageError(error)` returning true keeps one out). On an
 * error: `result.error`, a full-page screenshot `artifacts/<failureShot>` and `onFailure(page)`.
 * The result is written to plan.result in every case; the exit code says whether it failed.
 */
export async function drive(plan, result, { failureShot, onLocal, onPageError = () => false, onFailure }, body) {
  const context = await newContext(plan);
  let page = null;
  try {
    await blockNonLocal(context, result.blocked, onLocal);
    page = context.pages()[0] ?? (await context.newPage());
    page.on("pageerror", (e) => {
      if (!onPageError(e)) result.pageErrors.push(`${e.name}: ${e.message}`);
    });
    await body(page, context);
  } catch (e) {
    result.error = String(e?.stack ?? e);
    if (page) {
      const shot = join(plan.artifacts, failureShot);
      await page.screenshot({ path: shot, fullPage: true }).catch(() => {});
      (result.screenshots ??= []).push(shot);
      if (onFailure) await onFailure(page).catch(() => {});
    }
  } finally {
    await writeFile(plan.result, JSON.stringify(result, null, 1));
    await context.browser().close();
  }
  process.exitCode = result.error === null ? 0 : 1;
}

/** Until the notebook shows its `cellCount` cells and its kernel is idle; then the first cell is
 * selected in command mode (Shift+Enter runs the selected cell and selects the next). */
export async function openNotebook(page, plan, cellCount) {
  await page.goto(plan.page);
  await page.waitForFunction(({ sel, n }) => document.querySelectorAll(sel).length === n, { sel: LAB.cell, n: cellCount });
  await kernelIdle(page, plan);
  await selectCell(page, 0);
}

/** Until the notebook's kernel is idle with this page connected. Notebook 7 has no status bar:
 * there the server is asked about the notebook's session. */
export async function kernelIdle(page, plan) {
  if (plan.app !== "notebook") {
    await page.waitForFunction(
      ({ sel, pattern }) => [...document.querySelectorAll(sel)].some((e) => new RegExp(pattern).test(e.textContent.trim())),
      { sel: LAB.kernelStatus, pattern: LAB.kernelIdlePattern },
    );
    return;
  }
  const deadline = Date.now() + plan.stepTimeoutMs;
  for (;;) {
    const response = await fetch(`${plan.url}/api/sessions`, { headers: { Authorization: `token ${plan.token}` } });
    const kernels = (response.ok ? await response.json() : []).filter((s) => s.path === plan.notebook).map((s) => s.kernel);
    if (kernels.some((k) => k.execution_state === "idle" && k.connections > 0)) return;
    if (Date.now() > deadline) throw new Error(`no idle, connected kernel: ${JSON.stringify(kernels)}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

export async function selectCell(page, i) {
  await page.locator(LAB.cell).nth(i).locator(LAB.prompt).click();
  await page.keyboard.press("Escape");
}

/** Run the selected cell `i` of `cellCount`: the last one in place (Ctrl+Enter: Shift+Enter
 * would add a cell below it), any other with Shift+Enter. */
export async function startCell(page, i, cellCount) {
  await page.keyboard.press(i < cellCount - 1 ? "Shift+Enter" : "Control+Enter");
}

/** Until cell `i`'s prompt matches `pattern` (a regular expression's source). */
export async function waitPrompt(page, i, pattern, timeout) {
  await page.waitForFunction(
    ({ sel, prompt, i, pattern }) => new RegExp(pattern).test(document.querySelectorAll(sel)[i]?.querySelector(prompt)?.textContent.trim() ?? ""),
    { sel: LAB.cell, prompt: LAB.prompt, i, pattern },
    { timeout },
  );
}

/** Cell `i`'s execution count, once it has finished. */
export async function cellDone(page, i, timeout) {
  await waitPrompt(page, i, DONE, timeout);
  return Number((await page.locator(LAB.cell).nth(i).locator(LAB.prompt).innerText()).match(/\d+/)[0]);
}

export async function runCell(page, i, cellCount, timeout) {
  await startCell(page, i, cellCount);
  return cellDone(page, i, timeout);
}

/** The text cell `i` printed. */
export async function cellOutput(page, i) {
  return page.locator(LAB.cell).nth(i).locator(LAB.output).innerText();
}

/**
 * Until every element matching `selector` keeps its box and its data attributes over `frames`
 * animation frames in a row: a redraw, zoom or layout change that an action started is drawn.
 */
export async function settled(page, selector, frames = 5) {
  await page.waitForFunction(
    ({ selector, frames }) => {
      const now = JSON.stringify(
        [...document.querySelectorAll(selector)].map((e) => {
          const r = e.getBoundingClientRect();
          return [r.left, r.top, r.width, r.height, { ...e.dataset }];
        }),
      );
      const s = (window.__gpumemSettle ??= { last: null, same: 0 });
      s.same = now === s.last ? s.same + 1 : 0;
      s.last = now;
      if (s.same < frames) return false;
      window.__gpumemSettle = null;
      return true;
    },
    { selector, frames },
    { polling: "raf" },
  );
}

/** Until the widget's tooltip is hidden (after the mouse left what showed it). */
export async function tooltipGone(page) {
  await page.locator(LAB.tooltip).waitFor({ state: "hidden" });
}
