// The custom messages the browser sends the kernel, each type declared once here, and the one
// function that sends them: mirrors gpumem_widget/wire/messages.py, whose `MESSAGES` is the one
// description of them (docs/ARCHITECTURE.md is generated from it, and a pytest checks that the
// types and fields here are the same). The kernel parses every message into its TypedDict and
// routes it to the one handler of its type; a malformed one is refused there and counted
// (`%gpumem status`). Its one message back, `cells_page`, is read by ./protocol `parseCellsPage`.

export type Axis = "event" | "time";

/** A snapshot a worker reported: the worker's key (host:pid) and its index in that worker's list
 * (the browser never names a path). */
export interface SnapshotRef {
  key: string;
  index: number;
}

export type BrowserMessage =
  | { type: "load" } // compute the pending snapshot's overview
  | { type: "alive_at"; device: number; id: number; t: number } // what is alive at `t`
  | { type: "alive_at"; device: number; id: number; event: number } // or after trace entry `event`
  | { type: "view"; id: number; device: number; axis: Axis; t0: number | null; t1: number | null; width: number } // a zoom, or another axis
  | { type: "search"; device: number; query: string; axis: Axis; t0: number | null; t1: number | null }
  | { type: "cells_page"; before: number; limit: number } // older ledger records
  | { type: "cells_page"; execution_count: number; limit: number } // the page ending with this cell
  | { type: "shown" } // a view is rendered: this front end keeps the state, no per-cell message needed
  | { type: "worker_snapshot"; key: string; index: number } // a rank's reported snapshot
  | { type: "worker_compare"; a: SnapshotRef; b: SnapshotRef }; // two of them side by side

export type BrowserMessageType = BrowserMessage["type"];

/** What can carry a message to the kernel: the widget's model (anywidget's `AnyModel`). */
export interface KernelChannel {
  send(content: BrowserMessage): void;
}

/** The one way the browser sends the kernel a message. */
export function sendToKernel(model: KernelChannel, message: BrowserMessage): void {
  model.send(message);
}
