"""The chat speedrun: a pretrained base model → SFT on arithmetic conversations → GRPO, with the
held-out accuracy of each stage on the same fixed test problems, and a report.

Stages, each reused when its output is already in the run folder (so a rerun resumes):
conversations → base accuracy → SFT → GRPO (its first evaluation is the SFT model's) → report.
Train and test problems come from the task's hash split, so no test problem is ever trained on;
the test problems are drawn with their own seed (`eval_seed`), the same for every stage.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from lmforge.config import RUN_FOLDER, RunConfig, to_dict
from lmforge.posttrain.grpo import SUMMARY, evaluate_accuracy, grpo
from lmforge.posttrain.rl_config import RlConfig
from lmforge.posttrain.rollout import RolloutEngine, paired_gain
from lmforge.posttrain.sft import sft
from lmforge.posttrain.sft_config import sft_train_config
from lmforge.posttrain.tasks import get_task, write_jsonl
from lmforge.report.rl_report import plot_rl
from lmforge.run_dir import RunDir
from lmforge.tokenizer.chat_template import ChatTemplate
from lmforge.train.checkpoint import load_checkpoint
from lmforge.train.checkpoint_dir import read_model_config, resolve_checkpoint
from lmforge.train.metrics import read_metrics


@dataclass(frozen=True)
class ChatRecipe:
    """The chat speedrun's settings: how much SFT, how much RL, and the seeds."""

    task: str = "arithmetic"
    sft_conversations: int = 6000
    sft_steps: int = 200  # about 2 epochs: the SFT model is right about 2 times in 3, greedy
    sft_lr: float = 1e-3
    rl: RlConfig = field(
        default_factory=lambda: RlConfig(steps=100, eval_every=50, max_new_tokens=64)
    )
    seed: int = 0


def base_accuracy(checkpoint: Path, recipe: ChatRecipe, out: Path) -> dict:
    """The base model's held-out accuracy (saved in `out`; read back when already there)."""
    if out.exists():
        return json.loads(out.read_text())
    model, tokenizer = load_checkpoint(checkpoint)
    engine = RolloutEngine(
        model, ChatTemplate(tokenizer), recipe.rl.max_new_tokens, recipe.rl.engine_batch
    )
    test = get_task(recipe.task).problems(recipe.rl.eval_problems, "test", recipe.rl.eval_seed)
    try:
        accuracy = evaluate_accuracy(engine, test, recipe.rl)
    finally:
        engine.close()
    record = accuracy.record()
    out.write_text(json.dumps(record, indent=2) + "\n")
    return record


def chat_speedrun(
    base: str | Path, out_dir: str | Path, recipe: ChatRecipe = ChatRecipe(), fresh: bool = False
) -> Path:
    """Fine-tune and reinforce the pretrained checkpoint `base` into `out_dir`; the report."""
    out = Path(out_dir)
    if fresh and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    base = resolve_checkpoint(base)
    task = get_task(recipe.task)
    times = StageTimes(out / "times.json")

    data = out / "sft_data.jsonl"
    if not data.exists():
        write_jsonl(task.problems(recipe.sft_conversations, "train", recipe.seed), data)

    with times("base evaluation"):
        base_record = base_accuracy(base, recipe, out / "base_accuracy.json")

    model_config = read_model_config(base)
    sft_defaults = sft_train_config(model_config)
    train_cfg = dataclasses.replace(
        sft_defaults, max_steps=recipe.sft_steps, seed=recipe.seed,
        seq_len=min(256, model_config.max_seq_len),
        optimizer=dataclasses.replace(sft_defaults.optimizer, lr=recipe.sft_lr),
    )  # fmt: skip
    sft_dir = out / "sft"
    sft_cfg = RunConfig(name="sft", model=model_config, train=train_cfg)
    RunDir(sft_dir, RUN_FOLDER).claim(sft_cfg)
    with times("SFT"):
        sft(base, data, sft_dir, train_cfg, run_config=to_dict(sft_cfg))

    rl_cfg = dataclasses.replace(recipe.rl, task=recipe.task, seed=recipe.seed)
    rl_dir = out / "rl"
    with times("RL (with its evaluations)"):
        grpo(sft_dir, rl_dir, rl_cfg)
    return write_chat_report(out, base_record, times.seconds)


class StageTimes:
    """Each stage's wall time, kept in `path` from the run that first finished it (a rerun
    that reuses the stage does not overwrite it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: dict[str, float] = json.loads(path.read_text()) if path.exists() else {}

    @contextlib.contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.seconds.setdefault(stage, time.perf_counter() - start)
        self.path.write_text(json.dumps(self.seconds, indent=2) + "\n")


def write_chat_report(out: Path, base_record: dict, times: dict[str, float]) -> Path:
    summary = json.loads((out / "rl" / SUMMARY).read_text())
    sft_acc, rl_acc = summary["start_accuracy"], summary["final_accuracy"]
    plot = plot_rl(read_metrics(out / "rl" / "metrics.jsonl"), out / "rl.png")
    gain, gain_se = paired_gain(sft_acc, rl_acc)
    rows = [("base", base_record), ("SFT", sft_acc), ("RL (GRPO)", rl_acc)]
    lines = [
        "# Chat speedrun: base → SFT → RL on arithmetic",
        "",
        f"Held-out accuracy on the same {rl_acc['total']} test problems (eval seed "
        f"{summary['eval_seed']}; exact final answer after `####`): pass@1, the mean over "
        f"{rl_acc['samples']} completions per problem sampled as the rollouts are (what RL "
        "optimises; the same sampling seeds at every stage), and the greedy reply's. Standard "
        f"errors are over problems. Run seed {summary['seed']}.",
        "",
        "| stage | pass@1 (sampled) | greedy |",
        "|---|---|---|",
        *(
            f"| {name} | {r['accuracy']:.3f} ± {r['stderr']:.3f} | "
            f"{r['greedy_accuracy']:.3f} ± {r['greedy_stderr']:.3f} |"
            for name, r in rows
        ),
        "",
        f"RL's pass@1 gain over SFT: {gain:+.3f} ± {gain_se:.3f} "
        f"({gain / gain_se if gain_se else 0:.1f} standard errors of the paired difference).",
        "",
        "| stage | minutes |",
        "|---|---|",
        *(f"| {name} | {seconds / 60:.1f} |" for name, seconds in times.items()),
        "",
        f"![RL curves]({plot.name})",
        "",
        "The RL model's greedy replies to the first test problems:",
        "",
        *(
            f"- {e['prompt']} → `{' '.join(e['reply'].split())}` "
            f"({'right' if e['right'] else 'wrong'})"
            for e in rl_acc["examples"]
        ),
        "",
        "SFT's run and report: `sft/`; RL's metrics, checkpoints and report: `rl/`. Chat with the "
        f"result: `lmforge chat --checkpoint {out / 'rl'}`.",
    ]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
