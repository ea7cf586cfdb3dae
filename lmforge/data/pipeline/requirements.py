"""What a pipeline config needs installed, checked before any work starts.

Readers, steps, the writer and the executor each name the optional packages they import (the
`data`, `parquet` and `ray` extras, or fastText for a `.bin` model). `check_requirements` finds
every one the config will use and raises one line naming what to install, before the output
folder is claimed, so a missing package never surfaces as a traceback halfway through a run.
"""

from __future__ import annotations

from typing import NamedTuple

from lmforge import extras
from lmforge.data.pipeline.config import PipelineConfig
from lmforge.data.readers import Unit, list_units
from lmforge.errors import LmforgeError


class Need(NamedTuple):
    feature: str  # what needs it, as the error names it
    extra: str  # the pip extra that installs it ("" for a package outside the extras)
    modules: tuple[str, ...]


READER_NEEDS = {
    "warc": Need("reading WARC files", "data", ("warcio", "resiliparse")),
    "html": Need("reading HTML files", "data", ("resiliparse",)),
    "parquet": Need("reading Parquet files", "parquet", ("pyarrow",)),
}
ZSTD_INPUT = Need("reading .zst files", "data", ("zstandard",))
STEP_NEEDS = {
    "extract": Need("the extract step", "data", ("resiliparse",)),
    "langid": Need("the langid step", "data", ("py3langid",)),
}
WRITER_NEEDS = {
    "jsonl.zst": Need("writing jsonl.zst shards", "data", ("zstandard",)),
    "parquet": Need("writing Parquet shards", "parquet", ("pyarrow",)),
}
RAY = Need("--executor ray", "ray", ("ray",))
FASTTEXT_SUFFIXES = (".bin", ".ftz")


def input_needs(units: list[Unit]) -> list[Need]:
    """What reading `units` needs."""
    needs = [READER_NEEDS[u.kind] for u in units if u.kind in READER_NEEDS]
    if any(u.path.endswith((".zst", ".zstd")) for u in units):
        needs.append(ZSTD_INPUT)
    return needs


def config_needs(cfg: PipelineConfig, units: list[Unit]) -> list[Need]:
    """Everything running `cfg` over `units` imports that may not be installed."""
    needs = input_needs(units)
    needs += [STEP_NEEDS[name] for name in cfg.steps if name in STEP_NEEDS]
    for name, key in (("toxicity", "classifier"), ("classifier", "model")):
        model = getattr(cfg.step_config.get(name), key, "") if name in cfg.steps else ""
        if model.endswith(FASTTEXT_SUFFIXES):
            needs.append(Need(f"the fastText model {model}", "", ("fasttext",)))
    if cfg.write.format in WRITER_NEEDS:
        needs.append(WRITER_NEEDS[cfg.write.format])
    if cfg.executor == "ray":
        needs.append(RAY)
    return needs


def require_all(needs: list[Need]) -> None:
    """Raise one line for the first extra (in `needs` order) with a package missing, naming
    every feature of that extra that needs one."""
    by_extra: dict[str, tuple[list[str], list[str]]] = {}
    for need in needs:
        absent = extras.missing(*need.modules)
        if absent:
            features, modules = by_extra.setdefault(need.extra, ([], []))
            if need.feature not in features:
                features.append(need.feature)
            modules += [m for m in absent if m not in modules]
    for extra, (features, modules) in by_extra.items():
        feature = ", ".join(features[:-1]) + " and " + features[-1] if features[1:] else features[0]
        need = "need" if features[1:] else "needs"
        if not extra:  # fastText is no extra: its own package
            raise LmforgeError(
                f"{feature} {need} {', '.join(modules)} (not installed): "
                f"pip install {' '.join(modules)}"
            )
        extras.require(feature, extra, *modules, plural=bool(features[1:]))


def check_requirements(cfg: PipelineConfig) -> None:
    """Raise a one-line LmforgeError if anything `cfg` will import is not installed."""
    require_all(config_needs(cfg, list_units(cfg.input)))
