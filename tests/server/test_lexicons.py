"""Pronunciation lexicons through a real server: ``--lexicon`` files for every voice and
for one, a request's own ``lexicon``, and what is refused (docs/lexicons.md)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from voxwire.engine.registry import EngineOptions
from voxwire.server.config import ServerConfig
from voxwire.server.lexicons import ServerLexicons
from voxwire_client import Client, ServerError
from tests.conftest import RunningServer, run_server
from tests.server.test_stream import assert_speech

TEN = "/wˈʌn tˈuː θɹˈiː fˈɔːɹ fˈaɪv sˈɪks sˈɛvən ˈeɪt nˈaɪn tˈɛn/"
"""Ten words' phonemes: a word said as these lasts seconds, not a fraction of one."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    folder = tmp_path_factory.mktemp("lexicons")
    everyone, joes = folder / "everyone.txt", folder / "joe.txt"
    everyone.write_text(f"# everyone's\nVoxwire = {TEN}\nnginx = {TEN}\n", encoding="utf-8")
    joes.write_text("nginx = /ˈɛn/\n", encoding="utf-8")
    config = ServerConfig(engine=EngineOptions(name="piper"), lexicons=(str(everyone), f"joe={joes}"))
    with run_server(config) as s:
        yield s


async def spoken(server: RunningServer, text: str, **settings) -> tuple[np.ndarray, list[dict], dict]:
    async with await Client.connect(server.ws) as client:
        u = await client.speak(text, timestamps=True, sample_rate=24000, **settings)
        frames, done = await u.collect()
    audio = np.concatenate([f.to_float32() for f in frames])
    return audio, u.words, done.data


def seconds(words: list[dict], word: str) -> float:
    [timed] = [w for w in words if w["word"] == word]
    return (timed["end_ms"] - timed["start_ms"]) / 1000


async def test_a_request_entry_changes_the_audio_and_the_timestamps_keep_the_written_word(server):
    plain, plain_words, _ = await spoken(server, "I use Postgres daily.")
    said, said_words, _ = await spoken(server, "I use Postgres daily.", lexicon={"postgres": TEN})
    assert [w["word"] for w in said_words] == [w["word"] for w in plain_words] == ["I", "use", "Postgres", "daily"]
    assert seconds(said_words, "Postgres") > 2.5 * seconds(plain_words, "Postgres")
    assert said.size > plain.size + 1.5 * 24000  # nine words more, heard
    assert_speech(said, 24000, words=13)
    respelled, respelled_words, _ = await spoken(server, "I use Postgres daily.",
                                                 lexicon={"Postgres": "post gress, the database of databases"})
    assert [w["word"] for w in respelled_words] == ["I", "use", "Postgres", "daily"]
    assert seconds(respelled_words, "Postgres") > 2.5 * seconds(plain_words, "Postgres")


async def test_the_servers_file_speaks_on_every_door_and_a_request_wins_over_it(server):
    long, long_words, _ = await spoken(server, "Say Voxwire.")
    short, short_words, _ = await spoken(server, "Say Voxwire.", lexicon={"Voxwire": "/vˈɑks/"})
    assert seconds(long_words, "Voxwire") > 3 * seconds(short_words, "Voxwire")
    body = httpx.post(f"{server.http}/v1/audio/speech", timeout=60,
                      json={"model": "tts-1", "input": "Say Voxwire.", "voice": "joe", "response_format": "pcm"})
    assert body.status_code == 200
    openai = np.frombuffer(body.content, dtype="<i2").astype(np.float32) / 32768
    assert openai.size > short.size + 1.5 * 24000  # the file's ten words, on the OpenAI route too


def openai_speech(server: RunningServer, text: str, **fields) -> httpx.Response:
    return httpx.post(f"{server.http}/v1/audio/speech", timeout=60,
                      json={"model": "tts-1", "input": text, "voice": "joe", "response_format": "pcm", **fields})


def test_the_openai_route_takes_a_requests_own_lexicon_over_the_servers(server):
    plain = openai_speech(server, "I use Postgres daily.")
    said = openai_speech(server, "I use Postgres daily.", lexicon={"postgres": TEN})
    filed = openai_speech(server, "Say Voxwire.")
    mine = openai_speech(server, "Say Voxwire.", lexicon={"Voxwire": "/vˈɑks/"})
    assert [r.status_code for r in (plain, said, filed, mine)] == [200] * 4
    size = {name: len(r.content) // 2 for name, r in [("plain", plain), ("said", said), ("filed", filed), ("mine", mine)]}
    assert size["said"] > size["plain"] + 1.5 * 24000, size  # the entry's nine words more
    assert size["filed"] > size["mine"] + 1.5 * 24000, size  # the request's entry wins over the file's
    assert_speech(np.frombuffer(said.content, dtype="<i2").astype(np.float32) / 32768, 24000, words=13)


@pytest.mark.parametrize("lexicon, says", [
    ({"Postgres": "/pˈoʊst€/"}, "voice 'joe' has no phoneme '€'"),
    ({"Postgres": "a/b"}, "a value is phonemes between slashes"),
    ("Postgres", "\"lexicon\" must be an object"),
])
def test_the_openai_route_refuses_a_bad_lexicon_with_400_naming_the_field(server, lexicon, says):
    r = openai_speech(server, "I use Postgres daily.", lexicon=lexicon)
    error = r.json()["error"]
    assert r.status_code == 400 and (error["code"], error["param"], error["type"]) == (
        "invalid_lexicon", "lexicon", "invalid_request_error"), error
    assert says in error["message"], error["message"]
    assert openai_speech(server, "Still here.").status_code == 200


async def test_a_voices_file_wins_over_everyones(server):
    _, words, _ = await spoken(server, "Run nginx.")
    _, everyones, _ = await spoken(server, "Run nginx.", voice="joe", lexicon={"nginx": TEN})
    assert seconds(words, "nginx") < seconds(everyones, "nginx") / 3


async def test_a_lexicon_is_part_of_the_cached_results_key(tmp_path):
    with run_server(ServerConfig(engine=EngineOptions(name="piper"), cache_mb=16)) as server:
        first, _, done = await spoken(server, "I use Postgres daily.", lexicon={"postgres": "/pˈoʊst/"})
        again, _, cached = await spoken(server, "I use Postgres daily.", lexicon={"postgres": "/pˈoʊst/"})
        other, _, fresh = await spoken(server, "I use Postgres daily.", lexicon={"postgres": TEN})
    assert not done["cached"] and cached["cached"] and np.array_equal(first, again)
    assert not fresh["cached"] and other.size > first.size + 1.5 * 24000


@pytest.mark.parametrize("lexicon, says", [
    ({"Postgres": "/pˈoʊst€/"}, "lexicon entry 'Postgres': voice 'joe' has no phoneme '€'"),
    ({"Vox wire!": "x"}, "lexicon entry 'Vox wire!': a key is one or more words"),
    ({"Postgres": "a/b"}, "lexicon entry 'Postgres': a value is phonemes between slashes"),
    ({f"w{i}": "x" for i in range(501)}, "a lexicon has at most 500 entries here"),
    (["Postgres"], "\"lexicon\" must be an object"),
])
async def test_a_bad_request_entry_is_refused_naming_it_and_the_socket_speaks_on(server, lexicon, says):
    async with await Client.connect(server.ws) as client:
        with pytest.raises(ServerError) as e:
            await (await client.speak("I use Postgres daily.", lexicon=lexicon)).collect()
        assert e.value.code == "invalid_lexicon" and says in e.value.message, e.value.message
        frames, done = await (await client.speak("Still here.")).collect()
    assert done.data["samples"] > 0


async def test_the_largest_lexicon_a_request_may_have_is_taken_and_speaks(server):
    # 500 entries of 8-word keys and 390-character respellings: 225 KB, under the message limit.
    lexicon = {" ".join(f"w{i}x{j}" for j in range(8)): "x" * 390 for i in range(500)}
    lexicon["postgres"] = TEN
    del lexicon[next(iter(lexicon))]
    audio, words, done = await spoken(server, "I use Postgres daily.", lexicon=lexicon)
    assert [w["word"] for w in words] == ["I", "use", "Postgres", "daily"]
    assert done["audio_ms"] > 3000 and audio.size > 3 * 24000


async def test_replies_count_the_clients_own_entries(server):
    async with await Client.connect(server.ws) as client:
        configured = await client.configure(lexicon={"hi": "hello", "Postgres": "post gress"})
        u = await client.speak("Hi.")
        await u.collect()
        again = await client.speak("Hi.", lexicon=None)
        await again.collect()
    assert configured.data["lexicon"] == 2
    assert u.started is not None and u.started.data["lexicon"] == 2
    assert again.started is not None and again.started.data["lexicon"] == 0


def test_a_file_of_phonemes_is_refused_at_start_by_an_engine_whose_voices_come_later(cosyvoice_server, tmp_path):
    # CosyVoice2's voices are registered after the start and read respellings only: a file
    # of phonemes would otherwise be taken, and then refuse every request.
    cosyvoice2 = cosyvoice_server.service.worker.loaded_engine()
    phonemes, respelled = tmp_path / "phonemes.txt", tmp_path / "respelled.txt"
    phonemes.write_text("nginx = engine x\nVoxwire = /vˈɑkswaɪɚ/\n", encoding="utf-8")
    respelled.write_text("nginx = engine x\n", encoding="utf-8")
    with pytest.raises(ValueError, match="lexicon entry 'Voxwire': voice '\\(a voice registered later\\)' takes no "
                                         "phonemes; give a respelling"):
        ServerLexicons.load([str(phonemes)], cosyvoice2)
    assert [e.key for e in ServerLexicons.load([str(respelled)], cosyvoice2).everyone] == ["nginx"]


# -- inline phonemes: [word](/phonemes/) in the text itself --------------------------------

INLINE = f"I use [Postgres]({TEN}) daily."


async def test_inline_phonemes_across_streamed_messages_change_the_audio_and_keep_the_written_word(server):
    plain, plain_words, _ = await spoken(server, "I use Postgres daily.")
    async with await Client.connect(server.ws) as client:
        # Cut inside the markup, as an LLM's tokens would.
        u = await client.speak("I use [Post", final=False, timestamps=True, sample_rate=24000)
        for piece in ["gres](", TEN[:12], TEN[12:], ") daily."]:
            await u.send(piece, final=piece.endswith("."))
        frames, _ = await u.collect()
    said = np.concatenate([f.to_float32() for f in frames])
    assert [w["word"] for w in u.words] == ["I", "use", "Postgres", "daily"]
    assert seconds(u.words, "Postgres") > 2.5 * seconds(plain_words, "Postgres")
    assert said.size > plain.size + 1.5 * 24000
    assert_speech(said, 24000, words=13)


async def test_inline_phonemes_win_over_the_request_lexicon_and_apply_to_their_segment_alone(server):
    text = "Say [Voxwire](/vˈɑks/). Say Voxwire."
    audio, words, _ = await spoken(server, text, lexicon={"Voxwire": TEN})
    first, second = [w for w in words if w["word"] == "Voxwire"]
    assert [w["word"] for w in words] == ["Say", "Voxwire", "Say", "Voxwire"]
    assert (second["end_ms"] - second["start_ms"]) > 3 * (first["end_ms"] - first["start_ms"])


def test_inline_phonemes_speak_on_the_openai_route(server):
    plain = openai_speech(server, "I use Postgres daily.")
    said = openai_speech(server, INLINE)
    assert (plain.status_code, said.status_code) == (200, 200)
    assert len(said.content) // 2 > len(plain.content) // 2 + 1.5 * 24000


@pytest.mark.parametrize("text, says", [
    ("Use [C++](/siː/) here.", "inline phonemes '[C++](/siː/)': a key is one or more words"),
    ("Use [Postgres](/pˈoʊst€/) here.", "inline phonemes for 'Postgres': voice 'joe' has no phoneme '€'"),
])
async def test_inline_phonemes_that_cannot_be_said_are_refused_naming_them(server, text, says):
    async with await Client.connect(server.ws) as client:
        with pytest.raises(ServerError) as e:
            await (await client.speak(text)).collect()
        assert e.value.code == "invalid_lexicon" and says in e.value.message, e.value.message
        _, done = await (await client.speak("Still here.")).collect()
    assert done.data["samples"] > 0


async def test_brackets_that_are_no_markup_are_spoken_as_before(server):
    # A Markdown link is not inline phonemes: it is read as it always was.
    link = "Read [the guide](https://example.com/guide) today."
    audio, words, done = await spoken(server, link)
    assert [w["word"] for w in words] == ["Read", "the", "guide](https://example.com/guide", "today"]
    assert_speech(audio, 24000, words=8)  # the address is read out, as before
