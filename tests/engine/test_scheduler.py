from dataclasses import dataclass

from voxwire.engine.scheduler import pick, playback_deadline


@dataclass
class U:
    name: str
    submitted_at: float
    first_audio_at: float | None = None
    produced_seconds: float = 0.0
    ready: bool = True
    full: bool = False
    work: int = 1
    memory: int = 0

    def runnable(self) -> bool:
        return self.ready

    def backlogged(self) -> bool:
        return self.full

    def cost(self) -> int:
        return self.work

    def memory_needed(self) -> int:
        return self.memory


def test_waiting_for_first_audio_comes_before_playing_oldest_first():
    playing = U("playing", 0.0, first_audio_at=1.0, produced_seconds=3.0)  # dry at 4.0
    new_late = U("late", 5.0)
    new_early = U("early", 4.0)
    order = pick([playing, new_late, new_early], limit=3, now=3.0)
    assert [u.name for u in order] == ["early", "late", "playing"]


def test_a_listener_about_to_run_dry_goes_before_newcomers():
    dry_soon = U("dry", 0.0, first_audio_at=1.0, produced_seconds=0.25)  # dry at 1.25
    drier = U("drier", 0.0, first_audio_at=1.0, produced_seconds=0.2)  # dry at 1.2
    comfortable = U("ok", 0.0, first_audio_at=1.0, produced_seconds=5.0)
    new = U("new", 1.1)
    # 0.15 s left < URGENT_SECONDS: the earliest deadline first, then newcomers.
    order = pick([comfortable, new, dry_soon, drier], limit=4, now=1.1)
    assert [u.name for u in order] == ["drier", "dry", "new", "ok"]
    assert [u.name for u in pick([comfortable, new], limit=4, now=1.1)] == ["new", "ok"]


def test_one_kind_gives_each_kind_a_step_of_its_own():
    dry = U("dry", 0.0, first_audio_at=1.0, produced_seconds=0.2)
    comfortable = U("ok", 0.0, first_audio_at=1.0, produced_seconds=5.0)
    also_ok = U("ok2", 0.0, first_audio_at=1.0, produced_seconds=6.0)
    new, newer = U("new", 1.05), U("newer", 1.08)
    everyone = [comfortable, new, dry, also_ok, newer]
    assert [u.name for u in pick(everyone, limit=8, now=1.1, one_kind=True)] == ["dry"]
    assert [u.name for u in pick(everyone[:2] + everyone[3:], limit=8, now=1.1, one_kind=True)] == ["new", "newer"]
    assert [u.name for u in pick([comfortable, also_ok], limit=8, now=1.1, one_kind=True)] == ["ok", "ok2"]


def test_with_one_kind_only_the_batch_size_bounds_a_newcomers_step():
    newcomers = [U(f"n{i}", 1.0 + i / 100, work=32) for i in range(6)]
    playing = [U(f"p{i}", 0.0, first_audio_at=1.0, produced_seconds=5.0, work=32) for i in range(6)]
    assert len(pick(newcomers, limit=4, budget=64, now=2.0, one_kind=True)) == 4
    assert len(pick(playing, limit=4, budget=64, now=2.0, one_kind=True)) == 2
    assert len(pick(newcomers, limit=4, budget=64, now=2.0)) == 2  # kinds mixed: the budget holds


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


def test_a_batch_takes_the_most_urgent_up_to_the_limit():
    us = [U(f"n{i}", float(i)) for i in range(5)]
    assert [u.name for u in pick(us, limit=3, now=9.0)] == ["n0", "n1", "n2"]


def test_the_step_budget_bounds_a_batch_but_the_first_always_goes_in():
    big = U("big", 0.0, work=100)
    small = [U(f"s{i}", 1.0 + i, work=10) for i in range(3)]
    assert [u.name for u in pick([big, *small], limit=8, budget=50, now=5.0)] == ["big"]
    assert [u.name for u in pick(small, limit=8, budget=25, now=5.0)] == ["s0", "s1"]


def test_newcomers_join_while_their_memory_fits_and_none_passes_one_that_waits():
    playing = U("playing", 0.0, first_audio_at=1.0, produced_seconds=9.0)  # admitted: needs none
    first = U("first", 2.0, memory=60)
    large = U("large", 3.0, memory=50)
    small = U("small", 4.0, memory=10)
    batch = pick([playing, first, large, small], limit=8, memory_left=100, now=5.0)
    assert [u.name for u in batch] == ["first", "playing"]  # large waits; small may not pass it
    assert [u.name for u in pick([first, small], limit=8, memory_left=100, now=5.0)] == ["first", "small"]
