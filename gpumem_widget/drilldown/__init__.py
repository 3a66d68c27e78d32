"""The Snapshot tab's controller: the session's current snapshot, published as widget traits.

It sits above `snapshot` (which reads, models and views snapshots and knows no widget) and
below `live` (whose session holds one): it holds the widget, answers the browser's messages
and sets the ``drilldown*`` traits. Nothing in `snapshot` imports it.
"""
