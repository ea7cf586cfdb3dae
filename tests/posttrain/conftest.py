"""A tiny base checkpoint with a ChatML tokenizer, and conversations to fine-tune it on."""

import json
import random

import pytest
import torch

from lmforge.model import ModelConfig, Transformer
from lmforge.tokenizer import train_bpe
from lmforge.train.checkpoint import save_checkpoint

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BASE_MODEL = ModelConfig(vocab_size=384, d_model=32, n_layers=2, n_heads=2, max_seq_len=128)


def conversation(rng: random.Random) -> dict:
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    messages = [{"role": "user", "content": f"What is {a} + {b}?"}]
    if rng.random() < 0.3:
        messages.insert(0, {"role": "system", "content": "Answer with the sum."})
    messages.append({"role": "assistant", "content": f"{a} + {b} = {a + b}\n#### {a + b}"})
    return {"messages": messages}


@pytest.fixture(scope="session")
def chat_tokenizer():
    rng = random.Random(0)
    texts = [json.dumps(conversation(rng)) for _ in range(200)]
    texts += ["system\nuser\nassistant\nWhat is the sum? Answer with the sum."] * 5
    return train_bpe(texts, vocab_size=BASE_MODEL.vocab_size, special_tokens=SPECIALS, workers=1)


@pytest.fixture(scope="session")
def base_checkpoint(chat_tokenizer, tmp_path_factory):
    root = tmp_path_factory.mktemp("base")
    chat_tokenizer.save(root / "tokenizer")
    torch.manual_seed(0)
    model = Transformer(BASE_MODEL)
    optimizer = torch.optim.AdamW(model.parameters())
    return save_checkpoint(
        root / "checkpoints", 1, model, optimizer, {}, {}, {}, root / "tokenizer"
    )


@pytest.fixture(scope="session")
def conversations_file(tmp_path_factory):
    rng = random.Random(1)
    path = tmp_path_factory.mktemp("chat") / "train.jsonl"
    path.write_text("".join(json.dumps(conversation(rng)) + "\n" for _ in range(300)))
    return path
