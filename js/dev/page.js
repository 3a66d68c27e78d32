// Drives the built widget with a fake model: `?samples=20000&devices=1&cells=12&live=1`.
// The benchmark uses `window.gpumemDev`.
import widget from "../../gpumem_widget/static/widget.js";
import { cellsTrait, devicesTrait, FakeModel, memoryAt, packTable, statusTrait, timelineColumns, timelineData } from "./fake.js";

const params = new URLSearchParams(location.search);
const num = (k, d) => (params.has(k) ? Number(params.get(k)) : d);

const dev = { model: null, cleanups: [], cols: [], tail: null, t0: 0, dt: 0.01, next: 0, devices: 0, cells: [], running: null };

function emptyTail() {
  return Object.fromEntries(dev.cols.map((c) => [c, []]));
}

/** A fresh widget on `samples` samples spread over `span` seconds (default: 100 per second). */
function mount({ samples = 20000, span = samples / 100, devices = 1, cells = 12, width = null, target = "stage", windowed = null } = {}) {
  unmount();
  dev.running = null;
  dev.devices = devices;
  dev.dt = span / samples;
  dev.t0 = Date.now() / 1000 - samples * dev.dt;
  const { cols, data } = timelineData(devices, dev.t0, dev.dt, samples);
  dev.cols = cols;
  dev.next = samples;
  dev.tail = emptyTail();
  dev.cells = cellsTrait(devices, dev.t0, dev.t0 + samples * dev.dt, cells);
  dev.model = new FakeModel({
    devices: devicesTrait(devices),
    status: statusTrait(devices),
    cells: dev.cells,
    timeline_base: packTable(cols, data),
    timeline_tail: packTable(cols, dev.tail),
  });
  if (windowed !== null) windowLedger(windowed);
  const el = document.getElementById(target);
  el.style.width = width ? `${width}px` : "";
  dev.cleanups.push(widget.render({ model: dev.model, el }));
  return dev.model;
}

/** Play the kernel's ledger window (publisher.py): the newest `size` records in `cells`, a band
 * per cell in `cell_bands`, and pages of older records answered on request (LedgerPages). */
function windowLedger(size) {
  const all = dev.cells;
  const first = Math.max(0, all.length - size);
  const outcome = (c) => (c.oom ? 2 : c.error === "KeyboardInterrupt" ? 3 : c.error ? 1 : 0);
  dev.model.state.cells = all.slice(first);
  dev.model.state.ledger_extent = { total: all.length, first, bands_first: 0, epoch: 0 };
  dev.model.state.cell_bands = packTable(["t", "duration", "execution_count", "outcome"], {
    t: all.map((c) => c.started),
    duration: all.map((c) => c.duration),
    execution_count: all.map((c) => c.execution_count),
    outcome: all.map(outcome),
  });
  dev.model.answer = (msg) => {
    if (msg.type !== "cells_page") return null;
    const before = msg.execution_count != null ? all.findIndex((c) => c.execution_count === msg.execution_count) + 1 : msg.before;
    const start = Math.max(0, before - msg.limit);
    return { type: "cells_page", epoch: 0, first: start, records: all.slice(start, before) };
  };
}

function addView(target = "stage2") {
  dev.cleanups.push(widget.render({ model: dev.model, el: document.getElementById(target) }));
}

function unmount() {
  for (const c of dev.cleanups.splice(0)) c();
}

/** Append `k` samples to the tail and publish it, as the kernel's publisher does. */
function publishTail(k = 1) {
  for (let j = 0; j < k; j++) {
    const t = dev.t0 + dev.next++ * dev.dt;
    dev.tail.t.push(t);
    for (let d = 0; d < dev.devices; d++) {
      const m = memoryAt(t - dev.t0, d);
      for (const f of Object.keys(m)) dev.tail[`cuda:${d}/${f}`].push(m[f]);
    }
    dev.tail["host/rss"].push(3.5 * 1024 ** 3);
  }
  dev.model.set("timeline_tail", packTable(dev.cols, dev.tail));
  return dev.t0 + (dev.next - 1) * dev.dt;
}

/** Re-send the whole timeline as a new base (the rare, expensive update). */
function publishBase() {
  const { data } = timelineData(dev.devices, dev.t0, dev.dt, dev.next);
  dev.tail = emptyTail();
  dev.model.set("timeline_base", packTable(dev.cols, data));
  dev.model.set("timeline_tail", packTable(dev.cols, dev.tail));
}

/** The notebook imported torch and the kernel found `n` devices: as the publisher sends it, in
 * one update, the devices, a base with each device's columns (empty before now, the host samples
 * kept), an empty tail and the CUDA status. */
function attachDevices(n) {
  const { cols, data } = timelineData(n, dev.t0, dev.dt, dev.next);
  for (const c of cols) if (c.startsWith("cuda:")) data[c] = data[c].map((v, i) => (i < dev.next - 1 ? NaN : v));
  dev.devices = n;
  dev.cols = cols;
  dev.tail = emptyTail();
  dev.model.set("devices", devicesTrait(n));
  dev.model.set("timeline_base", packTable(cols, data));
  dev.model.set("timeline_tail", packTable(cols, dev.tail));
  dev.model.set("status", statusTrait(n));
}

function nextCount() {
  return (dev.cells[dev.cells.length - 1]?.execution_count ?? 0) + 1;
}

/** A cell starts running: the status names it and when it started (the next sample's time). */
function startCell() {
  const n = nextCount();
  dev.running = { n, started: dev.t0 + dev.next * dev.dt };
  dev.model.set("status", statusTrait(dev.devices, n, dev.running.started));
  return n;
}

/** The running cell (or a new one, 3 s long) ends: its record lands, the status goes idle. */
function addCell({ oom = false } = {}) {
  const n = dev.running?.n ?? nextCount();
  const tNow = dev.t0 + dev.next * dev.dt;
  const started = dev.running?.started ?? tNow - 3;
  dev.running = null;
  const [cell] = cellsTrait(dev.devices, started, tNow, 1);
  const source = `# cell ${n}\nx = torch.empty(${n} << 28, device="cuda")`;
  dev.cells = [...dev.cells, { ...cell, execution_count: n, started, duration: tNow - started, oom, error: oom ? "OutOfMemoryError" : null, source }];
  dev.model.set("cells", dev.cells);
  dev.model.set("status", statusTrait(dev.devices));
  return n;
}

/** A state recorded by record_state.py, with its buffers put back as ipywidgets does (DataViews). */
async function mountRecorded(path, { width = null } = {}) {
  const saved = await (await fetch(`/${path.replace(/^\/+/, "")}`)).json();
  const state = structuredClone(saved.state);
  saved.buffer_paths.forEach((bufferPath, i) => {
    const bytes = Uint8Array.from(atob(saved.buffers[i]), (c) => c.charCodeAt(0));
    let obj = state;
    for (const key of bufferPath.slice(0, -1)) obj = obj[key];
    obj[bufferPath[bufferPath.length - 1]] = new DataView(bytes.buffer);
  });
  unmount();
  dev.model = new FakeModel(state);
  const el = document.getElementById("stage");
  el.style.width = width ? `${width}px` : "";
  dev.cleanups.push(widget.render({ model: dev.model, el }));
}

window.gpumemDev = { mount, mountRecorded, unmount, addView, publishTail, publishBase, attachDevices, startCell, addCell, get model() { return dev.model; }, timelineColumns };

if (params.has("state")) {
  mountRecorded(params.get("state"));
} else if (!params.has("manual")) {
  mount({ samples: num("samples", 20000), devices: num("devices", 1), cells: num("cells", 12) });
  let live = num("live", 1) === 1 ? setInterval(() => publishTail(25), 250) : null;
  const button = (id, fn) => document.getElementById(id).addEventListener("click", fn);
  button("live", (e) => {
    if (live) {
      clearInterval(live);
      live = null;
      e.target.textContent = "resume live";
    } else {
      live = setInterval(() => publishTail(25), 250);
      e.target.textContent = "pause live";
    }
  });
  button("cell", () => {
    startCell();
    setTimeout(() => addCell(), 3000);
  });
  button("oom", () => addCell({ oom: true }));
  button("theme", () => {
    const light = document.body.dataset.jpThemeLight === "true";
    document.body.dataset.jpThemeLight = String(!light);
  });
  button("narrow", () => {
    const el = document.getElementById("stage");
    el.style.width = el.style.width ? "" : "400px";
  });
  button("second", () => addView());
  button("bad", () => dev.model.set("timeline_tail", { n: 3, columns: ["t"], dtypes: ["f8"], buffers: [new DataView(new ArrayBuffer(5))] }));
}
