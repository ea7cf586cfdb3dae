"""The model as evaluation sees it: lm-eval's three requests on text, served by the engine.

`EngineBackend` answers `loglikelihood` (context, continuation), `loglikelihood_rolling`
(whole documents) and `generate_until` (greedy or sampled generation until stop strings) the
way lm-eval's hf backend does, token for token (eval/encoding.py), over an `infer.Engine`:
scoring runs on the engine's thread with each distinct context prefilled once
(infer/score.py), and generation is continuously batched. lmforge's own tasks and the lm-eval
model class (eval/lm_eval_model.py) both go through it, so they cannot disagree.

Scores are computed in fp32 whatever the checkpoint was saved in: task numbers are compared
across tools, and fp32 is what they compute in on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lmforge.errors import LmforgeError
from lmforge.eval.encoding import encode, encode_pair, fit_window, rolling_windows
from lmforge.infer.engine import Engine, SamplingParams
from lmforge.infer.score import TokenScores
from lmforge.tokenizer import Tokenizer


@dataclass
class Generation:
    text: str
    token_ids: list[int]


class EngineBackend:
    def __init__(
        self,
        engine: Engine,
        tokenizer: Tokenizer,
        add_bos: bool = True,
        max_length: int | None = None,
    ) -> None:
        if tokenizer.eot_id is None:
            raise LmforgeError(
                "the tokenizer has no <|endoftext|> token to start empty contexts and documents "
                "with: evaluate a checkpoint whose tokenizer has one"
            )
        self.engine, self.tokenizer = engine, tokenizer
        self.prefix_id: int = tokenizer.eot_id
        self.bos = tokenizer.eot_id if add_bos else None  # see eval/encoding.py
        if max_length is not None and not 1 < max_length <= engine.max_context:
            raise LmforgeError(
                f"max_length={max_length} is invalid: use 2 .. the model's context of "
                f"{engine.max_context} tokens"
            )
        # Windows shorter than the model's context, to match a harness that cuts shorter.
        self.max_length = max_length or engine.max_context

    @classmethod
    def from_checkpoint(
        cls,
        checkpoint: str | Path,
        device: str = "cpu",
        max_batch_size: int = 8,
        add_bos: bool = True,
        max_length: int | None = None,
    ) -> EngineBackend:
        from lmforge.quant.checkpoint import load_any_checkpoint

        model, tokenizer = load_any_checkpoint(checkpoint, device)
        engine = Engine(model.float(), tokenizer, max_batch_size=max_batch_size)
        return cls(engine, tokenizer, add_bos, max_length)

    def close(self) -> None:
        self.engine.close()

    def __enter__(self) -> EngineBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- log-likelihoods --------------------------------------------------------------------

    def loglikelihood(self, requests: list[tuple[str, str]]) -> list[TokenScores]:
        """Scores of each continuation given its context (text), lm-eval's split and cut."""
        contexts: dict[str, list[int]] = {}
        pairs = [
            encode_pair(self.tokenizer, c, x, self.prefix_id, self.bos, contexts)
            for c, x in requests
        ]
        return self.loglikelihood_tokens(pairs)

    def loglikelihood_tokens(self, pairs: list[tuple[list[int], list[int]]]) -> list[TokenScores]:
        fitted = [fit_window(c, x, self.max_length) for c, x in pairs]
        return self.engine.score(fitted)

    def loglikelihood_rolling(self, texts: list[str]) -> list[float]:
        """Each document's total log-likelihood, every token predicted once (rolling windows)."""
        windows, owner = [], []
        for i, text in enumerate(texts):
            for window in rolling_windows(
                encode(self.tokenizer, text, self.bos), self.prefix_id, self.max_length
            ):
                windows.append(window)
                owner.append(i)
        totals = [0.0] * len(texts)
        for i, scores in zip(owner, self.engine.score(windows), strict=True):
            totals[i] += scores.total
        return totals

    # ---- generation -------------------------------------------------------------------------

    def generate_until(
        self,
        requests: list[tuple[str, list[str], int]],
        temperature: float = 0.0,
        samples: int = 1,
        seed: int = 0,
    ) -> list[list[Generation]]:
        """`samples` completions of each (context, stop strings, max tokens), cut before the
        first stop string; greedy at temperature 0, else seeded per request and sample."""
        prompts, params = [], []
        for i, (context, until, max_tokens) in enumerate(requests):
            if max_tokens >= self.max_length:
                raise LmforgeError(
                    f"max_gen_toks={max_tokens} leaves no room for a prompt in the model's "
                    f"{self.max_length}-token context: lower it"
                )
            ids = encode(self.tokenizer, context, self.bos)[-(self.max_length - max_tokens) :]
            for s in range(samples):
                prompts.append(ids or [self.prefix_id])
                params.append(
                    SamplingParams(
                        max_tokens=max_tokens,
                        temperature=temperature,
                        stop=tuple(u for u in until if u),
                        seed=seed + 1000 * i + s,
                    )
                )
        done = self.engine.generate(prompts, params)
        return [
            [Generation(c.text, c.token_ids) for c in done[i : i + samples]]
            for i in range(0, len(done), samples)
        ]
