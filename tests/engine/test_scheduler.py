from dataclasses import dataclass

from engine.scheduler import pick, playback_deadline


@dataclass
class U:
    name: str
    submitted_at: float
    first_audio_at: float | None = None
    produced_seconds: float = 0.0
    ready: bool = True
    full: bool = False

    def runnable(self) -> bool:
        return self.ready

    def backlogged(self) -> bool:
        return self.full


def test_waiting_for_first_audio_comes_before_playing_oldest_first():
    playing = U("playing", 0.0, first_audio_at=1.0, produced_seconds=0.1)
    new_late = U("late", 5.0)
    new_early = U("early", 4.0)
    assert [u.name for u in pick([playing, new_late, new_early], limit=3)] == ["early", "late", "playing"]


def test_earliest_playback_deadline_first():
    a = U("a", 0.0, first_audio_at=1.0, produced_seconds=3.0)  # runs dry at 4.0
    b = U("b", 0.0, first_audio_at=2.0, produced_seconds=1.5)  # runs dry at 3.5
    assert playback_deadline(b) == 3.5
    assert [u.name for u in pick([a, b], limit=2)] == ["b", "a"]


def test_backlogged_and_idle_utterances_are_skipped():
    full = U("full", 0.0, full=True)
    idle = U("idle", 0.0, ready=False)
    ok = U("ok", 9.0, first_audio_at=10.0, produced_seconds=60.0)
    assert pick([full, idle, ok]) == [ok]
    assert pick([full, idle]) == []
