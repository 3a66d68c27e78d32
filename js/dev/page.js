// Drives the built widget with a fake model: `?samples=20000&devices=1&cells=12&live=1`.
// The benchmark uses `window.gpumemDev`.
import widget from "../../gpumem_widget/static/widget.js";
import { cellsTrait, devicesTrait, FakeModel, memoryAt, packTable, statusTrait, timelineColumns, timelineData } from "./fake.js";

const params = new URLSearchParams(location.search);
const num = (k, d) => (params.has(k) ? Number(params.get(k)) : d);

const state = { model: null, cleanups: [], cols: [], tail: null, t0: 0, dt: 0.01, next: 0, devices: 0, cells: [] };

function emptyTail() {
  return Object.fromEntries(state.cols.map((c) => [c, []]));
}

function mount({ samples = 20000, devices = 1, cells = 12, width = null, target = "stage" } = {}) {
  unmount();
  state.devices = devices;
  state.dt = 0.01;
  state.t0 = Date.now() / 1000 - samples * state.dt;
  const { cols, data } = timelineData(devices, state.t0, state.dt, samples);
  state.cols = cols;
  state.next = samples;
  state.tail = emptyTail();
  state.cells = cellsTrait(devices, state.t0, state.t0 + samples * state.dt, cells);
  state.model = new FakeModel({
    devices: devicesTrait(devices),
    status: statusTrait(devices),
    cells: state.cells,
    timeline_base: packTable(cols, data),
    timeline_tail: packTable(cols, state.tail),
  });
  const el = document.getElementById(target);
  el.style.width = width ? `${width}px` : "";
  state.cleanups.push(widget.render({ model: state.model, el }));
  return state.model;
}

function addView(target = "stage2") {
  state.cleanups.push(widget.render({ model: state.model, el: document.getElementById(target) }));
}

function unmount() {
  for (const c of state.cleanups.splice(0)) c();
}

/** Append `k` samples to the tail and publish it, as the kernel's publisher does. */
function publishTail(k = 1) {
  for (let j = 0; j < k; j++) {
    const t = state.t0 + state.next++ * state.dt;
    state.tail.t.push(t);
    for (let d = 0; d < state.devices; d++) {
      const m = memoryAt(t - state.t0, d);
      for (const f of Object.keys(m)) state.tail[`cuda:${d}/${f}`].push(m[f]);
    }
    state.tail["host/rss"].push(3.5 * 1024 ** 3);
  }
  state.model.set("timeline_tail", packTable(state.cols, state.tail));
  return state.t0 + (state.next - 1) * state.dt;
}

/** Re-send the whole timeline as a new base (the rare, expensive update). */
function publishBase() {
  const { data } = timelineData(state.devices, state.t0, state.dt, state.next);
  state.tail = emptyTail();
  state.model.set("timeline_base", packTable(state.cols, data));
  state.model.set("timeline_tail", packTable(state.cols, state.tail));
}

function addCell({ oom = false } = {}) {
  const last = state.cells[state.cells.length - 1];
  const n = (last?.execution_count ?? 0) + 1;
  const tNow = state.t0 + state.next * state.dt;
  const [cell] = cellsTrait(state.devices, tNow - 3, tNow, 1);
  state.cells = [...state.cells, { ...cell, execution_count: n, oom, error: oom ? "OutOfMemoryError" : null, source: `# cell ${n}\nx = torch.empty(${n} << 28, device="cuda")` }];
  state.model.set("cells", state.cells);
}

window.gpumemDev = { mount, unmount, addView, publishTail, publishBase, addCell, get model() { return state.model; }, timelineColumns };

if (!params.has("manual")) {
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
  button("cell", () => addCell());
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
  button("bad", () => state.model.set("timeline_tail", { n: 3, columns: ["t"], dtypes: ["f8"], buffers: [new DataView(new ArrayBuffer(5))] }));
}
