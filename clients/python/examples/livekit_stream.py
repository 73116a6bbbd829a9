"""Voxwire's LiveKit Agents plugin driven as an AgentSession drives it: an LLM's answer
pushed token by token into ``TTS.stream()``, the audio written to a WAV file and the
timed transcript printed.

    pip install "voxwire-client[livekit]"
    python livekit_stream.py --url ws://127.0.0.1:8000/v1/stream -o answer.wav

Runs offline, with no LiveKit server; in an agent, ``AgentSession(tts=TTS(...))`` does
the same with the LLM's real tokens (docs/integrations.md).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import wave

from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT

from voxwire_client.livekit import TTS

ANSWER = "Sure. The museum opens at nine, and the guided tours start at ten. Would you like me to book one?"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=None, help="default: $VOXWIRE_URL, else ws://127.0.0.1:8000/v1/stream")
    parser.add_argument("--voice", default=None)
    parser.add_argument("--sample-rate", type=int, default=24000)
    parser.add_argument("-o", "--output", default="answer.wav")
    args = parser.parse_args()

    tts = TTS(url=args.url, voice=args.voice, sample_rate=args.sample_rate)  # the key: $VOXWIRE_API_KEY
    stream = tts.stream()

    async def llm() -> None:
        for token in re.findall(r"\s*\S+", ANSWER):
            stream.push_text(token)
            await asyncio.sleep(0.05)  # 20 tokens a second
        stream.end_input()

    writer = asyncio.create_task(llm())
    with wave.open(args.output, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(args.sample_rate)
        async for audio in stream:
            wav.writeframes(audio.frame.data.tobytes())
            for word in audio.frame.userdata.get(USERDATA_TIMED_TRANSCRIPT, []):
                print(f"{word.start_time:7.3f} s  {word.strip()}")
    await writer
    await tts.aclose()


if __name__ == "__main__":
    asyncio.run(main())
