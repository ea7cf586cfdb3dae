import os

import pytest
import torch

from lmforge.weights_file import save_module, save_tensors


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_safetensors_files_get_the_mode_the_umask_gives_other_files(umask, mode, tmp_path):
    old = os.umask(umask)
    try:
        save_tensors({"w": torch.zeros(3)}, tmp_path / "a.safetensors")
        save_module(torch.nn.Linear(2, 2), tmp_path / "b.safetensors")
        (tmp_path / "c.json").write_text("{}")
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()}
    assert modes == {"a.safetensors": mode, "b.safetensors": mode, "c.json": mode}
