// Text that wraps at narrow widths without splitting a figure: names break anywhere (CSS), but
// each number with its unit ("1.86 GiB", "41,000–42,000", "12.5%") stays on one line.

/** A number, a range of numbers, and the unit that follows it. */
const FIGURE = /[+\u2212-]?\d[\d,.]*(?:\u2013\d[\d,.]*)?(?:\s?(?:[KMGTPE]i?B|B|%|\u00d7|ms|s|min|h)\b|%|\u00d7)?/g;

/** Put `text` in `el`, each figure in a span that never wraps; textContent is `text` exactly. */
export function setFigures(el: HTMLElement, text: string): void {
  el.replaceChildren();
  let at = 0;
  for (const m of text.matchAll(FIGURE)) {
    const start = m.index;
    if (start > at) el.append(text.slice(at, start));
    const figure = document.createElement("span");
    figure.className = "gpumem-figure";
    figure.textContent = m[0];
    el.append(figure);
    at = start + m[0].length;
  }
  if (at < text.length) el.append(text.slice(at));
}

/** Whether a table cell holds a figure alone (it then never wraps). */
export function isFigure(text: string): boolean {
  return /^[[(]?[+\u2212-]?\d[\d,.]*(?:\s?\S{1,3})?[\])]?( \([\d.]+%\))?$/.test(text.trim());
}
