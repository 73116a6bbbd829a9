"""The soak's short form: 32 clients for a bounded time, then a leak check."""

import pytest

from voxwire.benchmarks.soak import run

pytestmark = pytest.mark.slow  # a soak


def test_short_soak_leaks_nothing_and_loses_nothing():
    # RSS: kernels for the few bucketed input shapes are built during the first minutes, so
    # a short run allows more; the 60 s soak (benchmarks/README.md) holds to 48 MB. The
    # result cache's growth is subtracted (memory the server means to keep). Tasks, threads
    # and file descriptors must return exactly.
    result = run(clients=32, duration=20, warmup=20, seed=7, rss_tolerance_mb=128)
    assert result.unexpected == []
    assert result.started > 0 and result.started == result.served + result.cancels + result.disconnects
    assert result.served and result.cancels and result.disconnects  # every path was exercised
    assert result.leaks == [], result.leaks
    assert result.final is not None and result.baseline is not None
    assert (result.final.tasks, result.final.threads, result.final.fds) == (
        result.baseline.tasks, result.baseline.threads, result.baseline.fds,
    )
