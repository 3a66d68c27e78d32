// Canvas colours come from the stylesheet's --gpumem-* custom properties, which follow
// JupyterLab's --jp-* theme variables (with fallbacks elsewhere). A theme switch changes those
// variables without any event on our element, so watch the attributes JupyterLab sets on <body>.

export interface Palette {
  fg: string;
  muted: string;
  grid: string;
  font: string;
  allocated: string;
  reserved: string;
  processUsed: string;
  othersUsed: string;
  deviceUsed: string;
  capacity: string;
  hostRss: string;
  estimate: string;
  band: string;
  bandAlt: string;
  bandError: string;
  bandOom: string;
  bandSelected: string;
  bandRunning: string;
}

const FALLBACK: Palette = {
  fg: "#1f1f1f",
  muted: "#616161",
  grid: "rgba(128, 128, 128, 0.25)",
  font: "11px system-ui, sans-serif",
  allocated: "#1f77d0",
  reserved: "#8e5bd6",
  processUsed: "#e0871a",
  othersUsed: "#c2417f",
  deviceUsed: "#8a8a8a",
  capacity: "#d63a2f",
  hostRss: "#2e9e6b",
  estimate: "#0f8a80",
  band: "rgba(128, 128, 128, 0.10)",
  bandAlt: "rgba(128, 128, 128, 0.05)",
  bandError: "rgba(224, 135, 26, 0.22)",
  bandOom: "rgba(214, 58, 47, 0.28)",
  bandSelected: "rgba(31, 119, 208, 0.22)",
  bandRunning: "rgba(46, 158, 107, 0.2)",
};

const VARIABLES: Record<Exclude<keyof Palette, "font">, string> = {
  fg: "--gpumem-fg",
  muted: "--gpumem-muted",
  grid: "--gpumem-grid",
  allocated: "--gpumem-allocated",
  reserved: "--gpumem-reserved",
  processUsed: "--gpumem-process-used",
  othersUsed: "--gpumem-others-used",
  deviceUsed: "--gpumem-device-used",
  capacity: "--gpumem-capacity",
  hostRss: "--gpumem-host-rss",
  estimate: "--gpumem-estimate",
  band: "--gpumem-band",
  bandAlt: "--gpumem-band-alt",
  bandError: "--gpumem-band-error",
  bandOom: "--gpumem-band-oom",
  bandSelected: "--gpumem-band-selected",
  bandRunning: "--gpumem-band-running",
};

/** The palette as styled on `el` (which must be in the document for styles to apply). */
export function readPalette(el: HTMLElement): Palette {
  const style = getComputedStyle(el);
  const palette: Palette = { ...FALLBACK };
  for (const [key, variable] of Object.entries(VARIABLES) as [keyof typeof VARIABLES, string][]) {
    const value = style.getPropertyValue(variable).trim();
    if (value) palette[key] = value;
  }
  if (style.fontFamily) palette.font = `11px ${style.fontFamily}`;
  return palette;
}

/** Calls `onChange` when JupyterLab (or the OS) switches between light and dark; returns a stop function. */
export function watchTheme(onChange: () => void): () => void {
  const observer = new MutationObserver(onChange);
  observer.observe(document.body, {
    attributes: true,
    attributeFilter: ["data-jp-theme-light", "data-jp-theme-name", "class"],
  });
  const media = window.matchMedia?.("(prefers-color-scheme: dark)");
  media?.addEventListener("change", onChange);
  return () => {
    observer.disconnect();
    media?.removeEventListener("change", onChange);
  };
}
