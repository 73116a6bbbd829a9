"""A lexicon on the Piper engine: its phonemes and respellings are what is spoken, in the
sentences espeak-ng would make, and the timings still name the written words."""

from __future__ import annotations

import pytest

from voxwire.engine.base import EngineError, SynthesisParams, WordTimings
from voxwire.engine.errors import ErrorCode
from voxwire.engine.text.lexicon import Lexicon, entry

LONG = "/wˈʌn tˈuː θɹˈiː fˈɔːɹ fˈaɪv sˈɪks sˈɛvən ˈeɪt nˈaɪn tˈɛn/"


@pytest.fixture(scope="module")
def engine():
    import torch

    from voxwire.engine.piper.engine import PiperEngine

    e = PiperEngine(backend="torch", device="cpu")
    torch.set_num_threads(1)  # PiperEngine sets its own count; see conftest for why 1
    return e


@pytest.fixture(scope="module")
def joe(engine):
    return engine._voices["joe"]


def said(joe, text: str, lexicon: Lexicon | None = None) -> list[str]:
    return ["".join(s) for s in joe.phonemize(text, lexicon)]


def test_phonemes_are_spliced_in_with_the_punctuation_and_sentences_around_them(joe):
    lexicon = Lexicon([entry("Voxwire", "/vˈɑks/")])
    plain = said(joe, "Hello Voxwire, hi. I use Voxwire! It works?")
    assert said(joe, "Hello Voxwire, hi. I use Voxwire! It works?", lexicon) == [
        s.replace(said(joe, "Voxwire")[0], "vˈɑks") for s in plain
    ]
    assert said(joe, "Voxwire", lexicon) == ["vˈɑks"]


def test_a_respelling_is_phonemized_as_its_words(joe):
    lexicon = Lexicon([entry("SQL", "sequel")])
    assert said(joe, "I like SQL.", lexicon) == said(joe, "I like sequel.")


def test_the_timed_word_is_the_written_word_and_spans_what_the_lexicon_says(engine):
    def timed(lexicon):
        params = SynthesisParams(voice="joe", timestamps=True, lexicon=lexicon)
        words = [w for item in engine.synthesize("I use Voxwire daily.", params) if isinstance(item, WordTimings)
                 for w in item.words]
        return {w.word: w.end - w.start for w in words}, [w.word for w in words]

    plain, order = timed(None)
    counted, counted_order = timed(Lexicon([entry("voxwire", LONG)]))
    assert order == counted_order == ["I", "use", "Voxwire", "daily"]
    # Ten words said for one: the written word's time grows, its neighbours' do not.
    assert counted["Voxwire"] > 3 * plain["Voxwire"]
    assert counted["daily"] < 1.5 * plain["daily"]


def test_the_voice_lists_its_phonemes_and_refuses_an_entry_it_cannot_say(engine):
    voice = next(v for v in engine.voices() if v.id == "joe")
    assert {"ˈ", "ɑ", "ɚ", "ː"} <= set(voice.phonemes) and not {"_", "^", "$", " "} & set(voice.phonemes)
    voice.check_lexicon(Lexicon([entry("Voxwire", "/vˈɑks/"), entry("nginx", "engine x")]))
    with pytest.raises(EngineError, match="'Voxwire': voice 'joe' has no phoneme '€'") as e:
        voice.check_lexicon(Lexicon([entry("Voxwire", "/vˈɑks€/")]))
    assert e.value.code == ErrorCode.INVALID_LEXICON
