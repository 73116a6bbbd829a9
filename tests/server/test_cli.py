"""``voxwire serve`` says clearly what is missing, and downloads nothing."""

import subprocess
import sys


def test_cosyvoice2_without_a_model_names_every_missing_file(tmp_path):
    (tmp_path / "llm.pt").write_bytes(b"")
    run = subprocess.run(
        [sys.executable, "-m", "server", "serve", "--engine", "cosyvoice2", "--model-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )
    assert run.returncode == 2
    for name in ("cosyvoice2.yaml", "flow.pt", "hift.pt", "campplus.onnx", "speech_tokenizer_v2.onnx", "CosyVoice-BlankEN"):
        assert name in run.stderr
    assert "llm.pt" not in run.stderr.split("lacks:")[1].split(".\n")[0]
    assert "pretrained_models/README.md" in run.stderr


def test_help_documents_the_options():
    run = subprocess.run([sys.executable, "-m", "server", "serve", "--help"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0
    for flag in ("--engine", "--piper-backend", "--api-key", "--allow-origin", "--drain-seconds", "--step-timeout"):
        assert flag in run.stdout
