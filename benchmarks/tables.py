"""benchmarks/README.md's tables, generated from the stored JSON results.

Each table in the README sits between two markers that name the table and its result:

    <!-- table: soak results/soak/soak.json -->
    | … |
    <!-- /table -->

``python -m voxwire.benchmarks.tables`` rewrites every such table from its JSON; ``--check``
only reports the tables that differ (tests/benchmarks/test_tables.py runs it), and the
test also checks that no table in the README lies outside a marker.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable

from voxwire.benchmarks import kokoro, report

HERE = Path(__file__).resolve().parent
README = HERE / "README.md"
BLOCK = re.compile(r"(<!-- table: (\S+) (\S+) -->\n)((?:(?!<!-- table: ).)*?)(<!-- /table -->)", re.S)
OPENING = re.compile(r"^<!-- table: (\S+) (\S+) -->$", re.M)


def piper_rtf(r: dict[str, Any]) -> list[str]:
    lines = [
        "| engine | precision | audio s | compute s | RTF | vs onnxruntime |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for row in r["rtf"]:
        lines.append(
            f"| {row['engine']} | {row['precision']} | {row['audio_s']:.2f} | {row['compute_s']:.3f} | "
            f"{row['rtf']:.4f} | {row['vs_onnxruntime']:.2f}× |"
        )
    return lines


def piper_latency(r: dict[str, Any]) -> list[str]:
    lat = r["latency"]
    others = [p for p in lat["precisions"] if p != "fp32"]
    encoders = lat["encoders"]  # precision naming each text-encoder dtype -> that dtype
    head = ["words", "phoneme ids", "onnxruntime, whole sentence", "`stream_chunks` first piece fp32",
            "fp32 ratio to 3 words"]
    for p in others:
        head += [f"first piece {p}", f"{p} ÷ fp32"]
    head += [f"`infer_prior` alone, {dt} encoder" for dt in encoders.values()]
    head += ["`infer_prior` GFLOP", "fp32 ratio floor on this CPU"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for row in lat["rows"]:
        cells = [str(row["words"]), str(row["phoneme_ids"]), f"{row['ort_whole_ms']:.1f} ms",
                 f"{row['stream_ms']['fp32']:.1f} ms", f"{row['ratio_stream']['fp32']:.2f}×"]
        for p in others:
            cells += [f"{row['stream_ms'][p]:.1f} ms", f"{row['stream_vs_fp32'][p]:.2f}×"]
        cells += [f"{row['prior_ms'][p]:.1f} ms" for p in encoders]
        cells += [f"{row['prior_gflop']:.2f}", f"{row['ratio_floor']:.2f}×"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def soak(r: dict[str, Any]) -> list[str]:
    base, final = r["baseline"], r["final"]
    return [
        "| clients | seconds | started | served | cancelled | vanished | unexpected | RSS start → end (peak) | "
        "threads | file descriptors | event-loop tasks | leaks |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        f"| {r['clients']} | {r['duration_s']:g} | {r['started']} | {r['served']} | {r['cancels']} | "
        f"{r['disconnects']} | {len(r['unexpected'])} | {base['rss_mb']:.0f} → {final['rss_mb']:.0f} MB "
        f"({r['peak_rss_mb']:.0f}) | {base['threads']} → {final['threads']} | {base['fds']} → {final['fds']} | "
        f"{base['tasks']} → {final['tasks']} | {', '.join(r['leaks']) or 'none'} |",
    ]


def workers(r: dict[str, Any]) -> list[str]:
    lines = [
        "| round | workers 1: wall, audio s/s, p95 TTFA | workers 2: wall, audio s/s, p95 TTFA | throughput 2 ÷ 1 |",
        "|---|---|---|---|",
    ]
    for i, (one, two) in enumerate(r["rounds"], 1):
        cell = lambda w: f"{w['wall_s']:.2f} s, {w['audio_s_per_s']:.2f}, {w['ttfa_ms']['p95']:.0f} ms"  # noqa: E731
        lines.append(f"| {i} | {cell(one)} | {cell(two)} | {two['audio_s_per_s'] / one['audio_s_per_s']:.2f} |")
    return lines


def rates(r: dict[str, Any]) -> list[str]:
    lines = [
        f"| output | TTFA median ({r['args']['rounds']} rounds) | × native |",
        "|---|---|---|",
    ]
    for name, row in r["ttfa"].items():
        lines.append(f"| {name} | {row['median_ms']:.1f} ms | {row['ratio_to_native']:.2f} |")
    return lines


def lexicon(r: dict[str, Any]) -> list[str]:
    lines = [
        f"| measured | lexicon | median ({r['args']['rounds']} rounds; phonemes: {5 * r['args']['rounds']}) | added | × none |",
        "|---|---|---|---|---|",
    ]
    for what, label in (("ttfa", "first audio, through a server"), ("phonemes", "a reply's phonemes, in-process")):
        for name, row in r[what].items():
            lines.append(f"| {label} | {name} | {row['median_ms']:.2f} ms | {row['added_ms']:+.2f} ms | {row['ratio']:.3f} |")
    for name, row in r.get("ssml_parse", {}).items():
        lines.append(f"| parsing a reply's SSML, in-process | {name} | {row['median_ms']:.3f} ms | | |")
    return lines


def voice_loading(r: dict[str, Any]) -> list[str]:
    rounds = r["args"]["rounds"]
    lines = [
        f"| measured ({rounds} rounds) | median | max |",
        "|---|---|---|",
    ]
    for case, row in r["first_audio"].items():
        lines.append(f"| first audio, voice {case} (alone) | {row['median']:.1f} ms | {row['max']:.1f} ms |")
    for case, row in r["beside_a_listener"].items():
        gap, stall = row["listener_max_gap_ms"], row["listener_stall_ms"]
        lines.append(f"| a listener's longest gap, {case} | {gap['median']:.1f} ms | {gap['max']:.1f} ms |")
        lines.append(f"| a listener's stall, {case} | {stall['median']:.1f} ms | {stall['max']:.1f} ms |")
        if row["other_ttfa_ms"]:
            other = row["other_ttfa_ms"]
            lines.append(f"| the other reply's first audio, {case} | {other['median']:.1f} ms | {other['max']:.1f} ms |")
    m = r["memory"]
    lines.append(f"| resident set when ready, 1 voice loaded / 3 loaded | {m['bound_1_ready_mb']:.0f} / "
                 f"{m['bound_3_ready_mb']:.0f} MiB | |")
    lines.append(f"| memory a loaded voice holds | {m['per_voice_mb']:.0f} MiB | |")
    lines.append(f"| resident set after {rounds} turns of every voice, 1 loaded / 3 loaded | "
                 f"{m['bound_1_after_mb']:.0f} / {m['bound_3_after_mb']:.0f} MiB | |")
    return lines


def voice_downloads(r: dict[str, Any]) -> list[str]:
    """benchmarks/voice_downloads.py: first audio of a voice's first request, and after."""
    lines = [
        f"| first audio ({r['args']['voices']} voices of {r['model_mib']:.0f} MiB, from a mirror on loopback) "
        "| median | max |",
        "|---|---|---|",
    ]
    for case, row in r["first_audio"].items():
        lines.append(f"| {case} | {row['median']:.1f} ms | {row['max']:.1f} ms |")
    return lines


def admission(r: dict[str, Any]) -> list[str]:
    """benchmarks/admission.py: the same flood of listeners, admission predicted and reactive."""
    a = r["args"]
    lines = [
        f"| admission ({a['listeners']} listeners {a['gap']} s apart, {a['per_listener']} answers each, "
        f"{a['rounds']} rounds, {a['door']}) | served | refused | served that underran | stall over audio served "
        "| p95 first audio |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in r["servers"].items():
        lines.append(f"| {name} | {row['served']} of {row['answers']} | {row['refused']} | {row['underran']} | "
                     f"{row['stall_s']:.1f} s over {row['audio_s']:.1f} s | {report._ms(row['ttfa_p95_ms'])} ms |")
    return lines


def ray_proxy(r: dict[str, Any]) -> list[str]:
    """One run of benchmarks/studies/ray_proxy.py: TTFA, stalled readers, sockets held."""
    t = r["ttfa_ms"]
    lines = [
        "| measure | direct (uvicorn) | through Ray's proxy |",
        "|---|---|---|",
        f"| TTFA median, {len(t['direct']['all'])} rounds | {t['direct']['median']:.1f} ms | "
        f"{t['ray']['median']:.1f} ms ({r['ttfa_ratio_ray_over_direct']:.2f}×) |",
    ]
    for mode, s in r["stalled"].items():
        for key in (k for k in s if k.startswith("per_reader_mb_at_")):
            at = key.removeprefix("per_reader_mb_at_")
            computed = s.get(f"computed_s_per_reader_at_{at}")
            cell = f"{s[key]:.2f} MB" + (f", {computed:.2f} s computed" if computed is not None else "")
            side = f"| {cell} | |" if mode.startswith("direct") else f"| | {cell} |"
            label = "with progress" if s["progress"] else "without progress"
            lines.append(f"| stalled readers {label} ({s['readers']}), per reader at {at} {side}")
    held = r.get("held_one_replica")
    if held:
        lines.append(
            f"| sockets held on one replica | | {held['held']}, all ready; {held['speaking_at_once']} speaking "
            f"at once, slowest {held['slowest_utterance_s']:.1f} s |"
        )
    two = r.get("held_two_replicas")
    if two:
        split = " + ".join(map(str, two.get("sockets_by_replica", [])))
        lines.append(
            f"| sockets held on two replicas | | {two['held']}, all ready ({split or 'split not read'}); "
            f"{two['speaking_at_once']} speaking at once, slowest {two['slowest_utterance_s']:.1f} s |"
        )
    return lines


def formats(r: dict[str, Any]) -> list[str]:
    """benchmarks/formats.py: bytes, client-observed TTFA and encoding cost per format."""
    lines = [
        f"| format | kbit/s | fewer bytes than pcm_s16le | TTFA median ({r['args']['rounds']} rounds) | over pcm_s16le "
        "| first frame, CPU over pcm_s16le | encoding, ms CPU per s of audio | of the engine's CPU |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, f in r["formats"].items():
        lines.append(
            f"| {name} | {f['kbit_per_s']:.1f} | {f['fewer_bytes_than_pcm_s16le_22k']:.2f}× | {f['ttfa_median_ms']:.1f} ms "
            f"| {f['ttfa_median_minus_pcm_ms']:+.1f} ms | {f['first_frame_cpu_minus_pcm_ms']:+.2f} ms "
            f"| {f['encode_ms_per_s']:.2f} | {100 * f['encode_fraction_of_engine_compute']:.2f}% |"
        )
    return lines


def wyoming(r: dict[str, Any]) -> list[str]:
    """benchmarks/wyoming.py: time to the first audio-chunk, alone and with 4 clients."""
    lines = [
        f"| server ({r['args']['rounds']} rounds, {r['args']['piper_backend']} backend for Voxwire) | first chunk median "
        f"| p95 | {r['clients']} clients p95 | ÷ single p95 | whole answer median |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in r["servers"].items():
        lines.append(
            f"| {name} | {s['single_median_ms']:.1f} ms | {s['single_p95_ms']:.1f} ms | {s['concurrent_p95_ms']:.1f} ms "
            f"| {s['concurrent_p95_over_single_p95']:.2f} | {s['single_total_median_ms']:.0f} ms |"
        )
    lines.append(f"| Voxwire ÷ wyoming-piper, first chunk median | {r['first_chunk_ratio_to_wyoming_piper']:.2f} | | | | |")
    return lines


def contention(r: dict[str, Any]) -> list[str]:
    """benchmarks/studies/contention.py: first audio quiet and beside busy neighbours, per server."""
    lines = [
        "| load | server | first chunk p50 | p95 | max | p95 ÷ quiet p95 | Voxwire p95 ÷ wyoming-piper p95 |",
        "|---|---|---|---|---|---|---|",
    ]
    for load, by_server in r["loads"].items():
        for name, s in by_server.items():
            versus = s.get("p95_over_wyoming_piper_p95")
            lines.append(
                f"| {load} | {name} | {s['p50_ms']:.0f} ms | {s['p95_ms']:.0f} ms | {s['max_ms']:.0f} ms "
                f"| {s['p95_over_quiet_p95']:.2f} | {'' if versus is None else f'{versus:.2f}'} |"
            )
    return lines


def contention_floor(r: dict[str, Any]) -> list[str]:
    """benchmarks/studies/contention.py --engine-only: the engine's first step alone, per load
    and thread policy."""
    lines = ["| load | engine threads | first step p50 | p95 | max | p95 ÷ quiet adaptive p95 |", "|---|---|---|---|---|---|"]
    for load, by_policy in r["engine_floor"].items():
        for policy, s in by_policy.items():
            lines.append(f"| {load} | {policy} | {s['p50_ms']:.0f} ms | {s['p95_ms']:.0f} ms | {s['max_ms']:.0f} ms "
                         f"| {s['p95_over_quiet_adaptive']:.2f} |")
    return lines


SERVER_LABELS = {"batched": "batched", "unbatched": "unbatched (--max-batch 1)",
                 "bf16": "bf16 (--precision bf16)", "fp32": "fp32 (--precision fp32)"}


def batching(r: dict[str, Any]) -> list[str]:
    """benchmarks/batching.py: the batched server against --max-batch 1 (or, with
    --precisions, bf16 against fp32), in one run."""
    servers, n = r["servers"], r["args"]["newcomers"]
    # With --precisions each server's burst is read against its own precision's floor.
    own_floors = "floors" in r and len({f["batched_step_ms"] for f in r["floors"].values()}) > 1
    floor_label = ("burst p95 ÷ its own floor (target ≤ 1.2)" if own_floors
                   else f"burst p95 ÷ the floor, {r['floor']['batched_step_ms']:.1f} ms (target ≤ 1.2)")
    rows = [
        ("TTFA p50, one listener alone", lambda s: f"{s['single_ttfa_p50_ms']:.1f} ms"),
        (f"burst of {n}: TTFA p50", lambda s: f"{s['burst_ttfa_p50_ms']:.1f} ms"),
        (f"burst of {n}: TTFA p95", lambda s: f"{s['burst_ttfa_p95_ms']:.1f} ms"),
        ("burst p95 ÷ single p50 (target ≤ 4)", lambda s: f"{s['burst_p95_over_single']:.2f}"),
        (floor_label, lambda s: f"{s['burst_p95_over_floor']:.2f}" + (
            f" (of {s['floor_ms']:.1f} ms)" if own_floors else "")),
        (f"burst of {n}: underruns (stall)", lambda s: (
            f"{s['burst_underruns']} ({s['burst_stall_ms']} ms)" if "burst_underruns" in s else "not measured")),
        ("staggered listeners held (levels " + ", ".join(map(str, r["args"]["levels"])) + ")",
         lambda s: f"{s['held']} of the compute limit {s['compute_limit']:.1f} ({s['held_over_limit']:.2f}×)"),
        ("engine steps by batch size", lambda s: _sizes(s["batch_sizes"])),
    ]
    names = list(servers)
    lines = ["| figure | " + " | ".join(SERVER_LABELS.get(k, k) for k in names) + " |",
             "|---|" + "---|" * len(names)]
    lines += [f"| {label} | " + " | ".join(cell(servers[k]) for k in names) + " |" for label, cell in rows]
    return lines


def _sizes(buckets: dict[str, float]) -> str:
    """Steps per batch-size bucket ("<=4.0": steps of 3 or 4) as "1: 153, 2: 60, 3–4: 82"."""
    out, lo = [], 1
    for bound, count in buckets.items():
        if bound == "<=+Inf":
            break
        top = int(float(bound.removeprefix("<=")))
        if count:
            out.append(f"{lo if lo == top else f'{lo}–{top}'}: {count:.0f}")
        lo = top + 1
    return ", ".join(out) or "none"


def quality_precision(r: dict[str, Any]) -> list[str]:
    """benchmarks/quality/precision.py: the reference, and the engine in fp32 and in bf16
    (paired: the same seed), each row's WER, DNSMOS and seams."""
    n = report._n  # as the quality table writes a missing figure
    rows = r["rows"]
    fp32 = next((rows[name] for name, p in r["config"]["precisions"].items() if p == "fp32"), None)
    lines = [
        "| row | WER % | over fp32 (points) | DNSMOS SIG | BAK | OVRL | seam ratio: median | worst | joins |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in rows.items():
        d, seams = row["dnsmos"], row["seams"]
        over = f"{row['wer'] - fp32['wer']:+.2f}" if fp32 and row is not fp32 else "–"
        joins = seams["joins"]
        lines.append(
            f"| {name} | {row['wer']:.2f} | {over} | {n(d['sig'])} | {n(d['bak'])} | {n(d['ovrl'])} | "
            f"{n(seams['median']) if joins else '–'} | {n(seams['worst']) if joins else '–'} | {joins or '–'} |"
        )
    return lines


def quality_clauses(r: dict[str, Any]) -> list[str]:
    """benchmarks/quality/clauses.py: each first_clause_words policy's first audio from the
    first token, over the corpus and over the replies it started at a clause (against
    waiting for the sentence, the same replies), with what the listener hears of them."""
    n = report._n
    lines = [
        "| first_clause_words | first audio p50 ms | p95 | replies started at a clause | their first audio p50 ms | waiting for the sentence | WER % | waiting | DNSMOS OVRL | waiting | seam ratio at the clause's join: median | worst | WER % (all) | DNSMOS OVRL (all) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in r["rows"].values():
        fa, e = row["first_audio_ms"], row["started_early"]
        some = e["replies"] > 0
        cell = (lambda v, f="{:.0f}": f.format(v) if some else "–")
        seams = e["clause_seams"]
        words = row["first_clause_words"]
        lines.append(
            f"| {words or '0 (wait for the sentence)'} | {fa['p50']:.0f} | {fa['p95']:.0f} | {e['replies']} | "
            f"{cell(e['first_audio_ms']['p50'])} | {cell(e['waiting_first_audio_ms']['p50'])} | "
            f"{cell(e['wer'], '{:.2f}')} | {cell(e['waiting_wer'], '{:.2f}')} | "
            f"{cell(e['dnsmos_ovrl'], '{:.2f}')} | {cell(e['waiting_dnsmos_ovrl'], '{:.2f}')} | "
            f"{n(seams['median']) if seams['joins'] else '–'} | {n(seams['worst']) if seams['joins'] else '–'} | "
            f"{row['wer']:.2f} | {n(row['dnsmos']['ovrl'])} |"
        )
    return lines


def precision_layers(r: dict[str, Any]) -> list[str]:
    from voxwire.benchmarks.studies.precision_convs import layer_table  # imports torch: only when asked

    return layer_table(r["layers"])


def precision_decoder(r: dict[str, Any]) -> list[str]:
    from voxwire.benchmarks.studies.precision_convs import decoder_table

    return decoder_table(r["decoder"])


def agents(r: dict[str, Any]) -> list[str]:
    """benchmarks/agents.py: first audio from the first LLM token, per framework and TTS."""
    ms, x = report._ms, report._x
    lines = [
        "| framework | TTS | text to the TTS | first audio p50 ms | p95 | after the first sentence p50 ms "
        f"| {r['config']['plan']['long_words']}-word first sentence: first audio p50 ms (after the sentence) "
        "| words timed "
        "| audio after interruption: frames | ms | errors |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in r["systems"].items():
        cut, long = s["interruptions"], s["long_first_sentence"]
        errors = s["errors"] + long["errors"] + cut["errors"] + s["warmup_errors"]
        lines.append(
            f"| {s['framework']} | {name} | {s['aggregation']} | {ms(s['first_audio_ms']['p50'])} "
            f"| {ms(s['first_audio_ms']['p95'])} | {ms(s['after_first_sentence_ms']['p50'])} "
            f"| {ms(long['first_audio_ms']['p50'])} ({ms(long['after_first_sentence_ms']['p50'])}) "
            f"| {x(s['word_timing_coverage'])} "
            f"| {cut['frames_after']} in {cut['cuts']} | {ms(cut['audio_ms_after'])} | {errors} |"
        )
    return lines


def agents_ratios(r: dict[str, Any]) -> list[str]:
    x = report._x
    lines = [
        "| framework | Voxwire ÷ better Piper: first audio p50 (target ≤ 0.4) | after the first sentence p50 "
        f"| {r['config']['plan']['long_words']}-word first sentence: after the sentence p50 | better Piper |",
        "|---|---:|---:|---:|---|",
    ]
    for framework, q in r["ratios"].items():
        lines.append(f"| {framework} | {x(q['ratio_p50'])} | {x(q['after_first_sentence_ratio_p50'])} "
                     f"| {x(q['long_first_sentence_after_ratio_p50'])} | {q['best_piper']} |")
    return lines


RENDER: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    "batching-precision": batching,
    "precision-layers": precision_layers,
    "precision-decoder": precision_decoder,
    "bench-headline": report.headline_table,
    "bench-servers": report.comparison_table,
    "bench-staggered": lambda r: report.load_table(r, "staggered"),
    "bench-burst": lambda r: report.load_table(r, "burst"),
    "bench-length": report.length_table,
    "piper-rtf": piper_rtf,
    "piper-latency": piper_latency,
    "soak": soak,
    "workers": workers,
    "rates": rates,
    "lexicon": lexicon,
    "voice_loading": voice_loading,
    "voice_downloads": voice_downloads,
    "admission": admission,
    "ray_proxy": ray_proxy,
    "formats": formats,
    "wyoming": wyoming,
    "contention": contention,
    "contention-floor": contention_floor,
    "batching": batching,
    "quality": lambda r: report.quality_table(r["rows"]),
    "quality-targets": report.quality_targets,
    "quality-paired": report.paired_table,
    "quality-precision": quality_precision,
    "quality-clauses": quality_clauses,
    "agents": agents,
    "agents-ratios": agents_ratios,
    "kokoro": kokoro.table,
    "kokoro-parts": kokoro.parts_table,
    "kokoro-targets": kokoro.targets_table,
}


def render(name: str, path: str, base: Path = HERE) -> str:
    result = json.loads((base / path).read_text())
    return "\n".join(RENDER[name](result)) + "\n"


def regenerate(text: str, base: Path = HERE) -> tuple[str, list[str]]:
    """The README with every table rendered afresh, and the names of those that changed."""
    changed: list[str] = []
    closed = {m.start() for m in BLOCK.finditer(text)}
    unclosed = [m.group(0) for m in OPENING.finditer(text) if m.start() not in closed]
    if unclosed:
        # Without this, the body would run on to the next table's end and swallow the text between.
        raise ValueError(f"no <!-- /table --> before the next table for: {unclosed}")

    def one(m: re.Match[str]) -> str:
        fresh = render(m.group(2), m.group(3), base)
        if fresh != m.group(4):
            changed.append(f"{m.group(2)} ({m.group(3)})")
        return m.group(1) + fresh + m.group(5)

    return BLOCK.sub(one, text), changed


CONSOLE = re.compile(r"<!-- console: (\S+) -->\n.*?<!-- /console -->", re.S)
"""Tables copied from a benchmark's console output before its results were stored: each
names the script whose ``--out`` run will replace it. tests/benchmarks/test_tables.py
pins the list, so that no new one is added."""


def console_tables(text: str) -> list[str]:
    return CONSOLE.findall(text)


def sections(text: str) -> dict[str, str]:
    """The README's ``## `` sections by heading (the text before the first: "")."""
    out: dict[str, str] = {}
    heading = ""
    for line in text.splitlines(keepends=True):
        if line.startswith("## "):
            heading = line[3:].strip()
        out[heading] = out.get(heading, "") + line
    return out


def loose_tables(text: str) -> list[str]:
    """Table lines that no marker covers: tables typed in by hand."""
    covered = CONSOLE.sub("", BLOCK.sub("", text))
    return [line for line in covered.splitlines() if line.startswith("|")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m voxwire.benchmarks.tables", description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="report stale tables, change nothing")
    args = p.parse_args(argv)
    text = README.read_text()
    fresh, changed = regenerate(text)
    loose = loose_tables(text)
    for line in loose:
        print(f"not generated: {line}", file=sys.stderr)
    if args.check:
        for name in changed:
            print(f"stale: {name}", file=sys.stderr)
        return 1 if changed or loose else 0
    README.write_text(fresh)
    for name in changed:
        print(f"regenerated: {name}")
    return 1 if loose else 0


if __name__ == "__main__":
    sys.exit(main())
