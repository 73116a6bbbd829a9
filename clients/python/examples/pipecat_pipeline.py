"""A Pipecat pipeline whose TTS is Voxwire: an LLM's answer, streamed token by token,
spoken by a Voxwire server and written to a WAV file with its word timings printed.

    pip install "voxwire-client[pipecat]"
    python pipecat_pipeline.py --url ws://127.0.0.1:8000/v1/stream -o answer.wav

The "LLM" here replays a fixed answer at 20 tokens a second so that the example runs
offline; in a voice assistant the same service sits between the LLM and the transport's
output (docs/integrations.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import wave

from pipecat.frames.frames import (
    EndFrame,
    Frame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TTSAudioRawFrame,
    TTSTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.workers.runner import WorkerRunner

from voxwire_client.pipecat import VoxwireTTSService

ANSWER = "Sure. The museum opens at nine, and the guided tours start at ten. Would you like me to book one?"


class WavSink(FrameProcessor):
    """The pipeline's output: audio to a WAV file, timed words to the terminal."""

    def __init__(self, path: str, sample_rate: int) -> None:
        super().__init__()
        self.wav = wave.open(path, "wb")
        self.wav.setnchannels(1)
        self.wav.setsampwidth(2)
        self.wav.setframerate(sample_rate)

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSAudioRawFrame):
            self.wav.writeframes(frame.audio)
        elif isinstance(frame, TTSTextFrame):
            print(f"{frame.pts / 1e9:7.3f} s  {frame.text}")
        elif isinstance(frame, EndFrame):
            self.wav.close()
        await self.push_frame(frame, direction)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="ws://127.0.0.1:8000/v1/stream")
    parser.add_argument("--voice", default=None)
    parser.add_argument("--sample-rate", type=int, default=24000)
    parser.add_argument("-o", "--output", default="answer.wav")
    args = parser.parse_args()

    tts = VoxwireTTSService(
        url=args.url,
        api_key=os.environ.get("VOXWIRE_API_KEY"),  # for a server started with keys
        settings=VoxwireTTSService.Settings(voice=args.voice),
    )
    worker = PipelineWorker(
        Pipeline([tts, WavSink(args.output, args.sample_rate)]),
        params=PipelineParams(audio_out_sample_rate=args.sample_rate),
    )
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def on_started(worker: PipelineWorker, frame: Frame) -> None:
        started.set()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    running = asyncio.create_task(runner.run())
    await started.wait()
    # The LLM's answer as Pipecat's LLM services deliver it: a frame per token.
    await worker.queue_frame(LLMFullResponseStartFrame())
    for token in re.findall(r"\s*\S+", ANSWER):
        await worker.queue_frame(LLMTextFrame(token))
        await asyncio.sleep(0.05)
    await worker.queue_frames([LLMFullResponseEndFrame(), EndFrame()])
    await running


if __name__ == "__main__":
    asyncio.run(main())
