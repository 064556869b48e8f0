"""Where each GGUF tensor comes from in a transformers checkpoint, and how it is transformed.

`tensor_source(src, name)` returns an iterator of float32 pieces that, concatenated in order, form the
GGUF tensor in numpy (reversed-ne) order. Large tensors (stacked experts, the PLE table) come in pieces
so that the converter never holds a whole one in memory.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import numpy as np

from strata.convert import transforms as tf
from strata.convert.hf_config import ple_table_names
from strata.convert.safetensors_reader import Checkpoint
from strata.errors import FormatError

# Rows per piece of the PLE table: 64 Mi elements keeps a piece at 256 MB of float32 whatever the width.
_PLE_PIECE_ELEMENTS = 64 * 1024 * 1024


class HFSource:
    """A checkpoint seen through the converter's prefix rule: `model.language_model.` / `model.` are stripped."""

    def __init__(self, ckpt: Checkpoint, geometry):
        self.ckpt = ckpt
        self.g = geometry
        names = ckpt.names()
        self.prefix = "model.language_model." if any(n.startswith("model.language_model.") for n in names) else "model."

    def name(self, short: str) -> str:
        return short if short.startswith("lm_head.") else self.prefix + short

    def has(self, short: str) -> bool:
        return self.name(short) in self.ckpt

    def f32(self, short: str, index: int | None = None) -> np.ndarray:
        return self.ckpt.read_f32(self.name(short), index)


Recipe = Callable[[HFSource, int], Iterator[np.ndarray]]


def _one(fn: Callable[[HFSource, str], np.ndarray]) -> Recipe:
    """A recipe that yields one array computed from `L` = "layers.N."."""
    def recipe(src: HFSource, layer: int) -> Iterator[np.ndarray]:
        yield fn(src, f"layers.{layer}.")
    return recipe


def _plain(suffix: str) -> Recipe:
    return _one(lambda s, L: s.f32(L + suffix))


def _gamma(suffix: str) -> Recipe:
    return _one(lambda s, L: tf.gamma_plus_one(s.f32(L + suffix)))


# ---- MoE: per-expert checkpoints (what save_pretrained writes) or packed gate_up_proj/down_proj ----

def _experts(part: str) -> Recipe:
    """part is "gate", "up" or "down"; yields one expert at a time in expert order."""
    def recipe(src: HFSource, layer: int) -> Iterator[np.ndarray]:
        base = f"layers.{layer}.mlp.experts."
        packed = base + ("down_proj" if part == "down" else "gate_up_proj")
        n_expert, ff = src.g.n_expert, src.g.expert_ff
        for e in range(n_expert):
            if src.has(packed):
                w = src.f32(packed, e)
                if part == "down":
                    yield w
                else:  # [2*ff, n_embd]: gate rows first, then up
                    if w.shape[0] != 2 * ff:
                        raise FormatError(f"{src.name(packed)}[{e}] has {w.shape[0]} rows, expected 2 x {ff}")
                    yield w[:ff] if part == "gate" else w[ff:]
            else:
                yield src.f32(f"{base}{e}.{part}_proj.weight")
    return recipe


# ---- Gated DeltaNet, qwen35 layout (separate projections, V heads reordered to tiled) ----

def _v_rows(suffix: str) -> Recipe:
    """A projection whose rows are V heads only (in_proj_z/_a/_b), reordered."""
    return _one(lambda s, L: tf.grouped_to_tiled(s.f32(L + suffix), s.g.ssm_n_k_heads, s.g.ssm_n_v_heads))


def _key_dim(g) -> int:
    return g.ssm_n_k_heads * g.ssm_head_k_dim


def _qkv35(s: HFSource, L: str) -> np.ndarray:
    return tf.reorder_v_rows(s.f32(L + "linear_attn.in_proj_qkv.weight"), 2 * _key_dim(s.g),
                             s.g.ssm_n_k_heads, s.g.ssm_n_v_heads)


def _conv35(s: HFSource, L: str) -> np.ndarray:
    return tf.reorder_v_rows(tf.squeeze_conv(s.f32(L + "linear_attn.conv1d.weight")), 2 * _key_dim(s.g),
                             s.g.ssm_n_k_heads, s.g.ssm_n_v_heads)


def _out35(s: HFSource, L: str) -> np.ndarray:
    return tf.grouped_to_tiled(s.f32(L + "linear_attn.out_proj.weight"), s.g.ssm_n_k_heads, s.g.ssm_n_v_heads, axis=1)


def _heads35(suffix: str, fn: Callable[[np.ndarray], np.ndarray] = lambda x: x) -> Recipe:
    """A per-V-head vector (A_log, dt_bias), reordered, then transformed."""
    return _one(lambda s, L: fn(tf.grouped_to_tiled(s.f32(L + suffix), s.g.ssm_n_k_heads, s.g.ssm_n_v_heads)))


# ---- qwen3next: fused in_proj_qkvz split, in_proj_ba kept whole, HF head order kept ----

def _qkvz(s: HFSource, L: str) -> tuple[np.ndarray, np.ndarray]:
    g = s.g
    return tf.split_qkvz(s.f32(L + "linear_attn.in_proj_qkvz.weight"), g.ssm_n_k_heads, g.ssm_head_k_dim,
                         g.ssm_n_v_heads, g.ssm_head_v_dim)


def _indexer_qk(rows: str) -> Recipe:
    """index_qk_proj = [q: n_heads*head_dim rows | k: head_dim rows]."""
    def fn(s: HFSource, L: str) -> np.ndarray:
        w = s.f32(L + "self_attn.indexer.index_qk_proj.weight")
        n_q = s.g.indexer_n_heads * s.g.indexer_head_dim
        if w.shape[0] != n_q + s.g.indexer_head_dim:
            raise FormatError(f"{s.name(L + 'self_attn.indexer.index_qk_proj.weight')} has {w.shape[0]} rows, "
                              f"expected {n_q} + {s.g.indexer_head_dim}")
        return w[:n_q] if rows == "q" else w[n_q:]
    return _one(fn)


_COMMON: dict[str, Recipe] = {
    "ffn_gate_inp.weight": _plain("mlp.gate.weight"),
    "ffn_gate_exps.weight": _experts("gate"),
    "ffn_up_exps.weight": _experts("up"),
    "ffn_down_exps.weight": _experts("down"),
    "ffn_gate_inp_shexp.weight": _plain("mlp.shared_expert_gate.weight"),
    "ffn_gate_shexp.weight": _plain("mlp.shared_expert.gate_proj.weight"),
    "ffn_up_shexp.weight": _plain("mlp.shared_expert.up_proj.weight"),
    "ffn_down_shexp.weight": _plain("mlp.shared_expert.down_proj.weight"),
    "attn_q.weight": _plain("self_attn.q_proj.weight"),
    "attn_k.weight": _plain("self_attn.k_proj.weight"),
    "attn_v.weight": _plain("self_attn.v_proj.weight"),
    "attn_output.weight": _plain("self_attn.o_proj.weight"),
    "attn_q_norm.weight": _gamma("self_attn.q_norm.weight"),
    "attn_k_norm.weight": _gamma("self_attn.k_norm.weight"),
    "ssm_norm.weight": _plain("linear_attn.norm.weight"),  # the gated norm's weight is plain: no +1
}

_NORMED_RESIDUAL: dict[str, Recipe] = {
    "attn_norm.weight": _gamma("input_layernorm.weight"),
    "post_attention_norm.weight": _gamma("post_attention_layernorm.weight"),
}

_GDN35: dict[str, Recipe] = {
    "attn_qkv.weight": _one(_qkv35),
    "attn_gate.weight": _v_rows("linear_attn.in_proj_z.weight"),
    "ssm_beta.weight": _v_rows("linear_attn.in_proj_b.weight"),
    "ssm_alpha.weight": _v_rows("linear_attn.in_proj_a.weight"),
    "ssm_conv1d.weight": _one(_conv35),
    "ssm_dt.bias": _heads35("linear_attn.dt_bias"),
    "ssm_a": _heads35("linear_attn.A_log", tf.decay_from_a_log),
    "ssm_out.weight": _one(_out35),
}

_GDN_NEXT: dict[str, Recipe] = {
    "attn_qkv.weight": _one(lambda s, L: _qkvz(s, L)[0]),
    "attn_gate.weight": _one(lambda s, L: _qkvz(s, L)[1]),
    "ssm_ba.weight": _plain("linear_attn.in_proj_ba.weight"),
    "ssm_conv1d.weight": _one(lambda s, L: tf.squeeze_conv(s.f32(L + "linear_attn.conv1d.weight"))),
    "ssm_dt.bias": _plain("linear_attn.dt_bias"),
    "ssm_a": _one(lambda s, L: tf.decay_from_a_log(s.f32(L + "linear_attn.A_log"))),
    "ssm_out.weight": _plain("linear_attn.out_proj.weight"),
}


def _hc(gguf_kind: str, hf_kind: str) -> dict[str, Recipe]:
    return {
        f"hc_{gguf_kind}_norm.weight": _gamma(f"{hf_kind}_hyper_connection.hc_norm.weight"),
        f"hc_{gguf_kind}_down.weight": _plain(f"{hf_kind}_hyper_connection.input_mix_weight_down.weight"),
        f"hc_{gguf_kind}_up.weight": _plain(f"{hf_kind}_hyper_connection.input_mix_weight_up.weight"),
        f"hc_{gguf_kind}_inject.weight": _plain(f"{hf_kind}_hyper_connection.block_inject_weight.weight"),
    }


_QWEN4EXP_ONLY: dict[str, Recipe] = {
    **_hc("attn", "attn"), **_hc("ffn", "mlp"),
    "indexer.q_proj.weight": _indexer_qk("q"),
    "indexer.k_proj.weight": _indexer_qk("k"),
    "indexer.q_norm.weight": _gamma("self_attn.indexer.q_layernorm.weight"),
    "indexer.k_norm.weight": _gamma("self_attn.indexer.k_layernorm.weight"),
    "ple_key.weight": _plain("ple.key_proj.weight"),
    "ple_value.weight": _plain("ple.value_proj.weight"),
    # these norm names do not end in "norm.weight" in HF; llama.cpp adds the 1 explicitly
    "ple_norm_key.weight": _gamma("ple.norm_key.weight"),
    "ple_norm_query.weight": _gamma("ple.norm_query.weight"),
    "ple_norm_conv.weight": _gamma("ple.norm_conv.weight"),
    "ple_conv1d.weight": _one(lambda s, L: tf.squeeze_conv(s.f32(L + "ple.conv1d.weight"))),  # not reordered
}

LAYER_RECIPES: dict[str, dict[str, Recipe]] = {
    "qwen4exp": {**_COMMON, **_GDN35, **_QWEN4EXP_ONLY},
    "qwen35moe": {**_COMMON, **_NORMED_RESIDUAL, **_GDN35},
    "qwen3next": {**_COMMON, **_NORMED_RESIDUAL, **_GDN_NEXT},
}


class MtpSource(HFSource):
    """The checkpoint's MTP block seen as layer n_layer, so that the main layers' recipes map it: `layers.{n_layer}.X`
    is `mtp.layers.0.X`, and `mtp.*` is read at the top level (the released checkpoints) or under the model's
    prefix."""

    def __init__(self, base: HFSource):
        self.ckpt, self.g, self.prefix = base.ckpt, base.g, base.prefix
        self._layer = f"layers.{base.g.n_layer}."

    def name(self, short: str) -> str:
        if short.startswith(self._layer):
            short = "mtp.layers.0." + short[len(self._layer):]
        if not short.startswith("mtp."):
            return super().name(short)
        return short if short in self.ckpt or self.prefix + short not in self.ckpt else self.prefix + short


def _mtp_plain(name: str) -> Recipe:
    return _one(lambda s, L: s.f32(name))


def _mtp_gamma(name: str) -> Recipe:
    return _one(lambda s, L: tf.gamma_plus_one(s.f32(name)))


# The MTP block's own tensors (docs/speculative.md, "MTP drafts"); the rest of the block is a main layer's, mapped by
# LAYER_RECIPES through MtpSource. Its norms take the +1 as the main layers' do.
_MTP_NEXT: dict[str, Recipe] = {
    "nextn.eh_proj.weight": _mtp_plain("mtp.fc.weight"),
    "nextn.enorm.weight": _mtp_gamma("mtp.pre_fc_norm_embedding.weight"),
    "nextn.hnorm.weight": _mtp_gamma("mtp.pre_fc_norm_hidden.weight"),
    "nextn.shared_head_norm.weight": _mtp_gamma("mtp.norm.weight"),
}

_MTP_QWEN4EXP: dict[str, Recipe] = {
    # fc_embedding and fc_hidden side by side: the input's embedding columns first (qwen4exp.md §7.1)
    "nextn.eh_proj.weight": _one(lambda s, L: np.concatenate(
        [s.f32("mtp.fc_embedding.weight"), s.f32("mtp.fc_hidden.weight")], axis=1)),
    "nextn.enorm.weight": _mtp_gamma("mtp.pre_fc_norm_embedding.weight"),
    "nextn.hnorm.weight": _mtp_gamma("mtp.pre_fc_norm_hidden.weight"),
    "nextn.hc_head_norm.weight": _mtp_gamma("mtp.hyper_connection_mixer.hc_norm.weight"),
    "nextn.hc_head_down.weight": _mtp_plain("mtp.hyper_connection_mixer.input_mix_weight_down.weight"),
    "nextn.hc_head_up.weight": _mtp_plain("mtp.hyper_connection_mixer.input_mix_weight_up.weight"),
}

MTP_RECIPES: dict[str, dict[str, Recipe]] = {
    "qwen4exp": {**LAYER_RECIPES["qwen4exp"], **_MTP_QWEN4EXP},
    "qwen35moe": {**LAYER_RECIPES["qwen35moe"], **_MTP_NEXT},
    "qwen3next": {**LAYER_RECIPES["qwen3next"], **_MTP_NEXT},
}


def _output(src: HFSource) -> Iterator[np.ndarray]:
    # a tied checkpoint has no lm_head; llama.cpp's loader would reuse token_embd, the file still needs it here
    yield src.f32("lm_head.weight" if src.has("lm_head.weight") else "embed_tokens.weight")


def _ple_table(src: HFSource) -> Iterator[np.ndarray]:
    """The n-gram table: shards concatenated in numeric order, streamed a bounded number of rows at a time."""
    layer = src.g.ple_layers[0]
    for name in ple_table_names(src.ckpt, layer):
        rows, width = src.ckpt.shape(name)
        step = max(1, _PLE_PIECE_ELEMENTS // width)
        for start in range(0, rows, step):
            yield src.ckpt.read_f32(name, slice(start, start + step))


GLOBAL_RECIPES: dict[str, Callable[[HFSource], Iterator[np.ndarray]]] = {
    "token_embd.weight": lambda s: iter([s.f32("embed_tokens.weight")]),
    "output.weight": _output,
    "output_norm.weight": lambda s: iter([tf.gamma_plus_one(s.f32("norm.weight"))]),
    "output_hc_norm.weight": lambda s: iter([tf.gamma_plus_one(s.f32("hyper_connection_mixer.hc_norm.weight"))]),
    "output_hc_down.weight": lambda s: iter([s.f32("hyper_connection_mixer.input_mix_weight_down.weight")]),
    "output_hc_up.weight": lambda s: iter([s.f32("hyper_connection_mixer.input_mix_weight_up.weight")]),
    "per_layer_token_embd.weight": _ple_table,
}

_LAYER_NAME = re.compile(r"^blk\.(\d+)\.(.+)$")


def tensor_source(src: HFSource, name: str) -> Iterator[np.ndarray]:
    """The pieces of GGUF tensor `name` for architecture src.g.arch; FormatError if no recipe knows it."""
    m = _LAYER_NAME.match(name)
    if m is None:
        recipe = GLOBAL_RECIPES.get(name)
        if recipe is None:
            raise FormatError(f"converter has no source for global tensor {name!r} ({src.g.arch})")
        return recipe(src)
    layer, suffix = int(m.group(1)), m.group(2)
    if src.g.n_mtp and layer == src.g.n_layer:  # the MTP block
        src, recipes = MtpSource(src), MTP_RECIPES[src.g.arch]
    else:
        recipes = LAYER_RECIPES[src.g.arch]
    recipe = recipes.get(suffix)
    if recipe is None:
        raise FormatError(f"converter has no source for tensor {name!r} ({src.g.arch})")
    return recipe(src, layer)
