"""The snapshot as typed data and its replay: the stage `io` writes into and `views` read.

`data` holds the columns (trace entries, segments, interned frames and stacks); `replay`
turns a device's trace into allocation intervals and memory totals (`Snapshot`); `segments`
replays the caching allocator's segments and blocks to any instant; `anomalies` says what in a
replayed trace does not add up. `resident` gives back the pages of mapped columns, which
`Snapshot.release_pages` does between views; `tags` is the ``cell:N`` tag convention the
recorder writes and the views and the tab read. This stage imports nothing above it.
"""
