// The Python side's real output (test/fixtures/wire.json, written by scripts/make_js_fixtures.py), as the
// browser receives it: JSON state with each binary buffer put back at its path as a DataView at
// an odd byte offset, as @jupyter-widgets/base's put_buffers may hand it over.
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

export interface Fixture {
  state: Record<string, unknown>;
  buffer_paths: (string | number)[][];
  buffers: string[];
  expected: { base: Record<string, (number | null)[]>; tail: Record<string, (number | null)[]>; cells: Record<string, unknown>[] };
}

// A path, not a URL: under happy-dom, URL is the page's class, which node:fs does not take.
const PATH = join(dirname(fileURLToPath(import.meta.url)), "fixtures", "wire.json");
export const fixture = JSON.parse(readFileSync(PATH, "utf8")) as Fixture;

export function received(): Record<string, unknown> {
  const state = structuredClone(fixture.state);
  fixture.buffer_paths.forEach((path, i) => {
    const bytes = Buffer.from(fixture.buffers[i] as string, "base64");
    const padded = new Uint8Array(bytes.length + 1);
    padded.set(bytes, 1);
    let obj = state as Record<string | number, unknown>;
    for (const key of path.slice(0, -1)) obj = obj[key] as Record<string | number, unknown>;
    obj[path[path.length - 1] as string | number] = new DataView(padded.buffer, 1, bytes.length);
  });
  return state;
}
