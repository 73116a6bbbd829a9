"""The pinned official commit's own files, for what no PyPI package carries yet.

The oracle package (cosyvoice-minicpmo, official files of 2025-06-27) predates the RAS fix
(f2ddcbe) and the min-length masking of the pinned commit. ``official/`` holds those two
files verbatim from FunAudioLLM/CosyVoice at PINNED_COMMIT; ``load`` checks each against
its git blob id before importing it, so an edited copy fails instead of testing a copy.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import types
from pathlib import Path

PINNED_COMMIT = "ace7c47f41bbd303aa6bf1ea80e6f9fbd595cd40"  # FunAudioLLM/CosyVoice, 2026-03-16
OFFICIAL = Path(__file__).parent / "official"
# file -> (its path upstream, git blob id at PINNED_COMMIT: `git rev-parse <commit>:<path>`)
BLOBS = {
    "common.py": ("cosyvoice/utils/common.py", "3f235a62e0455abbbf028635978b800e8be951af"),
    "llm.py": ("cosyvoice/llm/llm.py", "e8e81d942af886d85b1331f9ce8b72ba42f8843b"),
    # CosyVoice2Model: the streaming schedule (hop growth) and token2wav's vocoder seams.
    "model.py": ("cosyvoice/cli/model.py", "92a15d985dfbca4bb676d3fdc02732be1d07c461"),
}


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _stub_onnx_utils() -> None:
    # The pinned llm.py imports cosyvoice.utils.onnx (training-time token extraction,
    # onnxruntime sessions on CUDA) at module level; nothing the LM's inference touches.
    if "cosyvoice.utils.onnx" in sys.modules:
        return
    stub = types.ModuleType("cosyvoice.utils.onnx")
    stub.SpeechTokenExtractor = object  # type: ignore[attr-defined]
    stub.online_feature = False  # type: ignore[attr-defined]
    stub.onnx_path = ""  # type: ignore[attr-defined]
    sys.modules["cosyvoice.utils.onnx"] = stub


def load(name: str) -> types.ModuleType:
    """Import ``official/<name>`` (after checking it is byte-identical to the pinned blob)
    as the module ``cosyvoice_pinned.<stem>``."""
    path = OFFICIAL / name
    upstream, blob = BLOBS[name]
    actual = git_blob_id(path.read_bytes())
    if actual != blob:
        raise AssertionError(f"{path} is not {upstream} at {PINNED_COMMIT[:7]} (blob {actual}, want {blob})")
    module_name = f"cosyvoice_pinned.{path.stem}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    if name == "llm.py":
        _stub_onnx_utils()
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module
