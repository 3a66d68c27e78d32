// Small DOM builders the tabs share.

/** A table cell holding `text` (through textContent), with an optional class and tooltip. */
export function tableCell(text: string, className?: string, title?: string): HTMLTableCellElement {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  if (title) td.title = title;
  return td;
}
