// One Debian Chromium for a whole test run (tests/e2e/drivers.py, `shared_browser`): launched
// here with the arguments every driver used to launch it with; prints the endpoint the drivers
// connect to, and closes Chromium when its standard input ends.
//
// Usage: node browser_server.mjs /usr/bin/chromium

import { chromium } from "playwright-core";
import { BROWSER_ARGS } from "./browser.mjs";

const server = await chromium.launchServer({ executablePath: process.argv[2], headless: true, args: BROWSER_ARGS });
process.stdout.write(`${server.wsEndpoint()}\n`);
process.stdin.on("end", async () => {
  await server.close();
  process.exit(0);
});
process.stdin.resume();
