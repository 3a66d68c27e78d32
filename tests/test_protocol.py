from __future__ import annotations

import numpy as np
import pytest

from gpumem_widget.wire import protocol


def test_columns_per_device_and_host() -> None:
    cols = protocol.timeline_columns(2)
    assert cols[0] == "t"
    assert cols[-1] == "host/rss"
    assert "cuda:1/process_used" in cols
    assert len(cols) == 2 + 2 * len(protocol.DEVICE_FIELDS)


def test_pack_round_trip_keeps_time_exact_and_values_close() -> None:
    t = np.array([1.7e9 + 0.123456, 1.7e9 + 0.173456])
    v = np.array([141e9, np.nan])
    table = protocol.pack_table(["t", "host/rss"], {"t": t, "host/rss": v})
    assert table["n"] == 2
    assert table["dtypes"] == ["f8", "f4"]
    assert all(isinstance(b, bytes) for b in table["buffers"])
    back = protocol.unpack_table(table)
    np.testing.assert_array_equal(back["t"], t)  # float64: sub-millisecond times survive
    assert back["host/rss"][0] == pytest.approx(141e9, rel=1e-7)
    assert np.isnan(back["host/rss"][1])


def test_pack_rejects_ragged_columns() -> None:
    with pytest.raises(ValueError, match="rows"):
        protocol.pack_table(["t", "x"], {"t": np.zeros(3), "x": np.zeros(2)})
