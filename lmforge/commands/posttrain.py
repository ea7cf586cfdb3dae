"""The post-training commands: `sft` (supervised fine-tuning, optionally with LoRA) and `rl`
(GRPO on a verifiable task, with rollouts from lmforge's engine).

sft's config is fine-tuning's defaults (posttrain/sft_config.py) for the base checkpoint's
shape, then `--config`'s [train] table, then `--set train.KEY=VALUE`, then the flags; rl's is
RlConfig (posttrain/rl_config.py), then `--set rl.KEY=VALUE`, then the flags. Both are checked
before torch is imported.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING

from lmforge.config import RUN_FOLDER, RunConfig, apply_dict, apply_override, read_toml
from lmforge.config_ranges import check_ranges
from lmforge.errors import LmforgeError
from lmforge.posttrain.rl_config import DYNAMIC_SAMPLING, NORMS, SCALES, RlConfig, with_settings
from lmforge.run_dir import RunDir
from lmforge.run_flags import TRAIN_KEYS, add_run_options, add_speed_options, with_train_flags

if TYPE_CHECKING:
    from lmforge.model.lora_spec import LoraSpec

LORA_HELP = (
    "train LoRA adapters instead of the whole model, e.g. r=8,alpha=16,dropout=0.05,"
    "targets=q,k,v,o,gate,up,down (rslora=true: scaling alpha/sqrt(r); default targets q,k,v,o)"
)


def add_commands(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "sft",
        help="fine-tune a checkpoint on conversations (OpenAI messages JSONL)",
        description="Supervised fine-tuning: loss on the assistant's tokens only, conversations "
        "packed best-fit with attention kept inside each, the pretraining loop's checkpoints, "
        "resume and metrics.",
        epilog=TRAIN_KEYS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--checkpoint", required=True, help="the base model: checkpoint or run folder")
    p.add_argument("--data", required=True, help='JSONL, one {"messages": [...]} per line')
    p.add_argument("--val-data", help="held-out conversations (default: --val-fraction of --data)")
    p.add_argument("--val-fraction", type=float, default=0.05, help="held out (default 0.05)")
    p.add_argument("--epochs", type=float, default=2.0, help="passes over the data (default 2)")
    p.add_argument("--lora", metavar="SPEC", help=LORA_HELP)
    p.add_argument("--config", metavar="FILE.toml", help="a [train] table over the defaults")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="train.KEY=VALUE",
        help="override one training setting, e.g. train.optimizer.lr=1e-4 (repeatable)",
    )
    p.add_argument("--max-steps", type=int, help="optimizer steps (instead of --epochs)")
    p.add_argument("--minutes", type=float, help="a time budget (instead of --epochs)")
    p.add_argument("--seed", type=int, help="random seed")
    p.add_argument("--device", help="cpu, cuda, mps or auto")
    p.add_argument("--parallel", metavar="LAYOUT", help="under torchrun, e.g. dp=2")
    add_speed_options(p)
    add_run_options(p)
    p.set_defaults(func=cmd_sft)

    p = commands.add_parser(
        "rl",
        help="improve a checkpoint on a verifiable task by GRPO",
        description="GRPO: G sampled completions per prompt from lmforge's engine, rewards from "
        "the task, group-relative advantages, the clipped policy loss; held-out accuracy on "
        "fixed test problems at the start, every rl.eval_every steps and at the end.",
        epilog=RL_KEYS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--checkpoint", required=True, help="the starting model (an SFT run)")
    p.add_argument("--task", help="arithmetic or countdown (default arithmetic)")
    p.add_argument("--group-size", type=int, metavar="G", help="completions per prompt (8)")
    p.add_argument("--prompts-per-step", type=int, metavar="P", help="groups per step (16)")
    p.add_argument("--steps", type=int, help="GRPO steps (100)")
    p.add_argument("--minutes", type=float, help="a time budget (stops between steps)")
    p.add_argument("--lr", type=float, help="peak learning rate (default 2e-5 x 256 / d_model)")
    p.add_argument("--num-iterations", type=int, help="optimizer steps per rollout batch (1)")
    p.add_argument("--max-new-tokens", type=int, help="completion length cap (96)")
    p.add_argument("--temperature", type=float, help="sampling temperature (1.0)")
    p.add_argument("--top-k", type=int, help="sample from the k likeliest tokens (0: all)")
    p.add_argument(
        "--scale-rewards", choices=SCALES, help="advantage scaling; none is Dr.GRPO (group)"
    )
    p.add_argument("--loss-norm", choices=NORMS, help="loss normalisation (dapo)")
    p.add_argument("--beta", type=float, help="KL penalty to the starting model, k3 (0)")
    p.add_argument(
        "--dynamic-sampling",
        choices=DYNAMIC_SAMPLING,
        help="zero-variance groups: drop and refill them (DAPO), or count them (drop)",
    )
    p.add_argument("--lora", metavar="SPEC", help=LORA_HELP)
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="rl.KEY=VALUE",
        help="override one setting, e.g. rl.eval_every=10 (repeatable)",
    )
    p.add_argument("--seed", type=int, help="random seed (0)")
    p.add_argument("--device", help="cpu, cuda, mps or auto")
    p.add_argument("--precision", choices=["fp32", "bf16", "auto"], help="compute precision")
    p.add_argument("--threads", type=int, metavar="N", help="CPU threads (default: torch's)")
    p.add_argument(
        "--parallel", metavar="LAYOUT", help="under torchrun: dp=N or fsdp=N (default: all dp)"
    )
    add_run_options(p)
    p.set_defaults(func=cmd_rl)


RL_KEYS = """\
other settings (--set rl.KEY=VALUE): eps_low=0.2 eps_high=0.28 (clip-higher), micro_batch=32,
  warmup_steps=5, grad_clip=1.0, max_refills=4 (dynamic sampling rounds), eval_every=25,
  eval_problems=500, eval_samples=4 (sampled per problem), eval_seed=1234 (the fixed held-out
  problems), train_problems=4000, checkpoint_every=25, engine_batch=128 (decode slots),
  beta1=0.9 beta2=0.99 (AdamW), max_bad_steps=25 (non-finite steps in a row before it stops),
  activation_checkpointing=none|full|selective, compile=false, collective_timeout_s=600
"""

# Flags that set one RlConfig field each: (flag attribute, field).
_RL_FLAGS = (
    "task", "group_size", "prompts_per_step", "steps", "minutes", "lr", "num_iterations",
    "max_new_tokens", "temperature", "top_k", "scale_rewards", "loss_norm", "beta",
    "dynamic_sampling", "seed", "device", "precision", "parallel",
)  # fmt: skip


def rl_config(args: argparse.Namespace) -> tuple[RlConfig, LoraSpec | None]:
    """(GRPO's settings, its LoRA spec or None), from the defaults, --set and the flags."""
    from lmforge.model.lora_spec import LoraSpec

    cfg = with_settings(RlConfig(), args.set)
    given = {k: getattr(args, k) for k in _RL_FLAGS if getattr(args, k) is not None}
    cfg = dataclasses.replace(cfg, **given)
    cfg.validate()
    lora = LoraSpec.parse(args.lora) if args.lora is not None else None
    return cfg, lora


def cmd_rl(args: argparse.Namespace) -> int:
    cfg, lora = rl_config(args)  # a bad setting is reported before torch is imported
    out = Path(args.out or Path("runs") / "rl")

    from lmforge.posttrain.grpo import grpo
    from lmforge.report.rl_report import write_rl_report
    from lmforge.stages import command_status, is_rank_zero

    result = grpo(args.checkpoint, out, cfg, lora, fresh=args.fresh, threads=args.threads)
    status = command_status(result)
    if status:  # checkpointed on Ctrl-C or SIGTERM: exit 130 or 143
        return status
    if not is_rank_zero():  # under torchrun rank 0 alone reports
        return 0
    report = write_rl_report(out)
    start, final = result.start_accuracy, result.final_accuracy
    print(
        f"done: step {result.step}, held-out pass@1 {start.value:.3f} → {final.value:.3f} "
        f"(± {final.stderr:.3f}; greedy {start.greedy_value:.3f} → {final.greedy_value:.3f}; "
        f"{final.total} problems); checkpoint {result.checkpoint}; report {report}"
    )
    return 0


def sft_config(args: argparse.Namespace) -> tuple[RunConfig, LoraSpec | None]:
    """(the run's config, its LoRA spec or None), from the base checkpoint and the flags."""
    from lmforge.device.choice import pick_device
    from lmforge.model.lora_spec import LoraSpec
    from lmforge.posttrain.sft_config import sft_train_config
    from lmforge.train.checkpoint_dir import read_model_config, resolve_checkpoint

    lora = LoraSpec.parse(args.lora) if args.lora is not None else None
    model = read_model_config(resolve_checkpoint(args.checkpoint))
    cfg = RunConfig(name="sft", model=model, train=sft_train_config(model, lora is not None))
    if args.config:
        values = read_toml(args.config)
        unknown = set(values) - {"train"}
        if unknown:
            raise LmforgeError(
                f"{args.config}: sft reads only a [train] table, not [{', '.join(sorted(unknown))}]"
            )
        cfg = apply_dict(cfg, values, source=args.config)
    for item in args.set:
        if not item.strip().startswith("train."):
            raise LmforgeError(f"--set {item!r}: sft takes train.KEY=VALUE settings only")
        cfg = apply_override(cfg, item)
    train = with_train_flags(cfg.train, args)
    cfg = dataclasses.replace(cfg, train=train)
    check_ranges(cfg)
    pick_device(train.device)
    return cfg, lora


def cmd_sft(args: argparse.Namespace) -> int:
    cfg, lora = sft_config(args)  # a bad config is reported before torch is imported
    out = Path(args.out or Path("runs") / "sft")
    if int(os.environ.get("RANK", "0")) == 0:
        RunDir(out, RUN_FOLDER).claim(cfg, args.fresh)

    from lmforge.config import to_dict
    from lmforge.posttrain.sft import sft
    from lmforge.stages import command_status

    result = sft(
        args.checkpoint,
        args.data,
        out,
        cfg.train,
        lora=lora,
        epochs=args.epochs,
        val_data=args.val_data,
        val_fraction=args.val_fraction,
        resume=True,
        threads=args.threads,
        run_config=to_dict(cfg),
    )
    status = command_status(result)
    if status:  # checkpointed on Ctrl-C or SIGTERM: exit 130 or 143
        return status
    final = result.final_eval
    print(
        f"done: step {result.step}, held-out assistant tokens ({final.tokens:,}): loss "
        f"{final.loss:.4f}; checkpoint {result.checkpoint}"
        + (f"; adapter {out / 'adapter'}" if lora is not None else "")
    )
    return 0
