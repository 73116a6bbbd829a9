"""benchmarks/lexicon.py: the lexicon it measures is the one it says it is."""

from __future__ import annotations

import re

from voxwire.benchmarks.corpus import REPLIES
from voxwire.benchmarks.lexicon import ENTRIES, in_process, lexicon_file
from voxwire.engine.text.lexicon import Phonemes, load


def test_the_lexicon_has_its_entries_and_matches_the_corpus_words_it_holds(tmp_path):
    path, matched = lexicon_file(tmp_path)
    lexicon = load(path)
    corpus = {w for reply in REPLIES for w in re.findall(r"[A-Za-z]+", reply) if len(w) > 3}
    assert len(lexicon) == ENTRIES and matched == len(corpus) > 20
    pieces = [p for reply in REPLIES for p in lexicon.pieces(reply)]
    assert sum(isinstance(p, Phonemes) for p in pieces) >= 2 * len(REPLIES)
    # The respellings are the words themselves: what is spoken keeps its words.
    text = " ".join(p for p in pieces if not isinstance(p, Phonemes)).lower()
    assert set(re.findall(r"[a-z]+", text)) <= {w.lower() for r in REPLIES for w in re.findall(r"[A-Za-z]+", r)}


def test_in_process_times_every_lexicon_on_every_round(tmp_path):
    sparse, matched = lexicon_file(tmp_path, matched=2)
    figures = in_process({"sparse": sparse}, rounds=3)
    assert matched == 2 and set(figures) == {"none", "sparse"}
    assert all(len(v) == 3 and all(ms > 0 for ms in v) for v in figures.values())


def test_a_reply_as_ssml_says_the_reply_and_the_rich_one_reads_every_element():
    from voxwire.benchmarks.lexicon import parse_times, ssml
    from voxwire.engine.text.ssml import Break, Rate, Text, parse

    for reply in REPLIES:
        script = parse(ssml(reply))
        assert "".join(i.text for i in script.items if isinstance(i, Text)) == reply and not script.ignored
        rich = parse(ssml(reply, rich=True))
        assert not rich.ignored and any(isinstance(i, Break) for i in rich.items)
        assert any(isinstance(i, Rate) for i in rich.items)
    figures = parse_times(rounds=4)
    assert set(figures) == {"reply in <speak>", "with 4 elements"}
    assert all(len(v) == 4 and all(ms > 0 for ms in v) for v in figures.values())
