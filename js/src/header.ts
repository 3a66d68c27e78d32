// The header: mode, sampler state, the running cell, one chip per device (name, capacity,
// session peak, and who uses the device: this kernel and other processes, listed on expand),
// and every reason something is missing: a reader that is unavailable, an error the kernel side
// reported, or a trait the browser could not read.

import { formatBytes, formatClock, formatDuration } from "./common/format";
import type { DeviceInfo, ProcessUse, Status } from "./wire/protocol";

export class Header {
  readonly el: HTMLElement;
  // The header is rebuilt whenever the status changes (process figures move while a cell runs):
  // remember which process lists the user opened.
  private readonly openLists = new Set<number>();

  constructor() {
    this.el = document.createElement("header");
    this.el.className = "gpumem-header";
  }

  /** `kernelGone`: the model's comm closed (a restart, a shutdown): nothing updates it now. */
  update(devices: readonly DeviceInfo[], status: Status, problems: readonly string[], kernelGone = false): void {
    const top = document.createElement("div");
    top.className = "gpumem-header-top";
    // Host mode measures no GPU memory: the title says what is shown.
    const title = span("gpumem-title", status.mode === "cuda" ? "GPU memory" : "Host memory");
    const mode = span("gpumem-mode", status.mode === "cuda" ? "CUDA" : "host mode");
    mode.dataset["mode"] = status.mode;
    mode.title = status.mode === "cuda" ? "Sampling the PyTorch CUDA allocator and NVML" : hostModeText(status);
    const sampler = span("gpumem-sampler", kernelGone ? "kernel gone: the last state it sent" : samplerText(status));
    sampler.dataset["state"] = kernelGone ? "gone" : (status.sampler ?? "none");
    if (kernelGone) sampler.title = "The kernel restarted or shut down; run %gpumem show (or %load_ext gpumem_widget) for a live widget";
    top.append(title, mode, sampler);
    if (status.running_cell !== null && !kernelGone) {
      const since = status.running_started !== null ? ` since ${formatClock(status.running_started)}` : "";
      top.append(span("gpumem-running", `running [${status.running_cell}]${since}`));
    }

    const chips = document.createElement("div");
    chips.className = "gpumem-devices";
    for (const d of devices) {
      const chip = span("gpumem-device", `cuda:${d.index} ${d.name}`);
      chip.dataset["device"] = String(d.index);
      if (d.total !== null) chip.append(span("gpumem-device-total", ` \u00b7 ${formatBytes(d.total)}`));
      const peak = status.session_peak.find((p) => p.device === d.index);
      if (peak) chip.append(span("gpumem-device-peak", ` \u00b7 peak ${formatBytes(peak.allocated)}`));
      if (d.uuid) chip.title = d.uuid;
      const procs = status.processes.get(d.index);
      if (procs) chip.append(this.processList(d.index, procs));
      chips.append(chip);
    }

    const notes = document.createElement("ul");
    notes.className = "gpumem-problems";
    if (status.mode === "host") notes.append(item(hostModeText(status), "mode"));
    for (const [name, reader] of Object.entries(status.readers)) {
      // In host mode the line above says why there are no GPU readings; NVML has no device to read.
      if (status.mode === "host" && (name === "torch" || name === "nvml")) continue;
      if (!reader.ok) notes.append(item(`${name} unavailable${reader.reason ? `: ${reader.reason}` : ""}`, "reader"));
    }
    for (const hint of status.hints) notes.append(item(hint, "hint"));
    const history = status.history;
    if (history && !history.on && history.reason) notes.append(item(`history off: ${history.reason}`, "history"));
    if (history?.message) notes.append(item(`history: ${history.message}`, "history"));
    if (status.error) notes.append(item(status.error, "error"));
    for (const p of problems) notes.append(item(`display: ${p}`, "display"));

    this.el.replaceChildren(top, ...(devices.length > 0 ? [chips] : []), ...(notes.childElementCount > 0 ? [notes] : []));
  }

  /** "this kernel 4.20 GiB · other processes 1.30 GiB (2)", opening to one line per process. */
  private processList(device: number, procs: readonly ProcessUse[]): HTMLElement {
    const details = document.createElement("details");
    details.className = "gpumem-processes";
    details.dataset["device"] = String(device);
    details.open = this.openLists.has(device);
    details.addEventListener("toggle", () => {
      if (details.open) this.openLists.add(device);
      else this.openLists.delete(device);
    });
    const summary = document.createElement("summary");
    summary.textContent = processSummary(procs);
    const lines = procs.map(processLine);
    summary.title = lines.join("\n") || "NVML lists no process on this device";
    const list = document.createElement("ul");
    list.append(...lines.map((line, i) => item(line, procs[i]?.self ? "self" : "other")));
    details.append(summary, list);
    return details;
  }
}

/** The sum of what NVML says these processes use, and whether any figure was unavailable. */
function used(procs: readonly ProcessUse[]): { bytes: number; unknown: boolean } {
  return { bytes: procs.reduce((sum, p) => sum + (p.used ?? 0), 0), unknown: procs.some((p) => p.used === null) };
}

export function processSummary(procs: readonly ProcessUse[]): string {
  const mine = procs.filter((p) => p.self);
  const others = procs.filter((p) => !p.self);
  const text = (u: { bytes: number; unknown: boolean }): string => (u.unknown && u.bytes === 0 ? "n/a" : `${u.unknown ? "\u2265 " : ""}${formatBytes(u.bytes)}`);
  const self = mine.length > 0 ? `this kernel ${text(used(mine))}` : "this kernel not listed";
  return `${self} \u00b7 other processes ${others.length > 0 ? text(used(others)) : formatBytes(0)} (${others.length})`;
}

function processLine(p: ProcessUse): string {
  const who = p.self ? "this kernel" : (p.name ?? "(name not visible)");
  return `pid ${p.pid}  ${p.used === null ? "n/a" : formatBytes(p.used)}  ${who}`;
}

/** Host mode, honestly: why (the kernel's words), what is measured and what is not. */
export function hostModeText(status: Status): string {
  const why = status.readers["torch"]?.reason ?? "no CUDA device: host-memory mode";
  return `${why}. Measured: this process's host memory (RSS), sampled, so a cell's peak is at least the figure shown. Not measured: GPU memory.`;
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
