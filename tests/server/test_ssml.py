"""SSML through a real server on every door (docs/ssml.md): breaks as exact silence in the
audio and the timestamps, rates, phonemes, aliases and say-as heard, what is not read
named once, and bad documents refused with their position."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.tts import Synthesize, SynthesizeStart

from tests.conftest import RunningServer
from tests.server.doors.test_wyoming import hear, port, read
from tests.server.test_stream import assert_speech
from voxwire_client import Client, ServerError

RATE = 22050  # joe's own: pcm_f32le at it is the engine's samples, not resampled
TEN = "wˈʌn tˈuː θɹˈiː fˈɔːɹ fˈaɪv sˈɪks sˈɛvən ˈeɪt nˈaɪn tˈɛn"


async def spoken(server: RunningServer, document: str, **settings) -> tuple[np.ndarray, list[dict], dict, dict]:
    """The audio (float32 at the voice's rate), the timed words, started and done."""
    async with await Client.connect(server.ws) as client:
        u = await client.speak(document, text_format="ssml", timestamps=True, format="pcm_f32le", sample_rate=RATE,
                               **settings)
        frames, done = await u.collect()
    assert u.started is not None
    return np.concatenate([f.to_float32() for f in frames]), u.words, u.started.data, done.data


def silences(audio: np.ndarray) -> list[tuple[int, int]]:
    """Runs of exact zeros longer than 10 ms, as (start, length) in samples. The engine's
    own quiet is never exactly zero for so long; a break's silence is."""
    zero = np.concatenate([[False], audio == 0, [False]])
    edges = np.flatnonzero(np.diff(zero.astype(np.int8)))
    runs = [(int(a), int(b - a)) for a, b in zip(edges[::2], edges[1::2])]
    return [r for r in runs if r[1] > RATE // 100]


def word(words: list[dict], text: str) -> dict:
    [found] = [w for w in words if w["word"] == text]
    return found


async def test_a_break_is_exact_silence_in_the_audio_and_the_timestamps(piper_server):
    audio, words, _, _ = await spoken(piper_server, '<speak>Hello there. <break time="500ms"/>How are you?</speak>')
    [(start, length)] = silences(audio)
    assert length == RATE // 2  # 500 ms, to the sample
    assert word(words, "there")["end_ms"] <= 1000 * start / RATE + 1
    assert word(words, "How")["start_ms"] >= 1000 * (start + length) / RATE - 1
    assert_speech(audio, RATE, words=5)
    audio, words, _, _ = await spoken(piper_server, '<speak>One <break time="1.5s"/> two <break strength="weak"/> three.</speak>')
    assert [n for _, n in silences(audio)] == [round(1.5 * RATE), RATE // 4]
    assert [w["word"] for w in words] == ["One", "two", "three"]


async def test_a_prosody_rate_speaks_its_words_slower_or_faster(piper_server):
    text = "The museum opens at nine."
    _, normal, _, _ = await spoken(piper_server, f"<speak>{text}</speak>")
    _, slow, _, _ = await spoken(piper_server, f'<speak><prosody rate="x-slow">{text}</prosody></speak>')
    _, fast, _, _ = await spoken(piper_server, f'<speak><prosody rate="150%">{text}</prosody></speak>')

    def length(words: list[dict]) -> float:
        return words[-1]["end_ms"] - words[0]["start_ms"]

    assert length(slow) > 1.3 * length(normal) and length(fast) < 0.8 * length(normal)


async def test_phoneme_sub_and_say_as_are_heard_and_timed(piper_server):
    plain, plain_words, _, _ = await spoken(piper_server, "<speak>I use Postgres daily.</speak>")
    said, words, _, _ = await spoken(piper_server, f'<speak>I use <phoneme alphabet="ipa" ph="{TEN}">Postgres</phoneme> '
                                                   "daily.</speak>")
    assert [w["word"] for w in words] == ["I", "use", "Postgres", "daily"]  # timed as written
    assert said.size > plain.size + 1.5 * RATE
    _, words, _, _ = await spoken(piper_server, '<speak>Use the <sub alias="World Wide Web">WWW</sub>, '
                                                'spelled <say-as interpret-as="characters">SQL</say-as>, on '
                                                '<say-as interpret-as="date" format="mdy">3/5/2024</say-as>.</speak>')
    assert [w["word"] for w in words] == ["Use", "the", "World", "Wide", "Web", "spelled", "S", "Q", "L", "on",
                                          "March", "fifth", "2024"]


async def test_what_is_not_read_is_spoken_and_named_once_in_started(piper_server):
    audio, words, started, _ = await spoken(
        piper_server, '<speak><emphasis level="strong">Really</emphasis> <prosody pitch="+2st">good</prosody> '
                      "<emphasis>news</emphasis>.</speak>")
    assert started["ssml_ignored"] == ["<emphasis>", "<prosody pitch>"] and started["text_format"] == "ssml"
    assert [w["word"] for w in words] == ["Really", "good", "news"]
    _, _, plain_started, _ = await spoken(piper_server, "<speak>Fine.</speak>")
    assert "ssml_ignored" not in plain_started


@pytest.mark.parametrize("document, says", [
    ("<speak>Fish & chips</speak>", "SSML is not well-formed at line 1, column 14"),
    ("<speak>\n<s>Hi</p></speak>", "line 2, column 8: mismatched tag"),
    ('<!DOCTYPE speak [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]><speak>&b;</speak>',
     "may not have a DTD or declare entities"),
    ('<speak><break time="1h"/></speak>', "a time is a number of ms or s"),
])
async def test_a_bad_document_is_refused_with_where_and_why_and_the_socket_speaks_on(piper_server, document, says):
    async with await Client.connect(piper_server.ws) as client:
        with pytest.raises(ServerError) as e:
            await (await client.speak(document, text_format="ssml")).collect()
        assert e.value.code == "invalid_ssml" and says in e.value.message, e.value.message
        _, done = await (await client.speak("Still here.")).collect()
    assert done.data["samples"] > 0


async def test_ssml_comes_whole_and_a_streamed_document_is_refused_clearly(piper_server):
    async with await Client.connect(piper_server.ws) as client:
        with pytest.raises(ServerError) as e:
            await (await client.speak("<speak>Hello", text_format="ssml", final=False)).collect()
        assert e.value.code == "invalid_ssml" and "SSML comes whole" in e.value.message
        # As text, the same markup is read as it is written.
        frames, done = await (await client.speak("Fish &amp; chips.")).collect()
    assert done.data["samples"] > 0


def test_the_openai_route_reads_an_input_that_starts_with_speak_and_says_what_it_ignored(piper_server):
    def speech(text: str, **fields) -> httpx.Response:
        return httpx.post(f"{piper_server.http}/v1/audio/speech", timeout=60, json={
            "model": "tts-1", "input": text, "voice": "joe", "response_format": "pcm", "sample_rate": RATE, **fields})

    ssml = speech('<speak>Hello. <break time="2s"/> <emphasis>Bye.</emphasis></speak>')
    plain = speech("Hello. Bye.")
    assert ssml.status_code == plain.status_code == 200
    assert ssml.headers["x-voxwire-ssml-ignored"] == "<emphasis>" and "x-voxwire-ssml-ignored" not in plain.headers
    pcm = np.frombuffer(ssml.content, "<i2")
    assert pcm.size > np.frombuffer(plain.content, "<i2").size + 1.8 * RATE
    assert max(n for _, n in silences(pcm.astype(np.float32))) >= 2 * RATE  # int16 zeros, at least the break
    explicit = np.frombuffer(speech('Hello <break time="2s"/> there.', text_format="ssml").content, "<i2")
    as_text = np.frombuffer(speech('Hello <break time="2s"/> there.').content, "<i2")
    assert max(n for _, n in silences(explicit.astype(np.float32))) >= 2 * RATE
    assert not silences(as_text.astype(np.float32)) or max(n for _, n in silences(as_text.astype(np.float32))) < RATE
    refused = speech("<speak>Fish & chips</speak>")
    error = refused.json()["error"]
    assert refused.status_code == 400 and (error["code"], error["param"]) == ("invalid_ssml", "input")
    assert "line 1, column 14" in error["message"]
    bad_format = speech("Hi.", text_format="markdown").json()["error"]
    assert (bad_format["code"], bad_format["param"]) == ("invalid_field", "text_format")


async def test_wyoming_reads_text_format_ssml_and_refuses_it_streamed(piper_wyoming_server):
    server = piper_wyoming_server
    async with AsyncTcpClient("127.0.0.1", port(server)) as client:
        await client.write_event(Synthesize(text='Hello. <break time="1s"/> Bye.', text_format="ssml").event())
        heard = await hear(client)
        await client.write_event(Synthesize(text="Hello. Bye.").event())
        plain = await hear(client)
    rate = heard.start.rate  # type: ignore[union-attr]
    assert heard.audio.size > plain.audio.size + 0.8 * rate
    async with AsyncTcpClient("127.0.0.1", port(server)) as client:
        await client.write_event(SynthesizeStart(text_format="ssml").event())
        event = await read(client)
    assert Error.is_type(event.type) and Error.from_event(event).code == "invalid_ssml"
