"""The soak's short form: 32 clients for a bounded time, then a leak check."""

import pytest

from voxwire.benchmarks.soak import BATCH_WIDTH, run

pytestmark = pytest.mark.slow  # a soak


def test_the_pre_warm_covers_every_batch_width_the_engine_steps():
    from voxwire.engine.piper.engine import CPU_MAX_BATCH

    assert BATCH_WIDTH == CPU_MAX_BATCH


def test_short_soak_leaks_nothing_and_loses_nothing():
    # RSS: every batch width's kernels are built by the pre-warm, but the rest of what
    # random traffic meets (segments' last windows, mixed batches) only by the warm-up, so
    # a short run allows more; the 60 s soak (benchmarks/README.md) holds to 48 MB. The
    # result cache's growth is subtracted (memory the server means to keep). Tasks, threads
    # and file descriptors must return exactly.
    result = run(clients=32, duration=20, warmup=20, seed=7, rss_tolerance_mb=128)
    assert result.unexpected == []
    # Refused: 32 clients reading as fast as they can are past what 2 cores keep in real
    # time, and the server says so (overloaded) rather than let every listener run dry.
    ended = result.served + result.cancels + result.disconnects + result.refused
    assert result.started > 0 and result.started == ended
    assert result.served and result.cancels and result.disconnects  # every path was exercised
    assert result.leaks == [], result.leaks
    assert result.final is not None and result.baseline is not None
    assert (result.final.tasks, result.final.threads, result.final.fds) == (
        result.baseline.tasks, result.baseline.threads, result.baseline.fds,
    )
