"""`lmforge plan`: one request in, the plan's sections out (setup, parameters, FLOPs, memory,
communication, step time, inference), each line with the arithmetic behind it."""

from __future__ import annotations

from dataclasses import dataclass

from lmforge.errors import LmforgeError
from lmforge.plan import flops, inference, memory, params
from lmforge.plan.comm import RING_FACTOR, collective_time, comm_bytes_per_step
from lmforge.plan.explain import Line, Section, human
from lmforge.plan.hardware import Device, Link
from lmforge.plan.inference import WEIGHT_BYTES
from lmforge.plan.layout import Layout
from lmforge.plan.precision import PrecisionBytes
from lmforge.plan.shapes import ModelShape, with_kv_heads

OVERLAPPED = ("fsdp", "dp")  # prefetched / bucketed behind compute; tp, ep on the critical path


@dataclass(frozen=True)
class PlanRequest:
    shape: ModelShape
    device: Device
    gpus: int
    gpus_per_node: int
    intra: Link
    inter: Link
    layout: Layout
    precision: PrecisionBytes
    seq_len: int
    global_batch_tokens: int
    tokens: int
    activation_checkpointing: str = "none"
    tokens_rule: str = ""  # how `tokens` was chosen, when the user did not give it
    precision_rule: str = ""  # how `precision` was chosen, when the user did not give it
    mfu: float = 0.4
    micro_batch: int = 1

    @property
    def grad_accum(self) -> int:
        per_micro_step = self.seq_len * self.micro_batch * self.layout.data_parallel
        return max(1, round(self.global_batch_tokens / per_micro_step))

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.micro_batch * self.layout.data_parallel * self.grad_accum

    @property
    def peak(self) -> float:
        return self.device.peak(self.precision.matmul)

    def link_for(self, span: int) -> Link:
        return self.intra if span <= self.gpus_per_node else self.inter


def check(req: PlanRequest) -> None:
    """Refuse layouts the model or the cluster cannot take, one line each."""
    s, lay = req.shape, req.layout
    if s.n_heads % lay.tp or s.n_kv_heads % lay.tp:
        raise LmforgeError(
            f"tp={lay.tp} does not divide the {s.n_heads} heads and {s.n_kv_heads} KV heads of "
            f"{s.name}: pick a tp dividing {s.n_kv_heads}"
        )
    if req.gpus > req.gpus_per_node and req.gpus % req.gpus_per_node:
        raise LmforgeError(
            f"--gpus {req.gpus} is not a whole number of nodes of --gpus-per-node "
            f"{req.gpus_per_node}: change one of them"
        )
    if not 0 < req.mfu <= 1:
        raise LmforgeError(f"--mfu {req.mfu} must lie in (0, 1], e.g. 0.4")


def build(req: PlanRequest, inference_only: bool = False) -> list[Section]:
    """The plan's sections; `inference_only`: setup, parameters and inference, nothing of
    training."""
    check(req)
    inference_section = (f"Inference on {req.layout.tp} × {req.device.key}", inference_lines(req))
    parameters = ("Parameters", params.lines(req.shape))
    if inference_only:
        return [("Setup", setup_lines(req, training=False)), parameters, inference_section]
    cluster = req.peak * req.gpus
    return [
        ("Setup", setup_lines(req)),
        parameters,
        ("FLOPs", flops.lines(req.shape, req.seq_len, req.tokens, cluster, req.mfu)),
        ("Memory per device (training)", memory_lines(req)),
        ("Communication per step", comm_lines(req)),
        ("Step time", step_lines(req)),
        inference_section,
    ]


def setup_lines(req: PlanRequest, training: bool = True) -> list[Line]:
    nodes = max(1, req.gpus // req.gpus_per_node)
    dp = req.layout.data_parallel
    chosen = f" ({req.precision_rule})" if req.precision_rule else ""
    lines = [
        Line("model", "model", f"{req.shape.name} ({req.shape.family} family)"),
        Line("hardware", "hardware", f"{req.gpus} × {req.device.name}", "", req.device.source),
        Line("nodes", "nodes", f"{nodes} × {min(req.gpus, req.gpus_per_node)} devices", "",
             f"inside a node: {req.intra.name}; across nodes: {req.inter.name}"),
        Line("layout", "parallel layout", req.layout.describe()),
        Line("precision", "precision", f"{req.precision.name}{chosen}", "",
             f"matmuls at the {req.precision.matmul} peak {human(req.peak, 'FLOP/s')} per GPU"),
    ]  # fmt: skip
    if not training:
        return lines
    return [
        *lines,
        Line("tokens", "run tokens" + (" (default: 20 per active parameter)" if req.tokens_rule
             else ""), req.tokens, "tok", req.tokens_rule or "--tokens"),
        Line("tokens_per_step", "tokens per step", req.tokens_per_step, "tok",
             f"seq_len·micro_batch·dp·accum = {req.seq_len}·{req.micro_batch}·{dp}·"
             f"{req.grad_accum}"),
        Line("steps", "steps", -(-req.tokens // req.tokens_per_step), "",
             f"{req.tokens:,} tokens / {req.tokens_per_step:,}"),
    ]  # fmt: skip


def memory_lines(req: PlanRequest) -> list[Line]:
    s, lay, pb = req.shape, req.layout, req.precision
    mb, seq, ac = req.micro_batch, req.seq_len, req.activation_checkpointing
    state = memory.state_bytes(s, lay, pb)
    sp, tp = lay.sp, lay.tp
    per_layer = {
        mode: memory.activation_bytes_per_layer(s, mb, seq, mode, pb.activation, tp=tp, sp=sp)
        for mode in ("none", "selective", "full")
    }
    acts = s.n_layers * per_layer[ac] + memory.head_activation_bytes(s, mb, seq, pb.activation)
    buffers = memory.buffer_bytes(s, lay, pb)
    total = state.total + acts + buffers
    free = req.device.memory_bytes - total
    shard_p, shard_g, shard_os = lay.shards()
    local = f"params/tp ({tp})"
    verdict = (
        f"fits, {human(free, 'B')} to spare"
        if free >= 0
        else f"does not fit, by {human(-free, 'B')}"
    )
    ratio = f"{pb.param}:{pb.grad}:{pb.optimizer} bytes per parameter"
    return [
        Line("params", "parameters (P)", state.params, "B",
             f"{local} · {pb.param} B / {shard_p} shards"),
        Line("grads", "gradients (G)", state.grads, "B",
             f"{local} · {pb.grad} B / {shard_g} shards"),
        Line("optimizer", "optimizer state (OS)", state.optimizer, "B",
             f"{local} · ({pb.master} B master + {pb.adam} B Adam moments) / {shard_os} shards"),
        Line("ratio", "P:G:OS", ratio, "", f"ZeRO shards {shard_p}/{shard_g}/{shard_os}"),
        Line("activations_per_layer_none", "activations per layer, no checkpointing",
             per_layer["none"], "B",
             f"b·s·(2·(8+e)·d + e·(2+2r)·d + MLP + 4·h) with b={mb}, s={seq}, e={pb.activation}"
             f"{', /tp' if tp > 1 else ''}{' (sp: norms too)' if sp else ''}"),
        Line("activations_per_layer_selective", "activations per layer, selective",
             per_layer["selective"], "B", "b·s·(ρ·d + e·(3+2r)·d + e·k·(2f+1)·d + 4·h)"),
        Line("activations_per_layer_full", "activations per layer, full checkpointing",
             per_layer["full"], "B", f"b·s·ρ·d = {mb}·{seq}·{pb.activation}·{s.d_model}"),
        Line("activations", f"activations (checkpointing: {ac})", acts, "B",
             f"L·per layer + final norm and fp32 log-softmax = {s.n_layers}·"
             f"{per_layer[ac]:,.0f} + {acts - s.n_layers * per_layer[ac]:,.0f}"),
        Line("buffers", "communication buffers", buffers, "B",
             "FSDP: 2 gathered blocks + 1 block of gradients; DDP: 2 × 25 MiB buckets"),
        Line("total", "total", total, "B", "P + G + OS + activations + buffers"),
        Line("device", "device memory", req.device.memory_bytes, "B", req.device.name),
        Line("verdict", "verdict", verdict, "", f"{human(req.device.memory_bytes, 'B')} − total"),
    ]  # fmt: skip


def comm_times(req: PlanRequest) -> dict[str, tuple[int, float, Link, int]]:
    """`dim.op` → (bytes, seconds, link, ranks) per step."""
    nbytes = comm_bytes_per_step(
        req.shape,
        req.layout,
        req.micro_batch,
        req.seq_len,
        req.precision.name,
        req.grad_accum,
        req.activation_checkpointing,
    )
    dims = {name: (size, span) for name, size, span in req.layout.dims()}
    out = {}
    for key, b in nbytes.items():
        dim, op = key.split(".")
        size, span = dims[dim]
        link = req.link_for(span)
        out[key] = (b, collective_time(op, b, size, link.effective), link, size)
    return out


def comm_lines(req: PlanRequest) -> list[Line]:
    lines = []
    for key, (b, t, link, n) in comm_times(req).items():
        op = key.split(".")[1]
        factor = RING_FACTOR[op](n)
        lines.append(Line(f"{key}.bytes", f"{key} bytes", b, "B", _comm_formula(req, key, b)))
        lines.append(
            Line(f"{key}.seconds", f"{key} time over {link.key}", t, "s",
                 f"{factor:.3f}·bytes / ({human(link.bandwidth, 'B/s')} · {link.efficiency}), "
                 f"ring of {n}")
        )  # fmt: skip
    return lines or [Line("none", "none", "one device: nothing to communicate")]


def _comm_formula(req: PlanRequest, key: str, nbytes: int) -> str:
    pb, accum = req.precision, req.grad_accum
    if key.startswith("tp."):
        tensor = req.micro_batch * req.seq_len * req.shape.d_model * pb.activation
        recompute = " (+2 recomputed)" if req.activation_checkpointing == "full" else ""
        return (
            f"{nbytes // (tensor * accum)} × b·s·d·{pb.activation} B × {accum} micro-batches: "
            f"per block 2 forward{recompute} + 2 backward, plus the vocabulary-parallel head"
            + (" and the embedding's gradient" if key == "tp.all_gather" else "")
        )
    return {
        "dp.all_reduce": f"gradients held per rank · {pb.grad} B, once per step",
        "dp.reduce_scatter": f"gradients · {pb.grad} B, once per step (ZeRO 1/2)",
        "dp.all_gather": f"updated parameters · {pb.param} B, once per step (ZeRO 1/2)",
        "fsdp.all_gather": f"(params + block params regathered in backward) · {pb.param} B · "
        f"{accum} micro-batches",
        "fsdp.reduce_scatter": f"params · {pb.grad} B · {accum} micro-batches",
        "ep.all_to_all": f"per MoE block and micro-batch: E counts, then b·s·k rows · "
        f"{pb.activation} B out and back, again in backward · {accum} micro-batches",
        "edp.all_reduce": f"the experts an ep rank holds · {pb.grad} B, once per step",
    }[key]


def step_lines(req: PlanRequest) -> list[Line]:
    per_token = flops.training_flops_per_token(req.shape, req.seq_len)
    step_flops = per_token * req.tokens_per_step
    compute = step_flops / (req.gpus * req.peak * req.mfu)
    times = comm_times(req)
    hidden = sum(t for key, (_, t, _, _) in times.items() if key.split(".")[0] in OVERLAPPED)
    critical = sum(t for key, (_, t, _, _) in times.items() if key.split(".")[0] not in OVERLAPPED)
    exposed = max(0.0, hidden - compute) + critical
    step = compute + exposed
    tokens_per_s = req.tokens_per_step / step
    achieved = step_flops / (step * req.gpus * req.peak)
    return [
        Line("compute", "compute per step", compute, "s",
             f"{step_flops:.3e} FLOP / ({req.gpus} GPUs · {human(req.peak, 'FLOP/s')} · "
             f"{req.mfu} MFU)"),
        Line("overlapped_comm", "data-parallel communication", hidden, "s",
             "fsdp/dp collectives, overlapped with compute"),
        Line("exposed_comm", "communication not hidden", exposed, "s",
             f"max(0, {hidden:.3g} − {compute:.3g}) + tp/ep collectives {critical:.3g}"),
        Line("step", "step time", step, "s", "compute + communication not hidden"),
        Line("tokens_per_s", "tokens/s", tokens_per_s, "tok/s",
             f"{req.tokens_per_step:,} / {step:.4g} s"),
        Line("mfu", "MFU estimate", achieved, "%", f"{req.mfu} · compute / step"),
        Line("run_time", "run time", req.tokens / tokens_per_s, "s",
             f"{req.tokens:,} tokens / {tokens_per_s:,.0f} tok/s"),
    ]  # fmt: skip


def inference_lines(req: PlanRequest) -> list[Line]:
    s, n, ctx = req.shape, req.layout.tp, req.seq_len
    peak, bw, mem = req.peak * n, req.device.memory_bandwidth * n, req.device.memory_bytes * n
    kv_token = inference.kv_bytes_per_token(s)
    mha = inference.kv_bytes_per_token(with_kv_heads(s, s.n_heads))
    lines = [
        Line("kv_per_token", "KV cache per token", kv_token, "B",
             f"2·L·kv_heads·head_dim·2 B = 2·{s.n_layers}·{s.n_kv_heads}·{s.head_dim}·2"
             + (f" (GQA; all {s.n_heads} heads: {human(mha, 'B')})" if mha != kv_token else "")),
        Line("kv_per_sequence", f"KV cache per {ctx}-token sequence", kv_token * ctx, "B",
             f"{ctx} · KV per token"),
        Line("prefill", f"prefill of {ctx} tokens", inference.prefill_seconds(s, ctx, 1, peak,
             req.mfu), "s", f"b·s·(2·N + 2·L·d·s) / ({human(peak, 'FLOP/s')} · {req.mfu} MFU)"),
        Line("ridge_point", "ridge point", peak / bw, "FLOP/B",
             f"peak / bandwidth = {human(peak, 'FLOP/s')} / {human(bw, 'B/s')}"),
    ]  # fmt: skip
    for name in dict.fromkeys((req.precision.name, "int8", "int4")):
        lines += _decode_lines(req, name, WEIGHT_BYTES[name], peak, bw, mem, ctx, n)
    return lines


def _decode_lines(
    req: PlanRequest, name: str, wb: float, peak: float, bw: float, mem: float, ctx: int, n: int
) -> list[Line]:
    """Decode with weights of `wb` bytes each, split over `n` tensor-parallel devices."""
    s = req.shape
    batch = inference.max_batch(s, ctx, mem, wb)
    one = inference.decode_step(s, 1, ctx, peak, bw, wb)
    ridge = inference.ridge_batch(s, ctx, peak, bw, wb)
    short = inference.ridge_batch(s, 1, peak, bw, wb)
    weights = params.param_counts(s)["total"] * wb
    lines = [
        Line(f"{name}.weights", f"[{name} weights] weight memory, all {n} devices", weights, "B",
             f"{params.param_counts(s)['total']:,} params · {wb} B"),
        Line(f"{name}.weights_per_device", f"[{name} weights] weight memory per device",
             weights / n, "B", f"all devices / tp = {human(weights, 'B')} / {n}"),
        Line(f"{name}.max_batch", f"[{name} weights] max batch at {ctx} tokens", batch, "",
             f"({human(mem, 'B')} − weights) / KV per sequence"),
        Line(f"{name}.decode_1", f"[{name} weights] decode per token, batch 1", one.seconds, "s",
             f"{one.bound}-bound: max(bytes {one.memory_s:.3g} s, FLOPs {one.compute_s:.3g} s); "
             f"bytes = weights read + KV at {ctx}"),
        Line(f"{name}.tokens_per_s_1", f"[{name} weights] tokens/s, batch 1", 1 / one.seconds,
             "tok/s", "1 / decode time"),
        Line(f"{name}.ridge_batch", f"[{name} weights] batch where decode turns compute-bound",
             f"never at {ctx} tokens; {short or 0:.0f} at short context" if ridge is None
             else round(ridge, 1), "",
             f"b·F/peak = (W + b·KV)/bandwidth; at short context (KV negligible): "
             f"{short or 0:.0f}"),
    ]  # fmt: skip
    if batch:
        full = inference.decode_step(s, batch, ctx, peak, bw, wb)
        lines.append(
            Line(f"{name}.tokens_per_s_max", f"[{name} weights] tokens/s at batch {batch}",
                 batch / full.seconds, "tok/s",
                 f"{full.bound}-bound: {batch} / {full.seconds:.3g} s")
        )  # fmt: skip
    return lines
