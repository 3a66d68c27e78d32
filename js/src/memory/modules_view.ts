// The cell's details: what the module tracer saw of it (`notes.modules`): its phases, and the
// modules that held the most, as a rolled-up tree (`gpt` > `gpt.h` > `gpt.h.3` > `gpt.h.3.mlp`),
// one column per phase: what each module's forward kept (saved activations and output), what
// its recompute kept, what its backward added and the highest allocated seen in it, and its
// gradients and parameters. Without per-module figures, it says how to get them.

import { formatBytes, formatDelta } from "../common/format";
import type { ModuleRow, ModulesNote } from "../wire/notes";
import { phaseTotals } from "./phases";

type Column = [head: string, figure: (r: ModuleRow) => number, format: (n: number) => string, hint: string];

const COLUMNS: readonly Column[] = [
  ["forward kept", (r) => r.forward_kept, formatBytes, "Bytes its forward left allocated: the activations autograd saved, and its output"],
  ["recompute kept", (r) => r.recompute_kept, formatBytes, "Bytes its forward left when re-run in backward (activation checkpointing)"],
  ["backward added", (r) => r.backward_added, formatDelta, "Allocated less freed while backward was in it (its submodules included)"],
  ["backward high", (r) => r.backward_high, formatBytes, "The most allocated seen at its backward's boundaries (a lower bound of the peak there)"],
  ["gradients", (r) => r.gradients, formatBytes, "Its parameters' gradients at the cell's end"],
  ["parameters", (r) => r.parameters, formatBytes, "Its parameters"],
  ["calls", (r) => r.calls, String, "Forward calls in this cell"],
];

const ALLOCATOR_COLUMNS = new Set(["forward kept", "recompute kept", "backward added", "backward high"]);

export function modulesSection(note: ModulesNote, executionCount: number): HTMLElement {
  const section = document.createElement("section");
  section.className = "gpumem-note";
  section.dataset["note"] = "modules";
  const h = document.createElement("h4");
  h.textContent = "Modules and phases";
  section.append(h);
  if (note.phases) {
    const totals = phaseTotals(note.phases);
    if (totals) section.append(para("gpumem-modules-phases", `phases: ${totals}`));
  }
  if (note.modules === null) {
    section.append(para("gpumem-note-meta", note.hint ?? "per-module figures were not measured for this cell: `%gpumem modules on --figures`"));
    return section;
  }
  // Only the columns some row has a figure in (recompute: only with checkpointing); without CUDA,
  // none of the allocator's (they would read 0, which is not what the forward kept).
  const rows = note.modules;
  const columns = COLUMNS.filter(([head, figure]) => (note.allocator ? head === "forward kept" || rows.some((r) => figure(r) !== 0) : !ALLOCATOR_COLUMNS.has(head) && rows.some((r) => figure(r) !== 0)));
  if (!note.allocator) section.append(para("gpumem-note-meta", "no CUDA device: what each module's forward kept and its backward added are read from the CUDA allocator, so are not measured here"));
  const wrap = document.createElement("div");
  wrap.className = "gpumem-note-table gpumem-modules-table";
  const table = document.createElement("table");
  const thead = document.createElement("thead");
  const hr = document.createElement("tr");
  for (const head of ["module", ...columns.map((c) => c[0])]) {
    const th = document.createElement("th");
    th.scope = "col";
    th.textContent = head;
    const hint = columns.find((c) => c[0] === head)?.[3];
    if (hint) th.title = hint;
    hr.append(th);
  }
  thead.append(hr);
  const tbody = document.createElement("tbody");
  for (const row of rows) {
    const tr = document.createElement("tr");
    tr.dataset["module"] = row.path;
    const th = document.createElement("th");
    th.scope = "row";
    th.style.paddingLeft = `${row.depth}em`;
    th.textContent = (row.depth > 0 ? "\u2514 " : "") + lastPart(row.path, row.depth) + (row.compiled ? " (compiled)" : "");
    th.title = row.path;
    tr.append(th);
    for (const [head, figure, format] of columns) {
      const td = document.createElement("td");
      td.dataset["column"] = head;
      td.dataset["bytes"] = String(figure(row));
      td.textContent = format(figure(row));
      tr.append(td);
    }
    tbody.append(tr);
  }
  table.append(thead, tbody);
  wrap.append(table);
  section.append(wrap);
  if (note.modules_left_out > 0) {
    section.append(para("gpumem-note-meta", `${note.modules_left_out} lighter modules not shown: \`%gpumem modules table --cell ${executionCount}\` lists them all`));
  }
  return section;
}

/** A nested row shows its own name (`mlp`), a root its full path. */
function lastPart(path: string, depth: number): string {
  if (depth === 0) return path;
  const m = /(?:\.([^.[\]]+)|(\[[^[\]]*\]))$/.exec(path);
  return m ? (m[1] ?? m[2] ?? path) : path;
}

function para(className: string, text: string): HTMLParagraphElement {
  const p = document.createElement("p");
  p.className = className;
  p.textContent = text;
  return p;
}
