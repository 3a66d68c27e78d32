// Bundles the widget's ES module and stylesheet into the Python package (path fixed by pyproject).
import * as esbuild from "esbuild";

const options = {
  entryPoints: ["src/widget.ts"],
  outfile: "../gpumem_widget/static/widget.js",
  bundle: true,
  format: "esm",
  target: "es2020",
  minify: true,
  // anywidget saves the module in the notebook's widget state: keep it small and self-contained.
  sourcemap: false,
  // The notice uPlot's MIT license asks for, since its own source carries none into the bundle.
  banner: { js: "/*! gpumem_widget frontend; includes uPlot (MIT License, Copyright (c) 2022 Leon Sorokin) */" },
  logLevel: "info",
};

if (process.argv.includes("--watch")) {
  const ctx = await esbuild.context(options);
  await ctx.watch();
} else {
  await esbuild.build(options);
}
