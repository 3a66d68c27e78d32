// The allocator's segment map (parsed by wire/segments): one bar per
// segment, its blocks colored by state, rounding waste hatched, details on hover; then the
// fragmentation figures and the advice they triggered. Everything is text through textContent.
import { formatBytes } from "../common/format";
import { parseSegmentMap, type SegBlock, type SegFigure, type SegmentMapView, type SegSegment } from "../wire/segments";

const LEGEND: [string, string][] = [
  ["allocated", "allocated"],
  ["pending_free", "waiting for another stream"],
  ["free", "free (cached)"],
  ["waste", "rounding waste"],
];
const COLORS: Record<string, string> = {
  allocated: "#4c78a8",
  pending_free: "#f58518",
  free: "#d9d9d9",
  waste: "repeating-linear-gradient(45deg, #e45756 0 2px, #4c78a8 2px 5px)",
};
const MIN_BAR_PERCENT = 4;

function node<K extends keyof HTMLElementTagNameMap>(tag: K, cls: string, text?: string): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  el.className = cls;
  if (text !== undefined) el.textContent = text;
  return el;
}

export function formatFigure(f: SegFigure): string {
  if (typeof f.value === "boolean") return f.value ? "yes" : "no";
  if (f.unit === "bytes") return formatBytes(f.value);
  if (f.unit === "ratio") return f.value.toFixed(2);
  return String(f.value);
}

const hex = (n: number): string => `0x${n.toString(16)}`;

/** Hover text for one block: what it is, what asked for it, and the stack that allocated it. */
export function describeBlock(view: SegmentMapView, seg: SegSegment, b: SegBlock): string {
  const lines = [
    `${b.count > 1 ? `${b.count} ${b.state} blocks` : `${b.state} block`} at ${hex(seg.address + b.offset)}`,
    `size ${formatBytes(b.size)}` + (b.state === "free" ? "" : `, requested ${formatBytes(b.requested_size)}`),
    `stream ${b.stream}` + (b.tag ? `, tag ${b.tag}` : ""),
  ];
  const stack = view.stacks[b.stack];
  if (stack !== undefined && stack.frames.length > 0) {
    if (stack.site) lines.push(`allocated at ${stack.site}`);
    lines.push(...stack.frames.map((f) => `  ${f}`));
  }
  return lines.join("\n");
}

function describeSegment(seg: SegSegment): string {
  const used = seg.blocks.filter((b) => b.state !== "free").reduce((s, b) => s + b.size, 0);
  return (
    `${seg.expandable ? "expandable mapping" : "segment"} ${hex(seg.address)}: ${formatBytes(seg.size)}, ` +
    `${seg.pool} pool, stream ${seg.stream}, ${formatBytes(used)} in use`
  );
}

/** Draw `view` into `el`; returns a function that removes what it drew and its listeners. */
export function renderSegmentMap(el: HTMLElement, view: unknown): () => void {
  const root = node("div", "gpumem-segments");
  el.append(root);
  let parsed: SegmentMapView;
  try {
    parsed = parseSegmentMap(view);
  } catch (e) {
    root.append(node("div", "gpumem-segments-error", e instanceof Error ? e.message : String(e)));
    return () => root.remove();
  }
  const v = parsed;
  const reserved = v.segments.reduce((s, g) => s + g.size, 0);
  const when = v.t === null ? "before the trace" : v.x_unit === "s" ? new Date(v.t * 1000).toISOString() : `entry ${v.t}`;
  root.append(node("div", "gpumem-segments-title", `cuda:${v.device} at ${when}: ${v.segments.length} segments, ${formatBytes(reserved)} reserved`));
  const legend = node("div", "gpumem-segments-legend");
  for (const [key, label] of LEGEND) {
    const item = node("span", "gpumem-segments-key");
    const swatch = node("span", `gpumem-swatch gpumem-swatch-${key}`);
    swatch.style.cssText = `display:inline-block;width:10px;height:10px;margin:0 4px;background:${COLORS[key] ?? ""}`;
    item.append(swatch, document.createTextNode(label));
    legend.append(item);
  }
  root.append(legend);

  const details = node("pre", "gpumem-segments-details", "Hover over a block for its details.");
  details.style.cssText = "white-space:pre-wrap;min-height:4em;margin:4px 0";
  const bars = node("div", "gpumem-segments-bars");
  const largest = Math.max(1, ...v.segments.map((s) => s.size));
  v.segments.forEach((seg, si) => {
    const row = node("div", "gpumem-segment");
    row.title = describeSegment(seg);
    const label = node("div", "gpumem-segment-label", `${hex(seg.address)} ${formatBytes(seg.size)} ${seg.pool}${seg.expandable ? " expandable" : ""}`);
    label.style.cssText = "font:11px monospace";
    const bar = node("div", "gpumem-segment-bar");
    bar.style.cssText = `position:relative;height:14px;width:${Math.max(MIN_BAR_PERCENT, (100 * seg.size) / largest)}%;background:${COLORS["free"]};`;
    seg.blocks.forEach((b, bi) => {
      if (b.state === "free") return; // the bar's background
      const block = node("div", `gpumem-block gpumem-block-${b.state}`);
      block.dataset["segment"] = String(si);
      block.dataset["block"] = String(bi);
      const waste = b.size > 0 ? Math.max(0, b.size - b.requested_size) / b.size : 0;
      const fill = COLORS[b.state] ?? "";
      block.style.cssText =
        `position:absolute;top:0;height:100%;left:${(100 * b.offset) / seg.size}%;width:${(100 * b.size) / seg.size}%;` +
        `background:${waste > 0.01 ? `linear-gradient(90deg, ${fill} ${100 * (1 - waste)}%, #e45756 0)` : fill};` +
        "box-shadow:inset -1px 0 #fff";
      bar.append(block);
    });
    const free = seg.blocks.filter((b) => b.state === "free").reduce((s, b) => s + b.size, 0);
    bar.dataset["segment"] = String(si);
    bar.dataset["free"] = String(free);
    row.append(label, bar);
    bars.append(row);
  });
  if (v.hidden.segments > 0) {
    bars.append(node("div", "gpumem-segments-hidden", `${v.hidden.segments} smaller segments not shown (${formatBytes(v.hidden.bytes)})`));
  }
  root.append(bars, details);

  const onOver = (e: Event): void => {
    const target = e.target instanceof HTMLElement ? e.target : null;
    const si = Number(target?.dataset["segment"]);
    const seg = v.segments[si];
    if (seg === undefined) return;
    const b = target?.dataset["block"] !== undefined ? seg.blocks[Number(target.dataset["block"])] : undefined;
    details.textContent = b !== undefined ? describeBlock(v, seg, b) : describeSegment(seg);
  };
  bars.addEventListener("mouseover", onOver);

  const figures = node("table", "gpumem-fragmentation");
  for (const f of v.figures) {
    const tr = node("tr", "");
    tr.dataset["key"] = f.key;
    tr.append(node("th", "", f.label), node("td", "", formatFigure(f)), node("td", "gpumem-meaning", f.meaning));
    figures.append(tr);
  }
  root.append(node("h4", "", "Fragmentation"), figures);
  const advice = node("ul", "gpumem-advice");
  for (const a of v.advice) {
    const li = node("li", "");
    li.dataset["setting"] = a.setting;
    const figure = v.figures.find((f) => f.key === a.figure);
    const shown = figure !== undefined ? formatFigure({ ...figure, value: a.value }) : String(a.value);
    li.append(
      node("code", "", a.setting),
      node("div", "", a.why),
      node("div", "gpumem-advice-trigger", `because ${figure?.label ?? a.figure} = ${shown}`),
      node("div", "gpumem-advice-how", a.how),
    );
    advice.append(li);
  }
  root.append(node("h4", "", "Advice"), v.advice.length > 0 ? advice : node("div", "", "No allocator setting is called for at this instant."));
  return () => {
    bars.removeEventListener("mouseover", onOver);
    root.remove();
  };
}
