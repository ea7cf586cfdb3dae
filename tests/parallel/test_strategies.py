"""Every parallel strategy trains like one process on the same global batch.

One spawned group of 2 gloo processes runs all strategies in turn (start-up paid once); the
reference runs train in this process. Each layout trains with `train.optimizer.fused_adamw` on and
off (PyTorch's fused AdamW, or lmforge's), against one process with the same optimizer. Tolerances:
fp32 strategies match the single-process loss to 1e-4 (metrics keep 5 decimals) and the final
weights to rtol 1e-4 / atol 1e-5, but for at most 0.1 % of a tensor's elements, which Adam may move
by up to 2·lr per step (see `Launcher.assert_same_weights`); only the order of floating-point sums
differs.
FSDP's bf16 policy (bf16 weights in the forward, where the reference autocasts fp32 weights) matches
the loss to 2e-3; its weights differ from the reference as much as bf16 autocast's differ from fp32:
mean |Δ| ≤ 2e-4 and max |Δ| ≤ 2e-2 per tensor.
"""

import shutil

import pytest
import torch
from safetensors.torch import load_file

from lmforge.errors import LmforgeError
from lmforge.train.checkpoint import load_checkpoint
from lmforge.train.checkpoint_dcp import export_safetensors
from lmforge.train.metrics import read_metrics
from tests.parallel.conftest import MUON

STRATEGIES = {  # name: (train.* of the 2-process run, reference, tolerance)
    "ddp": ({"parallel": "dp=2"}, "fp32", "fp32"),
    "ddp_accumulation": ({"parallel": "dp=2", "grad_accum_steps": 2}, "accum", "fp32"),
    "zero1": ({"parallel": "dp=2", "zero1": True}, "fp32", "fp32"),
    "fsdp": ({"parallel": "fsdp=2"}, "fp32", "fp32"),
    "fsdp_bf16_zero2": (
        {"parallel": "fsdp=2", "precision": "bf16", "reshard_after_forward": False},
        "bf16",
        "bf16",
    ),
    "tp": ({"parallel": "tp=2", "sequence_parallel": False}, "fp32", "fp32"),
    "tp_sp": ({"parallel": "tp=2", "sequence_parallel": True}, "fp32", "fp32"),
}
# Each layout again with lmforge's AdamW instead of PyTorch's fused kernel, against one process
# with the same optimizer.
STRATEGIES.update(
    {
        f"{name}_unfused": ({**STRATEGIES[name][0], "fused_adamw": False}, "unfused", "fp32")
        for name in ("ddp", "zero1", "fsdp", "tp")
    }
)
# DDP, ZeRO-1 and FSDP again with Muon for the blocks' matrices (FSDP gathers a matrix's shards
# to orthogonalise it), against one process with Muon; "resharded_muon" below covers TP.
STRATEGIES.update(
    {
        f"{name}_muon": ({**STRATEGIES[name][0], **MUON}, "muon", "fp32")
        for name in ("ddp", "zero1", "fsdp")
    }
)


@pytest.fixture(scope="module")
def group(launcher, tmp_path_factory):
    """All 2-process runs, in one group: the strategies, then a checkpoint at fsdp=2 (2 steps)
    resumed at tp=2 (to 4 steps), with fused AdamW, lmforge's and Muon, and a ZeRO-1
    checkpoint resumed at the same layout."""
    root = tmp_path_factory.mktemp("group2")
    base = launcher.train
    runs = [
        {"out": str(root / name), "train": {**base, **t}} for name, (t, _, _) in STRATEGIES.items()
    ]
    half = {"parallel": "fsdp=2", "max_steps": 2}
    runs.append({"out": str(root / "resharded"), "train": {**base, **half}})
    runs.append({"out": str(root / "resharded"), "train": {**base, "parallel": "tp=2"}})
    unfused = {**base, "fused_adamw": False}
    runs.append({"out": str(root / "resharded_unfused"), "train": {**unfused, **half}})
    runs.append({"out": str(root / "resharded_unfused"), "train": {**unfused, "parallel": "tp=2"}})
    muon = {**base, **MUON}
    runs.append({"out": str(root / "resharded_muon"), "train": {**muon, **half}})
    runs.append({"out": str(root / "resharded_muon"), "train": {**muon, "parallel": "tp=2"}})
    zero1 = {**base, "parallel": "dp=2", "zero1": True}
    runs.append({"out": str(root / "zero1_resumed"), "train": {**zero1, "max_steps": 2}})
    runs.append({"out": str(root / "zero1_resumed"), "train": zero1})
    codes, outputs = launcher.spawn(2, runs, root)
    assert codes == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    return root


@pytest.mark.parametrize("name", STRATEGIES)
def test_strategy_matches_single_process(name, group, references, launcher):
    _, reference, tolerance = STRATEGIES[name]
    got, want = launcher.losses(group / name), launcher.losses(references / reference)
    assert len(got) == launcher.train["max_steps"]
    assert got == pytest.approx(want, abs=1e-4 if tolerance == "fp32" else 2e-3)
    got, want = launcher.weights(group / name), launcher.weights(references / reference)
    if tolerance == "fp32":
        launcher.assert_same_weights(got, want)
        return
    for key, value in got.items():
        difference = (value - want[key]).abs()
        assert difference.mean() <= 2e-4 and difference.max() <= 2e-2, key


def test_communication_is_logged_per_strategy(group, launcher):
    n_bytes = 4 * sum(w.numel() for w in launcher.weights(group / "ddp").values())  # fp32 gradients
    by_strategy = {
        name: [r for r in read_metrics(group / name / "metrics.jsonl") if "loss" in r][-1]
        for name in ("ddp", "fsdp", "tp", "tp_sp")
    }
    ddp, fsdp, tp, tp_sp = by_strategy.values()
    assert ddp["comm/all_reduce"] >= n_bytes  # every gradient, once
    assert fsdp["comm/reduce_scatter"] >= n_bytes and fsdp["comm/all_gather"] >= n_bytes
    assert "comm/reduce_scatter" not in tp and tp["comm/all_reduce"] > 0
    assert tp_sp["comm/reduce_scatter"] > 0 and tp_sp["comm/all_gather"] > 0
    assert all(r["comm_bytes_per_step"] > 0 for r in by_strategy.values())


RESUMED = {
    "resharded": "fp32_extended",
    "resharded_unfused": "unfused_extended",
    "resharded_muon": "muon_extended",
    "zero1_resumed": "fp32_extended",
}


@pytest.mark.parametrize("name", RESUMED)
def test_checkpoint_resumed_continues_the_run(name, group, references, launcher):
    """fsdp=2 → tp=2 (resharded by DCP; lmforge's AdamW state and Muon's as well as
    PyTorch's), and ZeRO-1's per-rank optimizer state at dp=2: a 2-step run extended to 4
    steps."""
    reference = references / RESUMED[name]
    assert launcher.losses(group / name) == pytest.approx(launcher.losses(reference), abs=1e-4)
    launcher.assert_same_weights(launcher.weights(group / name), launcher.weights(reference))


def test_checkpoint_from_fsdp_resumes_in_one_process(group, references, launcher, tmp_path):
    step_2 = tmp_path / "checkpoints" / "step_2"
    shutil.copytree(group / "resharded" / "checkpoints" / "step_2", step_2)
    (step_2 / "model.safetensors").unlink()  # only the run's last checkpoint has one anyway
    shutil.copy(group / "resharded" / "metrics.jsonl", tmp_path / "metrics.jsonl")
    launcher.single(tmp_path)
    reference = references / "fp32_extended"
    assert launcher.losses(tmp_path) == pytest.approx(launcher.losses(reference), abs=1e-4)
    launcher.assert_same_weights(launcher.weights(tmp_path), launcher.weights(reference))


def test_distributed_checkpoint_loads_for_inference(group, tmp_path):
    step_2 = tmp_path / "step_2"
    shutil.copytree(group / "resharded" / "checkpoints" / "step_2", step_2)
    exported = load_file(step_2 / "model.safetensors")
    (step_2 / "model.safetensors").unlink()
    model, tokenizer = load_checkpoint(step_2)  # gathers the shards, no process group
    for key, value in model.state_dict().items():
        assert torch.equal(value, exported[key]), key
    assert export_safetensors(step_2) == step_2 / "model.safetensors"
    assert load_file(step_2 / "model.safetensors").keys() == exported.keys()
    ids = torch.tensor([tokenizer.encode("def main():")])
    assert model(ids).shape == (1, ids.shape[1], model.config.vocab_size)
    final, _ = load_checkpoint(group / "resharded")  # the exported model.safetensors
    assert not torch.equal(final.output.weight, model.output.weight)  # two more steps


def test_zero1_state_cannot_be_resharded_to_another_layout(group, launcher, tmp_path):
    shutil.copytree(group / "zero1" / "checkpoints", tmp_path / "checkpoints")
    with pytest.raises(LmforgeError, match="ZeRO-1 optimizer state for 2 data-parallel ranks"):
        launcher.single(tmp_path, max_steps=6)
