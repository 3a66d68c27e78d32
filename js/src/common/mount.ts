// How widget.ts hosts a tab: each tab's entry module mounts the tab into its panel with what the
// host gives it (a TabHost) and hands back a Tab. The host owns what every tab shares: the model's
// listeners, one frame per burst of trait changes, the devices and status, and the header's list
// of problems; a tab owns its state and its drawing.

import type { AnyModel } from "@anywidget/types";
import type { DeviceInfo, Status, Traits } from "../wire/protocol";

/** The traits the host's frame watches; the Snapshot tab watches the drilldown ones itself. */
export type TraitName = Exclude<keyof Traits, `drilldown${string}`>;

export interface TabHost {
  readonly model: AnyModel<Traits>;
  /** The widget's root element (its styles give the palette; tooltips go in it). */
  readonly root: HTMLElement;
  /** The model's comm closed: nothing will answer or update. */
  readonly kernelGone: boolean;
  /** Draw at the next frame (one per burst of changes). */
  requestFrame(): void;
  /** Say what went wrong in the header, by source; null: it is right again. */
  setProblem(source: string, message: string | null): void;
  /** Run one decoding step; a malformed trait keeps the last good state and says why in the header. */
  attempt(source: string, step: () => unknown): boolean;
}

/** What changed since the last frame, and the shared traits as the host read them. */
export interface Frame {
  readonly stale: ReadonlySet<TraitName>;
  readonly devices: DeviceInfo[];
  readonly status: Status;
}

export interface Tab {
  /** Draw what the frame's changes touch (called at every frame, shown or hidden). */
  update?(frame: Frame): void;
  /** The tab's panel was shown (it has a size now). */
  shown?(): void;
  /** A custom message from the kernel; one that is not this tab's is ignored. */
  receive?(content: unknown): void;
  dispose(): void;
}
