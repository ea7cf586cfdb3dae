"""Hugging Face interoperability: lmforge models as `LlamaForCausalLM` folders, and back;
mixtures of experts as `MixtralForCausalLM` folders.

The architectures are the same (RMSNorm pre-norm, RoPE in the rotate_half layout, SwiGLU, no
biases, grouped-query attention, optional tied head), so conversion is a renaming of tensors
plus a translation of config fields; no weight is permuted. A mixture's stacked experts are
split into Mixtral's `block_sparse_moe.experts.N.{w1,w3,w2}` (gate, up, down) and stacked back
on import; Mixtral's router (softmax, top-k, renormalised, dropless) is lmforge's default, and
options it cannot express are refused at export. A folder holds config.json,
generation_config.json, model.safetensors and the tokenizer as `tokenizers`/`transformers` read
it. Its tokenizer prepends `<|endoftext|>` as the beginning-of-sequence token, because every
lmforge document and prompt starts after one. Reading never runs code: JSON and safetensors only.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from lmforge.errors import LmforgeError
from lmforge.model.transformer import ModelConfig, Transformer
from lmforge.tokenizer import Tokenizer
from lmforge.tokenizer.chat_template import ChatTemplate
from lmforge.tokenizer.hf_json import to_json
from lmforge.tokenizer.tokenizer import EOT
from lmforge.weights_file import save_module, save_tensors

WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"

# lmforge parameter names -> Hugging Face Llama names; per block, then outside the blocks.
LAYER_KEYS = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn.q_proj.weight": "self_attn.q_proj.weight",
    "attn.k_proj.weight": "self_attn.k_proj.weight",
    "attn.v_proj.weight": "self_attn.v_proj.weight",
    "attn.o_proj.weight": "self_attn.o_proj.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
    "mlp.gate_proj.weight": "mlp.gate_proj.weight",
    "mlp.up_proj.weight": "mlp.up_proj.weight",
    "mlp.down_proj.weight": "mlp.down_proj.weight",
}
TOP_KEYS = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_FROM_LAYER = {hf: ours for ours, hf in LAYER_KEYS.items()}
_FROM_TOP = {hf: ours for ours, hf in TOP_KEYS.items()}
# A mixture's block (Mixtral): the router, and per expert N its three projections.
MOE_KEYS = {"mlp.router.weight": "block_sparse_moe.gate.weight"}
EXPERT_KEYS = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
_FROM_MOE = {hf: ours for ours, hf in MOE_KEYS.items()}
_FROM_EXPERT = {hf: ours for ours, hf in EXPERT_KEYS.items()}
_HF_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")
_HF_EXPERT = re.compile(r"block_sparse_moe\.experts\.(\d+)\.(w1|w2|w3)\.weight")
_STACKED = re.compile(r"layers\.(\d+)\.mlp\.experts\.(gate_proj|up_proj|down_proj)")
_IGNORED = re.compile(r".*\.rotary_emb\.inv_freq")  # a buffer some older exports saved

# Config fields that must hold these values, since lmforge implements only that variant.
REQUIRED = {
    "model_type": "llama",
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
}
# Config fields of variants lmforge lacks (RoPE scaling, sliding windows, mixtures of experts).
UNSUPPORTED = (
    "rope_scaling",
    "sliding_window",
    "num_local_experts",
    "num_experts",
    "n_routed_experts",
    "moe_intermediate_size",
)


# The moe_ options Mixtral cannot express: (field, the value Mixtral has, why).
_MIXTRAL_ONLY = (
    ("moe_router", "softmax", "its router is a softmax"),
    ("moe_renormalize", True, "it renormalises the top-k weights"),
    ("moe_capacity_factor", None, "it drops no tokens"),
    ("moe_shared_experts", 0, "it has no shared experts"),
    ("moe_bias_update_rate", 0.0, "it has no balance bias"),
)


# -- config -------------------------------------------------------------------------------


def hf_config(model_config: ModelConfig, eot_id: int | None = None) -> dict[str, Any]:
    """The `LlamaConfig` fields of a model (`MixtralConfig` of a mixture of experts); `eot_id`
    becomes the bos and eos token."""
    if getattr(model_config, "n_experts", 0):
        return mixtral_config(model_config, eot_id)
    c = _dense(model_config)
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": c.vocab_size,
        "hidden_size": c.d_model,
        "intermediate_size": c.ffn_dim,
        "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads,
        "num_key_value_heads": c.kv_heads,
        "head_dim": c.head_dim,
        "max_position_embeddings": c.max_seq_len,
        "rms_norm_eps": c.norm_eps,
        "rope_theta": c.rope_theta,  # read by transformers 4
        "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta},  # and by 5
        "rope_scaling": None,
        "tie_word_embeddings": c.tie_embeddings,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
        "bos_token_id": eot_id,
        "eos_token_id": eot_id,
    }


def mixtral_config(c: ModelConfig, eot_id: int | None = None) -> dict[str, Any]:
    """The `MixtralConfig` fields of a mixture of experts, refusing what Mixtral lacks.

    `router_aux_loss_coef` carries moe_aux_loss_coef as a number: transformers' loss (pooled
    over the layers, expert fractions summing to k) is not lmforge's per-layer Switch loss.
    The z-loss, a training-only knob with no Mixtral field, is not carried.
    """
    _check_mixtral(c)
    config = hf_config(replace(c, n_experts=0, **_MOE_DEFAULTS), eot_id)
    for field in ("attention_bias", "mlp_bias"):  # Llama's fields, not Mixtral's
        del config[field]
    return {
        **config,
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "intermediate_size": c.expert_ffn_dim,
        "num_local_experts": c.n_experts,
        "num_experts_per_tok": c.experts_per_token,
        "router_aux_loss_coef": c.moe_aux_loss_coef,
        "output_router_logits": False,
        "router_jitter_noise": 0.0,
        "sliding_window": None,
    }


_MOE_DEFAULTS = {f.name: f.default for f in fields(ModelConfig) if f.name.startswith("moe_")}


def _check_mixtral(c: ModelConfig) -> None:
    for field, value, why in _MIXTRAL_ONLY:
        if getattr(c, field) != value:
            raise LmforgeError(
                f"model.{field}={getattr(c, field)!r} has no MixtralForCausalLM equivalent "
                f"({why}); export a model trained with {field}={value!r}"
            )


def _dense(config: ModelConfig) -> ModelConfig:
    if getattr(config, "n_experts", 0):
        raise LmforgeError(
            f"the model is a mixture of {config.n_experts} experts, which LlamaForCausalLM "
            "cannot hold; export a dense model (model.n_experts=0)"
        )
    return config


def config_from_hf(hf: dict[str, Any], origin: str = "config.json") -> ModelConfig:
    """The ModelConfig of a Hugging Face config, refusing variants lmforge does not implement."""
    if hf.get("model_type") == "mixtral":
        return _config_from_mixtral(hf, origin)
    for field, value in REQUIRED.items():
        if hf.get(field, value) != value:
            raise LmforgeError(
                f"{origin} sets {field}={hf[field]!r}; lmforge imports Llama models with "
                f"{field}={value!r} only"
            )
    for field in UNSUPPORTED:
        if hf.get(field):
            raise LmforgeError(
                f"{origin} sets {field}; lmforge imports plain Llama models (default RoPE, full "
                "attention, dense MLP): pick a model without it"
            )
    rope = hf.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default":
        raise LmforgeError(
            f"{origin} sets rope_parameters.rope_type={rope['rope_type']!r}; lmforge imports "
            "models with the 'default' RoPE only"
        )
    try:
        d_model, n_heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
        n_kv_heads = int(hf.get("num_key_value_heads") or n_heads)
        d_ff = int(hf["intermediate_size"])
        config = ModelConfig(
            vocab_size=int(hf["vocab_size"]),
            d_model=d_model,
            n_layers=int(hf["num_hidden_layers"]),
            n_heads=n_heads,
            n_kv_heads=None if n_kv_heads == n_heads else n_kv_heads,
            d_ff=d_ff,
            max_seq_len=int(hf.get("max_position_embeddings", 2048)),
            rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
            norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        )
    except KeyError as e:
        raise LmforgeError(f"{origin} lacks the field {e.args[0]}; it is not a Llama config") from e
    except (TypeError, ValueError) as e:
        raise LmforgeError(f"{origin} has a field of the wrong type ({e}); fix the file") from e
    if d_ff == ModelConfig(d_model=d_model).ffn_dim:
        config.d_ff = None  # lmforge's default width: keep the config as lmforge writes it
    if int(hf.get("head_dim") or config.head_dim) != config.head_dim:
        raise LmforgeError(
            f"{origin} sets head_dim={hf['head_dim']}, not hidden_size / num_attention_heads = "
            f"{config.head_dim}; lmforge imports models where they agree"
        )
    config.validate()
    return config


def _config_from_mixtral(hf: dict[str, Any], origin: str) -> ModelConfig:
    """A Mixtral config: its attention and shape as Llama's, then the mixture's fields."""
    for field in ("rope_scaling", "sliding_window", "router_jitter_noise"):
        if hf.get(field):
            raise LmforgeError(
                f"{origin} sets {field}; lmforge imports Mixtral models with default RoPE, full "
                "attention and no router jitter: pick a model without it"
            )
    moe = ("num_local_experts", "num_experts", "num_experts_per_tok", "router_aux_loss_coef")
    dense = {k: v for k, v in hf.items() if k not in moe}
    config = config_from_hf({**dense, "model_type": "llama"}, origin)
    try:
        config.n_experts = int(hf.get("num_local_experts") or hf["num_experts"])
        config.experts_per_token = int(hf.get("num_experts_per_tok", 2))
        config.moe_aux_loss_coef = float(hf.get("router_aux_loss_coef") or 0.0)
    except KeyError:
        raise LmforgeError(
            f"{origin} is a Mixtral config without num_local_experts; fix the file"
        ) from None
    except (TypeError, ValueError) as e:
        raise LmforgeError(f"{origin} has a field of the wrong type ({e}); fix the file") from e
    config.validate()
    return config


# -- weights ------------------------------------------------------------------------------


def to_hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """The model's weights under Hugging Face names; a tied head is left out, as HF does.

    A mixture's stacked experts become one tensor per expert (copies: safetensors refuses
    tensors that share memory)."""
    if model.config.n_experts:
        _check_mixtral(model.config)
    state = {}
    for name, tensor in model.state_dict().items():
        if name == "output.weight" and model.config.tie_embeddings:
            continue
        stacked = _STACKED.fullmatch(name)
        if stacked:
            for n, t in enumerate(tensor.detach()):
                state[_hf_name(f"layers.{stacked[1]}.mlp.experts.{n}.{stacked[2]}.weight")] = (
                    t.clone()
                )
            continue
        state[_hf_name(name)] = tensor.detach().contiguous()
    return state


def from_hf_state_dict(state: dict[str, torch.Tensor], model_config: ModelConfig) -> Transformer:
    """A float32 Transformer holding the weights of a Hugging Face Llama (or Mixtral) state dict.

    Mixtral's experts arrive one tensor per expert, under the names of lmforge's old ModuleList
    layout, which the experts' load pre-hook stacks.
    """
    with torch.device("meta"):  # shapes only: the weights come from `state`, not a random init
        model = Transformer(model_config)
    expected = _per_expert(model.state_dict())
    family = "Mixtral" if model_config.n_experts else "Llama"
    ours = {}
    for name, tensor in state.items():
        if _IGNORED.fullmatch(name):
            continue
        key = _lmforge_name(name)
        if key is None or key not in expected:
            raise LmforgeError(
                f"unexpected tensor {name!r} for a {model_config.n_layers}-layer {family} model "
                f"without biases; lmforge imports plain {family}ForCausalLM weights only"
            )
        if tensor.shape != expected[key].shape:
            raise LmforgeError(
                f"tensor {name!r} has shape {tuple(tensor.shape)} but the config implies "
                f"{tuple(expected[key].shape)}; the weights and config.json do not match"
            )
        ours[key] = tensor.float()
    if model_config.tie_embeddings:
        ours.pop("output.weight", None)  # some writers save the shared head anyway
        if "tok_embeddings.weight" in ours:
            ours["output.weight"] = ours["tok_embeddings.weight"]
    missing = sorted(_hf_name(k) for k in expected.keys() - ours.keys())
    if missing:
        raise LmforgeError(
            f"{len(missing)} tensors missing from the weights (first: {missing[0]}); "
            "pass the complete model folder"
        )
    model.load_state_dict(ours, assign=True)
    if model_config.tie_embeddings:
        model.output.weight = model.tok_embeddings.weight
    for module in model.modules():  # buffers that are no weights (RoPE tables) are computed
        if any(b.is_meta for b in module.buffers(recurse=False)):
            module.to_empty(device="cpu", recurse=False)
            module.reset_parameters()
    return model


def _per_expert(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` with each stacked expert tensor (E, …) split into E named tensors."""
    out = {}
    for name, tensor in state.items():
        stacked = _STACKED.fullmatch(name)
        if stacked is None:
            out[name] = tensor
            continue
        for n, t in enumerate(tensor):
            out[f"layers.{stacked[1]}.mlp.experts.{n}.{stacked[2]}.weight"] = t
    return out


def _hf_name(name: str) -> str:
    if name.startswith("layers."):
        _, index, rest = name.split(".", 2)
        if rest.startswith("mlp.experts."):  # mlp.experts.N.proj.weight
            _, _, n, proj, _ = rest.split(".")
            return f"model.layers.{index}.block_sparse_moe.experts.{n}.{EXPERT_KEYS[proj]}.weight"
        return f"model.layers.{index}.{LAYER_KEYS.get(rest) or MOE_KEYS[rest]}"
    return TOP_KEYS[name]


def _lmforge_name(name: str) -> str | None:
    match = _HF_LAYER.fullmatch(name)
    if match is None:
        return _FROM_TOP.get(name)
    expert = _HF_EXPERT.fullmatch(match[2])
    if expert is not None:
        return f"layers.{match[1]}.mlp.experts.{expert[1]}.{_FROM_EXPERT[expert[2]]}.weight"
    rest = _FROM_LAYER.get(match[2]) or _FROM_MOE.get(match[2])
    return None if rest is None else f"layers.{match[1]}.{rest}"


# -- tokenizer ----------------------------------------------------------------------------


def tokenizer_files(tokenizer: Tokenizer, max_length: int) -> dict[str, dict[str, Any]]:
    """tokenizer.json, tokenizer_config.json and special_tokens_map.json as JSON objects.

    `<|endoftext|>` is both bos and eos; `tokenizer(text)` prepends it, as lmforge does for
    every prompt, and `add_special_tokens=False` gives the plain ids of `encode_ordinary`.
    `chat_template` is lmforge's own (ChatML, or the plain format of a tokenizer without
    `<|im_start|>`/`<|im_end|>`), so `apply_chat_template` builds the prompts lmforge builds.
    """
    tokenizer_json = to_json(tokenizer)
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_length,
        "clean_up_tokenization_spaces": False,
        "chat_template": ChatTemplate(tokenizer).jinja(),
    }
    specials: dict[str, Any] = {}
    if tokenizer.eot_id is not None:
        tokenizer_json["post_processor"] = _prepend(EOT, tokenizer.eot_id)
        specials = {"bos_token": EOT, "eos_token": EOT}
    others = sorted(s for s in tokenizer.special_tokens if s != EOT)
    if others:
        specials["additional_special_tokens"] = others
    return {
        "tokenizer.json": tokenizer_json,
        "tokenizer_config.json": {**config, **specials},
        "special_tokens_map.json": specials,
    }


def _prepend(token: str, token_id: int) -> dict[str, Any]:
    """A `tokenizers` TemplateProcessing that starts each sequence with `token`."""

    def special(type_id: int) -> dict[str, Any]:
        return {"SpecialToken": {"id": token, "type_id": type_id}}

    def sequence(name: str, type_id: int) -> dict[str, Any]:
        return {"Sequence": {"id": name, "type_id": type_id}}

    return {
        "type": "TemplateProcessing",
        "single": [special(0), sequence("A", 0)],
        "pair": [special(0), sequence("A", 0), special(1), sequence("B", 1)],
        "special_tokens": {token: {"id": token, "ids": [token_id], "tokens": [token]}},
    }


def _read_tokenizer(folder: Path) -> Tokenizer:
    """tokenizer.json if present (it holds the split pattern), else vocab.json + merges.txt."""
    if (folder / "tokenizer.json").is_file():
        return Tokenizer.load(folder / "tokenizer.json")
    if (folder / "vocab.json").is_file():
        return Tokenizer.load(folder)
    raise LmforgeError(
        f"{folder} has no tokenizer.json nor vocab.json + merges.txt; lmforge imports models "
        "with a byte-level BPE tokenizer in one of those files"
    )


# -- folders ------------------------------------------------------------------------------


def export_hf(model: Transformer, tokenizer: Tokenizer, out_dir: str | Path) -> Path:
    """Write a `LlamaForCausalLM` folder (`MixtralForCausalLM` for a mixture of experts), weights
    in their own dtype, that transformers loads."""
    if tokenizer.vocab_size > model.config.vocab_size:
        raise LmforgeError(
            f"the tokenizer has {tokenizer.vocab_size} ids but the model only "
            f"{model.config.vocab_size} embeddings: export a model trained with this tokenizer"
        )
    weights = {name: t.cpu() for name, t in to_hf_state_dict(model).items()}
    config = hf_config(model.config, tokenizer.eot_id)
    config["torch_dtype"] = str(next(iter(weights.values())).dtype).removeprefix("torch.")
    generation = {"bos_token_id": tokenizer.eot_id, "eos_token_id": tokenizer.eot_id}
    if tokenizer.eot_id is not None:
        generation["pad_token_id"] = tokenizer.eot_id  # no padding token: pad with eos, as GPT-2

    def write(folder: Path) -> None:
        _write_json(folder / "config.json", config)
        _write_json(folder / "generation_config.json", generation)
        save_tensors(weights, folder / WEIGHTS, metadata={"format": "pt"})
        for name, obj in tokenizer_files(tokenizer, model.config.max_seq_len).items():
            _write_json(folder / name, obj)

    return _write_folder(Path(out_dir), write)


def import_hf(path: str | Path) -> tuple[Transformer, Tokenizer]:
    """The model (float32, eval mode) and tokenizer of a Hugging Face Llama or Mixtral folder."""
    folder = Path(path)
    if not folder.is_dir():
        raise LmforgeError(
            f"Hugging Face model folder {folder} not found; pass a folder holding config.json "
            f"and {WEIGHTS}"
        )
    config = config_from_hf(_read_json(folder / "config.json"), str(folder / "config.json"))
    tokenizer = _read_tokenizer(folder)
    if tokenizer.vocab_size > config.vocab_size:
        raise LmforgeError(
            f"the tokenizer in {folder} has {tokenizer.vocab_size} ids but config.json only "
            f"vocab_size={config.vocab_size}; the tokenizer belongs to another model"
        )
    model = from_hf_state_dict(_read_weights(folder), config)
    return model.eval(), tokenizer


def import_checkpoint(hf_dir: str | Path, out_dir: str | Path) -> Path:
    """Write a Hugging Face Llama folder as an lmforge checkpoint that `lmforge.load` reads."""
    out = Path(out_dir)
    _check_new(out)
    model, tokenizer = import_hf(hf_dir)
    run = {"imported_from": str(Path(hf_dir).resolve())}

    def write(folder: Path) -> None:
        save_module(model, folder / WEIGHTS)
        _write_json(folder / "config.json", {"model": asdict(model.config), "run": run})
        tokenizer.save(folder / "tokenizer")

    return _write_folder(out, write)


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    if (folder / WEIGHTS).is_file():
        files = [folder / WEIGHTS]
    elif (folder / WEIGHTS_INDEX).is_file():
        index = _read_json(folder / WEIGHTS_INDEX)
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict):
            raise LmforgeError(f"{folder / WEIGHTS_INDEX} lacks a 'weight_map'; fix the file")
        files = [folder / name for name in sorted(set(weight_map.values()))]
    elif (folder / "pytorch_model.bin").exists():
        raise LmforgeError(
            f"{folder} holds pytorch_model.bin, which loads through pickle; convert it with "
            "transformers' save_pretrained(..., safe_serialization=True) and import that"
        )
    else:
        raise LmforgeError(f"{folder} has no {WEIGHTS} nor {WEIGHTS_INDEX}; pass a model folder")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            state.update(load_file(file))
        except (OSError, SafetensorError) as e:
            raise LmforgeError(
                f"cannot read weights {file} ({e}); download or write the file again"
            ) from None
    return state


def _check_new(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise LmforgeError(f"{out} already exists and is not empty; pass a new --out folder")


def _write_folder(out: Path, write: Callable[[Path], None]) -> Path:
    """Fill a temporary folder beside `out` with `write`, then rename it to `out`."""
    out = out.resolve()
    _check_new(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; the result is an ordinary folder
        write(tmp)
        os.replace(tmp, out)  # an empty `out` is replaced, a non-empty one was refused above
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _read_json(path: Path) -> Any:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LmforgeError(f"{path} not found; pass a Hugging Face model folder") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LmforgeError(f"{path} is not valid JSON ({e}); fix or replace it") from None
    if not isinstance(obj, dict):
        raise LmforgeError(f"{path} is not a JSON object; fix or replace it")
    return obj


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
