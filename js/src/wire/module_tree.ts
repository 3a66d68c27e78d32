// The module tree at an instant (`drilldown_alive.modules`: snapshot/views/module_bytes.py
// `module_tree_at(...).to_wire()`): every module's bytes per phase, its submodules' included,
// then what no module holds. Mirrors gpumem_widget/wire/module_tree.py.

import { field, isArray, isNumber, isObject, isString, optional, ProtocolError } from "./json";
import { column, decodeF64Columns } from "./table";

export const PHASES = ["forward", "backward", "optimizer", "recompute", "other"] as const;

/** One row of the module tree at an instant: a module (its submodules' bytes included), or
 * what no module holds; bytes per phase ("other": none). */
export interface ModuleNode {
  label: string;
  bytes: number;
  phases: Record<(typeof PHASES)[number], number>;
  count: number; // allocations
  depth: number;
  children: ModuleNode[]; // in tree order
}

export interface ModuleTree {
  event: number;
  traced: boolean;
  root: ModuleNode; // "active": every byte alive then, once
  truncated: number; // the smallest modules left out
}

/** null where the answer has no tree (a kernel before the view existed). */
export function parseModuleTree(raw: unknown): ModuleTree | null {
  if (!isObject(raw)) return null;
  const what = "drilldown_alive.modules";
  const labels = field(raw, "labels", what, isArray, "a list");
  const { n, columns } = decodeF64Columns(raw["tree"], `${what}.tree`);
  if (n === 0 || labels.length !== n) throw new ProtocolError(`${what}: ${n} rows, ${labels.length} labels`);
  const parent = column(columns, "parent", what);
  const bytes = column(columns, "bytes", what);
  const count = column(columns, "count", what);
  const phase = PHASES.map((p) => column(columns, p, what));
  const nodes: ModuleNode[] = labels.map((label, i) => {
    const phases = Object.fromEntries(PHASES.map((p, k) => [p, phase[k]?.[i] ?? 0])) as ModuleNode["phases"];
    return { label: isString(label) ? label : "?", bytes: bytes[i] ?? 0, phases, count: count[i] ?? 0, depth: 0, children: [] };
  });
  for (let i = 1; i < n; i++) {
    const p = parent[i] ?? -1;
    const up = nodes[p];
    if (!up || p >= i) throw new ProtocolError(`${what}: row ${i} has parent ${p}`);
    const node = nodes[i] as ModuleNode; // parents come first: its depth is final here
    up.children.push(Object.assign(node, { depth: up.depth + 1 }));
  }
  return { event: optional(raw, "event", isNumber, -1), traced: raw["traced"] === true, root: nodes[0] as ModuleNode, truncated: optional(raw, "truncated", isNumber, 0) };
}
