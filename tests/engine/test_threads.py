"""engine/threads.py: the one place that sizes torch's and onnxruntime's CPU pools."""

from __future__ import annotations

import pytest
import torch

from engine.threads import configure_cpu_threads, onnx_session_options, physical_cores


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_the_default_is_the_physical_cores_capped():
    n = configure_cpu_threads()
    assert n == min(physical_cores(), 4) and torch.get_num_threads() == n
    assert configure_cpu_threads(max_threads=1) == 1 and torch.get_num_threads() == 1


def test_an_exact_count_is_set_as_asked():
    assert configure_cpu_threads(2) == 2 and torch.get_num_threads() == 2
    assert configure_cpu_threads(1) == 1 and torch.get_num_threads() == 1
    with pytest.raises(ValueError):
        configure_cpu_threads(0)


def test_onnxruntime_sessions_get_a_fixed_pool_that_does_not_spin():
    options = onnx_session_options(3)
    assert options.intra_op_num_threads == 3
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert onnx_session_options().intra_op_num_threads == 1
