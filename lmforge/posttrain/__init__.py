"""Post-training: supervised fine-tuning on conversations (sft.py, sft_data.py), LoRA adapters
in PEFT's format (model/lora.py and model/peft.py, which inference loads too), verifiable tasks
and their rewards (tasks/), and GRPO (grpo.py, its arithmetic in grpo_loss.py, its rollouts
from lmforge's engine in rollout.py, a step's groups in groups.py and its updates on the
shared training core in policy_update.py).

Names import their module (and torch) on first use.
"""

from lmforge.lazy import lazy_exports

_EXPORTS = {
    "sft": "lmforge.posttrain.sft",
    "sft_train_config": "lmforge.posttrain.sft_config",
    "Conversations": "lmforge.posttrain.sft_data",
    "pack": "lmforge.posttrain.sft_data",
    "read_conversations": "lmforge.posttrain.sft_data",
    "group_advantages": "lmforge.posttrain.grpo_loss",
    "policy_loss": "lmforge.posttrain.grpo_loss",
    "RlConfig": "lmforge.posttrain.rl_config",
    "RolloutEngine": "lmforge.posttrain.rollout",
}

__all__ = list(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
