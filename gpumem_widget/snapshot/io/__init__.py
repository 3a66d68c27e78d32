"""Reading and writing snapshot files: the first stage, which imports only `model` below it.

`load` reads `_dump_snapshot` pickles and `_snapshot()` dicts under byte limits with a
data-only unpickler (or the C reader, `c_reader` over `_rows.c`) into `model.data`'s columns;
`isolate` does it in a child process under a memory cap, and `columnar` caches the columns for
memory-mapping; `validate` refuses what cannot be drawn. `record` (torch's recorder, whose
files `load` reads) and `export` (the pickle memory_viz reads) are here too: they are the
other two ends of a file. Nothing here imports a view: what the conversion child computes
beyond the columns is named by the caller (`child.ChildViews`).
"""
