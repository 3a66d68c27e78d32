// A static file server for the dev page (ES modules do not load from file:// URLs).
// `npm run dev` serves the repository root; open /js/dev/index.html.
import { createReadStream, statSync } from "node:fs";
import { createServer } from "node:http";
import { extname, join, normalize, resolve, sep } from "node:path";
import { fileURLToPath } from "node:url";

const TYPES = { ".html": "text/html", ".js": "text/javascript", ".mjs": "text/javascript", ".css": "text/css", ".json": "application/json" };
export const REPO_ROOT = resolve(fileURLToPath(new URL("../..", import.meta.url)));

/** Serve `root` on 127.0.0.1:`port` (0 picks a free port); resolves to { server, url }. */
export function serve(dir = REPO_ROOT, port = 0) {
  const root = resolve(dir);
  const server = createServer((req, res) => {
    const path = normalize(decodeURIComponent(new URL(req.url ?? "/", "http://x").pathname));
    const file = join(root, path);
    let ok = false;
    try {
      ok = (file === root || file.startsWith(root + sep)) && statSync(file).isFile();
    } catch {
      ok = false;
    }
    if (!ok) {
      res.writeHead(404).end("not found");
      return;
    }
    res.writeHead(200, { "content-type": TYPES[extname(file)] ?? "application/octet-stream", "cache-control": "no-store" });
    createReadStream(file).pipe(res);
  });
  return new Promise((done) =>
    server.listen(port, "127.0.0.1", () => {
      const { port: p } = server.address();
      done({ server, url: `http://127.0.0.1:${p}` });
    }),
  );
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const { url } = await serve(REPO_ROOT, Number(process.env.PORT ?? 8765));
  console.log(`dev page: ${url}/js/dev/index.html (Ctrl-C to stop)`);
}
