"""The MoE layer against slow references written from the formulas, token by token.

Routing, capacity dropping (both policies), the Switch aux loss, the router z-loss and the
auxiliary-loss-free bias; grouped mm against the per-expert loop; shared experts; old ModuleList
checkpoints; the config's validation.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_model, save_file
from torch.utils.checkpoint import checkpoint

from lmforge.errors import LmforgeError
from lmforge.model import ModelConfig, Transformer
from lmforge.model.experts import GroupedExperts, _probe, grouped_mm_available
from lmforge.model.moe import (
    MoE,
    moe_losses,
    moe_metrics,
    update_biases,
)

D, FF, E, K = 16, 32, 4, 2


def moe_model(**overrides) -> Transformer:
    """A tiny MoE Transformer whose blocks take every moe_ option of the config."""
    cfg = ModelConfig(vocab_size=64, d_model=D, n_layers=2, n_heads=2, n_experts=E, d_ff=FF)
    for name, value in overrides.items():
        setattr(cfg, name, value)
    model = Transformer(cfg)
    for layer in model.layers:  # a no-op once Block builds its MoE with MoE.from_config
        layer.mlp = MoE.from_config(cfg)
    return model


def expert_on(moe: MoE, e: int, x: torch.Tensor) -> torch.Tensor:
    ex = moe.experts
    return (F.silu(x @ ex.gate_proj[e].T) * (x @ ex.up_proj[e].T)) @ ex.down_proj[e].T


def reference_routing(moe: MoE, x: torch.Tensor) -> list[list[tuple[int, torch.Tensor, float]]]:
    """Per token: its k (expert, weight, score), best first, from the formulas one token at a
    time; the choice in Python floats, the weight a differentiable 0-d tensor."""
    routes = []
    bias = [0.0] * moe.n_experts if moe.expert_bias is None else moe.expert_bias.tolist()
    for row in x:
        logits = [row @ w for w in moe.router.weight]
        if moe.router_kind == "softmax":
            z = sum(v.exp() for v in logits)
            scores = [v.exp() / z for v in logits]
        else:
            scores = [1 / (1 + (-v).exp()) for v in logits]
        chosen = sorted(range(moe.n_experts), key=lambda e: -(scores[e].item() + bias[e]))
        chosen = chosen[: moe.top_k]
        total = sum(scores[e] for e in chosen) if moe.renormalize else 1.0
        routes.append([(e, scores[e] / total, scores[e].item()) for e in chosen])
    return routes


def reference_forward(moe: MoE, x: torch.Tensor, capacity: int | None) -> torch.Tensor:
    """Each expert takes its rows by the drop policy up to capacity; the rest contribute 0."""
    routes = reference_routing(moe, x)
    rows = [(t, e, w, s) for t, r in enumerate(routes) for e, w, s in r]  # token-major order
    y = torch.zeros_like(x)
    for e in range(moe.n_experts):
        mine = [row for row in rows if row[1] == e]
        if moe.drop_policy == "probability":
            mine.sort(key=lambda row: -row[3])
        for t, _, w, _ in mine[:capacity]:
            y[t] += w * expert_on(moe, e, x[t])
    return y


@pytest.mark.parametrize("router", ["softmax", "sigmoid"])
@pytest.mark.parametrize("renormalize", [True, False])
def test_routing_equals_the_formulas(router, renormalize):
    torch.manual_seed(0)
    moe = MoE(D, FF, 8, 3, router=router, renormalize=renormalize)
    x = torch.randn(10, D)
    r = moe.route(x)
    for t, route in enumerate(reference_routing(moe, x)):
        assert r.experts[t].tolist() == [e for e, _, _ in route]
        torch.testing.assert_close(r.weights[t], torch.stack([w for _, w, _ in route]))
    if renormalize:
        torch.testing.assert_close(r.weights.sum(-1), torch.ones(10))
    if router == "softmax" and renormalize:  # Mixtral's order: the softmax of the k logits
        torch.testing.assert_close(r.weights, r.logits.gather(1, r.experts).softmax(-1))
    assert r.logits.dtype == r.weights.dtype == torch.float32


@pytest.mark.parametrize("grouped", [False, True])
def test_dropless_forward_and_backward_equal_the_reference(grouped):
    torch.manual_seed(1)
    moe = MoE(D, FF, E, K)
    moe.experts.use_grouped_mm = grouped
    x = torch.randn(3, 8, D, requires_grad=True)
    y = moe(x)
    ref = reference_forward(moe, x.reshape(-1, D), None).reshape(x.shape)
    torch.testing.assert_close(y, ref)
    (g,) = torch.autograd.grad(y.square().sum(), x)
    (g_ref,) = torch.autograd.grad(ref.square().sum(), x)
    torch.testing.assert_close(g, g_ref)
    assert int(moe.last_counts.sum()) == 24 * K and moe.last_dropped == 0.0


@pytest.mark.parametrize("policy", ["probability", "position"])
def test_capacity_drops_rows_by_policy_as_the_reference(policy):
    torch.manual_seed(2)
    moe = MoE(D, FF, E, K, capacity_factor=0.5, drop_policy=policy).train()
    x = torch.randn(24, D)
    capacity = math.ceil(0.5 * 24 * K / E)
    assert moe.capacity(24) == capacity == 6
    y = moe(x)
    ref = reference_forward(moe, x, capacity)
    torch.testing.assert_close(y, ref)
    kept = sum(min(c, capacity) for c in moe.last_counts.tolist())
    assert moe.last_dropped == pytest.approx(1 - kept / (24 * K)) and moe.last_dropped > 0.3
    fully_dropped = (ref == 0).all(-1)
    assert fully_dropped.any() and (y[fully_dropped] == 0).all()  # the residual carries them
    other = "position" if policy == "probability" else "probability"
    moe.drop_policy = other
    assert not torch.allclose(y, moe(x))  # the policies keep different rows here
    moe.eval()  # capacity is for training: inference is dropless
    torch.testing.assert_close(moe(x), reference_forward(moe, x, None))


@pytest.mark.parametrize("router", ["softmax", "sigmoid"])
def test_aux_and_z_losses_equal_the_formulas(router):
    torch.manual_seed(3)
    moe = MoE(D, FF, E, K, router=router)
    x = torch.randn(12, D)
    moe(x)
    routes = reference_routing(moe, x)
    logits = (x.double() @ moe.router.weight.double().T).tolist()
    f = [sum(e == c for r in routes for c, _, _ in r) / (12 * K) for e in range(E)]
    probs = []
    for row in logits:
        s = (
            [math.exp(v) for v in row]
            if router == "softmax"
            else [1 / (1 + math.exp(-v)) for v in row]
        )
        probs.append([v / sum(s) for v in s])
    p = [sum(row[e] for row in probs) / 12 for e in range(E)]
    aux = E * sum(fe * pe for fe, pe in zip(f, p, strict=True))
    z = sum(math.log(sum(math.exp(v) for v in row)) ** 2 for row in logits) / 12
    assert moe.last_aux_loss.item() == pytest.approx(aux, rel=1e-5)
    assert moe.last_z_loss.item() == pytest.approx(z, rel=1e-5)


def test_moe_losses_weight_every_block_and_reach_the_router():
    torch.manual_seed(4)
    model = moe_model(moe_aux_loss_coef=0.01, moe_z_loss_coef=0.001)
    model(torch.randint(0, 64, (2, 8)))
    layers = [layer.mlp for layer in model.layers]
    loss = moe_losses(model)
    expected = sum(0.01 * m.last_aux_loss + 0.001 * m.last_z_loss for m in layers)
    torch.testing.assert_close(loss, expected)
    loss.backward()
    assert all(m.router.weight.grad.abs().sum() > 0 for m in layers)
    dense = Transformer(ModelConfig(vocab_size=64, d_model=D, n_layers=1, n_heads=2))
    assert torch.equal(moe_losses(dense), torch.zeros(())) and moe_metrics(dense) == {}


def test_moe_metrics_sum_the_blocks():
    torch.manual_seed(5)
    model = moe_model(moe_capacity_factor=1.0, moe_bias_update_rate=0.1).train()
    model(torch.randint(0, 64, (2, 8)))
    layers = [layer.mlp for layer in model.layers]
    metrics = moe_metrics(model)
    assert metrics["moe/counts"] == sum(m.last_counts for m in layers).tolist()
    assert sum(metrics["moe/counts"]) == 2 * 16 * K
    assert metrics["moe/dropped"] == pytest.approx(sum(m.last_dropped for m in layers) / 2)
    assert metrics["moe/aux_loss"] == pytest.approx(sum(m.last_aux_loss.item() for m in layers) / 2)
    assert metrics["moe/bias_drift"] == 0.0
    update_biases(model)
    assert moe_metrics(model)["moe/bias_drift"] == pytest.approx(0.1)


def test_the_balance_bias_drives_a_skewed_router_toward_balance():
    torch.manual_seed(6)
    moe = MoE(D, FF, E, K, bias_update_rate=0.02).train()
    u = F.normalize(torch.randn(D), dim=0)
    x = torch.randn(64, D) + 2 * u
    with torch.no_grad():
        moe.router.weight[0] += 1.5 * u  # expert 0 is in almost every token's top 2
    seen = []

    def reduce(counts):  # what the trainer's all-reduce sees: all blocks at once
        seen.append(counts.shape)
        return counts

    ratios = []
    with torch.no_grad():
        for _ in range(40):
            moe(x)
            counts = moe.last_counts.float()
            ratios.append((counts.max() / counts.mean()).item())
            update_biases(moe, reduce)
    assert seen[0] == (1, E)
    assert ratios[0] > 1.7 and max(ratios[-10:]) < 1.3  # max / mean count
    r = moe.route(x)  # the bias only chooses: the weights are still the scores
    chosen = r.scores.gather(1, r.experts)
    torch.testing.assert_close(r.weights, chosen / chosen.sum(-1, keepdim=True))
    assert moe.expert_bias[0] < 0 and int(moe.pending_counts.sum()) == 0
    moe.eval()
    moe(x)
    assert int(moe.pending_counts.sum()) == 0  # evaluation forwards do not move the bias


def test_update_bias_formula_and_mirror():
    moe = MoE(D, FF, E, K, bias_update_rate=0.5)
    moe.update_bias(torch.tensor([10, 2, 4, 4]))  # mean 5
    torch.testing.assert_close(moe.expert_bias, torch.tensor([-0.5, 0.5, 0.5, 0.5]))
    master = MoE(D, FF, E, K, bias_update_rate=0.5)
    moe.pending_counts.copy_(torch.tensor([1, 1, 1, 5]))
    update_biases(moe, mirror=master)
    torch.testing.assert_close(master.expert_bias, torch.tensor([0.0, 1.0, 1.0, 0.0]))
    with pytest.raises(LmforgeError, match="moe_bias_update_rate"):
        MoE(D, FF, E, K).update_bias(torch.ones(E))


def test_activation_checkpointing_recomputes_without_counting_twice():
    torch.manual_seed(7)
    moe = MoE(D, FF, E, K, bias_update_rate=0.01, aux_loss_coef=0.1).train()
    x = torch.randn(2, 8, D, requires_grad=True)
    y = checkpoint(moe, x, use_reentrant=False)
    (y.square().sum() + moe_losses(moe)).backward()
    assert torch.equal(moe.pending_counts, moe.last_counts)
    grads = [p.grad.clone() for p in moe.parameters()]
    moe.zero_grad()
    (moe(x).square().sum() + moe_losses(moe)).backward()
    for a, p in zip(grads, moe.parameters(), strict=True):
        torch.testing.assert_close(a, p.grad)


def test_grouped_mm_equals_loop_outputs_and_gradients():
    assert grouped_mm_available()  # torch 2.13 has it on CPU; the loop is the fallback
    torch.manual_seed(8)
    experts = GroupedExperts(4, D, FF)
    x = torch.randn(20, D)
    counts = [7, 0, 9, 4]  # an empty expert included
    results = []
    for use in (True, False):
        experts.use_grouped_mm = use
        xi = x.clone().requires_grad_(True)
        y = experts(xi, torch.tensor(counts) if use else counts)
        y.sum().backward()  # an expanded (non-contiguous) upstream gradient
        results.append((y.detach(), xi.grad, [p.grad.clone() for p in experts.parameters()]))
        experts.zero_grad()
    (y1, gx1, gp1), (y2, gx2, gp2) = results
    torch.testing.assert_close(y1, y2, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gx1, gx2, atol=1e-5, rtol=1e-5)
    for a, b in zip(gp1, gp2, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_grouped_and_loop_moe_agree_with_every_option():
    torch.manual_seed(9)
    options = dict(router="sigmoid", capacity_factor=0.75, shared_experts=1, bias_update_rate=0.1)
    moe = MoE(D, FF, E, K, **options).train()
    x = torch.randn(2, 12, D)
    results = []
    for use in (True, False):
        moe.experts.use_grouped_mm = use
        xi = x.clone().requires_grad_(True)
        y = moe(xi)
        (y * torch.linspace(-1, 1, D)).sum().backward()
        results.append((y.detach(), xi.grad, [p.grad.clone() for p in moe.parameters()]))
        moe.zero_grad()
    (y1, gx1, gp1), (y2, gx2, gp2) = results
    for a, b in zip([y1, gx1, *gp1], [y2, gx2, *gp2], strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_shared_experts_add_an_always_on_swiglu_of_n_times_the_width():
    torch.manual_seed(10)
    moe = MoE(D, FF, E, K, shared_experts=2)
    assert moe.shared_experts.gate_proj.weight.shape == (2 * FF, D)
    x = torch.randn(6, D)
    routed = reference_forward(moe, x, None)
    s = moe.shared_experts
    halves = [
        (F.silu(x @ s.gate_proj.weight[i].T) * (x @ s.up_proj.weight[i].T))
        @ s.down_proj.weight[:, i].T
        for i in (slice(0, FF), slice(FF, 2 * FF))
    ]
    torch.testing.assert_close(moe(x), routed + halves[0] + halves[1])


def test_transformer_builds_stacked_experts_and_fine_grained_widths():
    model = moe_model(moe_expert_d_ff=16, moe_shared_experts=1)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    assert shapes["layers.1.mlp.router.weight"] == (E, D)
    assert shapes["layers.0.mlp.experts.gate_proj"] == (E, 16, D)
    assert shapes["layers.0.mlp.experts.down_proj"] == (E, D, 16)
    assert shapes["layers.0.mlp.shared_experts.up_proj.weight"] == (16, D)
    assert model(torch.randint(0, 64, (2, 8))).shape == (2, 8, 64)
    plain = Transformer(ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_experts=4))
    idle = 2 * (4 - 2) * 3 * 32 * plain.config.ffn_dim
    dense_n = plain.num_params(exclude_embeddings=True) - idle
    assert plain.flops_per_token(8) == 6 * dense_n + 12 * 2 * 32 * 8


def test_old_module_list_checkpoints_load_into_stacked_experts(tmp_path):
    torch.manual_seed(11)
    model = moe_model()
    old = {}
    for name, t in model.state_dict().items():
        head, _, proj = name.rpartition(".")
        if head.endswith("mlp.experts"):
            old.update({f"{head}.{e}.{proj}.weight": t[e].clone() for e in range(E)})
        else:
            old[name] = t.clone()
    assert "layers.1.mlp.experts.3.down_proj.weight" in old
    fresh = moe_model()
    fresh.load_state_dict(old)
    again = moe_model()
    save_file(old, tmp_path / "old.safetensors")
    load_model(again, tmp_path / "old.safetensors")  # how lmforge reads checkpoints
    for loaded in (fresh, again):
        for name, t in model.state_dict().items():
            assert torch.equal(loaded.state_dict()[name], t), name


def test_sharded_experts_compute_their_slice():
    torch.manual_seed(12)
    full = GroupedExperts(E, D, FF)
    local = GroupedExperts(E, D, FF)
    for name, param in full.named_parameters():  # experts 2 and 3, as an ep rank holds them
        setattr(local, name, torch.nn.Parameter(param.detach()[2:].clone()))
    x = torch.randn(9, D)
    torch.testing.assert_close(local(x, [4, 5]), full(x, [0, 0, 4, 5]))


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("moe_router", "relu", "moe_router is 'relu': set it to one of softmax, sigmoid"),
        ("moe_drop_policy", "random", "moe_drop_policy is 'random'"),
        ("moe_capacity_factor", 0.0, "moe_capacity_factor is 0.0: set it above 0"),
        ("moe_aux_loss_coef", -1.0, "moe_aux_loss_coef is -1.0: set it to 0 or above"),
        ("moe_z_loss_coef", float("nan"), "moe_z_loss_coef is nan"),
        ("moe_bias_update_rate", -0.1, "moe_bias_update_rate is -0.1"),
        ("moe_shared_experts", -1, "moe_shared_experts is -1"),
        ("moe_expert_d_ff", 0, "moe_expert_d_ff is 0: set it to a positive integer"),
        ("moe_renormalize", "yes", "moe_renormalize is 'yes': set it to true or false"),
    ],
)
def test_bad_moe_options_are_one_line_errors(field, value, message):
    cfg = ModelConfig(n_experts=4)
    setattr(cfg, field, value)
    with pytest.raises(LmforgeError, match=message.replace("(", r"\(")) as info:
        cfg.validate()
    assert "\n" not in str(info.value)


def test_moe_options_on_a_dense_model_are_refused():
    with pytest.raises(LmforgeError, match="model.moe_shared_experts is set but model.n_experts=0"):
        ModelConfig(moe_shared_experts=1).validate()
    ModelConfig(n_experts=8, moe_router="sigmoid", moe_capacity_factor=1.25).validate()


def test_the_grouped_mm_probe_ignores_the_callers_autograd_mode():
    _probe.cache_clear()
    with torch.inference_mode():  # as generation would call it first
        assert grouped_mm_available()
