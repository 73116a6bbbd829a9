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
    playing = U("playing", 0.0, first_audio_at=1.0, produced_seconds=3.0)  # dry at 4.0
    new_late = U("late", 5.0)
    new_early = U("early", 4.0)
    order = pick([playing, new_late, new_early], limit=3, now=3.0)
    assert [u.name for u in order] == ["early", "late", "playing"]


def test_a_listener_about_to_run_dry_goes_before_newcomers():
    dry_soon = U("dry", 0.0, first_audio_at=1.0, produced_seconds=0.25)  # dry at 1.25
    comfortable = U("ok", 0.0, first_audio_at=1.0, produced_seconds=5.0)
    new = U("new", 1.1)
    order = pick([comfortable, new, dry_soon], limit=3, now=1.1)  # 0.15 s left < URGENT_SECONDS
    assert [u.name for u in order] == ["dry", "new", "ok"]


def test_earliest_playback_deadline_first():
    a = U("a", 0.0, first_audio_at=1.0, produced_seconds=3.0)  # runs dry at 4.0
    b = U("b", 0.0, first_audio_at=2.0, produced_seconds=1.5)  # runs dry at 3.5
    assert playback_deadline(b) == 3.5
    assert [u.name for u in pick([a, b], limit=2, now=2.0)] == ["b", "a"]


def test_backlogged_and_idle_utterances_are_skipped():
    full = U("full", 0.0, full=True)
    idle = U("idle", 0.0, ready=False)
    ok = U("ok", 9.0, first_audio_at=10.0, produced_seconds=60.0)
    assert pick([full, idle, ok], now=10.0) == [ok]
    assert pick([full, idle], now=10.0) == []
