import itertools
import math

import pytest
import torch
from torch import nn

from lmforge.model import ModelConfig, Transformer
from lmforge.train import AdamW, clip_grad_norm, lr_at, param_groups


def _quadratic_problem(seed):
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(5, 3, generator=g)
    return [torch.randn(5, 3, generator=g), torch.randn(3, generator=g)], target


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_adamw_matches_torch_reference(weight_decay):
    ours, target = _quadratic_problem(0)
    ref = [p.clone() for p in ours]
    ours = [nn.Parameter(p) for p in ours]
    ref = [nn.Parameter(p) for p in ref]
    kwargs = dict(lr=0.05, betas=(0.9, 0.95), eps=1e-8, weight_decay=weight_decay)
    opt, ref_opt = AdamW(ours, **kwargs), torch.optim.AdamW(ref, **kwargs)
    for _ in range(25):
        for params, o in ((ours, opt), (ref, ref_opt)):
            loss = ((params[0] - target) ** 2).sum() + (params[1] ** 3).sum()
            o.zero_grad()
            loss.backward()
            o.step()
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_adamw_state_dict_round_trip_continues_identically():
    params, target = _quadratic_problem(1)
    a = [nn.Parameter(p.clone()) for p in params]
    b = [nn.Parameter(p.clone()) for p in params]
    opt_a = AdamW(a, lr=0.1)
    opt_b = AdamW(b, lr=0.1)

    def step(params, opt):
        opt.zero_grad()
        ((params[0] - target) ** 2).sum().backward()
        opt.step()

    for _ in range(3):
        step(a, opt_a)
        step(b, opt_b)
    opt_b2 = AdamW(b, lr=0.1)
    opt_b2.load_state_dict(opt_b.state_dict())
    step(a, opt_a)
    step(b, opt_b2)
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=0)


def test_param_groups_decay_matrices_but_not_gains_or_embeddings():
    model = Transformer(ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=2))
    decay, no_decay = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    ids = {id(p) for p in decay["params"]}
    assert id(model.output.weight) in ids and id(model.layers[0].attn.q_proj.weight) in ids
    assert id(model.tok_embeddings.weight) not in ids
    assert id(model.norm.weight) not in ids
    total = len(decay["params"]) + len(no_decay["params"])
    assert total == len(list(model.parameters()))


@pytest.mark.parametrize("embed_lr", [0.0, 3e-3])
def test_the_embedding_shares_the_no_decay_group_without_its_own_rate(embed_lr):
    model = Transformer(ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=2))
    assert len(param_groups(model, 0.1, lr=3e-3, embed_lr=embed_lr)) == 2  # 0 or lr: no split


def test_an_embedding_rate_gives_the_embedding_a_group_of_its_own():
    model = Transformer(ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=2))
    decay, embedding, no_decay = param_groups(model, 0.1, lr=3e-3, embed_lr=0.1)
    assert embedding["params"] == [model.tok_embeddings.weight]
    assert embedding["weight_decay"] == 0.0 and embedding["lr"] == 0.1
    assert embedding["lr_scale"] == pytest.approx(0.1 / 3e-3)
    assert id(model.output.weight) in {id(p) for p in decay["params"]}
    assert id(model.norm.weight) in {id(p) for p in no_decay["params"]}
    groups = (decay, embedding, no_decay)
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))


def test_schedule_warmup_peak_cosine_floor():
    kw = dict(max_lr=1.0, min_lr=0.1, warmup_steps=10, total_steps=110)
    assert lr_at(0, **kw) == pytest.approx(0.1)
    assert lr_at(9, **kw) == pytest.approx(1.0)
    assert lr_at(10, **kw) == pytest.approx(1.0)
    assert lr_at(60, **kw) == pytest.approx(0.55)  # halfway down the cosine
    assert lr_at(110, **kw) == pytest.approx(0.1)
    assert lr_at(500, **kw) == pytest.approx(0.1)
    after_warmup = [lr_at(s, **kw) for s in range(10, 111)]
    assert all(a >= b for a, b in itertools.pairwise(after_warmup))
    expected = 0.1 + 0.45 * (1 + math.cos(math.pi * 25 / 100))
    assert lr_at(35, **kw) == pytest.approx(expected)


def test_clip_grad_norm_matches_torch():
    torch.manual_seed(0)
    a = [nn.Parameter(torch.randn(4, 4)) for _ in range(3)]
    b = [nn.Parameter(p.detach().clone()) for p in a]
    for pa, pb in zip(a, b, strict=True):
        g = torch.randn_like(pa) * 3
        pa.grad, pb.grad = g.clone(), g.clone()
    ours = clip_grad_norm(a, 1.0)
    ref = torch.nn.utils.clip_grad_norm_(b, 1.0)
    torch.testing.assert_close(ours, ref)
    for pa, pb in zip(a, b, strict=True):
        torch.testing.assert_close(pa.grad, pb.grad)
    new_norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in a]))
    assert new_norm == pytest.approx(1.0, rel=1e-4)


def test_clip_leaves_small_gradients_alone():
    p = nn.Parameter(torch.zeros(3))
    p.grad = torch.tensor([0.1, 0.2, 0.2])
    norm = clip_grad_norm([p], 1.0)
    assert float(norm) == pytest.approx(0.3)
    assert torch.equal(p.grad, torch.tensor([0.1, 0.2, 0.2]))


@pytest.mark.parametrize("fused", [False, True], ids=["lmforge", "torch-fused"])
def test_found_inf_skips_the_step_on_the_device(fused):
    from lmforge.train.optimizers import build_optimizer

    model = nn.Linear(4, 3)
    opt = build_optimizer(model, lr=0.1, betas=(0.9, 0.95), weight_decay=0.1, fused=fused)
    assert isinstance(opt, torch.optim.AdamW) == fused
    model(torch.randn(2, 4)).sum().backward()
    opt.found_inf = torch.zeros(())
    opt.step()
    before = [p.detach().clone() for p in model.parameters()]
    state = [{k: v.clone() for k, v in opt.state[p].items()} for p in model.parameters()]
    for p in model.parameters():
        p.grad = torch.full_like(p, float("nan"))
    opt.found_inf = torch.ones(())
    opt.step()
    for p, b, s in zip(model.parameters(), before, state, strict=True):
        assert torch.equal(p, b)
        assert all(torch.equal(v, opt.state[p][k]) for k, v in s.items())
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.found_inf = torch.zeros(())
    opt.step()
    assert not torch.equal(next(model.parameters()), before[0])


@pytest.mark.parametrize("fused", [False, True], ids=["torch-foreach", "torch-fused"])
def test_step_unless_skips_a_bad_step_on_any_optimizer(fused):
    """PyTorch's non-fused AdamW rejects found_inf: step_unless skips on the host instead."""
    from lmforge.train.adamw import skips_on_device, step_unless

    model = nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=fused or None)
    assert skips_on_device(opt) == fused
    before = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = torch.full_like(p, float("nan"))
    step_unless(opt, torch.tensor(True))
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
    assert not hasattr(opt, "found_inf")  # no verdict is left for a later plain step()
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    step_unless(opt, torch.tensor(False))
    assert not torch.equal(model.weight, before[0])


def test_adamw_unscales_under_torch_grad_scaler_like_the_fused_kernel():
    """lmforge's AdamW declares PyTorch's amp protocol, so it must honour grad_scale too: under
    torch.amp.GradScaler it trains like the fused kernel under it, and like itself unscaled
    (eps is large, so a step that ignored the 1024× scale would differ)."""
    kwargs = dict(lr=0.1, eps=0.5)
    models = [nn.Linear(4, 3) for _ in range(3)]
    initial = {k: v.clone() for k, v in models[0].state_dict().items()}
    for model in models[1:]:
        model.load_state_dict(initial)
    opts = [
        AdamW(models[0].parameters(), **kwargs),
        torch.optim.AdamW(models[1].parameters(), fused=True, **kwargs),
        AdamW(models[2].parameters(), **kwargs),
    ]
    x = torch.randn(8, 4)
    for i, (model, opt) in enumerate(zip(models, opts, strict=True)):
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, enabled=i < 2)
        for _ in range(3):
            scaler.scale(model(x).square().mean()).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    for a, b, c in zip(*(m.parameters() for m in models), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-6)
    assert not torch.equal(models[0].weight, initial["weight"])
