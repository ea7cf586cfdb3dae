import pytest
import torch

from lmforge.device.choice import pick_device
from lmforge.errors import LmforgeError


@pytest.mark.parametrize("name", ["tpu", "xla", "meta", "cpu:0", "cuda:x", "cuda:-1", "gpu"])
def test_unknown_device_names_list_the_known_ones(name):
    with pytest.raises(LmforgeError, match=f"unknown device '{name}': use cpu, cuda, cuda:N, mps"):
        pick_device(name)


@pytest.mark.parametrize("name", [None, "", "auto", " auto "])
def test_auto_picks_a_device_this_machine_has(name):
    assert pick_device(name).type in ("cpu", "cuda", "mps")
    assert pick_device("cpu") == torch.device("cpu")


def test_unavailable_devices_say_what_to_use_instead(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    for name in ("cuda", "cuda:0"):
        with pytest.raises(LmforgeError, match=f"'{name}' requested but CUDA is not available"):
            pick_device(name)
    with pytest.raises(LmforgeError, match="MPS\\) is not available here: use --device cpu"):
        pick_device("mps")
    assert pick_device("auto") == torch.device("cpu")


def test_a_cuda_index_beyond_the_gpus_names_the_valid_ones(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(LmforgeError, match="has 2 CUDA device\\(s\\): use cuda:0 to cuda:1"):
        pick_device("cuda:2")
    assert pick_device("cuda:1") == torch.device("cuda", 1)
