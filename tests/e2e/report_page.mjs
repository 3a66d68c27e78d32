// What a standalone report shows, read in the page, and its rank tabs driven as a user does:
// shared by open_report.mjs (the e2e test) and time_rank_switch.mjs (the timing).

/** In the page: Bokeh's documents, the plot views, canvases and table rows that show (a hidden
 * tab's are laid out, under `visibility: hidden`), how many of them have painted pixels, and
 * the h2 headings that show. */
export function pageState() {
  const all = [];
  const walk = (root) => {
    for (const el of root.querySelectorAll("*")) {
      all.push(el);
      if (el.shadowRoot) walk(el.shadowRoot);
    }
  };
  walk(document);
  const visible = (el) =>
    el.getClientRects().length > 0 && getComputedStyle(el).visibility === "visible";
  const painted = (canvas) => {
    const ctx = canvas.getContext("2d");
    if (!ctx || !canvas.width || !canvas.height) return false;
    const data = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
    for (let i = 3; i < data.length; i += 4 * 97) if (data[i] !== 0) return true;
    return false;
  };
  const canvases = all.filter((el) => el.tagName === "CANVAS" && visible(el));
  const plots = all.filter((el) => el.classList?.contains("bk-Canvas") && visible(el));
  return {
    documents: window.Bokeh?.documents?.length ?? 0,
    plotViews: plots.length,
    paintedPlots: plots.filter((p) => [...(p.shadowRoot ?? p).querySelectorAll("canvas")].some(painted))
      .length,
    canvases: canvases.length,
    paintedCanvases: canvases.filter(painted).length,
    tableRows: all.filter((el) => el.classList?.contains("slick-row") && visible(el)).length,
    headings: all.filter((el) => el.tagName === "H2" && visible(el)).map((el) => el.textContent),
  };
}

/** Every rank the report offers, in order: its tab's title. */
export async function rankTitles(page) {
  return page.locator(".bk-tab").allTextContents();
}

/** Clicks rank `index`'s tab, then waits until its heading shows and every plot that shows has
 * painted. */
export async function showRank(page, index, title, timeout) {
  await page.locator(".bk-tab").nth(index).click({ timeout });
  await page.waitForFunction(
    `(() => { const s = (${pageState})(); ` +
      `return s.headings.includes(${JSON.stringify(title)}) && s.paintedPlots === s.plotViews; })()`,
    null,
    { timeout, polling: 50 },
  );
}
