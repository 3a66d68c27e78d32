// The "Snapshot" tab: a drill-down into a PyTorch memory snapshot. A placeholder until the
// snapshot panel lands; keep the signature (the widget mounts it on first view of the tab).

import type { AnyModel } from "@anywidget/types";

export function renderDrilldown(el: HTMLElement, _model: AnyModel): () => void {
  const note = document.createElement("p");
  note.className = "gpumem-drilldown-empty";
  note.textContent = "No snapshot loaded";
  el.append(note);
  return () => note.remove();
}
