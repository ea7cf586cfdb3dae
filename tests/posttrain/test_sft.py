"""Supervised fine-tuning: the loss mask, packing, the command, LoRA runs and exact resume."""

import json
import random

import numpy as np
import pytest
import torch

from lmforge.cli import main
from lmforge.errors import LmforgeError
from lmforge.model import ModelConfig, Transformer
from lmforge.model.peft import ADAPTER_CONFIG
from lmforge.posttrain.sft_data import IGNORE, Example, PackedBatches, pack, read_conversations
from lmforge.tokenizer import train_bpe
from lmforge.tokenizer.chat_template import IM_END, ChatTemplate, Message
from lmforge.train.checkpoint import load_checkpoint
from lmforge.train.metrics import read_metrics
from tests.kills import (
    kill_training_run,
    lmforge,
    newest_checkpoint,
    timed_run,
)

CONVERSATION = [
    Message("system", "Be brief."),
    Message("user", "What is 2 + 3?"),
    Message("assistant", "2 + 3 = 5\n#### 5"),
    Message("user", "And 4 + 4?"),
    Message("assistant", "#### 8"),
]


def _learned_runs(ids, mask):
    """The maximal runs of ids whose mask is 1."""
    runs, current = [], []
    for token, learned in zip(ids, mask, strict=True):
        if learned:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    return runs + ([current] if current else [])


def test_the_mask_covers_exactly_the_assistant_text_and_its_end_token(chat_tokenizer):
    template = ChatTemplate(chat_tokenizer)
    assert template.chatml
    ids, mask = template.render(CONVERSATION)
    assert len(ids) == len(mask)
    runs = _learned_runs(ids, mask)
    end = chat_tokenizer.special_tokens[IM_END]
    assert [r[-1] for r in runs] == [end, end]
    assert [chat_tokenizer.decode(r[:-1]) for r in runs] == ["2 + 3 = 5\n#### 5", "#### 8"]
    # the prompt the engine builds for the last turn is exactly the rendered ids before the reply
    prompt = template.prompt_ids(CONVERSATION[:-1])
    first_learned = len(ids) - 1 - mask[::-1].index(0, mask[::-1].index(1))
    assert ids[: len(prompt)] == prompt and len(prompt) == first_learned + 1


def test_the_plain_format_learns_the_reply_and_ends_the_document():
    tokenizer = train_bpe(["User: hi\nAssistant: hello\n"] * 20, 300, ["<|endoftext|>"], workers=1)
    template = ChatTemplate(tokenizer)
    ids, mask = template.render([Message("user", "hi"), Message("assistant", "hello")])
    (run,) = _learned_runs(ids, mask)
    assert run[-1] == tokenizer.eot_id
    assert tokenizer.decode(run[:-1]) == " hello\n"
    assert ids[: len(template.prompt_ids([Message("user", "hi")]))] == template.prompt_ids(
        [Message("user", "hi")]
    )


def _examples(n, seed=0):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.randint(3, 40)
        ids = [rng.randint(1, 300) for _ in range(length)]
        mask = [int(rng.random() < 0.5) for _ in range(length)]
        mask[-1] = 1
        out.append(Example(ids, mask))
    return out


def test_packing_keeps_every_target_inside_its_conversation():
    examples = _examples(60)
    packed = pack(examples, seq_len=64)
    # every conversation is placed whole, once; a target is its own conversation's next token
    found = []
    for x, y, seg in zip(packed.inputs, packed.targets, packed.segments, strict=True):
        for doc in np.unique(seg):
            at = np.flatnonzero(seg == doc)
            if y[at].max() == IGNORE and x[at].max() == 0:
                continue  # padding
            found.append((list(x[at]), list(y[at])))
    assert len(found) == len(examples)
    expected = sorted(
        (e.ids[:-1], [t if m else IGNORE for t, m in zip(e.ids[1:], e.mask[1:], strict=True)])
        for e in examples
    )
    assert sorted(found) == expected
    slots = sum(len(e.ids) - 1 for e in examples)
    assert len(packed) == -(-slots // 64)  # best fit needs no more rows than the slots demand here
    assert packed.fill == slots / (len(packed) * 64)


def test_a_packed_row_computes_each_conversation_as_if_alone():
    torch.manual_seed(0)
    model = Transformer(
        ModelConfig(vocab_size=320, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=64)
    ).eval()
    examples = _examples(12, seed=3)
    packed = pack(examples, seq_len=64)
    x, seg = torch.from_numpy(packed.inputs), torch.from_numpy(packed.segments)
    with torch.no_grad():
        logits = model(x, segments=seg)
        for r in range(len(packed)):
            for doc in seg[r].unique():
                at = (seg[r] == doc).nonzero().flatten()
                alone = model(x[r : r + 1, at])
                assert torch.allclose(logits[r, at], alone[0], atol=1e-5)


def test_batches_are_a_function_of_the_step_and_cover_every_row_each_epoch():
    packed = pack(_examples(100), seq_len=32)
    batches = PackedBatches(packed, batch_size=4, grad_accum_steps=2, seed=7)
    steps = len(packed) // 8
    seen = [
        tuple(batches.next(s, m, "cpu")[0][:, 0].tolist()) for s in range(steps) for m in (0, 1)
    ]
    again = PackedBatches(packed, batch_size=4, grad_accum_steps=2, seed=7)
    assert tuple(again.next(3, 1, "cpu")[0][:, 0].tolist()) == seen[7]
    rows = torch.cat([batches.next(s, m, "cpu")[0] for s in range(steps) for m in (0, 1)])
    assert len({tuple(r.tolist()) for r in rows}) == len(rows)  # no row twice in an epoch
    halves = [
        PackedBatches(packed, 4, 2, 7, rank=r, world_size=2).next(2, 0, "cpu")[0] for r in (0, 1)
    ]
    assert torch.equal(torch.cat(halves), batches.next(2, 0, "cpu")[0])


def test_bad_lines_name_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    good = json.dumps(
        {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
    )
    for line, words in [
        ("{not json", "not valid JSON"),
        (json.dumps({"text": "x"}), 'no "messages"'),
        (json.dumps({"messages": [{"role": "robot", "content": "x"}]}), "role is 'robot'"),
        (
            json.dumps({"messages": [{"role": "user", "content": "only a question"}]}),
            "no assistant",
        ),
        (json.dumps({"messages": [{"role": "assistant", "content": 3}]}), "no text content"),
    ]:
        path.write_text(good + "\n\n" + line + "\n")
        with pytest.raises(LmforgeError, match=f"bad.jsonl:3: .*{words}"):
            read_conversations(path)


def _sft_args(base, data, out, *extra):
    return [
        "sft",
        "--checkpoint",
        str(base),
        "--data",
        str(data),
        "--out",
        str(out),
        "--device",
        "cpu",
        "--threads",
        "1",
        "--set",
        "train.batch_size=8",
        "--set",
        "train.seq_len=64",
        "--set",
        "train.log_every=5",
        "--set",
        "train.eval.every=20",
        *extra,
    ]


def test_sft_learns_the_assistant_tokens(base_checkpoint, conversations_file, tmp_path, capsys):
    out = tmp_path / "run"
    args = _sft_args(base_checkpoint, conversations_file, out, "--max-steps", "60")
    assert main([*args, "--set", "train.optimizer.lr=3e-3"]) == 0
    printed = capsys.readouterr().out
    assert "285 conversations" in printed and "15 held out" in printed  # 5% of 300 held out
    records = read_metrics(out / "metrics.jsonl")
    val = [r["val_loss"] for r in records if "val_loss" in r]
    assert val[-1] < val[0] - 1.0  # the held-out assistant tokens got much more likely
    model, _ = load_checkpoint(out)
    assert model.config == load_checkpoint(base_checkpoint)[0].config
    assert main(_sft_args(base_checkpoint, tmp_path / "none.jsonl", tmp_path / "r2")) == 2
    assert "none.jsonl not found" in capsys.readouterr().err


def test_a_lora_run_writes_a_peft_adapter_that_loads_merged(
    base_checkpoint, conversations_file, tmp_path
):
    out = tmp_path / "lora"
    args = _sft_args(base_checkpoint, conversations_file, out, "--max-steps", "10")
    assert main([*args, "--lora", "r=4,alpha=8,targets=q,v,down"]) == 0
    config = json.loads((out / "adapter" / ADAPTER_CONFIG).read_text())
    assert config["r"] == 4 and sorted(config["target_modules"]) == [
        "down_proj",
        "q_proj",
        "v_proj",
    ]
    tuned, _ = load_checkpoint(out)  # the run's checkpoint, merged
    on_base, _ = load_checkpoint(base_checkpoint, adapter=out / "adapter")
    base, _ = load_checkpoint(base_checkpoint)
    ids = torch.randint(0, 384, (1, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(tuned(ids), on_base(ids), atol=1e-5)
        assert not torch.allclose(tuned(ids), base(ids), atol=1e-3)  # the adapters trained
    tuned_state, base_state = tuned.state_dict(), base.state_dict()
    assert torch.equal(
        tuned_state["layers.0.attn.k_proj.weight"], base_state["layers.0.attn.k_proj.weight"]
    )


def test_sft_killed_at_random_moments_resumes_exactly(
    base_checkpoint, conversations_file, tmp_path
):
    """SIGKILL at random moments (tests/kills.py), each after a new checkpoint: the same
    command resumes each time, never finds a half-written file, and ends with the metrics and
    weights of an uninterrupted run."""
    extra = ("--max-steps", "60", "--set", "train.checkpoint.every=5")
    killed, straight = tmp_path / "killed", tmp_path / "straight"

    def command(out):
        return lmforge(*_sft_args(base_checkpoint, conversations_file, out, *extra))

    spread = timed_run(command(straight), straight, lambda: newest_checkpoint(straight))
    log = kill_training_run(command(killed), killed, spread, "sft")
    assert "resuming from" in log.attempts[-1].stdout

    def trajectory(run):
        return [
            (r["step"], r.get("loss"), r.get("val_loss"))
            for r in read_metrics(run / "metrics.jsonl")
        ]

    assert len(trajectory(straight)) > 10
    a, _ = load_checkpoint(straight)
    b, _ = load_checkpoint(killed)
    identical = trajectory(killed) == trajectory(straight) and all(
        torch.equal(x, y)
        for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )
    log.summary("sft", identical)
    assert log.kills >= 1 and identical
