"""Activation-aware weight quantization (AWQ, Lin et al. 2023): per-input-channel scales searched
on calibration activations and folded into the model exactly, plus a per-group clipping search.

Channels that carry large activations matter most to a Linear's output; scaling their weight
columns up by s (and the op before them down by s) lets the quantization grid resolve them
better. The fp32 model computes the same function after folding; only quantization sees a
difference. The model is changed in place; quantize its Linears (RTN) afterwards.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from lmforge.errors import LmforgeError
from lmforge.model.attention import Attention
from lmforge.model.layers import Linear
from lmforge.model.transformer import Transformer
from lmforge.quant.calibration import block_passes, check_inputs
from lmforge.quant.schemes import fake_quantize

CLIP_RATIOS = tuple(1.0 - 0.05 * i for i in range(11))  # 1.0 down to 0.5


def apply_awq(
    model: Transformer,
    calibration: torch.Tensor,
    scheme: str,
    group_size: int | None,
    grid: int = 20,
    clip: bool = True,
    max_tokens: int = 4096,
) -> dict:
    """Search and fold AWQ scales (and, for int4, clip ranges) into model's blocks, in place.

    Groups of Linears sharing an input: q/k/v (folded into attn_norm), o_proj (into v_proj's
    rows, one scale per key/value channel shared by the query heads that read it), gate/up (into
    mlp_norm) and down_proj (into up_proj's rows). MoE MLPs are skipped and stay RTN. Returns
    {group: {"alpha", "error_rtn", "error_awq"}} with errors ‖Q(W)x − Wx‖² on the calibration
    tokens, and "skipped": the groups left alone. The search sees every k-th calibration token,
    k chosen so that at most about max_tokens are kept per Linear.
    """
    if grid < 1:
        raise LmforgeError(f"AWQ grid={grid} must be at least 1: pass a positive grid size")
    check_inputs(model, calibration, scheme, group_size)
    stride = max(1, -(-calibration.numel() // max_tokens))
    stats: dict = {"skipped": []}
    for i, block, run in block_passes(model, calibration):
        kept: dict[str, list[torch.Tensor]] = {}
        run(lambda name, x, kept=kept: kept.setdefault(name, []).append(x[::stride]))
        inputs = {name: torch.cat(xs) for name, xs in kept.items()}
        attn = block.attn
        groups = [
            (
                "attn.qkv",
                [attn.q_proj, attn.k_proj, attn.v_proj],
                inputs["attn.q_proj"],
                lambda s, b=block: _scale_rows(b.attn_norm.weight, s),
            ),
            (
                "attn.o_proj",
                [attn.o_proj],
                inputs["attn.o_proj"],
                lambda s, a=attn: _scale_rows(a.v_proj.weight, _per_kv(s, a)),
            ),
        ]
        if "mlp.gate_proj" in inputs:
            mlp = block.mlp
            groups += [
                (
                    "mlp.gate_up",
                    [mlp.gate_proj, mlp.up_proj],
                    inputs["mlp.gate_proj"],
                    lambda s, b=block: _scale_rows(b.mlp_norm.weight, s),
                ),
                (
                    "mlp.down_proj",
                    [mlp.down_proj],
                    inputs["mlp.down_proj"],
                    lambda s, m=mlp: _scale_rows(m.up_proj.weight, s),
                ),
            ]
        else:
            stats["skipped"].append(f"layers.{i}.mlp (mixture of experts: stays RTN)")
        for name, linears, x, fold_into in groups:
            tie = (lambda m, a=attn: _tie_kv(m, a)) if name == "attn.o_proj" else None
            alpha, before, after, s = _search_scale(linears, x, scheme, group_size, grid, tie)
            fold_into(1.0 / s)
            for linear in linears:
                _scale_columns(linear, s)
            if clip and scheme == "int4":
                for linear in linears:
                    _clip(linear, x / s, group_size)
            stats[f"layers.{i}.{name}"] = {"alpha": alpha, "error_rtn": before, "error_awq": after}
        run()
    return stats


def _search_scale(
    linears: list[Linear],
    x: torch.Tensor,
    scheme: str,
    group_size: int,
    grid: int,
    tie: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[float, float, float, torch.Tensor]:
    """(best α, error at α=0 i.e. RTN, best error, scales) over α in {0, 1/grid, .., 1}."""
    w = torch.cat([lin.weight.detach().float() for lin in linears])
    ref = x @ w.T
    mean_abs = x.abs().mean(dim=0).clamp(min=1e-8)
    if tie is not None:
        mean_abs = tie(mean_abs)
    best = (0.0, float("inf"), torch.ones_like(mean_abs))
    rtn = float("inf")
    for k in range(grid + 1):
        alpha = k / grid
        s = mean_abs.pow(alpha)
        s = s / (s.max() * s.min()).sqrt()
        q = fake_quantize(w * s, scheme, group_size) / s
        err = (x @ q.T - ref).pow(2).sum().item()
        if k == 0:
            rtn = err
        if err < best[1]:
            best = (alpha, err, s)
    return best[0], rtn, best[1], best[2]


def _tie_kv(mean_abs: torch.Tensor, attn: Attention) -> torch.Tensor:
    """With grouped-query attention the query heads reading one value head see the same value
    channels, so they must share one scale: their mean |x|, repeated over the group."""
    rep = attn.n_heads // attn.n_kv_heads
    m = mean_abs.view(attn.n_kv_heads, rep, attn.head_dim).mean(dim=1, keepdim=True)
    return m.expand(-1, rep, -1).reshape(-1)


def _per_kv(s: torch.Tensor, attn: Attention) -> torch.Tensor:
    """Scales over o_proj's input channels (n_heads · head_dim) as scales of v_proj's rows."""
    rep = attn.n_heads // attn.n_kv_heads
    return s.view(attn.n_kv_heads, rep, attn.head_dim)[:, 0].reshape(-1)


def _scale_rows(param: torch.Tensor, s: torch.Tensor) -> None:
    with torch.no_grad():
        shape = (-1,) + (1,) * (param.dim() - 1)
        param.copy_((param.float() * s.view(shape)).to(param.dtype))


def _scale_columns(linear: Linear, s: torch.Tensor) -> None:
    with torch.no_grad():
        w = linear.weight
        w.copy_((w.float() * s).to(w.dtype))


def _clip(linear: Linear, x: torch.Tensor, group_size: int, rows: int = 256) -> None:
    """Shrink each int4 group's [min, max] range by the ratio (1.0 .. 0.5) that minimises that
    group's output error on x, in place: RTN of the clipped weight is the AWQ-clipped result.
    Output rows go `rows` at a time to bound the (rows, groups, tokens) error tensor."""
    w = linear.weight.detach().float()
    out, cols = w.shape
    g = cols // group_size
    xg = x.view(-1, g, group_size)
    clipped = torch.empty_like(w)
    for r0 in range(0, out, rows):
        wg = w[r0 : r0 + rows].view(-1, g, group_size)
        lo, hi = wg.amin(dim=-1, keepdim=True), wg.amax(dim=-1, keepdim=True)
        best_err = torch.full(wg.shape[:2], float("inf"), device=w.device)
        best_w = wg.clone()
        for r in CLIP_RATIOS:
            wc = torch.maximum(torch.minimum(wg, hi * r), lo * r)
            q = fake_quantize(wc.reshape(len(wg), cols), "int4", group_size).view_as(wg)
            err = torch.einsum("ngk,ogk->ogn", xg, q - wg).pow(2).sum(dim=-1)
            better = err < best_err
            best_err = torch.where(better, err, best_err)
            best_w = torch.where(better[..., None], wc, best_w)
        clipped[r0 : r0 + rows] = best_w.reshape(-1, cols)
    with torch.no_grad():
        linear.weight.copy_(clipped.to(linear.weight.dtype))
