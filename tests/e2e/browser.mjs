// What every e2e driver shares: Debian's Chromium launched with no background networking, and
// every non-local request refused and recorded (a test fails if anything tried to leave).

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

/** A fresh-profile browser context for driving JupyterLab (plan: {profile, chromium, stepTimeoutMs}). */
export async function launchLab(plan) {
  const context = await chromium.launchPersistentContext(plan.profile, {
    executablePath: plan.chromium,
    headless: true,
    args: BROWSER_ARGS,
    viewport: { width: 1280, height: 1500 },
  });
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
