"""A bench run as a markdown report and PNG plots."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from voxwire.benchmarks.machine import facts


def save_results(path: Path, args: argparse.Namespace, **figures: Any) -> None:
    """A benchmark's figures as JSON, with the machine and the arguments that made them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    arguments = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    path.write_text(json.dumps({"machine": facts(), "args": arguments, **figures}, indent=2))


def _ms(x: float | None) -> str:
    return "n/a" if x is None or x != x else f"{x:.0f}"


def _x(x: float | None) -> str:
    return "n/a" if x is None or x != x else f"{x:.2f}"


def _held(n: int | None) -> str:
    return "not measured" if n is None else str(n)


def machine_line(m: dict[str, Any]) -> str:
    return (
        f"Machine: {m['cores']} cores ({m['cpu']}), {m['memory_gb']} GB, {m['device']}"
        f"{', ' + m['gpu'] if m.get('gpu') else ''}, Python {m['python']}, torch {m.get('torch', 'n/a')}, "
        f"commit {m.get('commit')}, load average {m.get('load_average_1m', 'n/a')} at the start"
    )


def _n(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None or x != x else f"{x:.{digits}f}"


def quality_table(rows: dict[str, Any]) -> list[str]:
    """What a listener hears (benchmarks/quality), row by row, beside the row's TTFA in
    the same run. Seams only for rows whose stream arrives in pieces of its own."""
    lines = [
        "| row | sentences | WER % | DNSMOS SIG | BAK | OVRL | seam ratio: median | worst | joins | TTFA p50 ms | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in rows.items():
        d, seams = row["dnsmos"], row["seams"]
        joins = seams["joins"]
        # Nothing heard is not a transcript that missed every word.
        wer = "n/a" if row["errors"] >= row["sentences"] else f"{row['wer']:.2f}"
        lines.append(
            f"| {name} | {row['sentences']} | {wer} | {_n(d['sig'])} | {_n(d['bak'])} | {_n(d['ovrl'])} | "
            f"{_n(seams['median']) if joins else '–'} | {_n(seams['worst']) if joins else '–'} | {joins or '–'} | "
            f"{_ms(row['ttfa_ms']['p50'])} | {row['errors']} |"
        )
    return lines


def paired_table(r: dict[str, Any]) -> list[str]:
    """benchmarks/quality/paired.py: one audio through every format."""
    lines = [
        "| format, as the socket sends it | WER % | over 16-bit PCM at its rate (points) | DNSMOS SIG | BAK | OVRL |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, row in r["rows"].items():
        d = row["dnsmos"]
        over = f"{row['wer_over_against']:+.2f}" if "against" in row else "–"
        lines.append(f"| {name} | {row['wer']:.2f} | {over} | {_n(d['sig'])} | {_n(d['bak'])} | {_n(d['ovrl'])} |")
    return lines


def quality_targets(r: dict[str, Any]) -> list[str]:
    """benchmarks/quality's targets (benchmarks/quality/targets.py), each met or not."""
    lines = ["| target | row | measured | limit | met |", "|---|---|---:|---:|---|"]
    for t in r["targets"]:
        lines.append(f"| {t['target']} | {t['row']} | {_n(t['measured'])} | {t['limit']:g} | "
                     f"{'yes' if t['met'] else '**no**'} |")
    return lines


def comparison_table(r: dict[str, Any]) -> list[str]:
    """Every server side by side: concurrency 1, then the streams each held."""
    lines = [
        "| server | protocol | precision | TTFA p50 | p95 | p99 | three sentences: TTFA p50 | last audio p50 | "
        "streams held, staggered | held, burst | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, s in r["servers"].items():
        one, three = s["single"], s["three_sentences"]
        t = one["ttfa_ms"]
        kind = s["kind"] + (f" ({s['format']})" if s.get("format") else "") + (
            " (streaming)" if s.get("streaming") else "")
        errors = one["errors"] + sum(row["errors"] for row in s["staggered"][1:] + s["burst"])
        lines.append(
            f"| {name} | {kind} | {s.get('precision') or 'not said'} | {_ms(t['p50'])} | {_ms(t['p95'])} | {_ms(t['p99'])} | "
            f"{_ms(three['ttfa_ms']['p50'])} | {_ms(one['last_audio_ms']['p50'])} | {_held(s['held_staggered'])} | "
            f"{_held(s['held_burst'])} | {errors} |"
        )
    return lines


def load_table(r: dict[str, Any], kind: str) -> list[str]:
    """One row per load level and server, levels interleaved as they were measured."""
    lines = [
        "| level | server | utterances | errors | TTFA p50 | p95 | p99 | last audio p50 | underruns | "
        "with underrun | stall ms | passed |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows = [(row["level"], name, row) for name, s in r["servers"].items() if s.get("loaded") for row in s[kind]]
    for level, name, row in sorted(rows, key=lambda x: x[0]):
        t = row["ttfa_ms"]
        lines.append(
            f"| {level} | {name} | {row['utterances']} | {row['errors']} | {_ms(t['p50'])} | {_ms(t['p95'])} | "
            f"{_ms(t['p99'])} | {_ms(row['last_audio_ms']['p50'])} | {row['underruns']} | "
            f"{row['utterances_with_underrun']} | {row['stall_ms']:.0f} | {'yes' if row['passed'] else 'no'} |"
        )
    return lines


def length_table(r: dict[str, Any]) -> list[str]:
    reps = r["config"]["plan"]["length_repeats"]
    lines = [
        f"| first sentence, words | server TTFA p50 (median of {reps}) | engine first chunk, in process "
        f"(median of {r['floor']['repeats'] if 'floor' in r else reps}) |",
        "|---|---|---|",
    ]
    floors = r["floor"]["length"] if "floor" in r else [None] * len(r["length"])
    for row, f in zip(r["length"], floors):
        lines.append(
            f"| {row['words']} | {_ms(row['ttfa_ms']['p50'])} | {_ms(f['first_chunk_ms']['p50']) if f else 'n/a'} |"
        )
    return lines


def headline_table(r: dict[str, Any]) -> list[str]:
    h, target = r["headline"], r["config"]["ttfa_target_ms"]
    lines = [
        "| headline | value |",
        "|---|---|",
        f"| TTFA p50, client-observed, concurrency 1 | {_ms(h['ttfa_p50_ms'])} ms |",
        f"| TTFA p50, three-sentence text | {_ms(h['three_sentences_ttfa_p50_ms'])} ms |",
    ]
    if "wyoming_piper_three_sentences_ttfa_p50_ms" in h:
        lines += [
            f"| wyoming-piper, three-sentence text, TTFA p50 | {_ms(h['wyoming_piper_three_sentences_ttfa_p50_ms'])} ms |",
            f"| Voxwire ÷ wyoming-piper, three-sentence text (target ≤ 0.5) | "
            f"{_x(h['three_sentences_ttfa_over_wyoming_piper'])} |",
            "| Voxwire ÷ wyoming-piper, TTFA p50 at each staggered level | "
            + ", ".join(f"{k}: {_x(v)}" for k, v in h["staggered_p50_over_wyoming_piper"].items()) + " |",
        ]
    if "floor_first_chunk_p50_ms" in h:
        lines += [
            f"| engine's first chunk p50, in process (the floor) | {_ms(h['floor_first_chunk_p50_ms'])} ms |",
            f"| TTFA ÷ floor | {_x(h['ttfa_over_floor'])} |",
        ]
    lines += [
        f"| whole then play (time to the last audio) p50 | {_ms(h['whole_then_play_p50_ms'])} ms |",
        f"| streams held, staggered listeners (no error or underrun, p95 TTFA < {target:.0f} ms, "
        f"every lower level too) | {_held(h['streams_held_staggered'])} |",
        f"| streams held, bursts of newcomers (same rule) | {_held(h['streams_held_burst'])} |",
    ]
    if "compute_limit_streams" in h:
        lines.append(
            f"| compute limit (1 ÷ single-stream RTF {_x(h['floor_rtf_p50'])}) | {h['compute_limit_streams']:.1f} |"
        )
    return lines


def cache_warning(r: dict[str, Any]) -> list[str]:
    """A warning for the top of the report when a server answered from its result cache:
    a replay's first audio is not a measure of synthesis."""
    cached = [(name, s) for name, s in r["servers"].items() if s.get("cached_answers")]
    if not cached:
        return []
    each = "; ".join(f"{name}: {s['cached_answers']} of {s['answers']}" for name, s in cached)
    return [
        f"**Warning: answers came from a server's result cache** ({each}). Their time to first "
        "audio measures a replay from memory, not synthesis: measure a server with its cache off "
        "(`voxwire serve --cache-mb 0`).",
        "",
    ]


def phases(r: dict[str, Any], name: str) -> list[tuple[str, dict[str, Any]]]:
    """A server's measured phases, each as (what it was, its figures); the length sweep and
    Poisson arrivals are the main server's."""
    s = r["servers"][name]
    out = [("concurrency 1", s["single"])]
    out += [(f"{row['level']} staggered listeners", row) for row in s["staggered"][1:]]
    out += [(f"bursts of {row['level']}", row) for row in s["burst"]]
    if name == next(iter(r["servers"])):  # the main server is measured first
        out += [(f"a first sentence of {row['words']} words", row) for row in r.get("length", [])]
        out += [("Poisson arrivals", r["poisson"])] if "poisson" in r else []
    return out


def failures(r: dict[str, Any]) -> list[str]:
    """A line for the top of the report for each server that answered nothing right in
    some phase: its figures there are n/a, and the reason is in its error codes."""
    lines = []
    for name in r["servers"]:
        failed = [(what, row) for what, row in phases(r, name) if row["utterances"] and not _answered(row)]
        if not failed:
            continue
        codes = sorted({code for _, row in failed for code in row["error_codes"]})
        where = "any phase" if len(failed) == len(phases(r, name)) else ", ".join(what for what, _ in failed)
        count = sum(row["errors"] for _, row in failed)
        lines += [f"**No successful answer from {name} in {where}**: {count} utterances, every one an error "
                  f"({', '.join(codes) or 'no code'}); its figures there are n/a.", ""]
    return lines


def _answered(row: dict[str, Any]) -> bool:
    return row["errors"] < row["utterances"]


def server_line(r: dict[str, Any]) -> str:
    """For a run against ``--url``: the server as it described itself, and what it did not say."""
    cfg = r["config"]
    facts = cfg.get("server") or {}
    known = [f"{what} {facts[key]}" for key, what in (("engine", "engine"), ("precision", "precision"),
                                                       ("device", "device"), ("version", "version"))
             if facts.get(key)]
    unsaid = [key for key in ("engine", "precision", "device") if not facts.get(key)]
    said = ", ".join([facts.get("server") or "a server that did not name itself", *known])
    if facts.get("description"):
        said += f" ({facts['description']})"
    if facts.get("said_by"):
        said += f", as {facts['said_by']} says"
    if unsaid:
        said += f"; {', '.join(unsaid)} not said"
    asked = f"; voice {cfg['voice']} asked for" if cfg.get("voice") else ""  # runs before --voice have none
    return f"Server: {cfg['url']}: {said}{asked}"


def engine_line(cfg: dict[str, Any]) -> str:
    """What a run of the bench's own servers served, and how."""
    if cfg["engine"] == "piper":
        return (f"Engine: piper ({cfg['piper_backend']} backend); every server started by the bench on 127.0.0.1 "
                "with the same voice file, Voxwire with its result cache off")
    voice = f"voice {cfg['voice']}" if cfg["voice"] else "Voxwire's default voice"
    return (f"Engine: {cfg['engine']} (`--kokoro-decode {cfg['kokoro_decode']}`), {voice}; "
            "started by the bench on 127.0.0.1 with its result cache off. No peer: no Kokoro server here takes a "
            "local model and streams (benchmarks/kokoro.py measures the engine against kokoro-onnx in process)")


def markdown(r: dict[str, Any], plots: list[Path], command: str) -> str:
    m, h, cfg = r["machine"], r["headline"], r["config"]
    target = cfg["ttfa_target_ms"]
    lines = [
        "## Results",
        "",
        *cache_warning(r),
        *failures(r),
        f"Command: `{command}` ({r['elapsed_s']:.0f} s)  ",
        machine_line(m) + "  ",
        server_line(r) if cfg["url"] else engine_line(cfg),
        "",
        *headline_table(r),
    ]
    lines += [
        "",
        "### Every server, concurrency 1 and streams held",
        "",
        *comparison_table(r),
        "",
        "### Staggered real-time listeners (each hears its answer out, then speaks again; level 1 is "
        "concurrency 1)",
        "",
        *load_table(r, "staggered"),
        "",
        "### Bursts of simultaneous newcomers (a fresh connection each, all at once)",
        "",
        *load_table(r, "burst"),
        "",
        "### Time to first audio as the first sentence grows (concurrency 1)",
        "",
        *length_table(r),
    ]
    if r.get("quality", {}).get("rows"):
        q = r["quality"]
        lines += [
            "",
            f"### What a listener hears ({q['sentences']} sentences of benchmarks/corpus/quality.txt; {q['asr']}; "
            "WER after benchmarks/quality/normalise.py; DNSMOS P.835)",
            "",
            *quality_table(q["rows"]),
        ]
    elif r.get("quality", {}).get("skipped"):
        lines += ["", f"Quality not measured: {r['quality']['skipped']}"]
    if "floor" in r:
        f = r["floor"]
        lines += [
            "",
            "### The engine alone, in process",
            "",
            "| figure | p50 | p95 | p99 |",
            "|---|---|---|---|",
            f"| first chunk (ms) | {_ms(f['first_chunk_ms']['p50'])} | {_ms(f['first_chunk_ms']['p95'])} | "
            f"{_ms(f['first_chunk_ms']['p99'])} |",
            f"| whole text (ms) | {_ms(f['whole_ms']['p50'])} | {_ms(f['whole_ms']['p95'])} | "
            f"{_ms(f['whole_ms']['p99'])} |",
            f"| real-time factor | {f['rtf']['p50']:.3f} | {f['rtf']['p95']:.3f} | {f['rtf']['p99']:.3f} |",
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


def _drawable(ms: float | None) -> bool:
    """A figure a log axis can show: there, and above 0 (nan where every answer failed)."""
    return ms is not None and ms == ms and ms > 0


def _nothing_to_draw(ax: Any) -> None:
    """An empty plot says why."""
    ax.text(0.5, 0.5, "no successful answer", ha="center", va="center", transform=ax.transAxes)


def plots(r: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, kind, title in ((axes[0], "staggered", "Staggered listeners"), (axes[1], "burst", "Bursts of newcomers")):
        for name, s in r["servers"].items():
            rows = s["staggered"][:1] + s["burst"] if kind == "burst" else s["staggered"]
            # A level whose every answer failed has no TTFA: it is left out, not drawn at 0.
            points = [(row["level"], row["ttfa_ms"]["p95"]) for row in rows if _drawable(row["ttfa_ms"]["p95"])]
            if not s.get("loaded") or not points:
                continue
            ax.plot(*zip(*points), "o-", label=name)
        drawn = bool(ax.get_legend_handles_labels()[0])
        ax.axhline(r["config"]["ttfa_target_ms"], color="grey", lw=0.8)
        # The target line gives the y axis a range; with no level drawn, a log x axis has
        # none, and cannot place its ticks.
        ax.set(xscale="log" if drawn else "linear", yscale="log", xlabel="concurrent streams",
               title=f"{title}: p95 TTFA")
        if not drawn:
            _nothing_to_draw(ax)
    axes[0].set_ylabel("ms")
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize=8)
    fig.tight_layout()
    paths.append(out / "concurrency.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    names = list(r["servers"])
    values = [r["servers"][n]["three_sentences"]["ttfa_ms"]["p50"] for n in names]
    ax.barh(names, [v if _drawable(v) else 0 for v in values])
    ax.set(xlabel="ms", title="TTFA p50, three-sentence text, concurrency 1")
    for i, v in enumerate(values):
        if not _drawable(v):
            ax.text(0, i, " no successful answer", va="center")
    fig.tight_layout()
    paths.append(out / "servers.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5, 4))
    words = [row["words"] for row in r["length"]]
    ax.plot(words, [row["ttfa_ms"]["p50"] for row in r["length"]], "o-", label="server TTFA p50")
    if "floor" in r:
        ax.plot(words, [f["first_chunk_ms"]["p50"] for f in r["floor"]["length"]], "s--", label="engine first chunk")
    ax.set(xlabel="words in the first sentence", ylabel="ms", title="TTFA against first-sentence length")
    ax.legend()
    if not any(_drawable(row["ttfa_ms"]["p50"]) for row in r["length"]):
        _nothing_to_draw(ax)
    fig.tight_layout()
    paths.append(out / "length.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths
