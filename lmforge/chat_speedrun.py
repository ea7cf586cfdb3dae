"""The chat speedrun: a pretrained base model → SFT on arithmetic conversations → GRPO, with the
held-out accuracy of each stage on the same fixed test problems, and a report.

Stages, each reused when its output is already in the run folder (so a rerun resumes):
conversations → base accuracy → SFT → GRPO (its first evaluation is the SFT model's) → report.
Train and test problems come from the task's hash split, so no test problem is ever trained on;
the test problems are drawn with their own seed (`eval_seed`), the same for every stage.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from lmforge.config import RunConfig, claim_run_dir, to_dict
from lmforge.posttrain.grpo import SUMMARY, evaluate_accuracy, grpo
from lmforge.posttrain.rl_config import RlConfig
from lmforge.posttrain.rollout import RolloutEngine
from lmforge.posttrain.sft import sft
from lmforge.posttrain.sft_config import sft_train_config
from lmforge.posttrain.tasks import get_task, write_jsonl
from lmforge.report.rl_report import plot_rl
from lmforge.tokenizer.chat_template import ChatTemplate
from lmforge.train.checkpoint import load_checkpoint
from lmforge.train.checkpoint_dir import read_model_config, resolve_checkpoint
from lmforge.train.metrics import read_metrics


@dataclass(frozen=True)
class ChatRecipe:
    """The chat speedrun's settings: how much SFT, how much RL, and the seeds."""

    task: str = "arithmetic"
    sft_conversations: int = 6000
    sft_steps: int = 300
    sft_lr: float = 3e-4
    rl: RlConfig = field(default_factory=lambda: RlConfig(steps=60, eval_every=20))
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
    times = {}

    data = out / "sft_data.jsonl"
    if not data.exists():
        write_jsonl(task.problems(recipe.sft_conversations, "train", recipe.seed), data)

    start = time.perf_counter()
    base_record = base_accuracy(base, recipe, out / "base_accuracy.json")
    times["base evaluation"] = time.perf_counter() - start

    start = time.perf_counter()
    model_config = read_model_config(base)
    train_cfg = dataclasses.replace(
        sft_train_config(model_config), max_steps=recipe.sft_steps, lr=recipe.sft_lr,
        seed=recipe.seed, seq_len=min(256, model_config.max_seq_len),
    )  # fmt: skip
    sft_dir = out / "sft"
    sft_cfg = RunConfig(name="sft", model=model_config, train=train_cfg)
    claim_run_dir(sft_cfg, sft_dir, fresh=False)
    sft(base, data, sft_dir, train_cfg, run_config=to_dict(sft_cfg))
    times["SFT"] = time.perf_counter() - start

    start = time.perf_counter()
    rl_cfg = dataclasses.replace(recipe.rl, task=recipe.task, seed=recipe.seed)
    rl_dir = out / "rl"
    grpo(sft_dir, rl_dir, rl_cfg)
    times["RL (with its evaluations)"] = time.perf_counter() - start
    return write_chat_report(out, base_record, times)


def write_chat_report(out: Path, base_record: dict, times: dict[str, float]) -> Path:
    summary = json.loads((out / "rl" / SUMMARY).read_text())
    sft_acc, rl_acc = summary["start_accuracy"], summary["final_accuracy"]
    plot = plot_rl(read_metrics(out / "rl" / "metrics.jsonl"), out / "rl.png")
    gain = rl_acc["accuracy"] - sft_acc["accuracy"]
    gain_se = (rl_acc["stderr"] ** 2 + sft_acc["stderr"] ** 2) ** 0.5
    rows = [("base", base_record), ("SFT", sft_acc), ("RL (GRPO)", rl_acc)]
    lines = [
        "# Chat speedrun: base → SFT → RL on arithmetic",
        "",
        f"Held-out accuracy on the same {rl_acc['total']} test problems (eval seed "
        f"{summary['eval_seed']}, greedy decoding, exact final answer after `####`); run seed "
        f"{summary['seed']}.",
        "",
        "| stage | accuracy | correct |",
        "|---|---|---|",
        *(
            f"| {name} | {r['accuracy']:.3f} ± {r['stderr']:.3f} | {r['correct']} |"
            for name, r in rows
        ),
        "",
        f"RL's pass@1 gain over SFT: {gain:+.3f} ± {gain_se:.3f} "
        f"({gain / gain_se if gain_se else 0:.1f} standard errors of the difference).",
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
