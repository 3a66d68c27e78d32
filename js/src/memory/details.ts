// The selected cell in full: per-device figures (before → after, change, peaks), memory outside
// PyTorch (NVML's process use minus what the allocator reserved), host RSS, what features noted
// (estimate, OOM post-mortem, leak hints, the module tracer's phases and modules, others), and
// the source.

import { outcome, outcomeLabel, type Mode } from "./cells";
import { formatBytes, formatClock, formatDelta, formatDuration } from "../common/format";
import { noteSections } from "./notes_view";
import { modulesSection } from "./modules_view";
import type { CellRecord, DeviceCellUsage, DeviceInfo } from "../wire/protocol";
import { workerSection } from "./worker_figures";

type Row = [label: string, value: (d: DeviceCellUsage) => string, hint?: string];

const peak = (bytes: number, exact: boolean): string => (exact ? formatBytes(bytes) : `\u2265 ${formatBytes(bytes)}`);
const change = (before: number, after: number, delta: number): string =>
  `${formatBytes(before)} \u2192 ${formatBytes(after)} (${formatDelta(delta)})`;

const DEVICE_ROWS: readonly Row[] = [
  ["allocated", (d) => change(d.allocated_before, d.allocated_after, d.delta_allocated)],
  ["peak allocated", (d) => peak(d.peak_allocated, d.peak_exact), "\u2265: a lower bound (passive peak mode)"],
  ["reserved", (d) => change(d.reserved_before, d.reserved_after, d.delta_reserved)],
  ["peak reserved", (d) => peak(d.peak_reserved, d.peak_exact)],
  [
    "outside PyTorch",
    (d) => (d.outside_pytorch === null ? "n/a (no NVML process figure)" : formatBytes(d.outside_pytorch)),
    "This process's driver-level use (NVML) minus what PyTorch reserved: CUDA context, cuBLAS/cuDNN workspaces, NCCL, other libraries",
  ],
  ["process (NVML)", (d) => formatBytes(d.process_used_after)],
  ["other processes (NVML)", (d) => formatBytes(d.others_used_after), "Every other process NVML lists on this device"],
  ["whole device (NVML)", (d) => formatBytes(d.device_used_after)],
  ["allocation retries", (d) => String(d.alloc_retries), "cudaMalloc retries after freeing cached blocks: memory pressure"],
  ["OOMs", (d) => String(d.ooms)],
];

export class Details {
  readonly el: HTMLElement;
  private readonly onClose: () => void;

  constructor(onClose: () => void) {
    this.onClose = onClose;
    this.el = document.createElement("section");
    this.el.className = "gpumem-details";
    this.el.hidden = true;
  }

  show(cell: CellRecord, devices: readonly DeviceInfo[], mode: Mode): void {
    this.el.hidden = false;
    this.el.dataset["executionCount"] = String(cell.execution_count);
    this.el.dataset["outcome"] = outcome(cell);

    const head = document.createElement("div");
    head.className = "gpumem-details-head";
    const title = document.createElement("strong");
    title.textContent = `[${cell.execution_count}]`;
    const meta = document.createElement("span");
    const status = outcomeLabel(cell);
    meta.textContent = [`started ${formatClock(cell.started)}`, `took ${formatDuration(cell.duration)}`, status].filter(Boolean).join(" \u00b7 ");
    if (status) meta.className = "gpumem-details-problem";
    const close = document.createElement("button");
    close.type = "button";
    close.className = "gpumem-details-close";
    close.textContent = "\u00d7";
    close.title = "Close";
    close.setAttribute("aria-label", "Close cell details");
    close.addEventListener("click", this.onClose);
    head.append(title, meta, close);

    const parts: HTMLElement[] = [head];
    if (mode === "cuda" && cell.devices.length > 0) parts.push(deviceTable(cell.devices, devices));
    parts.push(hostLine(cell), ...workerSection(cell.workers), ...noteSections(cell.notes));
    if (cell.notes.modules) parts.push(modulesSection(cell.notes.modules, cell.execution_count));
    const missing = Object.entries(cell.missing ?? {});
    if (missing.length > 0) {
      const list = document.createElement("ul");
      list.className = "gpumem-details-missing";
      for (const [figure, why] of missing) {
        const li = document.createElement("li");
        li.textContent = `${figure} missing: ${why}`;
        list.append(li);
      }
      parts.push(list);
    }
    const source = document.createElement("pre");
    source.className = "gpumem-details-source";
    source.textContent = cell.source;
    parts.push(source);
    this.el.replaceChildren(...parts);
  }

  hide(): void {
    this.el.hidden = true;
    this.el.replaceChildren();
    delete this.el.dataset["executionCount"];
  }
}

function deviceTable(usage: readonly DeviceCellUsage[], devices: readonly DeviceInfo[]): HTMLElement {
  const wrap = document.createElement("div");
  wrap.className = "gpumem-details-devices";
  const table = document.createElement("table");
  const head = document.createElement("tr");
  head.append(document.createElement("th"));
  for (const d of usage) {
    const th = document.createElement("th");
    th.scope = "col";
    const info = devices.find((x) => x.index === d.device);
    th.textContent = `cuda:${d.device}`;
    if (info) th.title = info.name;
    head.append(th);
  }
  const rows = DEVICE_ROWS.map(([label, value, hint]) => {
    const tr = document.createElement("tr");
    const th = document.createElement("th");
    th.scope = "row";
    th.textContent = label;
    if (hint) th.title = hint;
    tr.append(th);
    for (const d of usage) {
      const td = document.createElement("td");
      td.textContent = value(d);
      tr.append(td);
    }
    return tr;
  });
  const thead = document.createElement("thead");
  thead.append(head);
  const tbody = document.createElement("tbody");
  tbody.append(...rows);
  table.append(thead, tbody);
  wrap.append(table);
  return wrap;
}

function hostLine(cell: CellRecord): HTMLElement {
  const p = document.createElement("p");
  p.className = "gpumem-details-host";
  const { host_rss_before: before, host_rss_after: after, host_rss_peak: rssPeak } = cell;
  const delta = before !== null && after !== null ? after - before : null;
  p.textContent =
    `host RSS ${formatBytes(before)} \u2192 ${formatBytes(after)} (${formatDelta(delta)})` +
    (rssPeak !== null ? `, peak \u2265 ${formatBytes(rssPeak)} (sampled)` : "");
  return p;
}
