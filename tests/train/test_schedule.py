"""The learning-rate schedule: WSD and cosine shapes sized by fractions, and plans for runs whose
length changes (a budget re-fitted to the time left, a finished run extended)."""

import itertools

import pytest

from lmforge.train.schedule import OPEN_HORIZON, Schedule, lr_at, wsd_lr_at

KW = dict(max_lr=1.0, min_lr=0.1, warmup_steps=10)


def test_one_cosine_plan_is_the_plain_cosine():
    schedule = Schedule(**KW, kind="cosine")
    schedule.run_to(0, 100)
    assert [schedule.lr(s) for s in range(120)] == [
        lr_at(s, **KW, total_steps=100) for s in range(120)
    ]


def test_wsd_warms_up_holds_the_peak_and_decays_over_its_last_fifth():
    schedule = Schedule(**KW, warmup_frac=0.05, decay_frac=0.2)
    schedule.run_to(0, 100)
    lrs = [schedule.lr(s) for s in range(110)]
    assert lrs[:5] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])  # 5 % of the run, not 10 steps
    assert lrs[5:80] == [1.0] * 75
    decay = lrs[80:100]
    assert all(b < a for a, b in itertools.pairwise(decay))
    assert decay[-1] == pytest.approx(0.1 + 0.9 / 21) and lrs[100:] == [0.1] * 10
    assert lrs == [wsd_lr_at(s, 1.0, 0.1, 5, 80, 100) for s in range(110)]
    assert not schedule.decaying(79) and schedule.decaying(80)


def test_a_short_run_warms_up_for_a_fraction_of_it_not_the_fixed_step_count():
    schedule = Schedule(max_lr=1.0, min_lr=0.0, warmup_steps=50, warmup_frac=0.05)
    schedule.run_to(0, 53)  # the busy machine: 50 of 53 steps were warmup
    assert schedule.warmup(53) == 3 and schedule.decay_start(53) == 42
    assert schedule.lr(2) == 1.0 and schedule.lr(41) == 1.0


def test_refitting_on_the_plateau_edits_the_plan_and_changes_no_past_step():
    schedule = Schedule(**KW)
    schedule.run_to(0, 1000)
    before = [schedule.lr(s) for s in range(300)]
    schedule.run_to(300, 700)  # the machine slowed: fewer steps fit
    schedule.run_to(400, 800)  # ... then sped up again
    assert schedule.horizons == [(0, 800)]
    assert [schedule.lr(s) for s in range(300)] == before
    assert schedule.decay_start(800) == 640 and schedule.lr(639) == 1.0


def test_shortened_inside_the_decay_it_decays_from_where_it_is_to_the_floor():
    schedule = Schedule(**KW)
    schedule.run_to(0, 100)
    at_85 = schedule.lr(85)
    schedule.run_to(85, 92)  # behind the budget while cooling down
    assert schedule.horizons == [(0, 100), (85, 92)]
    tail = [schedule.lr(s) for s in range(85, 92)]
    assert at_85 > tail[0] and all(b < a for a, b in itertools.pairwise(tail))
    assert tail[-1] == pytest.approx(0.1 + (at_85 - 0.1) / 8) and schedule.lr(95) == 0.1


def test_the_budget_fixed_after_the_open_horizon_ramps_on_from_the_warmup_so_far():
    schedule = Schedule(**KW, warmup_frac=0.05)
    assert schedule.lr(4) == pytest.approx(0.5)  # open horizon: warmup_steps of warmup
    schedule.run_to(7, 60)  # 60 steps fit: a 3-step warmup, already past
    assert schedule.horizons == [(0, OPEN_HORIZON), (7, 60)]
    assert [schedule.lr(s) for s in range(7)] == pytest.approx([0.1 * (s + 1) for s in range(7)])
    assert 0.7 < schedule.lr(7) < 1.0 and schedule.lr(20) == 1.0


@pytest.mark.parametrize("kind", ["wsd", "cosine"])
def test_a_finished_run_extended_rewarms_then_follows_the_longer_run(kind):
    schedule = Schedule(**KW, kind=kind)
    schedule.run_to(0, 100)
    schedule.run_to(100, 200)
    assert schedule.horizons == [(0, 100), (100, 200)]
    assert schedule.lr(100 - 1) < 0.15  # the first plan ended near the floor
    rewarm = [schedule.lr(s) for s in range(100, 110)]  # a tenth of the 100 added steps
    target = schedule.curve(110, 200)
    assert schedule.lr(99) < rewarm[0] < rewarm[-1] < target  # rises steadily from there ...
    assert all(b > a for a, b in itertools.pairwise(rewarm))
    for s in range(110, 210):  # ... to a 200-step run's curve, down to the floor
        assert schedule.lr(s) == schedule.curve(s, 200)
    assert schedule.lr(199) < 0.13 and schedule.lr(200) == 0.1


def test_extending_twice_and_replanning_before_a_step():
    schedule = Schedule(**KW, kind="cosine")
    schedule.run_to(0, 100)
    schedule.run_to(100, 150)
    schedule.run_to(100, 200)  # changed again before any step of the tail: replaces it
    assert schedule.horizons == [(0, 100), (100, 200)]
    schedule.run_to(200, 300)
    assert schedule.horizons == [(0, 100), (100, 200), (200, 300)]
    assert schedule.lr(200) > schedule.lr(199)
    schedule.run_to(200, 300)  # the same length: nothing changes
    assert len(schedule.horizons) == 3


def test_no_plan_is_the_open_horizon_of_a_budget_not_yet_fixed():
    schedule = Schedule(**KW)
    assert schedule.total is None
    assert schedule.lr(4) == pytest.approx(0.5) and schedule.lr(50) == pytest.approx(1.0, abs=1e-6)
