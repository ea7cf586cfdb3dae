"""The chat speedrun's stages at toy size: base accuracy, SFT, GRPO and the report, reused on a
rerun."""

import json

from lmforge.chat_speedrun import ChatRecipe, chat_speedrun
from lmforge.posttrain.rl_config import RlConfig


def test_the_chat_speedrun_reports_each_stage_and_reuses_them(base_checkpoint, tmp_path):
    rl = RlConfig(
        steps=2, prompts_per_step=2, group_size=4, max_new_tokens=16, eval_problems=8,
        eval_samples=2, train_problems=50, engine_batch=8, device="cpu",
    )  # fmt: skip
    recipe = ChatRecipe(sft_conversations=40, sft_steps=3, rl=rl)
    out = tmp_path / "chat"
    report = chat_speedrun(base_checkpoint, out, recipe)
    text = report.read_text()
    for stage in ("| base |", "| SFT |", "| RL (GRPO) |"):
        assert stage in text
    assert "standard errors of the paired difference" in text
    summary = json.loads((out / "rl" / "rl.json").read_text())
    assert summary["steps"] == 2 and summary["final_accuracy"]["samples"] == 2
    times = json.loads((out / "times.json").read_text())
    assert set(times) == {"base evaluation", "SFT", "RL (with its evaluations)"}
    assert chat_speedrun(base_checkpoint, out, recipe) == report  # every stage reused
    assert json.loads((out / "times.json").read_text()) == times
    assert len(list((out / "sft" / "checkpoints").iterdir())) == 1
