"""Post-training: supervised fine-tuning on conversations (sft.py, sft_data.py), LoRA adapters
in PEFT's format (model/lora.py and model/peft.py, which inference loads too), verifiable tasks
and their rewards (tasks/), and GRPO (grpo_loss.py).

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
}

__all__ = list(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
