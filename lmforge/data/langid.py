"""Language identification with py3langid's model, which ships inside the package (97 languages).

`identify(text)` returns (ISO 639-1 code, confidence in [0, 1]). The model loads once per
process on first use, from the package's own files: nothing is downloaded.
"""

from __future__ import annotations

from functools import lru_cache

from lmforge.extras import import_extra

MAX_CHARS = 4000  # the head of a document decides; more text rarely changes the answer


@lru_cache(maxsize=1)
def _identifier():
    langid = import_extra("py3langid.langid", "language ID", "data")
    return langid.LanguageIdentifier.from_model_file(langid.MODEL_FILE, norm_probs=True)


def identify(text: str, max_chars: int = MAX_CHARS) -> tuple[str, float]:
    lang, confidence = _identifier().classify(text[:max_chars])
    return lang, float(confidence)
