// The widget on a page whose model forwards `send` to snapshot_bridge.py (the real kernel code)
// and applies the traits it answers with, as ipywidgets would: window.snap.mount(scenario, theme).
import widget from "/gpumem_widget/static/widget.js";

function decode(saved) {
  const state = structuredClone(saved.state);
  saved.buffer_paths.forEach((path, i) => {
    const bytes = Uint8Array.from(atob(saved.buffers[i]), (c) => c.charCodeAt(0));
    let obj = state;
    for (const key of path.slice(0, -1)) obj = obj[key];
    obj[path[path.length - 1]] = new DataView(bytes.buffer);
  });
  return state;
}

class BridgeModel {
  constructor(state, scenario) {
    this.state = state;
    this.scenario = scenario;
    this.handlers = new Map();
    this.inflight = 0;
    this.widget_manager = {};
  }
  get(name) {
    return this.state[name];
  }
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
  send(msg) {
    this.inflight++;
    fetch(`/msg/${this.scenario}`, { method: "POST", body: JSON.stringify(msg) })
      .then((r) => r.json())
      .then((changed) => {
        const state = decode(changed);
        for (const name of Object.keys(state)) this.set(name, state[name]);
      })
      .finally(() => this.inflight--);
  }
}

let cleanup = null;
let model = null;

async function setTheme(theme) {
  const link = document.getElementById("theme");
  const href = `/themes/${theme}.css`;
  if (!link.href.endsWith(href)) {
    const loaded = new Promise((resolve) => link.addEventListener("load", resolve, { once: true }));
    link.href = href;
    await loaded;
  }
  document.body.dataset.jpThemeLight = String(theme === "light");
}

window.snap = {
  async mount(scenario, theme) {
    await setTheme(theme);
    cleanup?.();
    const stage = document.getElementById("stage");
    stage.replaceChildren();
    const saved = await (await fetch(`/state/${scenario}`)).json();
    model = new BridgeModel(decode(saved), scenario);
    cleanup = widget.render({ model, el: stage });
    stage.querySelector(".gpumem-tabs button[data-tab='snapshot']").click();
  },
  /** Replays the `drilldown` values showing `scenario` published, in order, a frame or two
   * apart, and records what each left on screen and every chart part removed after the first
   * draw (the chart, its canvas, overlay, readout, legend, the tab's body). */
  async replay(scenario, theme) {
    await setTheme(theme);
    cleanup?.();
    const stage = document.getElementById("stage");
    stage.replaceChildren();
    const stages = await (await fetch(`/stages/${scenario}`)).json();
    model = new BridgeModel({ drilldown: {}, drilldown_alive: {} }, scenario);
    cleanup = widget.render({ model, el: stage });
    stage.querySelector(".gpumem-tabs button[data-tab='snapshot']").click();
    const PARTS = ".gpumem-drilldown-body, .gpumem-drilldown-chart, .gpumem-drilldown-stage, .gpumem-drilldown-overlay, .gpumem-drilldown-readout, .gpumem-drilldown-legend, canvas";
    const removed = [];
    const observer = new MutationObserver((records) => {
      for (const r of records) {
        for (const n of r.removedNodes) if (n.nodeType === 1 && (n.matches(PARTS) || n.querySelector(PARTS))) removed.push(n.className || n.tagName);
        if (r.type === "attributes" && r.target.matches(PARTS) && r.target.hidden) removed.push(`${r.target.className} hidden`);
      }
    });
    const frames = () => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
    const seen = [];
    let canvas = null;
    for (const saved of stages) {
      const value = decode(saved).drilldown;
      model.set("drilldown", value);
      await frames();
      const chart = stage.querySelector(".gpumem-drilldown-chart");
      const drawn = !!chart && chart.getClientRects().length > 0 && chart.dataset.yMax !== undefined;
      if (drawn && canvas === null) {
        canvas = chart.querySelector("canvas");
        observer.observe(stage, { subtree: true, childList: true, attributes: true, attributeFilter: ["hidden"] });
      }
      const line = stage.querySelector(".gpumem-drilldown-stage-line");
      seen.push({
        kind: "loading" in value ? `loading ${value.stage}` : value.preview ? "preview" : value.partial ? "partial" : "devices" in value ? "complete" : Object.keys(value).join(","),
        drawn,
        sameCanvas: canvas !== null && chart?.querySelector("canvas") === canvas,
        stageLine: line && line.getClientRects().length > 0 ? line.textContent : null,
        message: stage.querySelector(".gpumem-drilldown-empty")?.getClientRects().length ? stage.querySelector(".gpumem-drilldown-empty").textContent : null,
      });
    }
    observer.disconnect();
    return { stages: seen, removed };
  },
  idle() {
    return model !== null && model.inflight === 0;
  },
};
