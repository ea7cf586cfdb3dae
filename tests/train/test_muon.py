"""Muon: Newton–Schulz against an SVD reference, two steps against a hand-written one, and
training, resuming and refusing through the trainer."""

import types

import pytest
import torch
from safetensors.torch import load_file

import lmforge.train.step as step_module
from lmforge.errors import LmforgeError
from lmforge.model import ModelConfig, Transformer
from lmforge.train import train
from lmforge.train.adamw import AdamW
from lmforge.train.config import train_config
from lmforge.train.metrics import read_metrics
from lmforge.train.muon import Muon, newton_schulz
from lmforge.train.optimizers import build_optimizer

MODEL = ModelConfig(vocab_size=320, d_model=32, n_layers=2, n_heads=2, max_seq_len=32)


def _cfg(**kw):
    base = dict(
        batch_size=4,
        seq_len=32,
        lr=1e-2,
        warmup_steps=1,
        max_steps=4,
        eval_every=0,
        eval_batches=1,
        log_every=1,
        seed=3,
        device="cpu",
        optimizer="muon",
    )
    return train_config({**base, **kw})


@pytest.mark.parametrize("shape", [(64, 64), (96, 32), (32, 80), (200, 48)])
def test_newton_schulz_approximates_the_svd_orthogonalisation(shape):
    torch.manual_seed(0)
    g = torch.randn(shape, dtype=torch.float64)
    u, _, vt = torch.linalg.svd(g, full_matrices=False)
    reference = u @ vt  # the exact polar factor: every singular value 1
    got = newton_schulz(g.float()).double()
    singular = torch.linalg.svdvals(got)
    cosine = (got * reference).sum() / (got.norm() * reference.norm())
    assert got.shape == g.shape and cosine > 0.9
    # A square Gaussian matrix has near-zero singular values that 5 steps cannot lift fully.
    assert (
        singular.max() < 1.5 and torch.quantile(singular, 0.05 if shape[0] == shape[1] else 0) > 0.5
    )


def test_newton_schulz_in_bf16_stays_close_to_fp32():
    g = torch.randn(48, 32)
    fp32, bf16 = newton_schulz(g), newton_schulz(g, dtype=torch.bfloat16)
    assert bf16.dtype == torch.float32 and (bf16 - fp32).norm() / fp32.norm() < 0.05


def _reference_muon_step(w, g, buffer, lr, mu, wd):
    """One Nesterov Muon step written out with the SVD-free quintic, in float64."""
    buffer = mu * buffer + (1 - mu) * g
    u = (1 - mu) * g + mu * buffer
    tall = u.shape[0] > u.shape[1]
    x = u.T if tall else u
    x = x / (x.norm() + 1e-7)
    for _ in range(5):
        a = x @ x.T
        x = 3.4445 * x - 4.7750 * a @ x + 2.0315 * a @ a @ x
    x = x.T if tall else x
    scale = max(1, w.shape[0] / w.shape[1]) ** 0.5
    return w * (1 - lr * wd) - lr * scale * x, buffer


def test_newton_schulz_runs_in_bf16_only_where_bf16_is_fast(monkeypatch):
    from lmforge.device.capability import profile_capability
    from lmforge.train import muon

    assert muon.ns_dtype(torch.device("cuda")) == torch.bfloat16
    fast = types.SimpleNamespace(fast_bf16=lambda: True)  # bf16 measured fast
    monkeypatch.setattr(muon, "cpu_capability", lambda: fast)
    assert muon.ns_dtype(torch.device("cpu")) == torch.float32  # CPUs keep fp32 by default
    monkeypatch.setattr(muon, "CPU_BF16", True)
    assert muon.ns_dtype(torch.device("cpu")) == torch.bfloat16
    monkeypatch.setattr(muon, "cpu_capability", lambda: profile_capability("avx2"))
    assert muon.ns_dtype(torch.device("cpu")) == torch.float32  # emulated bf16 is slow


def test_two_steps_match_a_hand_written_reference(monkeypatch):
    from lmforge.train import muon

    monkeypatch.setattr(muon, "ns_dtype", lambda device: torch.float32)  # the exact arithmetic
    torch.manual_seed(1)
    model = Transformer(MODEL)
    opt = build_optimizer(model, 1e-2, (0.9, 0.95), 0.1, optimizer="muon", muon_lr=0.05)
    assert isinstance(opt, Muon)
    muon_group, *adam_groups = opt.param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    muon_names = {names[id(p)] for p in muon_group["params"]}
    assert muon_group["muon"] and muon_group["lr"] == 0.05 and muon_group["lr_scale"] == 5.0
    assert muon_names == {
        n for n, p in model.named_parameters() if n.startswith("layers.") and p.dim() == 2
    }
    assert {"tok_embeddings.weight", "output.weight", "norm.weight"}.isdisjoint(muon_names)
    adam_params = [p for g in adam_groups for p in g["params"]]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ref_model = Transformer(MODEL)
    ref_model.load_state_dict(model.state_dict())
    ref_adam = AdamW(
        [
            {**g, "params": [dict(ref_model.named_parameters())[names[id(p)]] for p in g["params"]]}
            for g in adam_groups
        ],
        lr=1e-2,
        betas=(0.9, 0.95),
    )
    buffers = {n: torch.zeros_like(before[n], dtype=torch.float64) for n in muon_names}
    ids = torch.randint(0, 320, (2, 17))
    for _ in range(2):
        for m in (model, ref_model):
            m.zero_grad()
            logits = m(ids[:, :-1])
            torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten()).backward()
        grads = {n: p.grad.double() for n, p in model.named_parameters()}
        opt.step()
        ref_adam.step()
        for n in muon_names:
            want, buffers[n] = _reference_muon_step(
                before[n].double(), grads[n], buffers[n], 0.05, 0.95, 0.1
            )
            before[n] = want.float()
            with torch.no_grad():  # the reference model's matrices follow, for the next grads
                dict(ref_model.named_parameters())[n].copy_(dict(model.named_parameters())[n])
    params = dict(model.named_parameters())
    for n in muon_names:
        torch.testing.assert_close(params[n].detach(), before[n], rtol=1e-4, atol=1e-5)
    for n, p in ref_model.named_parameters():
        if n not in muon_names:
            torch.testing.assert_close(params[n].detach(), p.detach(), rtol=0, atol=0)
    assert len(adam_params) == len(list(model.parameters())) - len(muon_names)


def test_a_skipped_step_leaves_parameters_and_state_untouched():
    model = Transformer(MODEL)
    opt = build_optimizer(model, 1e-2, (0.9, 0.95), 0.1, optimizer="muon")
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    before = [p.detach().clone() for p in model.parameters()]
    state = {k: v.clone() for s in opt.state.values() for k, v in s.items()}
    opt.found_inf = torch.ones(())
    opt.step()
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    after = {k: v for s in opt.state.values() for k, v in s.items()}
    assert all(torch.equal(state[k], after[k]) for k in state)


def _losses(run):
    return [r["loss"] for r in read_metrics(run / "metrics.jsonl") if "loss" in r]


def test_training_with_muon_lowers_the_loss(prepared, tmp_path):
    train(MODEL, _cfg(max_steps=12), prepared.shard_dir, tmp_path)
    losses = _losses(tmp_path)
    assert losses[-1] < losses[0] - 0.3


def test_a_muon_run_resumes_exactly(prepared, tmp_path, monkeypatch):
    straight, split = tmp_path / "straight", tmp_path / "split"
    train(MODEL, _cfg(), prepared.shard_dir, straight)
    real_clip, calls = step_module.clip_grad_norm, {"n": 0}

    def clip(params, max_norm):  # Ctrl-C during step 3: the run checkpoints step 2
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real_clip(params, max_norm)

    with monkeypatch.context() as m:
        m.setattr(step_module, "clip_grad_norm", clip)
        assert train(MODEL, _cfg(), prepared.shard_dir, split).step == 2
    train(MODEL, _cfg(), prepared.shard_dir, split)
    a = load_file(straight / "checkpoints" / "step_4" / "model.safetensors")
    b = load_file(split / "checkpoints" / "step_4" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert _losses(straight) == _losses(split)


def test_the_schedule_keeps_the_embedding_at_its_multiple_of_lr(prepared, tmp_path, monkeypatch):
    seen = []
    real_step = Muon.step

    def spy(self, *args, **kwargs):
        seen.append([(g.get("muon", False), g["lr"]) for g in self.param_groups])
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(Muon, "step", spy)
    train(MODEL, _cfg(embed_lr=0.3, muon_lr=0.05), prepared.shard_dir, tmp_path)
    assert len(seen) == 4
    for rates in seen:  # Muon's matrices, the head (decayed), the embedding, the gains
        (muon, muon_lr), (_, head), (_, embedding), (_, gains) = rates
        assert muon and head == gains and muon_lr == pytest.approx(5 * head)
        assert embedding == pytest.approx(30 * head)


def test_resuming_with_another_grouping_names_the_setting(prepared, tmp_path):
    train(MODEL, _cfg(max_steps=2), prepared.shard_dir, tmp_path)
    with pytest.raises(
        LmforgeError, match="resume with the train.optimizer.name and train.optimizer.embed_lr"
    ):
        train(MODEL, _cfg(embed_lr=0.3), prepared.shard_dir, tmp_path)


def test_muon_settings_are_checked_when_the_config_loads():
    from lmforge.config import load_config

    assert load_config("tiny", None, ["train.optimizer.name=muon"]).train.optimizer.name == "muon"
    assert load_config("tiny", None, []).train.optimizer.name == "adamw"  # the default stays
    with pytest.raises(
        LmforgeError, match="train.optimizer.name is 'sgd': choose one of adamw, muon"
    ):
        _cfg(optimizer="sgd").validate()
    with pytest.raises(LmforgeError, match="train.optimizer.muon_lr is 0.0: it must be above 0"):
        load_config("tiny", None, ["train.optimizer.muon_lr=0"])
    with pytest.raises(
        LmforgeError, match=r"train.optimizer.muon_momentum is 1.0: it must be in \[0, 1\)"
    ):
        load_config("tiny", None, ["train.optimizer.muon_momentum=1"])
    with pytest.raises(
        LmforgeError, match="train.optimizer.embed_lr is -1.0: it must be at least 0"
    ):
        load_config("tiny", None, ["train.optimizer.embed_lr=-1"])
    with pytest.raises(LmforgeError, match="set train.optimizer.embed_lr=0 .* or untie them"):
        load_config(
            "tiny", None, ["train.optimizer.embed_lr=0.1", "model.tie_embeddings=true"]
        ).validate()
    assert load_config("small", None, []).train.optimizer.embed_lr == 0.1
