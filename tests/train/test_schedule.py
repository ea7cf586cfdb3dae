"""The learning-rate schedule's plans: a run whose length changes continues on a new tail."""

import itertools

import pytest

from lmforge.train.schedule import Schedule, lr_at

KW = dict(max_lr=1.0, min_lr=0.1, warmup_steps=10)


def test_one_plan_is_the_plain_schedule():
    schedule = Schedule(**KW)
    schedule.plan(0, 100)
    assert [schedule.lr(s) for s in range(120)] == [
        lr_at(s, **KW, total_steps=100) for s in range(120)
    ]


def test_a_finished_run_extended_rewarms_then_follows_the_longer_runs_cosine():
    schedule = Schedule(**KW)
    schedule.plan(0, 100)
    schedule.plan(100, 200)
    assert schedule.plans == [(0, 100), (100, 200)]
    assert schedule.lr(100 - 1) == pytest.approx(0.1, abs=1e-3)  # the first plan ended at the floor
    rewarm = [schedule.lr(s) for s in range(100, 110)]  # a tenth of the 100 added steps
    target = lr_at(110, **KW, total_steps=200)
    assert 0.1 < rewarm[0] < rewarm[-1] < target  # rises steadily from the floor ...
    assert all(b > a for a, b in itertools.pairwise(rewarm))
    for s in range(110, 210):  # ... to a 200-step run's curve, down to the floor
        assert schedule.lr(s) == lr_at(s, **KW, total_steps=200)
    assert schedule.lr(199) == pytest.approx(0.1, abs=1e-3)


def test_extending_twice_and_replanning_before_a_step():
    schedule = Schedule(**KW)
    schedule.plan(0, 100)
    schedule.plan(100, 150)
    schedule.plan(100, 200)  # changed again before any step of the tail: replaces it
    assert schedule.plans == [(0, 100), (100, 200)]
    schedule.plan(200, 300)
    assert schedule.plans == [(0, 100), (100, 200), (200, 300)]
    assert schedule.lr(200) > schedule.lr(199)
    schedule.plan(200, 300)  # the same length: nothing changes
    assert len(schedule.plans) == 3


def test_no_plan_is_the_open_horizon_of_a_budget_not_yet_fixed():
    schedule = Schedule(**KW)
    assert schedule.total is None
    assert schedule.lr(4) == pytest.approx(0.5) and schedule.lr(50) == pytest.approx(1.0, abs=1e-6)
