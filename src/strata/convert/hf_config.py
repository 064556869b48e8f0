"""From a transformers config.json (plus the PLE int64 buffers) to a strata Geometry.

This is the converter's half of llama.cpp's `set_gguf_parameters`: which HF field feeds which
hyperparameter. The GGUF keys themselves come from `strata.models.metadata_for`, but for the few that only the
converter writes (`converter_metadata`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf

from strata.convert.safetensors_reader import Checkpoint
from strata.errors import FormatError, InvalidArgument
from strata.models import Geometry, variant
from strata.models.common import OUTPUT_GATES, attention_interval

# transformers model_type (outer or text) -> GGUF architecture
MODEL_TYPES = {
    "qwen4_exp": "qwen4exp", "qwen4_exp_text": "qwen4exp",
    "qwen3_next": "qwen3next",
    "qwen3_5_moe": "qwen35moe", "qwen3_5_moe_text": "qwen35moe",
}
# llama.cpp's converter writes this when a qwen35-family config has no mrope_section (qwen3next.md §2.4.9)
_DEFAULT_MROPE_SECTIONS = (11, 11, 10)
_PLE_BUFFERS = ("layer_multipliers", "ngram_heads_offsets", "ngram_heads_vocab_sizes")


def load_text_config(hf_dir: Path) -> tuple[str, dict[str, Any]]:
    """(architecture, text config dict); the text_config of a multimodal wrapper is merged over the top level."""
    path = hf_dir / "config.json"
    if not path.exists():
        raise FormatError(f"{hf_dir}: no config.json")
    top = json.loads(path.read_text())
    model_type = top.get("model_type", "")
    if model_type not in MODEL_TYPES:
        raise InvalidArgument(
            f"config.json model_type {model_type!r} is not supported; expected one of {sorted(MODEL_TYPES)}")
    text = dict(top)
    text.update(top.get("text_config") or {})
    return MODEL_TYPES[model_type], text


def _rope(cfg: dict[str, Any]) -> dict[str, Any]:
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    rope.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
    rope.setdefault("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    return rope


def _require(cfg: dict[str, Any], key: str) -> Any:
    if cfg.get(key) is None:
        raise FormatError(f"config.json: required field {key!r} is missing")
    return cfg[key]


def _layer_recurrent(cfg: dict[str, Any], n_layer: int) -> tuple[bool, ...]:
    types = cfg.get("layer_types")
    if types is None:
        interval = int(cfg.get("full_attention_interval", 4))
        return tuple((i + 1) % interval != 0 for i in range(n_layer))
    if len(types) != n_layer:
        raise FormatError(f"config.json: layer_types has {len(types)} entries, num_hidden_layers is {n_layer}")
    return tuple(t == "linear_attention" for t in types)


def _common_fields(arch: str, cfg: dict[str, Any]) -> dict[str, Any]:
    n_layer = int(_require(cfg, "num_hidden_layers"))
    head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
    rope = _rope(cfg)
    if arch == "qwen3next":
        sections: tuple[int, ...] = ()
    else:
        sections = tuple(int(s) for s in (rope.get("mrope_section") or _DEFAULT_MROPE_SECTIONS))
        sections = (sections + (0, 0, 0, 0))[:4]
    return dict(
        arch=arch, n_layer=n_layer, n_embd=int(_require(cfg, "hidden_size")),
        n_vocab=int(_require(cfg, "vocab_size")), context_length=int(cfg.get("max_position_embeddings", 0)),
        n_head=int(_require(cfg, "num_attention_heads")), n_head_kv=int(_require(cfg, "num_key_value_heads")),
        head_dim=head_dim, rope_dim=int(head_dim * float(rope["partial_rotary_factor"])),
        rope_theta=float(rope["rope_theta"]), rope_sections=sections,
        rms_eps=float(cfg.get("rms_norm_eps", 1e-6)), recurrent=_layer_recurrent(cfg, n_layer),
        ssm_n_k_heads=int(_require(cfg, "linear_num_key_heads")),
        ssm_n_v_heads=int(_require(cfg, "linear_num_value_heads")),
        ssm_head_k_dim=int(_require(cfg, "linear_key_head_dim")),
        ssm_head_v_dim=int(_require(cfg, "linear_value_head_dim")),
        ssm_conv_kernel=int(cfg.get("linear_conv_kernel_dim", 4)),
        n_expert=int(_require(cfg, "num_experts")), n_expert_used=int(_require(cfg, "num_experts_per_tok")),
        expert_ff=int(_require(cfg, "moe_intermediate_size")),
        shared_ff=int(_require(cfg, "shared_expert_intermediate_size")),
        hc_count=0, hc_rank=0, indexer_n_heads=0, indexer_head_dim=0, indexer_top_k=0, compress_ratios=(),
        ple_layers=(), ple_ngram=0, ple_heads_per_ngram=0, ple_conv_kernel=0, ple_eos=0, ple_head_dim=0,
        ple_multipliers=(), ple_head_offsets=(), ple_head_sizes=(), ple_rows=0, **variant(arch),
    )


def ple_table_names(ckpt: Checkpoint, layer: int) -> list[str]:
    """The checkpoint names of layer `layer`'s n-gram table: shards in numeric order, or the single tensor."""
    prefix = f"layers.{layer}.ple.ple_embedding.ngram_embedding."
    shards: dict[int, str] = {}
    single = None
    for name in ckpt.names():
        at = name.find(prefix)
        if at < 0:
            continue
        rest = name[at + len(prefix):]
        if rest == "weight":
            single = name
        elif rest.startswith("shard_") and rest.endswith(".weight"):
            shards[int(rest[len("shard_"):-len(".weight")])] = name
    if shards:
        order = sorted(shards)
        if order != list(range(len(order))):
            raise FormatError(f"PLE table of layer {layer}: shard indices {order} are not 0..{len(order) - 1}")
        return [shards[i] for i in order]
    if single is None:
        raise FormatError(f"PLE table of layer {layer}: no tensor named {prefix}weight or {prefix}shard_*.weight")
    return [single]


def _find(ckpt: Checkpoint, suffix: str) -> str:
    hits = [n for n in ckpt.names() if n.endswith(suffix) and not n.startswith("mtp.")]
    if len(hits) != 1:
        raise FormatError(f"checkpoint: expected exactly one tensor ending {suffix!r}, found {hits}")
    return hits[0]


def _qwen4exp_fields(cfg: dict[str, Any], ckpt: Checkpoint, fields: dict[str, Any]) -> None:
    recurrent = fields["recurrent"]
    ratio = int(cfg.get("indexer_compress_ratio") or 0)
    ple_layers = tuple(int(i) - 1 for i in cfg.get("ple_layer_ids") or ())
    n_heads = (int(cfg.get("ngram_size", 3)) - 1) * int(cfg.get("heads_per_ngram", 8))
    eos = cfg.get("eos_token_id")
    # transformers' Qwen4ExpTextRMSNormGated(activation=output_gate_type or hidden_act)
    gate = cfg.get("output_gate_type") or cfg.get("hidden_act", "silu")
    if gate not in OUTPUT_GATES:
        raise FormatError(f"config.json: output_gate_type {gate!r} is none of {', '.join(OUTPUT_GATES)}")
    fields.update(
        gdn_sigmoid_gate=OUTPUT_GATES[gate],
        hc_count=int(cfg.get("hc_count", 4)), hc_rank=int(cfg.get("hc_lowrank", 320)),
        indexer_n_heads=int(cfg.get("indexer_n_heads") or 0), indexer_head_dim=int(cfg.get("indexer_head_dim") or 0),
        indexer_top_k=int(cfg.get("indexer_budget") or 0),
        # The ratio goes on every attention layer: a re-saved config says "qwen_sparse_attention", and
        # keying on the raw "full_attention" string would silently turn QSA off (qwen4exp.md §5.3).
        compress_ratios=tuple(0 if r else ratio for r in recurrent),
        ple_layers=ple_layers,
    )
    if not ple_layers:
        return
    layer = ple_layers[0]
    # Read the int64 constants straight from the checkpoint: a float round-trip would corrupt 45-bit values.
    ints = [ckpt.read_int(_find(ckpt, f"layers.{layer}.ple.ple_embedding.{b}")) for b in _PLE_BUFFERS]
    table = ple_table_names(ckpt, layer)
    widths = {ckpt.shape(n)[1] for n in table}
    if len(widths) != 1:
        raise FormatError(f"PLE table of layer {layer}: shards have different row widths {sorted(widths)}")
    fields.update(
        ple_ngram=int(cfg.get("ngram_size", 3)), ple_heads_per_ngram=int(cfg.get("heads_per_ngram", 8)),
        ple_conv_kernel=int(cfg.get("ple_conv_kernel_size", 4)),
        # llama.cpp writes eos[-1] for a list (qwen4exp.md §5.4)
        ple_eos=int(eos[-1] if isinstance(eos, list) else _require(cfg, "eos_token_id")),
        ple_head_dim=int(cfg.get("ple_embed_dim") or fields["n_embd"]) // n_heads,
        ple_multipliers=tuple(int(v) for v in ints[0]), ple_head_offsets=tuple(int(v) for v in ints[1]),
        ple_head_sizes=tuple(int(v) for v in ints[2]), ple_rows=sum(ckpt.shape(n)[0] for n in table),
    )


def mtp_blocks(cfg: dict[str, Any], ckpt: Checkpoint) -> int:
    """The MTP blocks a checkpoint carries (config `mtp_num_hidden_layers`, or `num_nextn_predict_layers`, and its
    `mtp.*` tensors), for a conversion that keeps them; FormatError where it has none or more than strata maps."""
    n = int(cfg.get("mtp_num_hidden_layers") or cfg.get("num_nextn_predict_layers") or 0)
    has = any(name.startswith(("mtp.", "model.mtp.", "model.language_model.mtp.")) for name in ckpt.names())
    if n == 0 or not has:
        raise FormatError("the checkpoint has no MTP block to keep (config.json mtp_num_hidden_layers is "
                          f"{n}; {'some' if has else 'no'} mtp.* tensors)")
    if n != 1:
        raise FormatError(f"config.json: mtp_num_hidden_layers is {n}; strata converts a checkpoint of one MTP "
                          "block (the layout llama.cpp's converter writes)")
    return n


def converter_metadata(arch: str, cfg: dict[str, Any], g: Geometry) -> list[tuple[str, Any, gguf.GGUFValueType]]:
    """Keys llama.cpp's converter writes from config.json beyond those of strata.models.metadata_for: the dense
    FFN size a MoE config still carries (qwen3next) and qwen4exp's PLE stand-in for image placeholder tokens,
    which strata's engines never read; and qwen4exp's layer types as a per-layer list beside the interval (the
    list is read first; where no interval reproduces them, metadata_for writes the list alone)."""
    U32 = gguf.GGUFValueType.UINT32
    items = []
    if cfg.get("intermediate_size") is not None:
        items.append((f"{arch}.feed_forward_length", int(cfg["intermediate_size"]), U32))
    if arch == "qwen4exp" and cfg.get("ple_layer_ids") and cfg.get("image_token_id") is not None:
        items.append((f"{arch}.ple.image_token_id", int(cfg["image_token_id"]), U32))
    if arch == "qwen4exp" and cfg.get("layer_types") is not None and attention_interval(g) is not None:
        # one entry per block, as llama.cpp's loader reads it: an MTP block's is False (attention)
        items.append((f"{arch}.attention.recurrent_layers", [*g.recurrent, *[False] * g.n_mtp],
                      gguf.GGUFValueType.BOOL))
    return items


def geometry_fields(arch: str, cfg: dict[str, Any], ckpt: Checkpoint) -> dict[str, Any]:
    """Keyword arguments of strata.models.Geometry for this checkpoint."""
    fields = _common_fields(arch, cfg)
    if arch == "qwen4exp":
        _qwen4exp_fields(cfg, ckpt, fields)
    return fields
