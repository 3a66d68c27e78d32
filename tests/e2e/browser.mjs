// What every e2e driver shares: Debian's Chromium with no background networking (launched once
// for the run by browser_server.mjs), and every non-local request refused and recorded (a test
// fails if anything tried to leave).

import { chromium } from "playwright-core";

export const BROWSER_ARGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
  "--no-first-run",
  "--disable-quic",
];

export function isLocal(url) {
  const u = new URL(url);
  if (["file:", "data:", "blob:", "about:"].includes(u.protocol)) return true;
  return ["127.0.0.1", "localhost", "[::1]"].includes(u.hostname);
}

/** A fresh context (no cookies, storage or cache) in the run's one Chromium (plan.browser, the
 * endpoint browser_server.mjs printed), with plan.stepTimeoutMs for every step. Closing its
 * browser (`context.browser().close()`) ends this connection, not Chromium. */
export async function newContext(plan, options = {}) {
  const browser = await chromium.connect(plan.browser);
  const context = await browser.newContext({ viewport: { width: 1280, height: 1500 }, ...options });
  context.setDefaultTimeout(plan.stepTimeoutMs);
  return context;
}

/** Refuse every non-local request and websocket, pushing its URL to `blocked`; `onLocal(url)`
 * sees each local request that goes through. */
export async function blockNonLocal(context, blocked, onLocal = () => {}) {
  await context.route("**/*", (route) => {
    const url = route.request().url();
    if (!isLocal(url)) {
      blocked.push(url);
      return route.abort("blockedbyclient");
    }
    onLocal(url);
    return route.continue();
  });
  await context.routeWebSocket(
    (url) => !isLocal(url.href),
    (ws) => {
      blocked.push(ws.url());
      ws.close();
    },
  );
}

/** Every visible text and every enabled control in the widget (`.gpumem-widget`): its WCAG
 * contrast ratio with what is behind it (the backgrounds of its ancestors, composited). */
export async function measureContrast(page) {
  return page.evaluate(() => {
    const parse = (c) => {
      const m = c.match(/rgba?\(([^)]+)\)/);
      if (!m) return [0, 0, 0, 0];
      const p = m[1].split(/[ ,/]+/).filter(Boolean).map(Number);
      return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
    };
    const over = (fg, bg) => [0, 1, 2].map((i) => fg[i] * fg[3] + bg[i] * (1 - fg[3])).concat(1);
    const background = (el) => {
      const layers = [];
      for (let e = el; e; e = e.parentElement) {
        const c = parse(getComputedStyle(e).backgroundColor);
        if (c[3] > 0) layers.push(c);
        if (c[3] >= 1) break;
      }
      let bg = [255, 255, 255, 1];
      for (const c of layers.reverse()) bg = over(c, bg);
      return bg;
    };
    const opacity = (el) => {
      let o = 1;
      for (let e = el; e; e = e.parentElement) o *= Number(getComputedStyle(e).opacity);
      return o;
    };
    const lum = ([r, g, b]) => {
      const f = (v) => ((v /= 255) <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4);
      return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
    };
    const ratio = (a, b) => {
      const [x, y] = [lum(a), lum(b)].sort((p, q) => q - p);
      return (x + 0.05) / (y + 0.05);
    };
    const root = document.querySelector(".gpumem-widget");
    const out = [];
    const check = (el, text, color) => {
      const bg = background(el);
      const fg = parse(color);
      fg[3] *= opacity(el);
      out.push({ text: text.slice(0, 60), tag: el.tagName.toLowerCase(), cls: String(el.className).slice(0, 60), ratio: ratio(over(fg, bg), bg), fg: color, bg: `rgb(${bg.slice(0, 3).map(Math.round).join(",")})` });
    };
    for (const el of root.querySelectorAll("*")) {
      if (!el.getClientRects().length || el.closest("[hidden]")) continue;
      if (el.disabled) continue; // WCAG 1.4.3 exempts inactive controls
      const style = getComputedStyle(el);
      if (style.visibility === "hidden") continue;
      const own = [...el.childNodes].filter((n) => n.nodeType === 3 && n.textContent.trim()).map((n) => n.textContent.trim()).join(" ");
      if (own) check(el, own, style.color);
      else if (el.matches("button, select")) check(el, el.textContent || el.tagName, style.color);
      if (el.matches("input[placeholder]") && !el.value) check(el, el.placeholder, getComputedStyle(el, "::placeholder").color);
    }
    return out;
  });
}
