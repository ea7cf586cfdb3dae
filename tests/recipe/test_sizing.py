"""The self-sizing recipe: the rule's fit, the shape choice, the decision kept per run folder."""

import dataclasses
import math
import time

import pytest

from lmforge.budget_clock import BudgetClock
from lmforge.config import load_config
from lmforge.model import ModelConfig
from lmforge.recipe.scaling import ScalingRule, fit, load_rule
from lmforge.recipe.shapes import LADDER, shape
from lmforge.recipe.sizing import (
    MIN_BATCH,
    MIN_STEPS,
    SIZING_SHARE,
    TIMED,
    Sizing,
    batch_for_steps,
    choose_shape,
    flops_per_token,
    sized_model,
    sized_train,
)
from lmforge.train.config import OptimizerConfig, TrainConfig

BASE = ModelConfig(vocab_size=4096, max_seq_len=256)
TRAIN = TrainConfig(batch_size=16, seq_len=256, minutes=8.0)
RULE = ScalingRule(E=0.8, A=40.0, alpha=0.3, B=300.0, beta=0.35)


def test_the_fit_recovers_a_rule_from_its_own_points():
    params = [s.params(4096) for s in LADDER for _ in range(4)]
    tokens = [t for _ in LADDER for t in (3e5, 1e6, 3e6, 1e7)]
    bpb = [RULE.bpb(n, d) for n, d in zip(params, tokens, strict=True)]
    rule = fit(params, tokens, bpb)
    assert rule.rms_error < 1e-3 and rule.points == len(bpb)
    for n, d in [(1e6, 2e6), (5e6, 5e6)]:
        assert rule.bpb(n, d) == pytest.approx(RULE.bpb(n, d), abs=5e-3)


def test_the_shipped_rule_prefers_more_tokens_and_more_parameters():
    rule = load_rule()
    assert rule.points >= 12 and rule.rms_error < 0.1
    assert rule.bpb(4e6, 4e6) < rule.bpb(4e6, 1e6) and rule.bpb(4e6, 4e6) < rule.bpb(1e6, 4e6)


def _timer(flop_rate: float, overhead_s: float = 0.0, timed: list | None = None):
    """A fake machine: a step costs its FLOPs at `flop_rate`, plus a fixed overhead."""

    def seconds_per_step(model: ModelConfig, batch_size: int) -> float:
        if timed is not None:
            timed.append((model.d_model, batch_size))
        s = next(s for s in LADDER if s.d_model == model.d_model)
        tokens = batch_size * TRAIN.seq_len
        return flops_per_token(s, BASE.vocab_size, TRAIN.seq_len) * tokens / flop_rate + overhead_s

    return seconds_per_step


def test_a_faster_machine_or_a_longer_budget_buys_a_bigger_shape():
    slow = choose_shape(BASE, TRAIN, 60, _timer(2e10), RULE)
    fast = choose_shape(BASE, TRAIN, 1800, _timer(2e11), RULE)
    assert shape(fast.chosen).params(4096) > shape(slow.chosen).params(4096)
    for sizing in (slow, fast):  # the winner is the best of the timed, by the rule at its speed
        timed = [c for c in sizing.candidates if c.measured_tokens_per_s]
        best = min(timed, key=lambda c: RULE.bpb(c.params, sizing.budget_s * c.tokens_per_s))
        assert sizing.chosen == best.shape
        assert sizing.tokens == int(best.tokens_per_s * sizing.train_minutes * 60)


def test_it_times_a_few_shapes_not_the_whole_ladder_and_says_why():
    timed = []
    sizing = choose_shape(BASE, TRAIN, 480, _timer(5e10, timed=timed), RULE)
    assert 1 <= len(timed) <= 4 and len(set(timed)) == len(timed)
    assert {batch for _, batch in timed} == {TRAIN.batch_size}  # steps enough: batch kept
    assert sizing.batch_size == TRAIN.batch_size and not sizing.batch_reason
    assert len(sizing.candidates) == len(LADDER)
    assert sizing.chosen in sizing.reason and "tokens/s" in sizing.reason
    assert sizing.train_minutes <= 8.0 and sizing.budget_s == 480


def test_timing_stops_adding_candidates_once_it_has_spent_its_share_of_the_budget():
    def shapes_timed(budget_s: float, cost_s: float) -> tuple[Sizing, set]:
        now, timed = [0.0], []
        fake = _timer(5e10, timed=timed)

        def seconds_per_step(model: ModelConfig, batch_size: int) -> float:
            now[0] += cost_s  # each timing takes cost_s of the fake clock
            return fake(model, batch_size)

        sizing = choose_shape(BASE, TRAIN, budget_s, seconds_per_step, RULE, clock=lambda: now[0])
        return sizing, {d for d, batch in timed if batch == TRAIN.batch_size}

    _, roomy = shapes_timed(1800, cost_s=1.0)
    assert len(roomy) >= TIMED  # the reference and the best few
    tight, timed = shapes_timed(120, cost_s=SIZING_SHARE * 120)
    assert len(timed) <= 2  # the reference, then the best predicted alone
    best = min(tight.candidates, key=lambda c: c.predicted_bpb)
    assert shape(best.shape).d_model in timed and shape(tight.chosen).d_model in timed


def test_a_budget_of_few_steps_trains_on_smaller_batches_timed_again(tmp_path):
    assert batch_for_steps(16, MIN_STEPS) == 16
    assert batch_for_steps(16, MIN_STEPS / 2 - 1) == 8  # halved while steps fall short
    assert batch_for_steps(64, MIN_STEPS / 5) == 8
    assert batch_for_steps(16, 1) == MIN_BATCH and batch_for_steps(4, 1) == 4  # never below
    timed = []
    sizing = choose_shape(BASE, TRAIN, 30, _timer(5e10, timed=timed), RULE)
    assert sizing.batch_size == 8 and "batches of 8 sequences, not 16" in sizing.reason
    assert timed[-1] == (shape(sizing.chosen).d_model, 8)  # the chosen shape, timed at 8
    assert sizing.tokens == int(sizing.batch_tokens_per_s * sizing.train_minutes * 60)
    assert sized_train(TRAIN, sizing).batch_size == 8
    sizing.save(tmp_path / "sizing.json")
    again = Sizing.load(tmp_path / "sizing.json")
    assert again == sizing and again.tokens_per_s == sizing.batch_tokens_per_s


def test_overheads_the_flop_count_misses_are_measured_not_predicted():
    # Small shapes dominated by a fixed per-step cost: the prediction favours them, the
    # measurement does not, and the measurement decides.
    sizing = choose_shape(BASE, TRAIN, 300, _timer(5e10, overhead_s=0.5), RULE)
    chosen = next(c for c in sizing.candidates if c.shape == sizing.chosen)
    assert chosen.measured_tokens_per_s < chosen.predicted_tokens_per_s


def test_the_decision_round_trips_through_its_file(tmp_path):
    sizing = choose_shape(BASE, TRAIN, 480, _timer(5e10), RULE)
    sizing.save(tmp_path / "sizing.json")
    again = Sizing.load(tmp_path / "sizing.json")
    assert again == sizing and again.reason == sizing.reason
    model = sized_model(BASE, again)
    assert model.d_model == shape(again.chosen).d_model and model.vocab_size == 4096
    assert model.head_dim == 64


def test_the_default_preset_sizes_itself_and_a_named_preset_pins_its_shape():
    assert load_config().size_to_budget and load_config().name == "auto"
    assert not load_config("small").size_to_budget
    auto, small = load_config(), load_config("small")
    assert dataclasses.replace(auto, name="small", size_to_budget=False) == small


def test_shape_params_match_the_model():
    torch = pytest.importorskip("torch")
    from lmforge.model import Transformer

    for s in LADDER[:4]:
        model = Transformer(s.model_config(BASE))
        assert s.params(4096) == model.num_params(exclude_embeddings=True)
        assert flops_per_token(s, 4096, 256) == model.flops_per_token(256)
    del torch
    assert math.isfinite(RULE.bpb(1e6, 1e6))


def test_a_run_folder_sizes_once_and_a_resumed_run_reads_the_decision_back(
    prepared, tmp_path, monkeypatch
):
    import lmforge.recipe.timing as timing
    from lmforge.recipe import sizing as sizing_module

    calls = []

    def fake_seconds(model, cfg, shard_dir, steps=3, threads=None):
        calls.append(model.d_model)
        return model.d_model / 1000  # wider is slower

    monkeypatch.setattr(timing, "seconds_per_step", fake_seconds)
    monkeypatch.setattr(timing, "choose_threads", lambda *a: calls.append("trial") or "1")
    monkeypatch.setattr(sizing_module, "load_rule", lambda: RULE)
    cfg = dataclasses.replace(load_config(), train=dataclasses.replace(TRAIN, minutes=2.0))
    offset = [0.0]
    clock = BudgetClock(lambda: time.perf_counter() + offset[0])
    offset[0] = 30.0  # start-up before the sizing spent 30 s of the budget
    sized, decision = sizing_module.size_run(cfg, prepared.shard_dir, tmp_path, clock=clock)
    assert calls[0] == "trial" and (tmp_path / "sizing.json").is_file()
    assert decision.threads >= 1 and decision.budget_s == 120
    assert sized.model.d_model == shape(decision.chosen).d_model
    assert sized.model.vocab_size == 320  # the shards' vocabulary
    assert sized.train.minutes == 2.0  # training spends the whole budget on `clock`
    assert decision.sizing_s >= 30 and decision.train_minutes <= 1.5
    calls.clear()
    again, reread = sizing_module.size_run(cfg, prepared.shard_dir, tmp_path)
    assert not calls and reread == decision and again == sized  # resumed: no timing, same shape
    pinned = dataclasses.replace(cfg, size_to_budget=False)
    assert sizing_module.size_run(pinned, prepared.shard_dir, tmp_path) == (pinned, None)
    stepped = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, max_steps=10))
    assert sizing_module.size_run(stepped, prepared.shard_dir, tmp_path)[1] is None


def test_timing_runs_real_steps_and_the_thread_trial_leaves_its_choice_set(prepared):
    torch = pytest.importorskip("torch")
    from lmforge.recipe import timing

    model = ModelConfig(vocab_size=320, d_model=32, n_layers=1, n_heads=1, max_seq_len=32)
    cfg = TrainConfig(batch_size=2, seq_len=32, max_steps=1, optimizer=OptimizerConfig(name="muon"))
    before = torch.get_num_threads()
    try:
        assert timing.seconds_per_step(model, cfg, prepared.shard_dir, steps=2, threads=1) > 0
        assert torch.get_num_threads() == before  # restored
        evidence = timing.choose_threads(model, cfg, prepared.shard_dir)
        assert "ms per step" in evidence and 1 <= torch.get_num_threads() <= before
    finally:
        torch.set_num_threads(before)
