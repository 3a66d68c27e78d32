// A stand-in for the kernel on a page without Jupyter: a model object with anywidget's interface
// (get/set/on/off/save_changes/send) and trait values packed exactly as gpumem_widget/protocol.py
// packs them, with binary buffers as DataViews at odd byte offsets, as ipywidgets may deliver them.

const GiB = 1024 ** 3;
const MiB = 1024 ** 2;
export const DEVICE_FIELDS = ["allocated", "reserved", "active", "process_used", "others_used", "device_used"];

export class FakeModel {
  constructor(state) {
    this.state = { ...state };
    this.handlers = new Map();
    this.widget_manager = {};
  }
  get(name) {
    return this.state[name];
  }
  /** Like Backbone's set: change events fire synchronously. */
  set(name, value) {
    this.state[name] = value;
    for (const cb of this.handlers.get(`change:${name}`) ?? []) cb();
  }
  on(event, cb) {
    if (!this.handlers.has(event)) this.handlers.set(event, new Set());
    this.handlers.get(event).add(cb);
  }
  off(event, cb) {
    if (event == null) this.handlers.clear();
    else if (cb == null) this.handlers.delete(event);
    else this.handlers.get(event)?.delete(cb);
  }
  save_changes() {}
  /** Custom messages to the kernel: `answer` (when set) plays the kernel, replying a moment later. */
  send(msg) {
    this.sent = [...(this.sent ?? []), msg];
    const reply = this.answer?.(msg);
    if (reply) setTimeout(() => this.trigger("msg:custom", reply), 10);
  }
  /** Fire an event as Backbone's trigger does (custom messages, comm_live_update). */
  trigger(event, ...args) {
    for (const cb of this.handlers.get(event) ?? []) cb(...args);
  }
  listenerCount() {
    let n = 0;
    for (const set of this.handlers.values()) n += set.size;
    return n;
  }
}

export function timelineColumns(numDevices) {
  const cols = ["t"];
  for (let d = 0; d < numDevices; d++) for (const f of DEVICE_FIELDS) cols.push(`cuda:${d}/${f}`);
  cols.push("host/rss");
  return cols;
}

let offsetToggle = 0;

/** A DataView over a copy of `typed`'s bytes, starting at an odd offset every other call. */
function dataView(typed) {
  const pad = offsetToggle++ % 2 === 0 ? 3 : 0;
  const bytes = new Uint8Array(typed.byteLength + pad);
  bytes.set(new Uint8Array(typed.buffer, typed.byteOffset, typed.byteLength), pad);
  return new DataView(bytes.buffer, pad, typed.byteLength);
}

/** protocol.pack_table: `data` maps column name to an array of numbers (NaN for nothing). */
export function packTable(columns, data) {
  const n = columns.length ? data[columns[0]].length : 0;
  return {
    n,
    columns: [...columns],
    dtypes: columns.map((c) => (c === "t" ? "f8" : "f4")),
    buffers: columns.map((c) => dataView(c === "t" ? Float64Array.from(data[c]) : Float32Array.from(data[c]))),
  };
}

/** Memory of a training-like session: steps that allocate and free, a reserve that only grows. */
export function memoryAt(t, device) {
  const phase = t % 60;
  const base = (2 + device) * GiB;
  const step = phase < 40 ? ((phase * 7) % 5) * 0.8 * GiB : 0;
  const allocated = base + step + (t % 3) * 64 * MiB;
  const reserved = Math.max(allocated, base + 4.5 * GiB);
  const process = reserved + 530 * MiB;
  const others = 1.2 * GiB;
  return { allocated, reserved, active: allocated, process_used: process, others_used: others, device_used: process + others };
}

export function timelineData(numDevices, t0, dt, n) {
  const cols = timelineColumns(numDevices);
  const data = Object.fromEntries(cols.map((c) => [c, new Array(n)]));
  for (let i = 0; i < n; i++) {
    const t = t0 + i * dt;
    data.t[i] = t;
    for (let d = 0; d < numDevices; d++) {
      const m = memoryAt(t - t0, d);
      for (const f of DEVICE_FIELDS) data[`cuda:${d}/${f}`][i] = m[f];
    }
    data["host/rss"][i] = 3 * GiB + (i / n) * 512 * MiB;
  }
  return { cols, data };
}

export function devicesTrait(numDevices) {
  return Array.from({ length: numDevices }, (_, i) => ({
    index: i,
    name: "NVIDIA H200",
    uuid: `GPU-0000000${i}-fake`,
    total: 150754820096,
    nvml: true,
  }));
}

export function statusTrait(numDevices, runningCell = null, runningStarted = null) {
  const kernel = "/usr/bin/python -m ipykernel_launcher -f kernel-1.json";
  return {
    mode: numDevices > 0 ? "cuda" : "host",
    sampler: "running",
    busy_interval: 0.01,
    idle_interval: 0.5,
    peak_mode: "exact",
    readers: { torch: { ok: numDevices > 0, reason: numDevices > 0 ? null : "no CUDA device: host-memory mode" }, nvml: { ok: true, reason: null }, host: { ok: true, reason: null } },
    error: null,
    running_cell: runningCell,
    running_started: runningCell === null ? null : runningStarted,
    session_peak: Array.from({ length: numDevices }, (_, d) => ({ device: d, allocated: 7.2 * GiB, reserved: 8 * GiB })),
    // As Session._processes writes it: this kernel and another job on every device.
    processes: Object.fromEntries(
      Array.from({ length: numDevices }, (_, d) => [
        String(d),
        [
          { pid: 4242, used: (d === 0 ? 7 : 0.5) * GiB, self: true, name: kernel },
          { pid: 777, used: 1.2 * GiB, self: false, name: "python train.py --epochs 3" },
        ],
      ]),
    ),
  };
}

const SOURCES = [
  "model = build_model().cuda()\nopt = torch.optim.AdamW(model.parameters())",
  "for step in range(100):\n    loss = model(batch).loss\n    loss.backward()\n    opt.step()\n    opt.zero_grad()",
  "x = torch.randn(1 << 30, device='cuda')  # <b>not html</b>",
  "del x\ntorch.cuda.empty_cache()",
  "evaluate(model, val_loader)",
];

/** `count` cells spread over [t0, t1]; every 7th raised, every 11th ran out of memory. */
export function cellsTrait(numDevices, t0, t1, count) {
  const span = (t1 - t0) / count;
  return Array.from({ length: count }, (_, i) => {
    const n = i + 1;
    const started = t0 + i * span + span * 0.1;
    const duration = span * 0.7;
    const oom = n % 11 === 0;
    const error = oom ? "OutOfMemoryError" : n % 7 === 0 ? "ValueError" : null;
    const devices = Array.from({ length: numDevices }, (_, d) => {
      const before = memoryAt(started - t0, d);
      const after = memoryAt(started + duration - t0, d);
      return {
        device: d,
        allocated_before: before.allocated,
        allocated_after: after.allocated,
        reserved_before: before.reserved,
        reserved_after: after.reserved,
        peak_allocated: Math.max(before.allocated, after.allocated) + 256 * MiB,
        peak_reserved: Math.max(before.reserved, after.reserved),
        peak_exact: true,
        alloc_retries: oom ? 1 : 0,
        ooms: oom ? 1 : 0,
        process_used_after: after.process_used,
        device_used_after: after.device_used,
        others_used_after: after.others_used,
        delta_allocated: after.allocated - before.allocated,
        delta_reserved: after.reserved - before.reserved,
        outside_pytorch: after.process_used - after.reserved,
      };
    });
    return {
      execution_count: n,
      cell_id: `cell-${n}`,
      source: SOURCES[i % SOURCES.length],
      started,
      duration,
      error,
      oom,
      host_rss_before: 3 * GiB,
      host_rss_after: 3 * GiB + 4 * MiB,
      host_rss_peak: 3 * GiB + 9 * MiB,
      devices,
    };
  });
}
