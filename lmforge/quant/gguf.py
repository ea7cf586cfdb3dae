"""GGUF export: an lmforge model as one llama.cpp "llama" file (f32, f16, q8_0 or q4_0), and
reading such a file back, through the `gguf` package (llama.cpp's own writer and reader).

llama.cpp's "llama" architecture rotates interleaved channel pairs (2i, 2i+1), Meta's layout,
while lmforge pairs channel i with i + head_dim/2 (rotate_half). So the rows of the q and k
projections are permuted within each head exactly as llama.cpp's convert_hf_to_gguf.py does
(`LlamaModel.permute`), which leaves every attention score unchanged; the rest is renaming.

Tensor types follow convert_hf_to_gguf.py and `llama-quantize --pure`: the 1-D norms stay f32,
every 2-D weight (token_embd and output included) takes the chosen type, and a q8_0/q4_0 tensor
whose rows are not a multiple of the 32-value block is written f16 (the file records each
tensor's type; `GGUFExport.fallbacks` names them). A tied head is left out: llama.cpp then
reuses token_embd, as it does for the models it converts.

The tokenizer is GGUF's byte-level BPE ("gpt2"): the tokens and merges of the Hugging Face
export (tokenizer/hf_json.py), special tokens as control tokens, ids the model has beyond the
tokenizer as unused "[PADi]" tokens, `<|endoftext|>` as bos and eos with bos prepended, as
lmforge does. The pre-tokenizer is named after the split pattern: "gpt-2" for GPT-2's,
"llama-bpe" for GPT-4's (Llama 3's regex, cl100k's but for possessive quantifiers).
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

from lmforge import progress
from lmforge.errors import LmforgeError
from lmforge.extras import import_extra
from lmforge.model.config import ModelConfig
from lmforge.model.transformer import Transformer
from lmforge.tokenizer import Tokenizer
from lmforge.tokenizer.chat_template import ChatTemplate
from lmforge.tokenizer.hf_json import to_json
from lmforge.tokenizer.pretokenize import GPT2_PATTERN, GPT4_PATTERN

TYPES = ("f32", "f16", "q8_0", "q4_0")
PRE_TOKENIZERS = {GPT2_PATTERN: "gpt-2", GPT4_PATTERN: "llama-bpe"}

# lmforge parameter names -> llama.cpp tensor names (without ".weight"); per block, then the rest.
LAYER_NAMES = {
    "attn_norm.weight": "attn_norm",
    "attn.q_proj.weight": "attn_q",
    "attn.k_proj.weight": "attn_k",
    "attn.v_proj.weight": "attn_v",
    "attn.o_proj.weight": "attn_output",
    "mlp_norm.weight": "ffn_norm",
    "mlp.gate_proj.weight": "ffn_gate",
    "mlp.up_proj.weight": "ffn_up",
    "mlp.down_proj.weight": "ffn_down",
}
TOP_NAMES = {"tok_embeddings.weight": "token_embd", "norm.weight": "output_norm"}
HEAD_NAME = "output"
_FROM_LAYER = {gguf: ours for ours, gguf in LAYER_NAMES.items()}
_FROM_TOP = {gguf: ours for ours, gguf in {**TOP_NAMES, "output.weight": HEAD_NAME}.items()}


@dataclass
class GGUFExport:
    """What an export wrote: the file, its type, each tensor's GGML type, the f16 fallbacks."""

    path: Path
    file_type: str
    tensor_types: dict[str, str] = field(default_factory=dict)
    fallbacks: list[str] = field(default_factory=list)


def load_gguf_package() -> ModuleType:
    """The `gguf` package, or a one-line error naming the extra that installs it."""
    return import_extra("gguf", "GGUF export", "gguf")


# -- weights ------------------------------------------------------------------------------


def permute_qk(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Rows of a q or k projection from rotate_half order to interleaved pairs, per head: row
    i + j·head_dim/2 of a head becomes row 2i + j (convert_hf_to_gguf.py's `permute`)."""
    rows = weight.shape[0]
    split = weight.reshape(n_heads, 2, rows // n_heads // 2, *weight.shape[1:])
    return split.transpose(1, 2).reshape(weight.shape)


def unpermute_qk(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The inverse of `permute_qk`: interleaved rows back to lmforge's rotate_half order."""
    rows = weight.shape[0]
    split = weight.reshape(n_heads, rows // n_heads // 2, 2, *weight.shape[1:])
    return split.transpose(1, 2).reshape(weight.shape)


def gguf_name(name: str) -> str:
    """The llama.cpp name of an lmforge parameter, e.g. layers.0.attn.q_proj.weight ->
    blk.0.attn_q.weight."""
    if name.startswith("layers."):
        _, index, rest = name.split(".", 2)
        short = LAYER_NAMES.get(rest)
        if short is not None:
            return f"blk.{index}.{short}.weight"
    elif name in TOP_NAMES or name == "output.weight":
        return f"{TOP_NAMES.get(name, HEAD_NAME)}.weight"
    raise LmforgeError(
        f"parameter {name!r} has no GGUF llama counterpart; export a plain dense lmforge model"
    )


def gguf_tensors(model: Transformer) -> dict[str, torch.Tensor]:
    """The model's weights under llama.cpp names, float32 on the CPU, q and k permuted for
    interleaved RoPE; a tied head is left out."""
    config = _dense(model.config)
    tensors = {}
    for name, tensor in model.state_dict().items():
        if name == "output.weight" and config.tie_embeddings:
            continue
        tensor = tensor.detach().float().cpu()
        if name.endswith("attn.q_proj.weight"):
            tensor = permute_qk(tensor, config.n_heads)
        elif name.endswith("attn.k_proj.weight"):
            tensor = permute_qk(tensor, config.kv_heads)
        tensors[gguf_name(name)] = tensor.contiguous()
    return tensors


def lmforge_tensors(
    tensors: dict[str, torch.Tensor], config: ModelConfig
) -> dict[str, torch.Tensor]:
    """The inverse of `gguf_tensors`: lmforge names, q and k back in rotate_half order (a tied
    head is the embedding)."""
    ours = {}
    for name, tensor in tensors.items():
        short = name.removesuffix(".weight")
        if short.startswith("blk."):
            _, index, rest = short.split(".", 2)
            key = f"layers.{index}.{_FROM_LAYER[rest]}"
        else:
            key = _FROM_TOP[short]
        if key.endswith("attn.q_proj.weight"):
            tensor = unpermute_qk(tensor, config.n_heads)
        elif key.endswith("attn.k_proj.weight"):
            tensor = unpermute_qk(tensor, config.kv_heads)
        ours[key] = tensor
    if config.tie_embeddings and "tok_embeddings.weight" in ours:
        ours.setdefault("output.weight", ours["tok_embeddings.weight"])
    return ours


def _dense(config: ModelConfig) -> ModelConfig:
    if config.n_experts:
        raise LmforgeError(
            f"the model is a mixture of {config.n_experts} experts, which lmforge's GGUF export "
            "does not write: export a dense model (model.n_experts=0)"
        )
    return config


def ggml_type(gguf: ModuleType, tensor: torch.Tensor, file_type: str) -> Any:
    """The GGMLQuantizationType a tensor is written in, in a file of type `file_type`."""
    q = gguf.GGMLQuantizationType
    if tensor.dim() < 2:
        return q.F32
    wanted = {"f32": q.F32, "f16": q.F16, "q8_0": q.Q8_0, "q4_0": q.Q4_0}[file_type]
    block = gguf.GGML_QUANT_SIZES[wanted][0]
    return wanted if tensor.shape[-1] % block == 0 else q.F16


# -- metadata -----------------------------------------------------------------------------


def _check_type(file_type: str) -> None:
    if file_type not in TYPES:
        raise LmforgeError(f"GGUF type {file_type!r} is not one of {', '.join(TYPES)}: pick one")


def _pre_tokenizer(tokenizer: Tokenizer) -> str:
    pre = PRE_TOKENIZERS.get(tokenizer.pattern)
    if pre is None:
        raise LmforgeError(
            "the tokenizer splits text with a custom pattern, for which llama.cpp has no "
            "pre-tokenizer: export a model whose tokenizer uses the gpt2 or gpt4 pattern"
        )
    return pre


def _write_metadata(writer: Any, gguf: ModuleType, config: ModelConfig, file_type: str) -> None:
    file_types = {
        "f32": "ALL_F32",
        "f16": "MOSTLY_F16",
        "q8_0": "MOSTLY_Q8_0",
        "q4_0": "MOSTLY_Q4_0",
    }
    writer.add_file_type(int(gguf.LlamaFileType[file_types[file_type]]))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_vocab_size(config.vocab_size)
    writer.add_context_length(config.max_seq_len)
    writer.add_embedding_length(config.d_model)
    writer.add_block_count(config.n_layers)
    writer.add_feed_forward_length(config.ffn_dim)
    writer.add_head_count(config.n_heads)
    writer.add_head_count_kv(config.kv_heads)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_layer_norm_rms_eps(config.norm_eps)


def _write_tokenizer(writer: Any, gguf: ModuleType, tokenizer: Tokenizer, vocab_size: int) -> None:
    hf = to_json(tokenizer)["model"]
    by_id = {i: token for token, i in hf["vocab"].items()}
    specials = set(tokenizer.special_tokens.values())
    kinds = gguf.TokenType
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")  # convert_hf_to_gguf.py's name for an id without a token
            types.append(int(kinds.UNUSED))
        else:
            tokens.append(by_id[i])
            types.append(int(kinds.CONTROL if i in specials else kinds.NORMAL))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(_pre_tokenizer(tokenizer))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(hf["merges"])
    if tokenizer.eot_id is not None:
        writer.add_bos_token_id(tokenizer.eot_id)
        writer.add_eos_token_id(tokenizer.eot_id)
    writer.add_add_bos_token(tokenizer.eot_id is not None)
    writer.add_add_eos_token(False)
    writer.add_chat_template(ChatTemplate(tokenizer).jinja())


# -- files --------------------------------------------------------------------------------


def check_new_file(out: str | Path) -> Path:
    """`out` as a Path, refused if anything is there already (nothing is ever overwritten)."""
    out = Path(out)
    if out.exists() or out.is_symlink():
        raise LmforgeError(f"{out} already exists: pass a new --out file or remove it first")
    return out


def export_gguf(
    model: Transformer,
    tokenizer: Tokenizer,
    out: str | Path,
    file_type: str = "f16",
    name: str | None = None,
) -> GGUFExport:
    """Write `model` and `tokenizer` as one GGUF file at `out` (a temporary name beside it, then
    renamed); `name` is general.name (default: the file's stem)."""
    gguf = load_gguf_package()
    _check_type(file_type)
    out = check_new_file(out)
    config = _dense(model.config)
    if tokenizer.vocab_size > config.vocab_size:
        raise LmforgeError(
            f"the tokenizer has {tokenizer.vocab_size} ids but the model only "
            f"{config.vocab_size} embeddings: export a model trained with this tokenizer"
        )
    _pre_tokenizer(tokenizer)  # refuse before any work
    tensors = gguf_tensors(model)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{secrets.token_hex(4)}.tmp")
    arch = gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA]
    writer = gguf.GGUFWriter(tmp, arch)
    result = GGUFExport(out.resolve(), file_type)
    try:
        writer.add_name(name or out.stem)
        _write_metadata(writer, gguf, config, file_type)
        _write_tokenizer(writer, gguf, tokenizer, config.vocab_size)
        for tensor_name, tensor in progress.bar(tensors.items(), desc="gguf", unit="tensor"):
            qtype = ggml_type(gguf, tensor, file_type)
            writer.add_tensor(
                tensor_name, gguf.quants.quantize(tensor.numpy(), qtype), raw_dtype=qtype
            )
            result.tensor_types[tensor_name] = qtype.name.lower()
            if tensor.dim() >= 2 and qtype.name.lower() != file_type:
                result.fallbacks.append(tensor_name)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, out)
    finally:
        writer.close()
        tmp.unlink(missing_ok=True)
    return result


def export_checkpoint_gguf(
    checkpoint: str | Path, out: str | Path, file_type: str = "f16"
) -> GGUFExport:
    """`export_gguf` of a float checkpoint; quantized and mixture-of-experts ones are refused,
    like a missing `gguf` package or an existing `out`, before the weights load."""
    from lmforge.quant.checkpoint import read_quantization
    from lmforge.train.checkpoint import load_checkpoint
    from lmforge.train.checkpoint_dir import read_model_config, resolve_checkpoint

    load_gguf_package()
    _check_type(file_type)
    out = check_new_file(out)
    source = resolve_checkpoint(checkpoint)
    if read_quantization(source) is not None:
        raise LmforgeError(
            f"{source} is an lmforge-quantized checkpoint, whose int8/int4 codes GGUF cannot "
            "hold: export its float checkpoint with --type q8_0 or q4_0"
        )
    _dense(read_model_config(source))
    model, tokenizer = load_checkpoint(source)
    return export_gguf(model, tokenizer, out, file_type)


def read_gguf(path: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A GGUF file's metadata (key -> value, arrays as lists) and its tensors, each dequantized
    by gguf.quants.dequantize to float32, shaped (rows, columns) as torch stores weights."""
    gguf = load_gguf_package()
    path = Path(path)
    if not path.is_file():
        raise LmforgeError(f"GGUF file {path} not found: pass the path of a .gguf file")
    try:
        reader = gguf.GGUFReader(path)
    except (OSError, ValueError, IndexError, KeyError) as e:
        raise LmforgeError(f"{path} is not a readable GGUF file ({e}): export it again") from None
    metadata = {
        key: value.contents() for key, value in reader.fields.items() if not key.startswith("GGUF.")
    }
    tensors = {}
    for tensor in reader.tensors:
        values = gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type)
        shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists the fastest dim first
        tensors[tensor.name] = torch.from_numpy(np.array(values, dtype=np.float32).reshape(shape))
    return metadata, tensors
