// The header: mode, sampler state, the running cell, one chip per device (name, capacity,
// session peak), and every reason something is missing: a reader that is unavailable, an
// error the kernel side reported, or a trait the browser could not read.

import { formatBytes, formatDuration } from "./format";
import type { DeviceInfo, Status } from "./protocol";

export class Header {
  readonly el: HTMLElement;

  constructor() {
    this.el = document.createElement("header");
    this.el.className = "gpumem-header";
  }

  update(devices: readonly DeviceInfo[], status: Status, problems: readonly string[]): void {
    const top = document.createElement("div");
    top.className = "gpumem-header-top";
    const title = span("gpumem-title", "GPU memory");
    const mode = span("gpumem-mode", status.mode === "cuda" ? "CUDA" : "host memory");
    mode.dataset["mode"] = status.mode;
    mode.title = status.mode === "cuda" ? "Sampling the PyTorch CUDA allocator and NVML" : "No CUDA device: showing this process's host memory (RSS)";
    const sampler = span("gpumem-sampler", samplerText(status));
    sampler.dataset["state"] = status.sampler ?? "none";
    top.append(title, mode, sampler);
    if (status.running_cell !== null) top.append(span("gpumem-running", `running [${status.running_cell}]`));

    const chips = document.createElement("div");
    chips.className = "gpumem-devices";
    for (const d of devices) {
      const chip = span("gpumem-device", `cuda:${d.index} ${d.name}`);
      chip.dataset["device"] = String(d.index);
      if (d.total !== null) chip.append(span("gpumem-device-total", ` \u00b7 ${formatBytes(d.total)}`));
      const peak = status.session_peak.find((p) => p.device === d.index);
      if (peak) chip.append(span("gpumem-device-peak", ` \u00b7 peak ${formatBytes(peak.allocated)}`));
      if (d.uuid) chip.title = d.uuid;
      chips.append(chip);
    }

    const notes = document.createElement("ul");
    notes.className = "gpumem-problems";
    for (const [name, reader] of Object.entries(status.readers)) {
      if (!reader.ok) notes.append(item(`${name} unavailable${reader.reason ? `: ${reader.reason}` : ""}`, "reader"));
    }
    if (status.error) notes.append(item(status.error, "error"));
    for (const p of problems) notes.append(item(`display: ${p}`, "display"));

    this.el.replaceChildren(top, ...(devices.length > 0 ? [chips] : []), ...(notes.childElementCount > 0 ? [notes] : []));
  }
}

function samplerText(status: Status): string {
  if (status.sampler === null) return "sampler not started";
  const intervals =
    status.busy_interval !== null && status.idle_interval !== null
      ? ` (every ${formatDuration(status.busy_interval)} in a cell, ${formatDuration(status.idle_interval)} idle)`
      : "";
  const peaks = status.peak_mode === "passive" ? ", passive peaks" : "";
  return `sampler ${status.sampler}${status.sampler === "running" ? intervals : ""}${peaks}`;
}

function span(className: string, text: string): HTMLSpanElement {
  const el = document.createElement("span");
  el.className = className;
  el.textContent = text;
  return el;
}

function item(text: string, kind: string): HTMLLIElement {
  const li = document.createElement("li");
  li.dataset["kind"] = kind;
  li.textContent = text;
  return li;
}
