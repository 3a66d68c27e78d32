// The Workers tab's entry: the `workers` trait decoded into the view, under the Memory tab's
// cell bands (handed in by the host, which updates the Memory tab first).

import "./workers.css";
import type { Frame, Tab, TabHost } from "../common/mount";
import type { Band } from "../wire/protocol";
import { parseWorkers } from "../wire/workers";
import { WorkersView, type CompareSnapshots, type OpenSnapshot } from "./view";

export function mountWorkersTab(panel: HTMLElement, host: TabHost, bands: () => Band[], onOpen: OpenSnapshot, onCompare: CompareSnapshots): Tab {
  const view = new WorkersView(onOpen, onCompare);
  panel.append(view.el);
  return {
    update({ stale }: Frame): void {
      if (stale.has("workers")) {
        host.attempt("workers", () => view.update(parseWorkers(host.model.get("workers")), bands()));
      } else if (stale.has("cells")) {
        view.setBands(bands());
      }
    },
    shown: () => view.setBands(bands()), // sized now
    dispose: () => view.el.remove(),
  };
}
