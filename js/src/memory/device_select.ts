// The device selector, shown when the kernel sees more than one CUDA device: "all devices" (one
// chart panel per device; ledger figures summed, peaks the largest) or one device's figures.
// The choice belongs to this view only, like zoom: nothing goes back to the kernel.

import type { DeviceChoice, Mode } from "./cells";
import type { DeviceInfo } from "../wire/protocol";

const ALL = "all";

export class DeviceSelect {
  readonly el: HTMLLabelElement;
  private readonly select: HTMLSelectElement;
  private optionsKey = "";

  constructor(onChange: (choice: DeviceChoice) => void) {
    this.el = document.createElement("label");
    this.el.className = "gpumem-device-select";
    this.el.hidden = true;
    this.select = document.createElement("select");
    this.select.title = "Which device the chart and the ledger show";
    this.select.addEventListener("change", () => onChange(this.select.value === ALL ? null : Number(this.select.value)));
    this.el.append("Device ", this.select);
  }

  update(devices: readonly DeviceInfo[], mode: Mode, choice: DeviceChoice): void {
    this.el.hidden = mode !== "cuda" || devices.length < 2;
    const key = JSON.stringify(devices.map((d) => [d.index, d.name]));
    if (key !== this.optionsKey) {
      this.optionsKey = key;
      const all = new Option("All devices", ALL);
      all.title = "One panel per device; ledger changes summed over devices, peaks the largest of any device";
      this.select.replaceChildren(all, ...devices.map((d) => new Option(`cuda:${d.index}`, String(d.index))));
      for (const [i, d] of devices.entries()) (this.select.options[i + 1] as HTMLOptionElement).title = d.name;
    }
    this.select.value = choice === null ? ALL : String(choice);
  }
}
