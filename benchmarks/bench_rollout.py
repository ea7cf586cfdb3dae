"""RL rollouts and GRPO steps: lmforge against transformers' generate and TRL's GRPOTrainer.

Both sides hold identical weights: lmforge's model exported with `export_hf` (the
LlamaForCausalLM folder `lmforge export` writes, tokenizer included) and loaded back with
`from_pretrained` (fp32, sdpa attention). Everything runs on the CPU with the same torch thread
count (--threads, default 2, this machine's cores; the engine's scheduler thread inherits it,
checked), timed in wall-clock seconds in interleaved repetitions; medians are reported, and
the ratio of each repetition's back-to-back pair beside the ratio of medians.

Models: "speedrun" (vocab 4096, d_model 256, 4 layers, 4 heads, context 256): the trained
speedrun checkpoint in runs/auto where it is there (--checkpoint), else a seeded random init;
"134M" (bench_infer's large shape: vocab 32000, d_model 768, 12 layers, 12 heads, context
512), seeded random init (speed does not depend on the weights' values). Prompts: arithmetic
problems of the train split (`get_task("arithmetic").problems(n, "train", 0)`) in the chat
template, tokenized with runs/auto's tokenizer (else a BPE trained here on arithmetic text);
the 134M shape takes the same ids (all below its vocabulary).

Part 1, rollouts: --prompts (64) prompts x G = 8 completions of exactly --new-tokens (128)
tokens, sampled at temperature 1 from the whole vocabulary:

- lmforge: its inference engine (continuous batching of the 512 requests over --slots decode
  slots, default 128 and 512: RlConfig.engine_batch's default, what `lmforge rl` runs, and the
  whole batch at once, as generate takes it; a slot count above the completions runs once, at
  the completions' count; eager, as RolloutEngine runs it; --compiled-slots adds engines whose
  decode step is compiled, warmed up by one untimed pass, which compiles each row count it
  meets; a KV pool of what the running requests can hold: slots x (longest prompt +
  --new-tokens) positions), each request with its own seed (`request_seed`) and the
  log-probability of every sampled token (logprobs=True), as RolloutEngine.sample submits them.
  The engine is driven directly, with a tokenizer stub that has no special tokens, so no request
  stops before --new-tokens (RolloutEngine always stops at the template's end tokens);
- transformers: `generate` as TRL's GRPOTrainer calls it without vLLM: the prompts repeated G
  times each (TRL's RepeatSampler order), left-padded, the whole batch in one call (--hf-batch
  0; N: chunks of N rows), do_sample with temperature 1, top_k 0, top_p 1, the default dynamic
  KV cache, no compile, under no_grad; min_new_tokens = max_new_tokens, so it too generates
  exactly --new-tokens. TRL asks generate for no scores (it recomputes log-probs in its
  training forward), so neither does this row; --hf-logprobs adds a row that also returns
  them (output_scores, log_softmax and gather over the sampled tokens).

  Generated tokens/s (tokens / wall seconds, tokens counted on each side) are compared. The
  134M shape runs --prompts-134m (16) prompts (128 completions) only: transformers needs
  minutes per pass there on 2 cores; tokens/s is a rate and both sides run the same subset.
  Identical weights are checked by comparing 8 greedy tokens of two prompts on both sides.
  Target: lmforge >= 5x transformers' tokens/s.

Part 2, one GRPO step end to end, same model, reward, prompts and batch (--grpo-prompts 16 x
G = 8 completions of at most --grpo-new-tokens 64, stopping at the chat template's end token
or any special token on both sides), fp32, AdamW with betas (0.9, 0.99), lr 5e-5, no weight
decay, gradient clipping at 1, clip range 0.2 / 0.28, beta 0 (no reference model), one
optimizer step per rollout batch, the token-level "dapo" loss, group-scaled advantages,
micro-batches of --micro-batch (32) completions:

- lmforge: `GroupSampler.collect` + `PolicyTrainer.train` + `RolloutEngine.sync` (what `lmforge
  rl` runs per step), RlConfig(dynamic_sampling="count"), so no refill rounds (TRL has none);
- TRL: `GRPOTrainer` on the exported folder (model and tokenizer; its chat template gives the
  same prompt ids as lmforge's, checked), conversational prompts in a `datasets.Dataset` with
  the reward's fields as columns, the same reward (the arithmetic task's: exact answer + 0.1
  format) wrapped as a TRL reward function; per_device_train_batch_size = --micro-batch and
  gradient_accumulation_steps = the rest, so one optimizer step consumes one rollout batch;
  use_cpu, bf16 off and gradient_checkpointing off (TRL defaults both on; lmforge uses
  neither), the model's eos ids set to the tokenizer's special tokens (lmforge's stops).

  One TRL training run of --reps + 1 steps; after each TRL step (in on_step_end) one lmforge
  step runs, so the two interleave. A TRL step is timed from on_step_begin to on_step_end
  (generation, rewards, forward, backward, optimizer); the first step of each side is a
  warm-up and is dropped. Target: lmforge's seconds per step <= 0.5x TRL's. --grpo-shapes
  134M adds that shape with the tokenizer's vocabulary of 4096 (91M parameters: completions
  must decode on both sides).

Writes benchmarks/results/rollout.json.

    python benchmarks/bench_rollout.py [--reps 3] [--threads 2] [--shapes speedrun,134M]
        [--prompts 64] [--new-tokens 128] [--prompts-134m 16] [--slots 128,512]
        [--compiled-slots ''] [--hf-batch 0]
        [--hf-logprobs] [--grpo-shapes speedrun] [--grpo-prompts 16] [--grpo-new-tokens 64]
        [--micro-batch 32] [--skip-rollouts] [--skip-grpo] [--quick]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

from lmforge.atomic import write_text
from lmforge.device.cpuinfo import read_cpuinfo
from lmforge.infer.engine import Engine, SamplingParams
from lmforge.model import ModelConfig, Transformer
from lmforge.model.hf import export_hf
from lmforge.model.layers import Linear
from lmforge.posttrain.grpo import GroupSampler, PolicyTrainer
from lmforge.posttrain.rl_config import RlConfig
from lmforge.posttrain.rollout import RolloutEngine, request_seed
from lmforge.posttrain.tasks import get_task
from lmforge.posttrain.tasks.problem import Problem
from lmforge.tokenizer import Tokenizer, train_bpe
from lmforge.tokenizer.chat_template import ChatTemplate, Message

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results" / "rollout.json"
SPEEDRUN_RUN = ROOT / "runs" / "auto"
ROLLOUT_TARGET = 5.0  # lmforge's tokens/s over transformers'
GRPO_TARGET = 0.5  # lmforge's seconds per step over TRL's
GROUP_SIZE = 8
SEED = 0
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
SHAPES = {
    "speedrun": ModelConfig(vocab_size=4096, d_model=256, n_layers=4, n_heads=4, max_seq_len=256),
    "134M": ModelConfig(vocab_size=32000, d_model=768, n_layers=12, n_heads=12, max_seq_len=512),
}
HF_ROW = "transformers generate (as TRL)"
HF_LOGPROBS_ROW = "transformers generate + logprobs"


class NoSpecials:
    """The engine's tokenizer interface, with no stop tokens: every request decodes to length."""

    special_tokens: dict[str, int] = {}  # noqa: RUF012

    def token_bytes(self, token: int) -> bytes:
        return b"x"


@dataclass
class Model:
    """One shape's lmforge model and its Hugging Face export (a folder, loaded on demand)."""

    shape: str
    model: Transformer
    hf_dir: Path
    source: str

    @property
    def params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def load_hf(self):
        from transformers import LlamaForCausalLM

        hf = LlamaForCausalLM.from_pretrained(
            self.hf_dir, dtype=torch.float32, attn_implementation="sdpa"
        )
        return hf.eval()


# -- models, tokenizer, prompts -----------------------------------------------------------


def load_tokenizer(checkpoint: Path | None, work: Path) -> tuple[Tokenizer, str]:
    """The speedrun checkpoint's tokenizer where there is one, else a BPE trained here."""
    if checkpoint is not None:
        from lmforge.train.checkpoint import load_checkpoint

        _, tokenizer = load_checkpoint(checkpoint)
        return tokenizer, f"the speedrun checkpoint's ({checkpoint})"
    problems = get_task("arithmetic").problems(3000, "train", 1)
    texts = [json.dumps(p.to_json()) for p in problems]
    tokenizer = train_bpe(texts, vocab_size=4096, special_tokens=SPECIALS, workers=1)
    tokenizer.save(work / "tokenizer")
    return tokenizer, f"a BPE of {tokenizer.vocab_size} ids trained here on arithmetic problems"


def build_model(
    shape: str, tokenizer: Tokenizer, checkpoint: Path | None, work: Path, vocab: int | None
) -> Model:
    """`shape`'s model (the speedrun checkpoint's weights for that shape where given, else a
    seeded random init, fp32) and its export to a Hugging Face folder."""
    if shape == "speedrun" and checkpoint is not None and vocab is None:
        from lmforge.train.checkpoint import load_checkpoint

        model, _ = load_checkpoint(checkpoint)
        source = f"trained speedrun checkpoint {checkpoint}"
    else:
        config = replace(SHAPES[shape], vocab_size=vocab or SHAPES[shape].vocab_size)
        torch.manual_seed(SEED)
        model = Transformer(config)
        source = "random init (seed 0)"
    model = model.float().eval()
    folder = work / f"hf-{shape}-{model.config.vocab_size}"  # the same weights: made once
    if not folder.is_dir():
        export_hf(model, tokenizer, folder)
    return Model(shape, model, folder, source)


def prompt_ids(problems: list[Problem], template: ChatTemplate) -> list[list[int]]:
    return [template.prompt_ids([Message("user", p.prompt)]) for p in problems]


def left_pad(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :] = torch.tensor(row)
        mask[i, width - len(row) :] = 1
    return ids, mask


def engine_threads(engine: Engine) -> tuple[str, int]:
    """The thread the engine runs the model on and torch's thread count there."""
    seen: list[tuple[str, int]] = []

    def hook(module, args) -> None:
        seen.append((threading.current_thread().name, torch.get_num_threads()))

    handle = engine.model.register_forward_pre_hook(hook)
    try:
        engine.generate([[1, 2]], SamplingParams(max_tokens=1))
    finally:
        handle.remove()
    return seen[0]


# -- part 1: rollouts ---------------------------------------------------------------------


def lmforge_rollouts(engine: Engine, prompts: list[list[int]], n: int, round_: int) -> dict:
    """G sampled completions of each prompt, with log-probs, as RolloutEngine submits them."""
    requests = [ids for ids in prompts for _ in range(GROUP_SIZE)]
    params = [
        SamplingParams(
            max_tokens=n, temperature=1.0, seed=request_seed(SEED, round_, k), logprobs=True
        )
        for k in range(len(requests))
    ]
    cpu, start = time.process_time(), time.perf_counter()
    completions = engine.generate(requests, params)
    wall = time.perf_counter() - start
    tokens = sum(len(c.token_ids) for c in completions)
    assert all(len(c.logprobs or []) == len(c.token_ids) == n for c in completions)
    return {"seconds": wall, "cpu_s": time.process_time() - cpu, "tokens": tokens}


def hf_rollouts(
    hf, prompts: list[list[int]], n: int, batch: int, pad: int, logprobs: bool, round_: int
) -> dict:
    """G sampled completions of each prompt from transformers' generate, as TRL calls it."""
    from transformers import GenerationConfig

    rows = [ids for ids in prompts for _ in range(GROUP_SIZE)]
    config = GenerationConfig(
        max_new_tokens=n,
        min_new_tokens=n,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        pad_token_id=pad,
        bos_token_id=hf.generation_config.bos_token_id,
        eos_token_id=hf.generation_config.eos_token_id,
        disable_compile=True,
        output_scores=logprobs,
        return_dict_in_generate=logprobs,
    )
    size = batch or len(rows)
    torch.manual_seed(round_)
    tokens = 0
    cpu, start = time.process_time(), time.perf_counter()
    for i in range(0, len(rows), size):
        ids, mask = left_pad(rows[i : i + size], pad)
        with torch.no_grad():
            out = hf.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        sequences = out.sequences if logprobs else out
        completion = sequences[:, ids.shape[1] :]
        if logprobs:
            scores = torch.stack(out.scores, dim=1).float()  # (rows, n, vocab)
            chosen = torch.log_softmax(scores, -1).gather(-1, completion[..., None])
            assert chosen.shape[:2] == completion.shape
        tokens += completion.numel()
    wall = time.perf_counter() - start
    assert tokens == len(rows) * n, (tokens, len(rows), n)
    return {"seconds": wall, "cpu_s": time.process_time() - cpu, "tokens": tokens}


def same_greedy(engine: Engine, hf, prompts: list[list[int]], pad: int) -> bool:
    """8 greedy tokens of each prompt agree on both sides: the weights are the same."""
    ours = [
        c.token_ids for c in engine.generate(prompts, SamplingParams(max_tokens=8, temperature=0))
    ]
    for prompt, tokens in zip(prompts, ours, strict=True):
        with torch.no_grad():
            ids = torch.tensor([prompt])
            out = hf.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, min_new_tokens=8,
                do_sample=False, pad_token_id=pad,
            )  # fmt: skip
        if out[0, len(prompt) :].tolist() != tokens:
            return False
    return True


def bench_rollouts(
    m: Model, prompts: list[list[int]], n: int, reps: int, slots: list[tuple[int, bool]],
    hf_batch: int, hf_logprobs: bool,
) -> dict:  # fmt: skip
    hf = m.load_hf()
    pad = hf.generation_config.pad_token_id or 0
    longest = max(map(len, prompts)) + n  # KV positions: what the running requests can hold
    running = [min(s, len(prompts) * GROUP_SIZE) for s, _ in slots]
    engines = {
        f"lmforge engine ({s} slots{', compiled' if compiled else ''})": Engine(
            copy.deepcopy(m.model).requires_grad_(False), NoSpecials(), max_batch_size=s,
            max_kv_tokens=rows * longest, compile=compiled,
        )
        for (s, compiled), rows in zip(slots, running, strict=True)
    }  # fmt: skip
    impls: dict[str, Callable[[list[list[int]], int, int], dict]] = {}
    impls[HF_ROW] = lambda p, k, r: hf_rollouts(hf, p, k, hf_batch, pad, False, r)
    if hf_logprobs:
        impls[HF_LOGPROBS_ROW] = lambda p, k, r: hf_rollouts(hf, p, k, hf_batch, pad, True, r)
    for label, engine in engines.items():
        impls[label] = lambda p, k, r, e=engine: lmforge_rollouts(e, p, k, r)
    threads = {label: engine_threads(e) for label, e in engines.items()}
    same = {label: same_greedy(e, hf, prompts[:2], pad) for label, e in engines.items()}
    for run in impls.values():  # warm up: allocators, the engine's thread, generate's caches
        run(prompts[:1], 4, 0)
    for engine in engines.values():  # every row count a compiled step meets, compiled
        if engine.runner.compiled:
            lmforge_rollouts(engine, prompts, n, 0)
    runs: dict[str, list[dict]] = {label: [] for label in impls}
    for rep in range(reps):  # interleaved: every side once per round
        for label, run in impls.items():
            r = run(prompts, n, rep + 1)
            r["tokens_per_s"] = r["tokens"] / r["seconds"]
            runs[label].append(r)
            print(
                f"  {m.shape} rep {rep + 1}/{reps} {label}: {r['tokens_per_s']:.0f} tokens/s "
                f"({r['tokens']} tokens in {r['seconds']:.1f} s)",
                flush=True,
            )
    for engine in engines.values():
        engine.close()
    summary = {
        label: {
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in rs),
            "seconds": statistics.median(r["seconds"] for r in rs),
            "cpu_s": statistics.median(r["cpu_s"] for r in rs),
            "tokens": rs[0]["tokens"],
            "per_rep_tokens_per_s": [round(r["tokens_per_s"], 1) for r in rs],
            "per_rep_seconds": [round(r["seconds"], 2) for r in rs],
        }
        for label, rs in runs.items()
    }
    ratios = {}
    for label in engines:
        paired = [
            a["tokens_per_s"] / b["tokens_per_s"]
            for a, b in zip(runs[label], runs[HF_ROW], strict=True)
        ]
        ratio = summary[label]["tokens_per_s"] / summary[HF_ROW]["tokens_per_s"]
        ratios[label] = {
            "ratio": ratio,
            "ratio_per_rep": [round(x, 3) for x in paired],
            "target_met": ratio >= ROLLOUT_TARGET,
        }
        if hf_logprobs:
            ratios[label]["ratio_vs_hf_with_logprobs"] = (
                summary[label]["tokens_per_s"] / summary[HF_LOGPROBS_ROW]["tokens_per_s"]
            )
    return {
        "params": m.params,
        "model": asdict(m.model.config),
        "weights": m.source,
        "prompts": len(prompts),
        "completions": len(prompts) * GROUP_SIZE,
        "new_tokens": n,
        "prompt_tokens_mean": sum(map(len, prompts)) / len(prompts),
        "hf_batch_rows": hf_batch or len(prompts) * GROUP_SIZE,
        "engine_thread_torch_threads": threads,
        "same_greedy_tokens": same,
        "summary": summary,
        "ratios": ratios,
    }


# -- part 2: GRPO steps -------------------------------------------------------------------


class LmforgeGrpo:
    """What `lmforge rl` runs per step: rollouts, one optimizer step, the engine synced."""

    def __init__(
        self, base: Transformer, tokenizer: Tokenizer, pool: list[Problem], cfg: RlConfig
    ) -> None:
        task = get_task(cfg.task)
        self.policy = copy.deepcopy(base).train().requires_grad_(True)
        template = ChatTemplate(tokenizer)
        self.engine = RolloutEngine(self.policy, template, cfg.max_new_tokens, cfg.engine_batch)
        self.sampler = GroupSampler(cfg, pool, task.reward, self.engine)
        self.trainer = PolicyTrainer(self.policy, cfg, torch.device("cpu"))
        self.step_index = 0

    def step(self) -> dict:
        start = time.perf_counter()
        collected = self.sampler.collect(self.step_index)
        rolled = time.perf_counter()
        self.trainer.train(self.step_index, collected)
        trained = time.perf_counter()
        self.engine.sync(self.policy)
        end = time.perf_counter()
        self.step_index += 1
        lengths = [len(r.completion_ids) for r in collected.rollouts]
        return {
            "seconds": end - start,
            "generate_s": rolled - start,  # rollouts and their rewards (collect)
            "rest_s": end - rolled,
            "train_s": trained - rolled,
            "sync_s": end - trained,
            "completions": len(lengths),
            "completion_tokens": sum(lengths),
            "prompt_tokens": sum(len(r.prompt_ids) for r in collected.rollouts),
            "mean_completion_length": sum(lengths) / len(lengths),
            "reward_mean": float(collected.rewards.mean()),
            "torch_threads": torch.get_num_threads(),
        }

    def close(self) -> None:
        self.engine.close()


def trl_reward(reward: Callable[..., float], keys: list[str]) -> Callable[..., list[float]]:
    """The task's reward as a TRL reward function (conversational prompts and completions;
    TRL passes the dataset's other columns as keyword arguments, one value per completion)."""

    def arithmetic_reward(prompts, completions, **kwargs) -> list[float]:
        return [
            reward(p[-1]["content"], c[0]["content"], **{k: kwargs[k][i] for k in keys})
            for i, (p, c) in enumerate(zip(prompts, completions, strict=True))
        ]

    return arithmetic_reward


def bench_grpo(
    m: Model, tokenizer: Tokenizer, pool: list[Problem], cfg: RlConfig, reps: int, work: Path
) -> dict:
    from datasets import Dataset
    from transformers import AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    template = ChatTemplate(tokenizer)
    hf_tokenizer = AutoTokenizer.from_pretrained(m.hf_dir)
    same_prompts = all(
        template.prompt_ids([Message("user", p.prompt)])
        == list(
            hf_tokenizer.apply_chat_template(
                [{"role": "user", "content": p.prompt}], add_generation_prompt=True,
                tokenize=True, return_dict=True,
            )["input_ids"]
        )
        for p in pool[:64]
    )  # fmt: skip
    hf = m.load_hf()
    hf.generation_config.eos_token_id = sorted(tokenizer.special_tokens.values())  # lmforge's stops
    keys = list(pool[0].reward_fields())
    rows = [{"prompt": [{"role": "user", "content": p.prompt}], **p.reward_fields()} for p in pool]
    batch = cfg.prompts_per_step * cfg.group_size
    names = {f.name for f in fields(GRPOConfig)}  # transformers 5 renamed the setting
    checkpointing = next(
        n for n in ("activation_checkpointing", "gradient_checkpointing") if n in names
    )
    args = GRPOConfig(
        output_dir=str(work / f"trl-{m.shape}"),
        per_device_train_batch_size=cfg.micro_batch,
        gradient_accumulation_steps=batch // cfg.micro_batch,
        num_generations=cfg.group_size,
        max_completion_length=cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_k=0,
        learning_rate=cfg.lr,
        lr_scheduler_type="constant",
        adam_beta1=0.9,
        adam_beta2=0.99,
        weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.grad_clip,
        num_iterations=cfg.num_iterations,
        beta=cfg.beta,
        epsilon=cfg.eps_low,
        epsilon_high=cfg.eps_high,
        loss_type=cfg.loss_norm,
        scale_rewards=cfg.scale_rewards,
        max_steps=reps + 1,
        use_cpu=True,
        bf16=False,
        **{checkpointing: False},  # TRL turns it on by default; lmforge does not checkpoint
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=SEED,
    )
    ours = LmforgeGrpo(m.model, tokenizer, pool, cfg)

    class Interleave(TrainerCallback):
        """Times each TRL step, then runs one lmforge step."""

        def __init__(self) -> None:
            self.started = self.generate_s = 0.0
            self.trl: list[dict] = []
            self.lmforge: list[dict] = []

        def on_step_begin(self, args, state, control, **kwargs):
            self.generate_s = 0.0
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            seconds = time.perf_counter() - self.started
            self.trl.append(
                {
                    "seconds": seconds,
                    "generate_s": self.generate_s,
                    "rest_s": seconds - self.generate_s,
                    "torch_threads": torch.get_num_threads(),
                }
            )
            self.lmforge.append(ours.step())
            for side, r in (("TRL", self.trl[-1]), ("lmforge", self.lmforge[-1])):
                print(
                    f"  {m.shape} step {state.global_step} {side}: {r['seconds']:.2f} s", flush=True
                )

    clock = Interleave()
    inner_generate = hf.generate

    def generate(*args, **kwargs):  # TRL calls the model's own generate: time it
        start = time.perf_counter()
        try:
            return inner_generate(*args, **kwargs)
        finally:
            clock.generate_s += time.perf_counter() - start

    hf.generate = generate
    trainer = GRPOTrainer(
        model=hf,
        reward_funcs=trl_reward(get_task(cfg.task).reward, keys),
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=hf_tokenizer,
        callbacks=[clock],
    )
    trainer.remove_callback(PrinterCallback)  # its log lines; the metrics stay in log_history
    trainer.train()
    ours.close()
    logs = [h for h in trainer.state.log_history if "completions/mean_length" in h]
    for record, log in zip(clock.trl, logs, strict=False):
        record["mean_completion_length"] = log["completions/mean_length"]
        record["reward_mean"] = log.get("reward")
    measured = {"TRL GRPOTrainer": clock.trl[1:], "lmforge": clock.lmforge[1:]}  # first: warm-up

    def median(rs: list[dict], key: str) -> float | None:
        values = [r[key] for r in rs if r.get(key) is not None]
        return statistics.median(values) if values else None

    summary = {
        side: {
            "seconds_per_step": median(rs, "seconds"),
            "generate_s": median(rs, "generate_s"),  # TRL: in generate; lmforge: collect
            "rest_s": median(rs, "rest_s"),  # the rest of the step (loss, backward, optimizer)
            "train_s": median(rs, "train_s"),  # lmforge: PolicyTrainer.train alone
            "mean_completion_length": median(rs, "mean_completion_length"),
            "reward_mean": median(rs, "reward_mean"),
            "per_step_seconds": [round(r["seconds"], 3) for r in rs],
            "torch_threads": rs[0]["torch_threads"],
        }
        for side, rs in measured.items()
    }
    ratio = summary["lmforge"]["seconds_per_step"] / summary["TRL GRPOTrainer"]["seconds_per_step"]
    ours_steps = measured["lmforge"]
    tokens = statistics.median(r["completion_tokens"] + r["prompt_tokens"] for r in ours_steps)
    floor = matmul_floor(m.model, int(tokens), cfg.micro_batch * int(tokens) // batch)
    floor["budget_s"] = GRPO_TARGET * summary["TRL GRPOTrainer"]["seconds_per_step"]
    floor["lmforge_train_s"] = summary["lmforge"]["train_s"]
    paired = [
        a["seconds"] / b["seconds"]
        for a, b in zip(measured["lmforge"], measured["TRL GRPOTrainer"], strict=True)
    ]
    return {
        "params": m.params,
        "model": asdict(m.model.config),
        "weights": m.source,
        "prompts_per_step": cfg.prompts_per_step,
        "completions_per_step": batch,
        "max_new_tokens": cfg.max_new_tokens,
        "micro_batch": cfg.micro_batch,
        "trl_gradient_accumulation_steps": args.gradient_accumulation_steps,
        "same_prompt_ids": same_prompts,
        "warmup_steps_dropped": 1,
        "warmup": {"TRL GRPOTrainer": clock.trl[0], "lmforge": clock.lmforge[0]},
        "steps": {side: rs for side, rs in measured.items()},
        "summary": summary,
        "ratio": ratio,
        "ratio_per_step": [round(x, 3) for x in paired],
        "target_met": ratio <= GRPO_TARGET,
        "training_matmul_floor": floor,
    }


def matmul_floor(model: Transformer, tokens: int, rows: int) -> dict:
    """The least time a step's training can take here: its matrix products alone (every
    Linear's forward and its two backward products, the head's included) over `tokens` trained
    tokens, in micro-batches of `rows` tokens, at the rate torch's matmul reaches on this
    machine for those shapes (best of 5). Attention, norms, the loss and the optimizer come on
    top, so a 0.5x target below this floor cannot be met by any implementation of the same
    training (same tokens, same model, fp32)."""
    shapes: dict[tuple[int, int], int] = {}
    for module in model.modules():
        if isinstance(module, Linear):
            shapes[tuple(module.weight.shape)] = shapes.get(tuple(module.weight.shape), 0) + 1
    seconds = flops = 0.0
    for (out, inp), count in shapes.items():
        x, w, g = torch.randn(rows, inp), torch.randn(out, inp), torch.randn(rows, out)

        def products(x=x, w=w, g=g) -> None:
            x @ w.t(), g @ w, g.t() @ x  # forward, input gradient, weight gradient

        products()
        best = min(timed(products) for _ in range(5))
        seconds += best * count * tokens / rows
        flops += 6 * rows * inp * out * count * tokens / rows
    return {
        "trained_tokens": tokens,
        "rows_per_micro_batch": rows,
        "matmul_gflop": flops / 1e9,
        "matmul_gflops_per_s": flops / seconds / 1e9,
        "matmul_seconds": seconds,
    }


def timed(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# -- report -------------------------------------------------------------------------------


def source_state() -> dict:
    """The commit measured, and lmforge's files changed since it (measured as they are)."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
        return done.stdout.strip()

    changed = git("status", "--porcelain", "--", "lmforge").splitlines()
    return {"commit": git("rev-parse", "HEAD"), "lmforge_uncommitted": changed}


def print_rollouts(results: dict) -> None:
    print(
        "\n| shape | params | completions × new tokens | side | tokens/s | s | per-rep tokens/s |"
    )
    print("|---|---|---|---|---|---|---|")
    for shape, r in results.items():
        size = f"{r['prompts']}×{GROUP_SIZE} × {r['new_tokens']}"
        for label, s in r["summary"].items():
            per_rep = ", ".join(f"{x:.0f}" for x in s["per_rep_tokens_per_s"])
            print(
                f"| {shape} | {r['params'] / 1e6:.1f}M | {size} | {label} | "
                f"{s['tokens_per_s']:.0f} | {s['seconds']:.1f} | {per_rep} |"
            )
    print()
    for shape, r in results.items():
        for label, x in r["ratios"].items():
            also = x.get("ratio_vs_hf_with_logprobs")
            extra = "" if also is None else f"; {also:.2f}x generate + logprobs"
            print(
                f"{shape}: {label} / transformers = {x['ratio']:.2f}x tokens/s (per repetition "
                f"{', '.join(f'{v:.2f}x' for v in x['ratio_per_rep'])}{extra}); target >= "
                f"{ROLLOUT_TARGET:g}x {'met' if x['target_met'] else 'NOT met'}; same greedy "
                f"tokens: {r['same_greedy_tokens'][label]}"
            )


def print_grpo(results: dict) -> None:
    head = "| shape | params | batch | side | s/step | generation s | rest s | mean length"
    print(f"\n{head} | per-step s |")
    print("|---|---|---|---|---|---|---|---|---|")

    def num(x: float | None, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    for shape, r in results.items():
        size = f"{r['prompts_per_step']}×{GROUP_SIZE} ≤ {r['max_new_tokens']}"
        for side, s in r["summary"].items():
            print(
                f"| {shape} | {r['params'] / 1e6:.1f}M | {size} | {side} | "
                f"{s['seconds_per_step']:.2f} | {num(s['generate_s'], '.2f')} | "
                f"{num(s['rest_s'], '.2f')} | {num(s['mean_completion_length'], '.1f')} | "
                f"{', '.join(f'{x:.2f}' for x in s['per_step_seconds'])} |"
            )
    print()
    for shape, r in results.items():
        print(
            f"{shape}: lmforge / TRL = {r['ratio']:.2f}x seconds per GRPO step (per step "
            f"{', '.join(f'{x:.2f}x' for x in r['ratio_per_step'])}); target <= {GRPO_TARGET:g}x "
            f"{'met' if r['target_met'] else 'NOT met'}; same prompt ids: {r['same_prompt_ids']}"
        )
        f = r["training_matmul_floor"]
        print(
            f"{shape}: the training's matrix products alone ({f['matmul_gflop']:.0f} GFLOP over "
            f"{f['trained_tokens']} tokens) take {f['matmul_seconds']:.2f} s at this machine's "
            f"{f['matmul_gflops_per_s']:.0f} GFLOP/s; lmforge's training took "
            f"{f['lmforge_train_s']:.2f} s; the target's whole step: {f['budget_s']:.2f} s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="interleaved repetitions (GRPO: steps)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads for both sides")
    parser.add_argument("--shapes", default="speedrun,134M", help="part 1's shapes")
    parser.add_argument("--prompts", type=int, default=64, help="part 1's prompts (speedrun)")
    parser.add_argument("--prompts-134m", type=int, default=16, help="part 1's prompts (134M)")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--slots", default="128,512", help="the engine's decode slots, eager")
    parser.add_argument("--compiled-slots", default="", help="decode slots, compiled, e.g. 512")
    parser.add_argument("--hf-batch", type=int, default=0, help="generate's rows (0: all)")
    parser.add_argument("--hf-logprobs", action="store_true", help="also generate + logprobs")
    parser.add_argument("--grpo-shapes", default="speedrun", help="part 2's shapes")
    parser.add_argument("--grpo-prompts", type=int, default=16)
    parser.add_argument("--grpo-new-tokens", type=int, default=64)
    parser.add_argument("--micro-batch", type=int, default=32, help="completions per backward")
    parser.add_argument("--checkpoint", default=str(SPEEDRUN_RUN), help="'none': random init")
    parser.add_argument("--skip-rollouts", action="store_true")
    parser.add_argument("--skip-grpo", action="store_true")
    parser.add_argument("--quick", action="store_true", help="a tiny run to check the script")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.quick:
        args.reps, args.prompts, args.prompts_134m, args.new_tokens = 1, 2, 2, 16
        args.grpo_prompts, args.grpo_new_tokens, args.micro_batch = 2, 16, 8
        if args.out == RESULTS:  # a check of the script, not a measurement
            args.out = Path(tempfile.gettempdir()) / "bench_rollout_quick.json"
    torch.set_num_threads(args.threads)
    import accelerate
    import datasets
    import transformers
    import trl

    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", ".*is_gradient_checkpointing", FutureWarning)  # TRL's call

    checkpoint = Path(args.checkpoint)
    if args.checkpoint == "none" or not (checkpoint / "checkpoints").is_dir():
        checkpoint = None
    grpo_batch = args.grpo_prompts * GROUP_SIZE
    micro = min(args.micro_batch, grpo_batch)
    if grpo_batch % micro:
        raise SystemExit(f"--micro-batch {micro} must divide {grpo_batch} completions per step")
    started = time.perf_counter()
    rollouts, grpo = {}, {}
    with tempfile.TemporaryDirectory(prefix="bench_rollout_") as tmp:
        work = Path(tmp)
        tokenizer, tok_source = load_tokenizer(checkpoint, work)
        template = ChatTemplate(tokenizer)
        print(f"tokenizer: {tok_source}; {args.threads} threads", flush=True)
        if not args.skip_rollouts:
            problems = get_task("arithmetic").problems(
                max(args.prompts, args.prompts_134m), "train", 0
            )
            for shape in args.shapes.split(","):
                count = args.prompts_134m if shape == "134M" else args.prompts
                m = build_model(shape, tokenizer, checkpoint, work, None)
                print(f"rollouts, {shape} ({m.params / 1e6:.1f}M, {m.source}): {count} prompts "
                      f"× {GROUP_SIZE} × {args.new_tokens} tokens", flush=True)  # fmt: skip
                prompts = prompt_ids(problems[:count], template)
                completions = count * GROUP_SIZE
                slots = [
                    (min(int(s), completions), compiled)
                    for spec, compiled in ((args.slots, False), (args.compiled_slots, True))
                    for s in spec.split(",")
                    if s
                ]
                slots = list(dict.fromkeys(slots))  # 512 slots for 128 completions: 128
                rollouts[shape] = bench_rollouts(
                    m, prompts, args.new_tokens, args.reps, slots, args.hf_batch, args.hf_logprobs
                )
                del m
        if not args.skip_grpo:
            pool = get_task("arithmetic").problems(256, "train", 0)
            cfg = RlConfig(
                prompts_per_step=args.grpo_prompts,
                group_size=GROUP_SIZE,
                max_new_tokens=args.grpo_new_tokens,
                dynamic_sampling="count",
                micro_batch=micro,
                warmup_steps=0,
                device="cpu",
            )
            for shape in args.grpo_shapes.split(","):
                # completions must decode on both sides: a random model gets the tokenizer's ids
                trained = shape == "speedrun" and checkpoint is not None
                vocab = None if trained else tokenizer.vocab_size
                m = build_model(shape, tokenizer, checkpoint, work, vocab)
                print(f"GRPO, {shape} ({m.params / 1e6:.1f}M, {m.source}): {args.grpo_prompts} "
                      f"prompts × {GROUP_SIZE}, ≤ {args.grpo_new_tokens} tokens, "
                      f"{args.reps} steps + 1 warm-up", flush=True)  # fmt: skip
                grpo[shape] = bench_grpo(m, tokenizer, pool, cfg, args.reps, work)
                del m
    if rollouts:
        print_rollouts(rollouts)
    if grpo:
        print_grpo(grpo)
    cpu = read_cpuinfo()
    out = {
        "task": "arithmetic (lmforge.posttrain.tasks), train split, chat template",
        "tokenizer": tok_source,
        "timed": "wall seconds, medians of interleaved repetitions (GRPO: steps, warm-up dropped)",
        "targets": {
            "rollouts": f"lmforge >= {ROLLOUT_TARGET:g}x transformers' generated tokens/s",
            "grpo": f"lmforge <= {GRPO_TARGET:g}x TRL GRPOTrainer's seconds per step",
        },
        "cpu": cpu.model,
        "cpu_avx512_flags": sorted(f for f in cpu.features if f.startswith("avx512")),
        "cores": os.cpu_count(),
        "threads": args.threads,
        "repetitions": args.reps,
        "quick": args.quick,
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "accelerate": accelerate.__version__,
        "datasets": datasets.__version__,
        "source": source_state(),
        "load_average_after": os.getloadavg(),
        "total_s": round(time.perf_counter() - started, 1),
        "rollouts": rollouts,
        "grpo": grpo,
    }
    write_text(args.out, json.dumps(out, indent=2, default=str) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
