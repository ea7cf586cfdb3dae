"""Run configuration: one dataclass per section, named presets, TOML files and `--set` overrides.

Each section's dataclass lives beside the code it configures (`ModelConfig` in model/,
`TrainConfig` in train/, `DataConfig` and `TokenizerConfig` in prepare.py); this module only
composes them into a `RunConfig`, names the presets, and reads and writes them.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from lmforge.atomic import write_text
from lmforge.config_ranges import check_ranges
from lmforge.errors import LmforgeError
from lmforge.model import ModelConfig
from lmforge.prepare import DataConfig, TokenizerConfig
from lmforge.run_dir import RunKind
from lmforge.train import TrainConfig
from lmforge.train.config import (
    CheckpointConfig,
    EvalConfig,
    OptimizerConfig,
    PrecisionConfig,
    ScheduleConfig,
    nest_train,
)

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib


@dataclass
class RunConfig:
    name: str = "small"
    size_to_budget: bool = False  # a time-budgeted run picks its shape (lmforge.recipe)
    model: ModelConfig = field(default_factory=ModelConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def validate(self) -> None:
        """Refuse bad settings before any work starts (data preparation takes a while) and
        before a run folder is claimed: value ranges, the device, the data path."""
        from lmforge.device.choice import pick_device

        check_ranges(self)
        self.model.validate()
        self.train.validate()
        self.train.check_model(self.model)
        specials = len(set(self.tokenizer.special_tokens))
        if self.tokenizer.vocab_size < 256 + specials:
            raise LmforgeError(
                f"tokenizer.vocab_size {self.tokenizer.vocab_size} is below 256 bytes + "
                f"{specials} special tokens: raise it to at least {256 + specials}"
            )
        pick_device(self.train.device)
        path = self.data.path
        if path and path != "stdlib" and not path.startswith("hf:") and not Path(path).exists():
            raise LmforgeError(
                f"data path {path} does not exist: pass an existing file or folder to --data "
                "(or data.path)"
            )


TOP_LEVEL = {"name": str, "size_to_budget": bool}
"""RunConfig's settings outside any section."""


def tiny() -> RunConfig:
    """Seconds on a CPU: for tests and smoke runs."""
    return RunConfig(
        name="tiny",
        model=ModelConfig(vocab_size=512, d_model=64, n_layers=2, n_heads=4, max_seq_len=64),
        tokenizer=TokenizerConfig(vocab_size=512, train_bytes=2_000_000),
        train=TrainConfig(
            batch_size=8,
            seq_len=64,
            max_steps=100,
            log_every=10,
            optimizer=OptimizerConfig(lr=3e-3),
            schedule=ScheduleConfig(warmup_steps=10),
            eval=EvalConfig(every=50, batches=4),
        ),
    )


def small() -> RunConfig:
    """The speedrun's recipe at a pinned 5.3M-parameter shape: about ten minutes end to end on
    two CPU cores. Muon with a WSD schedule decaying to zero (README: the scaling sweep)."""
    return RunConfig(
        name="small",
        model=ModelConfig(vocab_size=4096, d_model=256, n_layers=4, n_heads=4, max_seq_len=256),
        tokenizer=TokenizerConfig(vocab_size=4096),
        train=TrainConfig(
            batch_size=16,
            seq_len=256,
            minutes=8.0,
            log_every=10,
            optimizer=OptimizerConfig(
                name="muon",
                lr=3e-3,
                embed_lr=0.1,  # 33x lr: -0.17 bpb at 2.5 minutes (README: the embedding's own lr)
            ),
            schedule=ScheduleConfig(kind="wsd", min_lr_ratio=0.0, warmup_steps=50),
            eval=EvalConfig(every=100, batches=16),
            checkpoint=CheckpointConfig(every=200),
            # bf16 where measured fast: 1.35x the tokens, lower bpb (README)
            precision=PrecisionConfig(dtype="auto"),
        ),
    )


def auto() -> RunConfig:
    """The speedrun default: `small`'s recipe at the shape its time budget buys on this
    machine (lmforge.recipe.sizing); with a step count instead of a budget, small's shape."""
    return dataclasses.replace(small(), name="auto", size_to_budget=True)


def gpt2_124m() -> RunConfig:
    """GPT-2 small's shape (124M parameters with GPT-2's vocabulary): a GPU run."""
    return RunConfig(
        name="gpt2-124m",
        model=ModelConfig(vocab_size=50304, d_model=768, n_layers=12, n_heads=12, max_seq_len=1024),
        tokenizer=TokenizerConfig(vocab_size=50257),
        train=TrainConfig(
            batch_size=32,
            seq_len=1024,
            grad_accum_steps=16,
            max_steps=19073,
            log_every=10,
            optimizer=OptimizerConfig(lr=6e-4),
            schedule=ScheduleConfig(warmup_steps=700),
            eval=EvalConfig(every=250, batches=20),
            checkpoint=CheckpointConfig(every=1000),
        ),
    )


def _gpu_pretraining(seq_len: int, lr: float) -> TrainConfig:
    """Defaults for the published shapes below: about 4M tokens per step on a GPU cluster."""
    return TrainConfig(
        batch_size=1,
        seq_len=seq_len,
        grad_accum_steps=4 * 2**20 // seq_len,
        max_steps=25_000,
        log_every=10,
        optimizer=OptimizerConfig(lr=lr),
        schedule=ScheduleConfig(warmup_steps=2000),
        eval=EvalConfig(every=1000, batches=20),
        checkpoint=CheckpointConfig(every=1000),
        precision=PrecisionConfig(dtype="bf16"),
    )


def llama2_7b() -> RunConfig:
    """Llama 2 7B's shape: 6,738,415,616 parameters (Touvron et al. 2023)."""
    return RunConfig(
        name="llama2-7b",
        model=ModelConfig(
            vocab_size=32000, d_model=4096, n_layers=32, n_heads=32, d_ff=11008, max_seq_len=4096
        ),
        tokenizer=TokenizerConfig(vocab_size=32000),
        train=_gpu_pretraining(4096, 3e-4),
    )


def llama3_8b() -> RunConfig:
    """Llama 3 8B's shape: 8,030,261,248 parameters, grouped-query attention (8 KV heads)."""
    return RunConfig(
        name="llama3-8b",
        model=ModelConfig(
            vocab_size=128256,
            d_model=4096,
            n_layers=32,
            n_heads=32,
            n_kv_heads=8,
            d_ff=14336,
            max_seq_len=8192,
            rope_theta=500000.0,
        ),
        tokenizer=TokenizerConfig(vocab_size=128256),
        train=_gpu_pretraining(8192, 3e-4),
    )


def llama3_70b() -> RunConfig:
    """Llama 3 70B's shape: 70,553,706,496 parameters, grouped-query attention (8 KV heads)."""
    return RunConfig(
        name="llama3-70b",
        model=ModelConfig(
            vocab_size=128256,
            d_model=8192,
            n_layers=80,
            n_heads=64,
            n_kv_heads=8,
            d_ff=28672,
            max_seq_len=8192,
            rope_theta=500000.0,
        ),
        tokenizer=TokenizerConfig(vocab_size=128256),
        train=_gpu_pretraining(8192, 1.5e-4),
    )


def mixtral_8x7b() -> RunConfig:
    """Mixtral 8x7B's shape: 46,702,792,704 parameters, 2 of 8 experts active per token."""
    return RunConfig(
        name="mixtral-8x7b",
        model=ModelConfig(
            vocab_size=32000,
            d_model=4096,
            n_layers=32,
            n_heads=32,
            n_kv_heads=8,
            d_ff=14336,
            max_seq_len=32768,
            rope_theta=1e6,
            n_experts=8,
            experts_per_token=2,
        ),
        tokenizer=TokenizerConfig(vocab_size=32000),
        train=_gpu_pretraining(4096, 3e-4),
    )


PRESETS = {
    "auto": auto,
    "tiny": tiny,
    "small": small,
    "gpt2-124m": gpt2_124m,
    "llama2-7b": llama2_7b,
    "llama3-8b": llama3_8b,
    "llama3-70b": llama3_70b,
    "mixtral-8x7b": mixtral_8x7b,
}


def preset(name: str) -> RunConfig:
    if name not in PRESETS:
        raise LmforgeError(f"unknown preset {name!r}: choose one of {', '.join(PRESETS)}")
    return PRESETS[name]()


def load_config(
    preset_name: str | None = None, path: str | Path | None = None, overrides: list[str] = ()
) -> RunConfig:
    """Preset (default `auto`), then the TOML file, then `section.key=value` overrides."""
    cfg = preset(preset_name or "auto")
    if path is not None:
        cfg = apply_dict(cfg, read_toml(path), source=str(path))
    for item in overrides:
        cfg = apply_override(cfg, item)
    check_ranges(cfg)
    return cfg


def read_toml(path: str | Path) -> dict:
    try:
        return tomllib.loads(Path(path).read_text())
    except FileNotFoundError as e:
        raise LmforgeError(f"config file {path} does not exist: check the path") from e
    except tomllib.TOMLDecodeError as e:
        raise LmforgeError(f"config file {path} is not valid TOML: {e}") from e


def apply_dict(
    cfg: RunConfig, values: dict, source: str = "config", note: bool = True
) -> RunConfig:
    """A copy of `cfg` with `values` (nested like the TOML file) applied; unknown keys rejected.
    A [train] table's flat keys of configs written before its sections (`lr`) go to their
    section (`optimizer.lr`, train.config.FLAT_KEYS), with a one-line note on stderr each
    unless not `note`."""
    updates: dict[str, Any] = {}
    for key, value in values.items():
        if key in TOP_LEVEL:
            updates[key] = _coerce(value, TOP_LEVEL[key], key, source)
            continue
        section = _section(cfg, key, source)
        if not isinstance(value, dict):
            raise LmforgeError(f"{source}: [{key}] must be a table of settings")
        if key == "train":
            value, moved = nest_train(value)
            for old, new in moved if note else ():
                print(f"note: {source}: train.{old} is now train.{new}", file=sys.stderr)
        updates[key] = _apply_section(section, value, key, source)
    return dataclasses.replace(cfg, **updates)


def _apply_section(section: Any, values: dict, prefix: str, source: str) -> Any:
    """A copy of the dataclass `section` (config key `prefix`) with `values` applied, nested
    sections (a table: [train.optimizer]) included."""
    fields = {f.name: f for f in dataclasses.fields(section)}
    hints = typing.get_type_hints(type(section))
    changes = {}
    for name, v in values.items():
        key = f"{prefix}.{name}"
        if name not in fields:
            raise LmforgeError(
                f"{source}: unknown key {key}; valid keys: {', '.join(_keys(section))}"
            )
        current = getattr(section, name)
        if dataclasses.is_dataclass(current):
            if not isinstance(v, dict):
                raise LmforgeError(
                    f"{source}: {key} is a section: set its keys ({key}.KEY=VALUE, or "
                    f"[{key}] in a TOML file)"
                )
            changes[name] = _apply_section(current, v, key, source)
        else:
            changes[name] = _coerce(v, hints[name], key, source)
    return dataclasses.replace(section, **changes)


def _keys(section: Any, prefix: str = "") -> list[str]:
    """The keys of the dataclass `section`, a nested section's as `name.key`."""
    keys = []
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if dataclasses.is_dataclass(value):
            keys += _keys(value, f"{prefix}{f.name}.")
        else:
            keys.append(f"{prefix}{f.name}")
    return keys


def apply_override(cfg: RunConfig, item: str) -> RunConfig:
    """Apply one `section.key=value` (`train.optimizer.lr=1e-3`: more dots for a nested
    section); the value is read as TOML (`3`, `1e-3`, `true`, `"x"`)."""
    dotted, sep, raw = item.partition("=")
    path = [part.strip() for part in dotted.split(".")]
    if not sep or len(path) < 2 or not all(path):
        raise LmforgeError(
            f"--set {item!r} is not of the form section.key=value (e.g. train.optimizer.lr=1e-3)"
        )
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()  # a bare word is a string
    for part in reversed(path):
        value = {part: value}
    return apply_dict(cfg, value, source="--set")


def to_dict(cfg: RunConfig) -> dict:
    return dataclasses.asdict(cfg)


def save_toml(cfg: RunConfig, path: str | Path) -> None:
    """Write the resolved config (None values are left out: they mean 'the default')."""
    write_text(path, config_text(cfg))


def config_text(cfg: RunConfig) -> str:
    return tomli_w.dumps(_drop_none(to_dict(cfg)))


RUN_ENTRIES = (
    "config.toml",
    "data",
    "tokenizer",
    "tokens",
    "sizing.json",
    "checkpoints",
    "metrics.jsonl",
)
"""What a run folder holds before its report (eval/, plots/ and report.md come last)."""


def _a_stage_finished(out: Path) -> bool:
    """Whether a stage of the run in `out` finished: its data, tokenizer, shards, a
    checkpoint or a logged step."""
    from lmforge.train.checkpoint_dir import list_checkpoints

    return (
        (out / "data" / "stats.json").exists()
        or (out / "tokenizer").exists()
        or (out / "tokens" / "meta.json").exists()
        or bool(list_checkpoints(out / "checkpoints"))
        or (out / "metrics.jsonl").exists()
    )


LAYOUT_KEYS = frozenset(
    {
        "train.parallel.layout",
        "train.parallel.ddp_bucket_mb",
        "train.parallel.reshard_after_forward",
        "train.parallel.sequence_parallel",
        "train.parallel.collective_timeout_s",
        "train.compute.compile",
    }
)
"""How a run is spread over processes and compiled, not what it computes: a distributed
checkpoint resumes at any layout or world size (lmforge/train/checkpoint_dcp.py)."""


def upgrade_run_config(config: dict) -> dict:
    """A run folder's recorded config in today's layout: a flat [train] table (written before
    TrainConfig's sections) nested into them."""
    train = config.get("train")
    if not isinstance(train, dict):
        return config
    return {**config, "train": nest_train(train)[0]}


RUN_FOLDER = RunKind(
    "a run",
    "config.toml",
    upgrade=upgrade_run_config,
    resumable=frozenset({"train.max_steps", "train.minutes"}) | LAYOUT_KEYS,
    change="a new length or layout",
    entries=RUN_ENTRIES,
    finished=_a_stage_finished,
)
"""The run folder of a RunConfig's run (pretraining, the speedrun, SFT): `RunDir(out, RUN_FOLDER)`.
A run may change its length when it resumes (a finished run given more steps continues from its
last checkpoint on a new schedule tail, lmforge/train/schedule.py) and its layout."""


def _section(cfg: RunConfig, key: str, source: str) -> Any:
    sections = [f.name for f in dataclasses.fields(cfg) if f.name not in TOP_LEVEL]
    if key not in sections:
        raise LmforgeError(
            f"{source}: unknown section {key!r}; valid sections: {', '.join(sections)}"
        )
    return getattr(cfg, key)


def _coerce(value: Any, hint: Any, key: str, source: str) -> Any:
    is_union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    allowed = typing.get_args(hint) if is_union else (hint,)
    if value in ("none", "None") and type(None) in allowed:
        return None
    origin = [typing.get_origin(a) or a for a in allowed]
    if float in origin and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if any(isinstance(value, t) and not (t is int and isinstance(value, bool)) for t in origin):
        return value
    names = " or ".join(getattr(t, "__name__", str(t)) for t in origin)
    raise LmforgeError(f"{source}: {key} must be {names}, got {value!r}")


def _drop_none(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _drop_none(v) for k, v in obj.items() if v is not None}
    return obj
