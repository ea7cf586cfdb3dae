"""lmforge as an lm-evaluation-harness model: `model="lmforge"`, `model_args="checkpoint=DIR"`.

Importing this module registers the class with lm-eval (lm-eval has no plugin mechanism for
out-of-tree models, so `lmforge eval --harness lm-eval` imports it and calls
`simple_evaluate`; in your own script, import it before calling lm-eval). Its three requests go
to `EngineBackend`, the same code `lmforge eval` runs, so the two give the same numbers.
"""

from __future__ import annotations

from typing import Any

from lmforge.errors import LmforgeError
from lmforge.eval.backend import EngineBackend

try:
    import lm_eval.models  # noqa: F401  (lm-eval registers its own models only into an empty registry)
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
except ImportError as e:  # pragma: no cover - the message is the point
    raise LmforgeError(
        "the lm-eval model class needs lm-evaluation-harness: pip install 'lmforge[eval]'"
    ) from e


@register_model("lmforge")
class LmforgeLM(LM):
    def __init__(
        self,
        checkpoint: str,
        device: str | None = None,
        batch_size: int | str | None = None,
        max_batch_size: int | None = None,
        add_bos_token: bool | str = True,
        max_length: int | str | None = None,
        **_: Any,
    ) -> None:
        super().__init__()
        slots = int(batch_size) if str(batch_size or "").isdigit() else (max_batch_size or 8)
        bos = str(add_bos_token).lower() not in ("false", "0", "no")
        length = int(max_length) if max_length else None
        self.backend = EngineBackend.from_checkpoint(
            checkpoint, device or "cpu", slots, bos, length
        )

    @property
    def tokenizer_name(self) -> str:
        return "lmforge"

    def loglikelihood(
        self, requests: list[Any], disable_tqdm: bool = False
    ) -> list[tuple[float, bool]]:
        scored = self.backend.loglikelihood([tuple(r.args) for r in requests])
        return [(s.total, s.is_greedy) for s in scored]

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        return self.backend.loglikelihood_rolling([r.args[0] for r in requests])

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Greedy unless a request samples; requests with equal settings batch together."""
        groups: dict[tuple, list[int]] = {}
        prompts = []
        for i, request in enumerate(requests):
            context, kwargs = request.args
            kwargs = dict(kwargs or {})
            until = kwargs.get("until") or []
            until = (until,) if isinstance(until, str) else tuple(until)
            sampled = kwargs.get("do_sample") and float(kwargs.get("temperature", 0.0)) > 0
            temperature = float(kwargs["temperature"]) if sampled else 0.0
            groups.setdefault(
                (until, int(kwargs.get("max_gen_toks", 256)), temperature), []
            ).append(i)
            prompts.append(context)
        out = [""] * len(requests)
        for (until, max_tokens, temperature), indices in groups.items():
            batch = [(prompts[i], list(until), max_tokens) for i in indices]
            for i, (gen,) in zip(
                indices, self.backend.generate_until(batch, temperature), strict=True
            ):
                out[i] = gen.text
        return out


def run_lm_eval(
    checkpoint: str,
    tasks: list[str],
    limit: int | None = None,
    num_fewshot: int | None = None,
    batch_size: int = 8,
) -> dict[str, Any]:
    """lm-eval's `simple_evaluate` with lmforge's model class; task YAML paths are loaded
    through a TaskManager over their folders. lm-eval's own tasks (some 14,000, indexed in
    about 11 s) are indexed only when a task is given by name: a YAML file's group that lists
    lm-eval's tasks needs one of them named too."""
    from pathlib import Path

    import lm_eval
    from lm_eval.tasks import TaskManager

    files = {t: Path(t) for t in tasks if Path(t).exists()}
    folders = sorted({str(f.resolve().parent) for f in files.values()})
    names = [_task_name(t) if t in files else t for t in tasks]
    named = any(t not in files for t in tasks)
    manager = TaskManager(include_path=folders or None, include_defaults=named)
    results = lm_eval.simple_evaluate(
        model="lmforge",
        model_args=f"checkpoint={checkpoint}",
        tasks=names,
        limit=limit,
        num_fewshot=num_fewshot,
        batch_size=batch_size,
        task_manager=manager,
    )
    return results["results"] if results else {}


def _task_name(path: str) -> str:
    import yaml

    with open(path) as f:
        return yaml.safe_load(f)["task"]
