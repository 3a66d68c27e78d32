// The details panel's sections for a cell's notes, all as text: the estimate beside the measured
// peak (with its terms), the OOM post-mortem (figures per device, what holds the memory, what to
// do), leak hints, the previous run's peak, and any other note as its JSON.

import { previousRunText } from "./cells";
import { formatBytes, formatClock, formatPercent } from "../common/format";
import { estimateError, type CellNotes, type EstimateNote, type Holder, type LeakHint, type OomDevice, type OtherNote, type PostMortem, type PreviousRun } from "../wire/notes";

const OTHER_NOTE_CHARS = 4000;

export function noteSections(notes: CellNotes): HTMLElement[] {
  const sections: HTMLElement[] = [];
  if (notes.estimate) sections.push(estimateSection(notes.estimate));
  if (notes.postmortem) sections.push(postMortemSection(notes.postmortem));
  if (notes.leaks.length > 0) sections.push(leaksSection(notes.leaks));
  if (notes.history) sections.push(previousRunSection(notes.history));
  for (const other of notes.other) sections.push(otherSection(other));
  return sections;
}

// ---------------------------------------------------------------------------------------------
// estimate

function estimateSection(note: EstimateNote): HTMLElement {
  const { estimate: e, comparison: c } = note;
  const section = noteSection("estimate", `Estimate vs measured on cuda:${note.device}`);
  const shape = [e.batch !== null ? `batch ${e.batch}` : "", e.seq !== null ? `seq ${e.seq}` : "", e.dtype, e.optimizer].filter(Boolean);
  section.append(para("gpumem-note-meta", `${e.model}${shape.length ? `: ${shape.join(", ")}` : ""}`));

  const verdict = para(
    "gpumem-note-verdict",
    `predicted ${formatBytes(c.predicted)} \u00b7 measured ${note.peak_exact ? "" : "\u2265 "}${formatBytes(c.measured)} ` +
      `(${formatPercent(estimateError(c))}) \u00b7 ${c.within_tolerance ? "within" : "outside"} \u00b1${Math.round(c.tolerance * 100)}%`,
  );
  verdict.dataset["within"] = String(c.within_tolerance);
  section.append(verdict);
  if (c.explanation) section.append(para("gpumem-note-text", c.explanation));
  if (c.suspect !== null) {
    const term = e.terms.find((t) => t.key === c.suspect);
    section.append(para("gpumem-note-text", `most likely off: ${term ? `${term.label} (${term.source})` : c.suspect}`));
  }
  if (!note.peak_exact) section.append(para("gpumem-note-text", "The measured peak is a lower bound (passive peak mode)."));

  const rows: string[][] = e.terms.map((t) => [t.label, formatBytes(t.bytes), t.formula + (t.source ? ` [${t.source}]` : "")]);
  for (const p of e.phases) rows.push([`${p.name} phase${p.name === e.peak_phase ? " (peak)" : ""}`, formatBytes(p.bytes), p.at ? `peak at ${p.at}` : ""]);
  if (e.total !== null) rows.push(["total (peak)", formatBytes(e.total), e.peak_formula]);
  if (c.other_bytes > 0) rows.push(["+ other memory on the device", formatBytes(c.other_bytes), "allocated before the cell beyond what the estimate holds between steps"]);
  section.append(table("gpumem-note-terms", ["term", "bytes", "formula"], rows));
  if (e.notes.length > 0) section.append(list(e.notes.map((n) => `note: ${n}`)));
  return section;
}

// ---------------------------------------------------------------------------------------------
// OOM post-mortem

type OomRow = [label: string, value: (d: OomDevice) => string | null, hint?: string];

const bytesOrNull = (n: number | null): string | null => (n === null ? null : formatBytes(n));
const countOrNull = (n: number | null): string | null => (n === null ? null : String(n));

const OOM_ROWS: readonly OomRow[] = [
  ["requested", (d) => bytesOrNull(d.requested), "The allocation that failed (rounded up to the allocator's block size)"],
  ["free (driver)", (d) => bytesOrNull(d.free), "What the driver had free at the OOM, after PyTorch emptied its cache"],
  ["capacity", (d) => bytesOrNull(d.capacity), "The device's memory, or the limit set_per_process_memory_fraction allows"],
  ["short by", (d) => (d.shortfall ? formatBytes(d.shortfall) : null)],
  ["allocated at the OOM", (d) => bytesOrNull(d.allocated)],
  ["reserved at the OOM", (d) => bytesOrNull(d.reserved)],
  [
    "reserved but unallocated",
    (d) => bytesOrNull(d.reserved_unallocated),
    "Reserved by PyTorch but not allocated to tensors: fragmentation the failed request could not use",
  ],
  ["inactive split blocks", (d) => bytesOrNull(d.inactive_split), "Free blocks inside partly used segments"],
  ["allocator retries", (d) => countOrNull(d.alloc_retries), "cudaMalloc failures that made PyTorch free its cache and retry (so far in the session)"],
  ["OOMs so far", (d) => countOrNull(d.ooms)],
  ["this process (NVML)", (d) => bytesOrNull(d.this_process), "Everything this process holds on the device, non-PyTorch memory included"],
  ["outside PyTorch", (d) => bytesOrNull(d.outside_pytorch), "CUDA context, cuBLAS/cuDNN workspaces, NCCL, other libraries"],
  ["other processes", (d) => (d.other_processes.length > 0 ? d.other_processes.map((p) => `pid ${p.pid} ${formatBytes(p.bytes)}`).join(", ") : null)],
  ["allocated now", (d) => bytesOrNull(d.allocated_now), "After the cell ended"],
  ["reserved now", (d) => bytesOrNull(d.reserved_now)],
  ["figures from", (d) => (d.source === "none" ? null : `the OOM ${d.source}`), "observer: exact, read inside the allocator; message: the error text, rounded"],
];

const SECTIONS: readonly [section: string, title: string][] = [
  ["user", "Variables"],
  ["output_cache", "Output cache (Out, _, _N)"],
  ["traceback", "Last traceback (its frames' locals)"],
];

function postMortemSection(pm: PostMortem): HTMLElement {
  const section = noteSection("postmortem", "OOM post-mortem");
  const failed = pm.devices.find((d) => d.failed);
  const ask =
    failed && failed.requested !== null
      ? `: asked for ${formatBytes(failed.requested)}` +
        (failed.free !== null ? `, ${formatBytes(failed.free)} free` : "") +
        (failed.capacity !== null ? ` of ${formatBytes(failed.capacity)}` : "") +
        (failed.shortfall ? `, short by ${formatBytes(failed.shortfall)}` : "")
      : "";
  section.append(para("gpumem-note-verdict", `${pm.error_type}${failed ? ` on cuda:${failed.device}` : ""}${ask}`));
  if (pm.place) {
    const from = pm.place.source === "snapshot" ? "the OOM's entry in the snapshot" : "the failing thread's tag";
    const line = para("gpumem-note-text", `While running: ${pm.place.text} (from ${from})`);
    line.dataset["place"] = pm.place.tag;
    section.append(line);
  }
  if (pm.events > 1) section.append(para("gpumem-note-text", `${pm.events} OOMs during the cell (it caught some and went on)`));

  const shown = OOM_ROWS.filter(([, value]) => pm.devices.some((d) => value(d) !== null));
  if (pm.devices.length > 0 && shown.length > 0) {
    const head = ["", ...pm.devices.map((d) => `cuda:${d.device}${d.failed ? " (failed)" : ""}`)];
    const rows = shown.map(([label, value]) => [label, ...pm.devices.map((d) => value(d) ?? "\u2014")]);
    const hints = shown.map(([, , hint]) => hint);
    section.append(table("gpumem-note-oom", head, rows, hints));
  }

  const holders = pm.holders;
  if (holders) {
    section.append(heading("What holds CUDA memory"));
    const releasable = Object.entries(holders.releasable).filter(([, n]) => n > 0);
    if (releasable.length > 0) {
      const parts = releasable.map(([device, n]) => {
        const why = [
          holders.traceback_only[device] ? `traceback ${formatBytes(holders.traceback_only[device])}` : "",
          holders.output_cache_only[device] ? `output cache ${formatBytes(holders.output_cache_only[device])}` : "",
        ].filter(Boolean);
        return `${formatBytes(n)} on ${device}${why.length ? ` (${why.join(", ")})` : ""}`;
      });
      section.append(para("gpumem-note-text", `Held only by the traceback and the output cache (released by %gpumem free): ${parts.join("; ")}`));
    }
    for (const [key, title] of SECTIONS) {
      const rows = holders.holders.filter((h) => h.section === key);
      if (rows.length === 0) continue;
      const group = document.createElement("div");
      group.className = "gpumem-note-holders";
      group.dataset["section"] = key;
      group.append(para("gpumem-note-subhead", title), list(rows.map(holderLine)));
      section.append(group);
    }
    if (holders.holders.length === 0) section.append(para("gpumem-note-text", "No notebook name holds CUDA memory."));
    if (holders.holders_left_out > 0) section.append(para("gpumem-note-text", `\u2026 and ${holders.holders_left_out} more`));
    if (holders.truncated) section.append(para("gpumem-note-text", "The walk was cut short: figures are lower bounds."));
  }

  if (pm.suggestions.length > 0) {
    section.append(heading("What to do, most useful first"));
    const ol = document.createElement("ol");
    ol.className = "gpumem-note-suggestions";
    for (const s of pm.suggestions) {
      const li = document.createElement("li");
      li.dataset["key"] = s.key;
      const title = document.createElement("strong");
      title.textContent = s.title;
      li.append(title);
      if (s.recoverable !== null) {
        const enough = s.sufficient === null ? "" : s.sufficient ? ", enough for the request" : ", not enough on its own";
        li.append(` (frees ${formatBytes(s.recoverable)}${enough})`);
      }
      if (s.detail) li.append(para("gpumem-note-text", s.detail));
      if (s.command) {
        const code = document.createElement("code");
        code.textContent = s.command;
        li.append(code);
      }
      ol.append(li);
    }
    section.append(ol);
  }

  if (pm.message) {
    const full = document.createElement("details");
    const summary = document.createElement("summary");
    summary.textContent = "error message";
    const pre = document.createElement("pre");
    pre.textContent = pm.message;
    full.append(summary, pre);
    section.append(full);
  }
  return section;
}

function holderLine(h: Holder): string {
  const name = h.aliases.length > 0 ? `${h.name} (${h.aliases.join(", ")})` : h.name;
  const devices = Object.entries(h.bytes)
    .map(([device, n]) => {
      const only = h.exclusive[device] ?? 0;
      return `${formatBytes(n)} on ${device}${only > 0 && only !== n ? `, ${formatBytes(only)} only here` : ""}`;
    })
    .join("; ");
  const largest = h.largest[0];
  const extras = [
    largest ? `largest ${largest.path} [${largest.shape.join(", ")}] ${largest.dtype}` : "",
    h.autograd_graphs > 0 ? `+${h.autograd_graphs} autograd graph(s), not counted` : "",
    h.truncated ? "walk cut short" : "",
  ].filter(Boolean);
  return `${name}: ${h.type} \u00b7 ${devices || formatBytes(h.total)}${extras.length ? ` \u00b7 ${extras.join(" \u00b7 ")}` : ""}`;
}

// ---------------------------------------------------------------------------------------------
// leaks, anything else

function leaksSection(hints: readonly LeakHint[]): HTMLElement {
  const section = noteSection("leaks", "Leak hints");
  section.append(list(hints.map((h) => `${h.device ? `${h.device}, ${formatBytes(h.bytes)}: ` : ""}${h.message}`)));
  return section;
}

function previousRunSection(prev: PreviousRun): HTMLElement {
  const section = noteSection("history", prev.regression ? "Above its previous run" : "Previous run");
  const verdict = para("gpumem-note-verdict", previousRunText(prev));
  verdict.dataset["within"] = String(!prev.regression);
  section.append(verdict);
  const when = prev.previous_started !== null ? `, a kernel started ${formatClock(prev.previous_started)}` : "";
  section.append(para("gpumem-note-meta", `The same source ran in the previous session of this notebook (${prev.previous_session.slice(0, 8)}${when}); \`%gpumem history\` lists them.`));
  return section;
}

function otherSection(note: OtherNote): HTMLElement {
  const details = document.createElement("details");
  details.className = "gpumem-note";
  details.dataset["note"] = note.key;
  const summary = document.createElement("summary");
  summary.textContent = `note: ${note.key}${note.problem ? ` (not readable by this version: ${note.problem})` : ""}`;
  const pre = document.createElement("pre");
  let text: string;
  try {
    text = JSON.stringify(note.value, null, 1) ?? String(note.value);
  } catch {
    text = String(note.value); // a value JSON cannot write (a cycle): say what it is
  }
  pre.textContent = text.length > OTHER_NOTE_CHARS ? `${text.slice(0, OTHER_NOTE_CHARS)}\n\u2026` : text;
  details.append(summary, pre);
  return details;
}

// ---------------------------------------------------------------------------------------------
// text-only DOM

function noteSection(kind: string, title: string): HTMLElement {
  const section = document.createElement("section");
  section.className = "gpumem-note";
  section.dataset["note"] = kind;
  section.append(heading(title));
  return section;
}

function heading(text: string): HTMLElement {
  const h = document.createElement("h4");
  h.textContent = text;
  return h;
}

function para(className: string, text: string): HTMLParagraphElement {
  const p = document.createElement("p");
  p.className = className;
  p.textContent = text;
  return p;
}

function list(lines: readonly string[]): HTMLUListElement {
  const ul = document.createElement("ul");
  for (const line of lines) {
    const li = document.createElement("li");
    li.textContent = line;
    ul.append(li);
  }
  return ul;
}

/** A table of text; `hints[i]` becomes row i's header tooltip. */
function table(className: string, head: readonly string[], rows: readonly (readonly string[])[], hints: readonly (string | undefined)[] = []): HTMLElement {
  const wrap = document.createElement("div");
  wrap.className = `gpumem-note-table ${className}`;
  const t = document.createElement("table");
  const thead = document.createElement("thead");
  const hr = document.createElement("tr");
  for (const h of head) {
    const th = document.createElement("th");
    th.scope = "col";
    th.textContent = h;
    hr.append(th);
  }
  thead.append(hr);
  const tbody = document.createElement("tbody");
  rows.forEach((row, i) => {
    const tr = document.createElement("tr");
    row.forEach((text, j) => {
      const cell = document.createElement(j === 0 ? "th" : "td");
      cell.textContent = text;
      if (j === 0) {
        cell.scope = "row";
        const hint = hints[i];
        if (hint) cell.title = hint;
      }
      tr.append(cell);
    });
    tbody.append(tr);
  });
  t.append(thead, tbody);
  wrap.append(t);
  return wrap;
}
