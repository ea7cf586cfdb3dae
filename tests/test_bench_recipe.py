"""benchmarks/bench_recipe.py: the two reference recipes and the one evaluator all three share."""

import math
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))  # where the benchmark imports reference_recipes from

import bench_recipe  # noqa: E402
from reference_recipes import nanochat, nanogpt, random_batch  # noqa: E402

from lmforge.model import ModelConfig, Transformer  # noqa: E402
from lmforge.train.bpb import evaluate  # noqa: E402

VOCAB = 64


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tokens(n: int = 4000, seed: int = 0) -> np.ndarray:
    """A learnable stream: mostly a repeating pattern, some noise."""
    rng = np.random.default_rng(seed)
    data = np.tile(np.arange(VOCAB - 4), n // (VOCAB - 4) + 1)[:n]
    noise = rng.random(n) < 0.1
    data[noise] = rng.integers(0, VOCAB, noise.sum())
    return data.astype(np.uint16)


def tiny_nanogpt():
    run = nanogpt.build(VOCAB, n_layer=2, n_head=2, n_embd=32, block_size=16)
    run.set_iterations(1000)
    return run


def tiny_nanochat():
    shape = nanochat.depth_shape(2, VOCAB, aspect_ratio=32, head_dim=32, seq_len=16)
    run = nanochat.Run(shape, nanochat.Hyper(device_batch_size=8, total_batch_size=256))
    run.set_iterations(1000)
    return run


@pytest.mark.parametrize("make", [tiny_nanogpt, tiny_nanochat], ids=["nanoGPT", "nanochat"])
def test_reference_starts_near_uniform_and_learns_a_fixed_batch(make):
    run = make()
    x, y = random_batch(tokens(), 8, run.context, torch.Generator().manual_seed(0))
    losses = [run.step(it, lambda: (x, y)) for it in range(100, 130)]
    assert losses[0] == pytest.approx(math.log(VOCAB), abs=0.15)
    assert losses[-1] < losses[0] - 0.5
    logits = run.model(x)
    assert logits.shape == (8, run.context, VOCAB)


def test_nanogpt_ties_embeddings_and_decays_only_matrices():
    run = tiny_nanogpt()
    assert run.model.wte.weight is run.model.lm_head.weight
    decayed, plain = run.optimizer.param_groups
    assert decayed["weight_decay"] == 0.1 and all(p.dim() >= 2 for p in decayed["params"])
    assert plain["weight_decay"] == 0.0 and all(p.dim() < 2 for p in plain["params"])
    assert not any(name.endswith("bias") for name, _ in run.model.named_parameters())


def test_nanogpt_schedule_is_train_py_get_lr():
    h = nanogpt.Hyper()
    assert nanogpt.lr_at(0, h, 1000) == pytest.approx(1e-3 / 101)
    assert nanogpt.lr_at(100, h, 1000) == pytest.approx(1e-3)
    assert nanogpt.lr_at(550, h, 1000) == pytest.approx((1e-3 + 1e-4) / 2)
    assert nanogpt.lr_at(1000, h, 1000) == pytest.approx(1e-4)
    assert nanogpt.lr_at(5000, h, 1000) == 1e-4


def test_nanochat_width_from_depth_and_schedules():
    assert (nanochat.depth_shape(6, 4096).n_embd, nanochat.depth_shape(6, 4096).n_head) == (384, 6)
    assert nanochat.depth_shape(1, 4096).n_embd == 64
    run = tiny_nanochat()
    run.set_iterations(1000)
    assert run.lr_multiplier(0) == pytest.approx(1 / 40)
    assert run.lr_multiplier(350) == 1.0
    assert run.lr_multiplier(1000 - 650) == 1.0 and run.lr_multiplier(1000 - 649) < 1.0
    assert run.lr_multiplier(999) == pytest.approx(1 / 650 + (1 - 1 / 650) * 0.05)
    assert run.muon_momentum(0) == pytest.approx(0.85)
    assert run.muon_momentum(399) == pytest.approx(0.97 - 0.12 / 400)  # still warming up
    assert run.muon_momentum(400) == pytest.approx(0.97 - 0.07 * 50 / 650)  # in the warmdown
    assert run.muon_momentum(999) == pytest.approx(0.90, abs=1e-3)
    assert run.muon_weight_decay(0) == pytest.approx(run.weight_decay)
    assert run.muon_weight_decay(500) == pytest.approx(run.weight_decay / 2)


def test_nanochat_optimizer_covers_every_parameter_once():
    run = tiny_nanochat()
    adam = [p for g in run.adamw.param_groups for p in g["params"]]
    muon = [p for g in run.muon for p in g.params]
    ids = [id(p) for p in adam + muon]
    assert len(ids) == len(set(ids)) == len(list(run.model.parameters()))
    assert {id(p) for p in muon} == {id(p) for p in run.model.h.parameters()}
    assert run.model.lm_head.weight is not run.model.wte.weight
    assert run.model.scaling_params() == sum(p.numel() for p in muon) + VOCAB * 64


@pytest.mark.parametrize("shape", [(32, 96), (96, 32), (64, 64)])
def test_polar_express_orthogonalizes(shape):
    torch.manual_seed(0)
    if shape[0] != shape[1]:  # a square Gaussian has singular values near 0, no fixed band
        sv = torch.linalg.svdvals(nanochat.orthogonalize(torch.randn(*shape)))
        assert sv.min() > 0.75 and sv.max() < 1.25  # measured 0.86 to 1.14
    # A spread of 100x in singular values still comes out within Muon's known band (0.5, 1.5).
    k = min(shape)
    u = torch.linalg.qr(torch.randn(shape[0], k))[0]
    v = torch.linalg.qr(torch.randn(shape[1], k))[0]
    spread = u @ torch.diag(torch.logspace(0, -2, k)) @ v.T
    for dtype in (torch.float32, torch.bfloat16):
        sv = torch.linalg.svdvals(nanochat.orthogonalize(spread, 5, dtype).float())
        assert sv.min() > 0.5 and sv.max() < 1.5


def test_evaluator_equals_lmforge_evaluate():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=VOCAB, d_model=32, n_layers=1, n_heads=2))
    data = tokens(16 * 11 + 5)
    lengths = np.random.default_rng(1).integers(0, 4, VOCAB)  # some ids stand for no text
    ours = bench_recipe.bits_per_byte(model, data, lengths, 16, batch_size=3)
    theirs = evaluate(model, data, lengths, 16, batch_size=4, max_batches=100)
    assert ours["windows"] == 11 and ours["tokens"] == theirs.tokens
    assert ours["bytes"] == theirs.bytes
    assert ours["bpb"] == pytest.approx(theirs.bpb, rel=1e-6)


def test_evaluator_by_hand_on_a_uniform_model():
    class Uniform(torch.nn.Module):
        def forward(self, ids):
            return torch.zeros(*ids.shape, VOCAB)

    data = np.arange(9, dtype=np.uint16)  # windows [0..4] and [4..8]: targets 1..8
    lengths = np.zeros(VOCAB, dtype=np.int64)
    lengths[1:9] = [1, 2, 3, 0, 1, 2, 3, 4]  # target 4 is a special token: no bytes, no loss
    out = bench_recipe.bits_per_byte(Uniform(), data, lengths, 4)
    assert (out["tokens"], out["bytes"], out["windows"]) == (7, 16, 2)
    assert out["bpb"] == pytest.approx(7 * math.log(VOCAB) / math.log(2) / 16)


def test_a_half_run_counts_only_where_it_ran():
    def run(recipe, rep, bpb):
        return {"recipe": recipe, "rep": rep, "eval": {"bpb": bpb}, "params": 1, "tokens": 1,
                "steps": 1, "wall_s": 1.0}  # fmt: skip

    half = {**run("lmforge_half", 1, 1.95), "clock_s": 0.5}  # half of nanoGPT's clock
    runs = [run("nanoGPT", 1, 2.0), run("nanochat", 1, 2.1), run("lmforge", 1, 1.8), half]
    assert not bench_recipe._beat(runs, "nanochat", "nanoGPT", 1)
    summary, targets = bench_recipe.summarize(runs)
    assert summary["nanochat"]["half_reaches_nanogpt"] == [False]
    assert targets["lmforge_lowest_bpb"] and targets["lmforge_half_reaches_nanogpt"]
    assert targets["lmforge_half_clock_within_half"]
    half["clock_s"] = 0.55  # reached nanoGPT's bpb, but on more than half its time
    assert not bench_recipe.summarize(runs)[1]["lmforge_half_clock_within_half"]


def test_train_within_fixes_the_step_count_from_timed_steps():
    class Stub:
        batch_size, context = 2, 8

        def __init__(self):
            self.planned = None

        def step(self, it, batch):
            batch()
            time.sleep(0.01)
            return 1.0

        def set_iterations(self, n):
            self.planned = n

    out = bench_recipe.train_within(Stub, 0.4, tokens(), seed=0)
    assert out["planned_steps"] == out["run"].planned
    assert 7 < out["planned_steps"] <= 7 + 0.4 / 0.01
    assert out["steps"] <= out["planned_steps"]
    assert out["wall_s"] < 0.4 + 0.2
