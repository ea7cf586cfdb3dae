"""GRPO's loop: rollouts from the engine, weight sync, dynamic sampling, learning, the command,
resume and the report."""

import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import lmforge.posttrain.policy_update as policy_update
from lmforge.cli import main
from lmforge.errors import LmforgeError
from lmforge.infer.engine import SamplingParams
from lmforge.posttrain.grpo import RL_FOLDER, GroupSampler, PolicyTrainer, grpo
from lmforge.posttrain.grpo_loss import policy_loss, token_logprobs
from lmforge.posttrain.rl_config import RlConfig, recorded, width_scaled_lr, with_settings
from lmforge.posttrain.rollout import RolloutEngine, batch_tensors, held_out_accuracy, paired_gain
from lmforge.posttrain.tasks import get_task
from lmforge.report.rl_report import write_rl_report
from lmforge.run_dir import RunDir
from lmforge.tokenizer.chat_template import ChatTemplate
from lmforge.train.checkpoint import load_checkpoint
from lmforge.train.checkpoint_dir import read_model_config
from lmforge.train.guard import Diverged
from lmforge.train.metrics import read_metrics
from tests.kills import (
    kill_training_run,
    newest_checkpoint,
    timed_run,
)
from tests.posttrain.rl_main import digits_task

RL_MAIN = Path(__file__).with_name("rl_main.py")

SMALL = RlConfig(
    steps=3, prompts_per_step=4, group_size=4, max_new_tokens=12, micro_batch=8, eval_every=0,
    eval_problems=16, train_problems=200, checkpoint_every=1, lr=1e-3, warmup_steps=1,
    engine_batch=16, device="cpu",
)  # fmt: skip


@pytest.fixture
def policy(base_checkpoint):
    model, tokenizer = load_checkpoint(base_checkpoint)
    return model.train(), ChatTemplate(tokenizer)


def _problems(n=4):
    return get_task("arithmetic").problems(n, "train", 0)


def test_rollouts_are_seeded_per_request_and_carry_the_trainers_logprobs(policy):
    model, template = policy
    engine = RolloutEngine(model, template, max_new_tokens=10, max_batch_size=8)
    try:
        problems = _problems(3)
        batch = engine.sample(problems, 4, 1.0, 0, seed=7, step=2)
        assert [r.group for r in batch.rollouts] == [0] * 4 + [1] * 4 + [2] * 4
        again = engine.sample(problems[:2], 4, 1.0, 0, seed=7, step=2)  # other batch-mates
        assert [r.completion_ids for r in again.rollouts] == [
            r.completion_ids for r in batch.rollouts[:8]
        ]
        other = engine.sample(problems, 4, 1.0, 0, seed=7, step=3)
        assert [r.completion_ids for r in other.rollouts] != [
            r.completion_ids for r in batch.rollouts
        ]
        inputs, targets, mask = batch_tensors(batch.rollouts, torch.device("cpu"))
        for i, r in enumerate(batch.rollouts):
            assert targets[i][mask[i].bool()].tolist() == r.completion_ids
            assert len(r.logprobs) == len(r.completion_ids)
        with torch.no_grad():
            logp, _ = token_logprobs(model(inputs), targets)
        engine_logp = torch.cat([torch.tensor(r.logprobs) for r in batch.rollouts])
        assert torch.allclose(logp[mask.bool()], engine_logp, atol=1e-4)
    finally:
        engine.close()


def test_after_a_step_the_engine_computes_the_trainers_logits(policy):
    model, template = policy
    cfg = SMALL
    engine = RolloutEngine(model, template, cfg.max_new_tokens, cfg.engine_batch)
    try:
        sampler = GroupSampler(cfg, _problems(50), lambda p, c, **f: float(len(c) % 2), engine)
        trainer = PolicyTrainer(model, cfg, torch.device("cpu"))
        collected = sampler.collect(0)
        assert collected.rollouts
        before = [p.detach().clone() for p in model.parameters()]
        trainer.train(0, collected)
        assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
        ids = engine.prompt_ids(_problems(1)[0])
        stale = engine.engine.score([(ids[:1], ids[1:])])[0].logprobs
        engine.sync(model)
        synced = engine.engine.score([(ids[:1], ids[1:])])[0].logprobs
        with torch.no_grad():
            logits = model.eval()(torch.tensor([ids]))
        want = torch.log_softmax(logits[0, :-1], -1).gather(-1, torch.tensor(ids[1:])[:, None])
        assert torch.allclose(torch.tensor(synced), want[:, 0], atol=1e-5)
        assert not torch.allclose(torch.tensor(stale), want[:, 0], atol=1e-5)
        budget = model.config.max_seq_len - len(ids)
        handle = engine.engine.submit(ids, SamplingParams(max_tokens=budget, temperature=0))
        events = iter(handle)
        next(events)  # decoding now, for many more steps than loading takes to be refused
        with pytest.raises(LmforgeError, match="serving requests"):
            engine.sync(model)
        handle.result()
    finally:
        engine.close()


def test_dynamic_sampling_drops_and_refills_groups_without_signal_or_counts_them(policy):
    model, template = policy
    engine = RolloutEngine(model, template, 6, 16)
    try:
        pool = _problems(40)
        odd = {p.prompt for p in pool[::2]}  # half the prompts always score 1: no signal

        def reward(prompt, completion, **fields):
            return 1.0 if prompt in odd else float(len(completion) % 3 == 0)

        drop = GroupSampler(SMALL, pool, reward, engine).collect(0)
        assert drop.rounds >= 2 and drop.zero_variance >= 1
        groups = drop.rewards.view(-1, SMALL.group_size)
        assert len(groups) <= SMALL.prompts_per_step
        assert not (groups == groups[:, :1]).all(dim=1).any()  # every kept group has signal
        count_cfg = with_settings(SMALL, ["rl.dynamic_sampling=count"])
        counted = GroupSampler(count_cfg, pool, reward, engine).collect(0)
        assert counted.rounds == 1 and len(counted.rollouts) == 16
        assert counted.zero_variance >= 1
        zero = counted.rewards.view(-1, 4)
        flat = (zero == zero[:, :1]).all(dim=1)
        assert torch.all(counted.advantages.view(-1, 4)[flat] == 0)
    finally:
        engine.close()


def test_grpo_raises_the_reward_it_is_given(policy):
    """A reward for digits: a few steps make the untrained policy write mostly digits."""
    model, template = policy
    cfg = with_settings(SMALL, ["rl.lr=1e-2", "rl.group_size=8"])
    engine = RolloutEngine(model, template, cfg.max_new_tokens, 32)

    def digits(prompt, completion, **fields):
        return sum(c.isdigit() for c in completion) / max(len(completion), 1)

    try:
        sampler = GroupSampler(cfg, _problems(100), digits, engine)
        trainer = PolicyTrainer(model, cfg, torch.device("cpu"))
        rewards = []
        for step in range(12):
            collected = sampler.collect(step)
            rewards.append(float(collected.rewards.mean()))
            trainer.train(step, collected)
            engine.sync(model)
        print(rewards)
        assert sum(rewards[-3:]) / 3 > 1.5 * sum(rewards[:3]) / 3, rewards
    finally:
        engine.close()


def _untimed(run):
    """A run's training steps' metrics without their timings and without the engine gap, whose
    last bits depend on how the engine's thread batched the rollouts (the first part of a
    resumed run also logged its final evaluation)."""
    rows = [m for m in read_metrics(run / "metrics.jsonl") if "reward_mean" in m]
    return [
        {k: v for k, v in m.items() if not k.endswith("_per_s") and k != "engine_gap"} for m in rows
    ]


def _digits(prompt, completion, **fields):
    return sum(c.isdigit() for c in completion) / max(len(completion), 1)


def test_a_resumed_run_repeats_the_steps_of_an_unbroken_one(base_checkpoint, tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    grpo(base_checkpoint, straight, SMALL, quiet=True, reward=_digits)
    two = with_settings(SMALL, ["rl.steps=2"])
    grpo(base_checkpoint, resumed, two, quiet=True, reward=_digits)
    grpo(base_checkpoint, resumed, SMALL, quiet=True, reward=_digits)
    start, _ = load_checkpoint(base_checkpoint)
    a, _ = load_checkpoint(straight)
    b, _ = load_checkpoint(resumed)
    assert not torch.equal(start.output.weight, a.output.weight)  # it trained
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(x, y), name
    steps = [m for m in read_metrics(straight / "metrics.jsonl") if "reward_mean" in m]
    assert [m["step"] for m in steps] == [1, 2, 3]
    assert _untimed(resumed) == _untimed(straight)
    for key in ("reward_std", "accuracy", "response_length", "clip_fraction", "entropy", "loss",
                "grad_norm", "engine_gap", "rollout_tokens_per_s", "train_tokens_per_s",
                "zero_variance_groups"):  # fmt: skip
        assert key in steps[0], key
    assert steps[0]["engine_gap"] < 1e-4  # the engine sampled from the trainer's weights


def _cli_flags(base, out, steps: int) -> list[str]:
    return [
        "rl", "--checkpoint", str(base), "--task", "digits", "--group-size", "3",
        "--prompts-per-step", "3", "--max-new-tokens", "12", "--steps", str(steps), "--lr",
        "1e-3", "--device", "cpu", "--threads", "1", "--out", str(out), "--set",
        "rl.micro_batch=8", "--set", "rl.warmup_steps=1", "--set", "rl.eval_problems=4", "--set",
        "rl.eval_samples=1", "--set", "rl.train_problems=200", "--set", "rl.engine_batch=16",
        "--set", "rl.eval_every=0", "--set", "rl.checkpoint_every=1",
    ]  # fmt: skip


def test_a_run_killed_at_random_moments_and_resumed_repeats_an_unbroken_one(
    base_checkpoint, tmp_path
):
    """SIGKILL (no chance to save) at random moments (tests/kills.py), each after a new
    checkpoint: the same command resumes each time from the newest complete checkpoint, never
    finds a half-written file, and ends where an unbroken run ends."""
    killed, straight = tmp_path / "killed", tmp_path / "straight"
    steps = 7  # a checkpoint each: room for 5 kills, each after a new one before the last

    def command(out):
        return [sys.executable, str(RL_MAIN), *_cli_flags(base_checkpoint, out, steps)]

    def uninterrupted():
        with digits_task():
            assert main(_cli_flags(base_checkpoint, straight, steps)) == 0

    spread = timed_run(uninterrupted, straight, lambda: newest_checkpoint(straight))
    log = kill_training_run(command(killed), killed, spread, "grpo")
    assert "rl: resuming from" in log.attempts[-1].stdout
    assert [m["step"] for m in _untimed(killed)] == list(range(1, steps + 1))
    a, b = (load_checkpoint(run)[0].state_dict() for run in (straight, killed))
    identical = _untimed(killed) == _untimed(straight) and all(
        torch.equal(x, b[name]) for name, x in a.items()
    )
    log.summary("grpo", identical)
    assert log.kills >= 1 and identical


def test_a_non_finite_loss_is_skipped_and_stops_the_run_like_pretraining(
    base_checkpoint, tmp_path, monkeypatch
):
    """The non-finite guard of the shared core: a NaN loss skips the update (the weights and
    the optimizer stay as they were, the step is counted), and `max_bad_steps` such steps in a
    row stop the run with one line naming the last good checkpoint."""
    out = tmp_path / "rl"
    cfg = with_settings(SMALL, ["rl.max_bad_steps=2"])
    grpo(base_checkpoint, out, replace(cfg, steps=1), quiet=True, reward=_digits)

    def nan_loss(*args, **kwargs):
        loss, stats = policy_loss(*args, **kwargs)
        return loss * math.nan, stats

    monkeypatch.setattr(policy_update, "policy_loss", nan_loss)
    with pytest.raises(Diverged) as stopped:
        grpo(base_checkpoint, out, replace(cfg, steps=6), quiet=True, reward=_digits)
    good = out / "checkpoints" / "step_1"
    assert str(stopped.value) == (
        "rl stopped at step 3: 2 steps in a row had a non-finite loss or gradient "
        f"norm and were skipped; the last good checkpoint is {good}: lower rl.lr or change "
        "--precision, then resume from it (or start over with --fresh)"
    )
    steps = [m for m in read_metrics(out / "metrics.jsonl") if "reward_mean" in m]
    assert [m["step"] for m in steps] == [1, 2, 3]
    assert [m["skipped_steps"] for m in steps] == [0, 1, 2]
    assert math.isnan(steps[1]["loss"]) and math.isnan(steps[2]["grad_norm"])
    a, _ = load_checkpoint(good)
    b, _ = load_checkpoint(out / "checkpoints" / "step_2")  # saved after a skipped step
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(x, y), name
    assert not (out / "checkpoints" / "step_3").exists()


def test_the_optimizer_betas_are_settings_recorded_where_they_change(policy):
    model, _ = policy

    def betas(cfg):
        return PolicyTrainer(model, cfg, torch.device("cpu")).optimizer.defaults["betas"]

    assert betas(SMALL) == (0.9, 0.99)  # what GRPO always used
    cfg = with_settings(SMALL, ["rl.beta1=0.8", "rl.beta2=0.95", "rl.compile=false"])
    assert betas(cfg) == (0.8, 0.95)
    assert "beta1" not in recorded(SMALL) and recorded(cfg)["beta2"] == 0.95
    with pytest.raises(LmforgeError, match="betas lie in"):
        with_settings(SMALL, ["rl.beta2=1"]).validate()
    with pytest.raises(LmforgeError, match="data parallelism only"):
        with_settings(SMALL, ["rl.parallel=tp=2"]).validate()
    with pytest.raises(LmforgeError, match="takes true or false"):
        with_settings(SMALL, ["rl.compile=maybe"])


def test_the_command_writes_the_summary_and_report(base_checkpoint, tmp_path, capsys):
    out = tmp_path / "rl"
    flags = ["--checkpoint", str(base_checkpoint), "--group-size", "4", "--prompts-per-step",
             "4", "--max-new-tokens", "12", "--steps", "2", "--device", "cpu", "--set",
             "rl.eval_problems=16", "--set", "rl.train_problems=200", "--set",
             "rl.engine_batch=16", "--out", str(out)]  # fmt: skip
    assert main(["rl", *flags]) == 0
    assert "held-out accuracy" in capsys.readouterr().out
    summary = json.loads((out / "rl.json").read_text())
    assert summary["final_accuracy"]["total"] == 16 and summary["steps"] == 2
    report = (out / "report.md").read_text()
    assert "Held-out accuracy" in report and (out / "rl.png").stat().st_size > 1000
    assert write_rl_report(out) == out / "report.md"
    width = read_model_config(base_checkpoint).d_model  # no --lr: scaled as 1/width
    assert json.loads((out / "rl_config.json").read_text())["lr"] == 2e-5 * 256 / width


def test_the_learning_rate_scales_as_one_over_width():
    assert width_scaled_lr(256) == 2e-5
    assert width_scaled_lr(128) == 2 * width_scaled_lr(256)
    RlConfig(lr=0.0).validate()  # 0: scaled to the model
    with pytest.raises(LmforgeError, match="at least 0"):
        RlConfig(lr=-1.0).validate()


def test_bad_settings_are_one_line_errors(base_checkpoint, tmp_path, capsys):
    ckpt = ["--checkpoint", str(base_checkpoint), "--out", str(tmp_path / "rl")]
    assert main(["rl", *ckpt, "--group-size", "1"]) != 0
    assert "use 2 or more" in capsys.readouterr().err
    assert main(["rl", *ckpt, "--set", "rl.nope=1"]) != 0
    assert "rl takes rl.KEY=VALUE" in capsys.readouterr().err
    folder = RunDir(tmp_path / "x", RL_FOLDER)
    folder.claim({"lr": 1e-3, "steps": 3})
    folder.claim({"lr": 1e-3, "steps": 9})  # a longer run resumes
    with pytest.raises(LmforgeError, match=r"an rl run with another config \(lr: 0.001 → 1.0\)"):
        folder.claim({"lr": 1.0, "steps": 9})
    folder.claim({"lr": 1.0, "steps": 9}, fresh=True)
    assert folder.saved() == {"lr": 1.0, "steps": 9}


def test_held_out_accuracy_samples_alike_at_every_stage_and_pairs_its_gains(policy):
    model, template = policy
    engine = RolloutEngine(model, template, max_new_tokens=8, max_batch_size=16)
    try:
        problems = _problems(5)

        def first_char_is_digit(prompt, completion, **fields):
            return float(completion[:1].isdigit())

        a = held_out_accuracy(engine, problems, first_char_is_digit, samples=3, seed=4)
        b = held_out_accuracy(engine, problems, first_char_is_digit, samples=3, seed=4)
        assert a.scores == b.scores and a.total == 5 and a.samples == 3
        assert all(score in (0, 1 / 3, 2 / 3, 1) for score in a.scores)
        assert a.value == pytest.approx(sum(a.scores) / 5)
        greedy = held_out_accuracy(engine, problems, first_char_is_digit, samples=0)
        assert greedy.scores == [float(g) for g in greedy.greedy] == [float(g) for g in a.greedy]
    finally:
        engine.close()
    before = {"scores": [0.0, 0.5, 1.0, 0.25]}
    after = {"scores": [0.25, 0.75, 1.0, 0.5]}
    gain, se = paired_gain(before, after)
    assert gain == pytest.approx(0.1875) and se == pytest.approx(0.0625)
