"""A bench run as a markdown report and PNG plots."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks.machine import facts


def save_results(path: Path, args: argparse.Namespace, **figures: Any) -> None:
    """A benchmark's figures as JSON, with the machine and the arguments that made them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    arguments = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    path.write_text(json.dumps({"machine": facts(), "args": arguments, **figures}, indent=2))


def _ms(x: float | None) -> str:
    return "n/a" if x is None or x != x else f"{x:.0f}"


def markdown(r: dict[str, Any], plots: list[Path], command: str) -> str:
    m, h = r["machine"], r["headline"]
    lines = [
        "## Results",
        "",
        f"Command: `{command}`  ",
        f"Machine: {m['cores']} cores ({m['cpu']}), {m['memory_gb']} GB, {m['device']}, Python {m['python']}, "
        f"torch {m.get('torch', 'n/a')}, commit {m.get('commit')}  ",
        f"Engine: {r['config']['engine']} ({r['config']['piper_backend']} backend), "
        f"server: {r['config']['url'] or 'started by the bench on 127.0.0.1, result cache off'}; "
        f"utterances served from a result cache: {r['single']['cached'] + sum(row['cached'] for row in r['sweep'])}",
        "",
        "| headline | value |",
        "|---|---|",
        f"| TTFA p50, client-observed, concurrency 1 | {_ms(h['ttfa_p50_ms'])} ms |",
        f"| engine's first chunk p50, in process (the floor) | {_ms(h['floor_first_chunk_p50_ms'])} ms |",
        f"| TTFA ÷ floor | {h['ttfa_over_floor']:.2f} |",
    ]
    if "piper_http_ttfb_p50_ms" in h:
        lines += [
            f"| Piper HTTP server, time to first byte p50 | {_ms(h['piper_http_ttfb_p50_ms'])} ms |",
            f"| TTFA ÷ Piper HTTP | {h['ttfa_over_piper_http']:.2f} |",
        ]
    lines += [
        f"| whole then play (time to the last frame) p50 | {_ms(h['whole_then_play_p50_ms'])} ms |",
        f"| streams held (no underrun, p95 TTFA < {r['config']['ttfa_target_ms']:.0f} ms) | {h['streams_held']} |",
        f"| compute limit (cores ÷ floor RTF) | {h['compute_limit_streams']:.1f} |",
        "",
        "### Concurrency sweep (closed loop; each client listens before it speaks again)",
        "",
        "| streams | utterances | errors | TTFA p50 | p95 | p99 | underruns | with underrun | stall ms | held |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in r["sweep"]:
        t = row["ttfa_ms"]
        lines.append(
            f"| {row['concurrency']} | {row['utterances']} | {row['errors']} | {_ms(t['p50'])} | {_ms(t['p95'])} | "
            f"{_ms(t['p99'])} | {row['underruns']} | {row['utterances_with_underrun']} | {row['stall_ms']:.0f} | "
            f"{'yes' if row['held'] else 'no'} |"
        )
    lines += [
        "",
        "### Time to first audio as the first sentence grows (concurrency 1)",
        "",
        "| first sentence, words | server TTFA p50 (ms) | engine first chunk (ms) |",
        "|---|---|---|",
    ]
    for row, f in zip(r["length"], r["floor"]["length"]):
        lines.append(f"| {row['words']} | {_ms(row['ttfa_ms']['p50'])} | {_ms(f['first_chunk_ms'])} |")
    s = r["single"]
    lines += [
        "",
        "### Concurrency 1",
        "",
        "| figure | p50 | p95 | p99 |",
        "|---|---|---|---|",
        *(
            f"| {name} | {_ms(v['p50'])} | {_ms(v['p95'])} | {_ms(v['p99'])} |"
            for name, v in [
                ("TTFA, client (ms)", s["ttfa_ms"]),
                ("TTFA, server's own (ms)", s["server_ttfa_ms"]),
                ("sound starts, after a 100 ms jitter buffer (ms)", s["sound_ms"]),
                ("whole utterance received (ms)", s["whole_ms"]),
                ("engine alone: first chunk (ms)", r["floor"]["first_chunk_ms"]),
                ("engine alone: whole text (ms)", r["floor"]["whole_ms"]),
            ]
        ),
        f"| engine real-time factor | {r['floor']['rtf']['p50']:.3f} | {r['floor']['rtf']['p95']:.3f} | "
        f"{r['floor']['rtf']['p99']:.3f} |",
    ]
    if "peers" in r:
        p = r["peers"]["piper_http"]
        lines += [
            f"| Piper HTTP: first byte (ms) | {_ms(p['ttfb_ms']['p50'])} | {_ms(p['ttfb_ms']['p95'])} | "
            f"{_ms(p['ttfb_ms']['p99'])} |",
            f"| Piper HTTP: whole response (ms) | {_ms(p['total_ms']['p50'])} | {_ms(p['total_ms']['p95'])} | "
            f"{_ms(p['total_ms']['p99'])} |",
        ]
    if "poisson" in r:
        po = r["poisson"]
        t = po["ttfa_ms"]
        lines += [
            "",
            f"### Poisson arrivals, {po['rate_per_s']:g} utterances/s for {po['seconds']:g} s (a connection each)",
            "",
            "| utterances | errors | TTFA p50 | p95 | p99 | underruns | with underrun | stall ms |",
            "|---|---|---|---|---|---|---|---|",
            f"| {po['utterances']} | {po['errors']} | {_ms(t['p50'])} | {_ms(t['p95'])} | {_ms(t['p99'])} | "
            f"{po['underruns']} | {po['utterances_with_underrun']} | {po['stall_ms']:.0f} |",
        ]
    if "memory" in r:
        mem = r["memory"]
        lines += [
            "",
            f"### Memory with {mem['readers']} stalled readers",
            "",
            "| idle RSS | with stalled readers | audio held for them |",
            "|---|---|---|",
            f"| {mem['idle_rss_mb']:.0f} MB | {mem['stalled_rss_mb']:.0f} MB | {mem['queued_audio_s']:.1f} s |",
        ]
    if plots:
        lines += ["", *(f"![{p.stem}]({p.name})" for p in plots)]
    return "\n".join(lines) + "\n"


def plots(r: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    levels = [row["concurrency"] for row in r["sweep"]]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for p, style in (("p50", "o-"), ("p95", "s--"), ("p99", "^:")):
        a.plot(levels, [row["ttfa_ms"][p] for row in r["sweep"]], style, label=p)
    a.axhline(r["config"]["ttfa_target_ms"], color="grey", lw=0.8)
    a.set(xscale="log", yscale="log", xlabel="concurrent streams", ylabel="TTFA (ms)", title="Time to first audio")
    a.set_xticks(levels, [str(x) for x in levels])
    a.legend()
    b.bar([str(x) for x in levels], [row["utterances_with_underrun"] for row in r["sweep"]])
    b.set(xlabel="concurrent streams", ylabel="utterances with an underrun", title="Underruns")
    fig.tight_layout()
    paths.append(out / "concurrency.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5, 4))
    words = [row["words"] for row in r["length"]]
    ax.plot(words, [row["ttfa_ms"]["p50"] for row in r["length"]], "o-", label="server TTFA p50")
    ax.plot(words, [f["first_chunk_ms"] for f in r["floor"]["length"]], "s--", label="engine first chunk")
    ax.set(xlabel="words in the first sentence", ylabel="ms", title="TTFA against first-sentence length")
    ax.legend()
    fig.tight_layout()
    paths.append(out / "length.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths
