"""The engine in bf16 against fp32 and the reference: ``python -m voxwire.benchmarks.quality.precision``.

Three rows speak the whole quality corpus in this process, as in the full harness
(``listen.hear``: sentence by sentence, in a shuffled order, each after a pause): the
reference (Piper's library on onnxruntime, whole sentences) and Voxwire's engine (torch,
chunked) in fp32 and in bf16. The two engine rows are seeded alike
(``rows.EngineSession``): they draw the same noise, so they read every sentence with
nearly the same durations (bf16's encoder moves one now and then by a frame) and the same
joins, and what differs between them is the arithmetic alone. Then Whisper and DNSMOS hear
all three (``listen.judged``), the precision targets are checked (``targets.checks``), and
the seam ratios are compared join by join.

    python -m voxwire.benchmarks.quality.precision --out benchmarks/results/quality

Writes precision.json to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from voxwire.benchmarks import corpus
from voxwire.benchmarks.quality import rows as R
from voxwire.benchmarks.quality.listen import hear, judged
from voxwire.benchmarks.quality.score import Sample
from voxwire.benchmarks.quality.targets import checks

_T0 = time.monotonic()


def log(message: str) -> None:
    print(f"[precision {time.monotonic() - _T0:6.1f} s] {message}", file=sys.stderr, flush=True)


def paired_seams(fp32: list[Sample], bf16: list[Sample]) -> dict[str, Any]:
    """Each join's seam ratio in bf16 minus the same join's in fp32, over the sentences
    both read with the same joins."""
    diffs = [b - a for x, y in zip(fp32, bf16) if len(x.seams) == len(y.seams) for a, b in zip(x.seams, y.seams)]
    d = np.abs(np.asarray(diffs, np.float64))
    same = sum(len(x.seams) == len(y.seams) for x, y in zip(fp32, bf16))
    return {
        "sentences_with_the_same_joins": same,
        "joins": len(diffs),
        "median_abs_change": round(float(np.median(d)), 3) if diffs else float("nan"),
        "p99_abs_change": round(float(np.percentile(d, 99)), 3) if diffs else float("nan"),
        "max_abs_change": round(float(d.max()), 3) if diffs else float("nan"),
        "bf16_higher": int(sum(x > 0 for x in diffs)),
    }


def run(texts: list[str]) -> dict[str, Any]:
    rows = R.in_process()
    log(f"{len(rows)} rows speak {len(texts)} sentences")
    heard = asyncio.run(hear(rows, texts, log))
    result = judged(rows, heard, len(texts), log)
    result["config"].update(seed=R.ENGINE_SEED, precisions=R.ENGINES)
    return {**result, "paired_seams": paired_seams(heard[R.ENGINE_FP32], heard[R.ENGINE_BF16]),
            "targets": checks(result["rows"]), "elapsed_s": round(time.monotonic() - _T0, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m voxwire.benchmarks.quality.precision", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="write precision.json there")
    p.add_argument("--sentences", type=int, help="only the corpus's first N sentences (default: all)")
    args = p.parse_args(argv)
    results = run(corpus.quality()[: args.sentences])
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "precision.json").write_text(json.dumps(results, indent=2, allow_nan=True))
    from voxwire.benchmarks.tables import quality_precision
    from voxwire.benchmarks.report import quality_targets

    print("\n".join([*quality_precision(results), "", *quality_targets(results)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
