"""``voxwire serve`` says clearly what is missing, and downloads nothing."""

import subprocess
import sys

import pytest


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


def serve(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "server", "serve", "--port", "1", *args], capture_output=True, text=True, timeout=timeout
    )


def test_a_missing_piper_voice_is_one_line_and_exit_2(tmp_path):
    run = serve("--piper-voice", str(tmp_path / "missing.onnx"))
    assert run.returncode == 2
    assert "Traceback" not in run.stderr
    assert "missing.onnx" in run.stderr and len(run.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "args,says",
    [
        (["--chunk-ms", "100"], "--chunk-ms (default_chunk_ms) must be from 150 to 250, got 100"),
        (["--chunk-ms", "0"], "--chunk-ms (default_chunk_ms) must be from 150 to 250, got 0"),
        (["--sample-rate", "96000"], "--sample-rate (default_sample_rate) must be from 8000 to 48000, got 96000"),
        (["--step-timeout", "0.03"], "--step-timeout (step_timeout) must be at least 1, got 0.03"),
        (["--max-utterances-total", "0"], "--max-utterances-total ([limits] max_utterances_total) must be at least 1"),
    ],
)
def test_settings_out_of_their_range_refuse_to_start(args, says):
    run = serve(*args)
    assert run.returncode == 2 and says in run.stderr and "Traceback" not in run.stderr


def test_a_default_voice_the_engine_lacks_refuses_to_start():
    run = serve("--voice", "nobody")  # the engine loads, then the voice is checked
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "'nobody' is not a voice of the piper engine (its voices: joe)" in run.stderr


def test_help_names_each_settings_file_key():
    run = subprocess.run([sys.executable, "-m", "server", "serve", "--help"], capture_output=True, text=True, timeout=60)
    text = " ".join(run.stdout.split())  # argparse wraps lines
    assert "file: default_chunk_ms" in text and "file: [limits] max_text_chars" in text
