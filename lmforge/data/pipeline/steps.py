"""The per-document steps: extraction, language ID, quality rules, toxicity, PII, classifier.

Each is a `Filter` or a `Transform` over a core module of `lmforge.data` that knows nothing of
pipelines; the step only adds its config, its removal reasons and its counters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from lmforge.data.code_detect import is_code, names_source_file
from lmforge.data.documents import Document
from lmforge.data.pipeline.step import Filter, Transform
from lmforge.data.quality import CodeConfig, GopherConfig, quality_score


class Extract(Transform):
    """HTML documents (format `html`, from HTML files and WARC records) to plain text."""

    name = "extract"
    drop_reason = "no_text_extracted"

    @dataclass
    class Config:
        main_content: bool = False  # drop navigation and boilerplate (resiliparse's heuristic)

    def transform(self, doc: Document) -> Document | None:
        if doc.meta.get("format") != "html":
            return doc
        from lmforge.data.html import html_to_text

        text = html_to_text(doc.text, self.config.main_content)
        self.stats.count("html_extracted")
        return Document(doc.id, text, {**doc.meta, "format": "text"}) if text else None


class LangId(Filter):
    """Labels each document's language; keeps the listed languages above a confidence."""

    name = "langid"

    @dataclass
    class Config:
        languages: list[str] = field(default_factory=lambda: ["en"])  # empty: keep every language
        min_confidence: float = 0.65
        skip_code: bool = True  # source files keep their format; langid is for prose

    def setup(self) -> None:
        from lmforge.data.langid import identify

        self.identify = identify

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        if self.config.skip_code and doc.meta.get("format") == "code":
            return True
        lang, confidence = self.identify(doc.text)
        doc.meta["lang"], doc.meta["lang_confidence"] = lang, round(confidence, 4)
        self.stats.count(f"lang_{lang}")
        if confidence < self.config.min_confidence:
            return False, "langid_low_confidence"
        if self.config.languages and lang not in self.config.languages:
            return False, f"langid_not_{'_'.join(self.config.languages)}"
        return True


class Quality(Filter):
    """Gopher's rules for prose, the code profile for source code (`profile = auto` chooses per
    document: by its format or file name, then by its text; `code_detect.is_code`)."""

    name = "quality"

    @dataclass
    class Config:
        profile: str = "auto"  # auto (per document: source code or prose), prose or code
        gopher: GopherConfig = field(default_factory=GopherConfig)
        code: CodeConfig = field(default_factory=CodeConfig)

    PROFILES: ClassVar[tuple[str, ...]] = ("auto", "prose", "code")

    def setup(self) -> None:
        if self.config.profile not in self.PROFILES:
            from lmforge.errors import LmforgeError

            raise LmforgeError(
                f"quality.profile {self.config.profile!r} is unknown: use auto, prose or code"
            )

    def profile(self, doc: Document) -> str:
        """The configured profile; under auto, code for source code and prose otherwise."""
        if self.config.profile != "auto":
            return self.config.profile
        return "code" if is_code(doc) else "prose"

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        profile = self.profile(doc)
        self.stats.count(f"profile_{profile}")  # how many documents each profile judged
        label, score = quality_score(doc.text, profile, self.config.gopher, self.config.code)
        doc.meta["quality_rules_score"] = round(score, 4)
        return (False, label) if label != "ok" else True


class Toxicity(Filter):
    """NSFW and toxic-language verdicts (`is_nsfw`, `is_toxic`) plus an optional classifier."""

    name = "toxicity"

    @dataclass
    class Config:
        word_list: str = ""  # the NSFW list; empty: the one shipped with lmforge
        toxic_word_list: str = ""  # profanity, slurs, insults; empty: the shipped one
        nsfw: bool = True  # remove sexual content
        toxic: bool = True  # remove toxic language
        max_word_hits: int = 0  # C4 removes a page with any listed word
        classifier: str = ""  # model path; empty: no classifier
        classifier_label: str = "__label__toxic"  # for fastText models
        classifier_threshold: float = 0.5  # remove when the score is at least this

    def setup(self) -> None:
        from lmforge.data import toxicity

        self.toxicity = toxicity
        load = toxicity.WordList.load
        self.nsfw_words = load(self.config.word_list) if self.config.word_list else None
        toxic_list = self.config.toxic_word_list
        self.toxic_words = load(toxic_list) if toxic_list else None
        self.scorer = None
        if self.config.classifier:
            from lmforge.data.scorer import load_scorer

            self.scorer = load_scorer(self.config.classifier, self.config.classifier_label)

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        hits = self.config.max_word_hits
        for kind, on, check, words in (
            ("nsfw", self.config.nsfw, self.toxicity.is_nsfw, self.nsfw_words),
            ("toxic", self.config.toxic, self.toxicity.is_toxic, self.toxic_words),
        ):
            if on:
                label, score = check(doc.text, words, hits)
                doc.meta[f"{kind}_score"] = round(score, 4)
                if label != "clean":
                    return False, f"toxicity_{kind}"
        threshold = self.config.classifier_threshold
        if self.scorer is not None and self.scorer(doc.text) >= threshold:
            return False, "toxicity_classifier"
        return True


class Pii(Transform):
    """Masks e-mail addresses, phone numbers, IPs and card numbers with typed placeholders.

    `profile = auto` masks source files (format `code`, or a code extension in the id or in the
    record's path or extension field) with the code profile and leaves the rest to the masker,
    which treats text that looks like code as code and everything else as prose.
    """

    name = "pii"

    @dataclass
    class Config:
        types: list[str] = field(
            default_factory=lambda: ["email", "phone", "ipv4", "ipv6", "credit_card"]
        )
        profile: str = "auto"  # auto (by the document's meta, then its text), prose or code

    def setup(self) -> None:
        from lmforge.data.pii import ALL_TYPES, PROFILES
        from lmforge.errors import LmforgeError

        unknown = set(self.config.types) - set(ALL_TYPES)
        if unknown:
            raise LmforgeError(f"pii.types has unknown {sorted(unknown)}: use {list(ALL_TYPES)}")
        if self.config.profile not in PROFILES:
            raise LmforgeError(
                f"pii.profile {self.config.profile!r} is unknown: use auto, prose or code"
            )

    def profile(self, doc: Document) -> str:
        """The configured profile; under auto, code where the meta or id names a source file."""
        if self.config.profile != "auto":
            return self.config.profile
        return "code" if names_source_file(doc) else "auto"

    def transform(self, doc: Document) -> Document | None:
        from lmforge.data.pii import mask_pii

        text, counts = mask_pii(doc.text, self.config.types, self.profile(doc))
        if not counts:
            return doc
        for kind, n in counts.items():
            self.stats.count(kind, n)
        self.stats.count("documents_masked")
        return Document(doc.id, text, doc.meta)


class QualityClassifier(Filter):
    """Keeps documents that a trained classifier scores at least `threshold` ("looks like T")."""

    name = "classifier"

    @dataclass
    class Config:
        model: str = ""  # from `lmforge data train-classifier`, or a fastText .bin
        label: str = "__label__1"  # for fastText models
        threshold: float = 0.5

    def setup(self) -> None:
        from lmforge.data.scorer import load_scorer
        from lmforge.errors import LmforgeError

        if not self.config.model:
            raise LmforgeError("the classifier step needs a model: --set classifier.model=PATH")
        self.scorer = load_scorer(self.config.model, self.config.label)

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        score = self.scorer(doc.text)
        doc.meta["quality_score"] = round(score, 4)
        return True if score >= self.config.threshold else (False, "classifier_below_threshold")
