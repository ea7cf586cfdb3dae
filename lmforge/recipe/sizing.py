"""Choose the shape a wall-clock budget buys on this machine.

1. Predict each ladder shape's step time from its FLOPs, at the FLOP rate of one timed shape.
2. Predict each shape's final bits per byte from the scaling rule at the tokens its predicted
   speed fits in the budget; time the most promising few for real, best first, until the
   timing has spent SIZING_SHARE of the budget (the best is always timed).
3. Keep the timed shape with the lowest predicted bpb at its measured speed.
4. If the budget holds fewer than MIN_STEPS optimizer steps of the configured batch, halve the
   batch (not below MIN_BATCH) and time the chosen shape again at it: a short run gains more
   from more steps than from larger ones (measured: README, How the speedrun sizes itself).

Only shapes whose tokens stay within twice the sweep's longest run of them compete (the rule
has not seen a smaller shape saturate beyond that; `ScalingRule.trusted`).

The timing spends part of the budget, so the training minutes are what is left after it. The
decision (every candidate's predicted and measured speed, and why the winner won) is a
`Sizing`, saved in the run folder so a resumed run keeps its shape and its budget.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lmforge.atomic import write_json
from lmforge.budget_clock import BudgetClock
from lmforge.config import RunConfig
from lmforge.model import ModelConfig
from lmforge.parallel.world import world_size_from_env
from lmforge.recipe.scaling import ScalingRule, load_rule
from lmforge.recipe.shapes import LADDER, Shape
from lmforge.tokens import read_meta
from lmforge.train.config import TrainConfig

TIMED = 3  # shapes timed for real: the best few by prediction
SIZING_SHARE = 0.05  # of the budget, after which no more candidates are timed
# The shape timed first, whose FLOP rate predicts the others: cheap (a third of d256-l4's step
# time), and only the ranking rests on it, since the favoured candidates are timed for real.
REFERENCE = "d128-l4"
MIN_STEPS = 1000  # fewer steps than this in the budget: a smaller batch
MIN_BATCH = 8  # at 2.5 min, batch 8 beat both 16 and 4 (README)


@dataclass
class Candidate:
    shape: str
    params: int
    predicted_tokens_per_s: float
    predicted_bpb: float
    measured_tokens_per_s: float | None = None
    bpb_at_measured: float | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.measured_tokens_per_s or self.predicted_tokens_per_s


@dataclass
class Sizing:
    chosen: str
    budget_s: float
    sizing_s: float  # spent before training (start-up, timing shapes), out of the budget
    train_minutes: float
    tokens: int  # what the chosen shape's measured speed fits in the training minutes
    candidates: list[Candidate] = field(default_factory=list)
    threads: int | None = None  # the CPU threads the shapes were timed at, training's too
    batch_size: int = 0  # sequences per step training uses (0: the configured batch)
    batch_tokens_per_s: float | None = None  # the chosen shape timed at a reduced batch
    batch_reason: str = ""

    @property
    def tokens_per_s(self) -> float:
        """The chosen shape's measured speed at the batch it trains on."""
        chosen = next(c for c in self.candidates if c.shape == self.chosen)
        return self.batch_tokens_per_s or chosen.tokens_per_s

    @property
    def reason(self) -> str:
        timed = sorted(
            (c for c in self.candidates if c.bpb_at_measured is not None),
            key=lambda c: (c.shape != self.chosen, c.bpb_at_measured),
        )
        best, others = timed[0], timed[1:]
        rest = "; ".join(
            f"{c.shape} {c.params / 1e6:.1f}M: {c.bpb_at_measured:.3f}" for c in others
        )
        return (
            f"{best.shape} ({best.params / 1e6:.1f}M parameters) has the lowest predicted "
            f"bpb, {best.bpb_at_measured:.3f}, for the {self.tokens / 1e6:.2f}M tokens "
            f"{self.train_minutes:.1f} min hold at its measured {self.tokens_per_s:,.0f} "
            f"tokens/s"
            + (f" (timed beside it: {rest})" if rest else "")
            + (f"; {self.batch_reason}" if self.batch_reason else "")
        )

    def save(self, path: Path) -> None:
        write_json(path, asdict(self), indent=1)

    @classmethod
    def load(cls, path: Path) -> Sizing:
        data = json.loads(path.read_text())
        data["candidates"] = [Candidate(**c) for c in data["candidates"]]
        return cls(**data)


def flops_per_token(shape: Shape, vocab_size: int, seq_len: int) -> float:
    """Training FLOPs per token, as Transformer.flops_per_token counts them."""
    return 6 * shape.params(vocab_size) + 12 * shape.n_layers * shape.d_model * seq_len


def choose_shape(
    base: ModelConfig,
    cfg: TrainConfig,
    budget_s: float,
    seconds_per_step: Callable[[ModelConfig, int], float],
    rule: ScalingRule | None = None,
    ladder: tuple[Shape, ...] = LADDER,
    clock: Callable[[], float] = time.monotonic,
) -> Sizing:
    """The ladder shape whose predicted final bpb in `budget_s` is lowest, and the batch it
    trains on; `seconds_per_step(model_config, batch_size)` times real training steps
    (recipe.timing, or a fake in tests, with a fake `clock`). `clock()` reads seconds: the
    budget clock's `elapsed` in `size_run`."""
    rule = rule or load_rule()
    t0 = clock()  # the timing's start: what it spends counts against `budget_s`
    tokens_per_step = cfg.batch_size * cfg.seq_len * cfg.grad_accum_steps
    vocab = base.vocab_size

    def tokens_per_s(shape: Shape) -> float:
        return tokens_per_step / seconds_per_step(shape.model_config(base), cfg.batch_size)

    reference = next((s for s in ladder if s.name == REFERENCE), ladder[len(ladder) // 2])
    measured = {reference.name: tokens_per_s(reference)}
    rate = measured[reference.name] * flops_per_token(reference, vocab, cfg.seq_len)
    left = budget_s - (clock() - t0)
    candidates = [
        Candidate(
            s.name,
            s.params(vocab),
            rate / flops_per_token(s, vocab, cfg.seq_len),
            rule.bpb(s.params(vocab), left * rate / flops_per_token(s, vocab, cfg.seq_len)),
        )
        for s in ladder
    ]
    trusted = [c for c in candidates if _trusted(rule, c.shape, left * c.tokens_per_s)]
    by_prediction = sorted(trusted or candidates, key=lambda c: c.predicted_bpb)
    for i, c in enumerate(by_prediction[:TIMED]):
        if i and clock() - t0 > SIZING_SHARE * budget_s:
            break
        if c.shape not in measured:
            measured[c.shape] = tokens_per_s(next(s for s in ladder if s.name == c.shape))
    sizing_s = clock() - t0
    train_s = max(budget_s - sizing_s, 0.0)
    for c in candidates:
        if c.shape in measured:
            c.measured_tokens_per_s = measured[c.shape]
            c.bpb_at_measured = rule.bpb(c.params, train_s * measured[c.shape])
    timed = [c for c in candidates if c.bpb_at_measured is not None]
    eligible = [c for c in timed if _trusted(rule, c.shape, train_s * c.tokens_per_s)]
    best = min(eligible or timed, key=lambda c: c.bpb_at_measured)
    steps = train_s * best.tokens_per_s / tokens_per_step
    batch = batch_for_steps(cfg.batch_size, steps)
    sizing = Sizing(
        best.shape, budget_s, sizing_s, train_s / 60, tokens=0, candidates=candidates,
        batch_size=batch,
    )  # fmt: skip
    if batch != cfg.batch_size:
        model = next(s for s in ladder if s.name == best.shape).model_config(base)
        step_tokens = tokens_per_step // cfg.batch_size * batch
        sizing.batch_tokens_per_s = step_tokens / seconds_per_step(model, batch)
        sizing.batch_reason = (
            f"batches of {batch} sequences, not {cfg.batch_size}: at {cfg.batch_size} the "
            f"budget holds {steps:,.0f} steps, under the {MIN_STEPS:,} a run should take"
        )
        sizing.sizing_s = clock() - t0
        sizing.train_minutes = max(budget_s - sizing.sizing_s, 0.0) / 60
    sizing.tokens = int(sizing.train_minutes * 60 * sizing.tokens_per_s)
    return sizing


def batch_for_steps(batch_size: int, steps: float) -> int:
    """The batch a run of `steps` steps of `batch_size` trains on instead: halved while the run
    would take fewer than MIN_STEPS steps, never below MIN_BATCH."""
    while steps < MIN_STEPS and batch_size // 2 >= MIN_BATCH:
        batch_size, steps = batch_size // 2, steps * 2
    return batch_size


def _trusted(rule: ScalingRule, shape: str, tokens: float) -> bool:
    """Within the sweep's range for `shape` (a rule without sweep ranges trusts every shape)."""
    return not rule.swept_tokens or rule.trusted(shape, tokens)


def sized_model(base: ModelConfig, sizing: Sizing, ladder: tuple[Shape, ...] = LADDER):
    """`base` at the chosen shape."""
    return next(s for s in ladder if s.name == sizing.chosen).model_config(base)


def sized_train(cfg: TrainConfig, sizing: Sizing) -> TrainConfig:
    """`cfg` at the chosen batch. Its minutes stay the whole budget: training spends them on the
    same budget clock as the sizing (`size_run`'s `clock`), so the timing's share is already
    spent."""
    return dataclasses.replace(cfg, max_steps=0, batch_size=sizing.batch_size or cfg.batch_size)


SIZING_FILE = "sizing.json"


def size_run(
    cfg: RunConfig,
    shard_dir: str | Path,
    out: Path,
    threads: int | None = None,
    clock: BudgetClock | None = None,
) -> tuple[RunConfig, Sizing | None]:
    """`cfg` at the shape its budget buys (a `size_to_budget` run with a time budget, on one
    process), deciding once per run folder: a resumed run reads `sizing.json` back.

    Shapes are timed at `threads` CPU threads, else at the count a thread trial on the
    reference shape finds fastest (left set: training then uses it, see `Sizing.threads`).
    The sizing spends the command's budget `clock` (default: one started now), so the start-up
    before the sizing counts in `Sizing.sizing_s` with the timing."""
    if not cfg.size_to_budget or cfg.train.max_steps or world_size_from_env() > 1:
        return cfg, None
    from lmforge.recipe import timing  # imports torch

    base = dataclasses.replace(cfg.model, vocab_size=read_meta(shard_dir).vocab_size)
    path = out / SIZING_FILE
    sizing = Sizing.load(path) if path.is_file() else None
    if sizing is None or sizing.budget_s != cfg.train.minutes * 60:
        print(f"sizing: timing candidate shapes for a {cfg.train.minutes:g} min budget")
        clock = clock or BudgetClock()
        reference = next(s for s in LADDER if s.name == REFERENCE).model_config(base)
        if threads is None and cfg.train.device in ("auto", "cpu"):
            print(f"sizing: threads {timing.choose_threads(reference, cfg.train, shard_dir)}")
        count = threads or _torch_threads()
        sizing = choose_shape(
            base,
            cfg.train,
            clock.remaining(cfg.train.minutes),
            lambda model, batch: timing.seconds_per_step(
                model, dataclasses.replace(cfg.train, batch_size=batch), shard_dir, threads=count
            ),
            clock=clock.elapsed,
        )
        sizing.budget_s, sizing.threads = cfg.train.minutes * 60, count
        sizing.sizing_s = clock.elapsed()
        sizing.save(path)
    print(f"sizing: {sizing.reason}")
    sized = dataclasses.replace(
        cfg, model=sized_model(base, sizing), train=sized_train(cfg.train, sizing)
    )
    return sized, sizing


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()
