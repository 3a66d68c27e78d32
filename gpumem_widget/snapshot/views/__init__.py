"""Views of a snapshot, computed in the kernel at screen resolution: the browser only draws.

Each reads `model` (never `io`): (a) `active` memory by site, (b) what is `alive` at an
instant, (c) per-cell slices (`cells`), (d) `categories`, on the x axis and screen grid of
`grid` with the device `facts` they share; `segment_views` (the segment map, reserved over
time), `fragmentation` and `advice`, `search`, `compare`, and `attribution` (whose code an
allocation is charged to). `panel` composes them into the Snapshot tab's traits, `first` into
what a conversion child computes while it converts.
"""
