"""The numpy oracle forward pass of qwen4exp, qwen3next and qwen35moe (transformers semantics)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from strata.errors import InvalidArgument
from strata.options import KV, check_defer_experts
from strata.reference import kv_formats
from strata.reference.attention import AttentionShape, KvState, gated_attention
from strata.reference.gdn import GdnShape, GdnState, gdn_forward
from strata.reference.hc import hc_read, hc_write
from strata.reference.moe import moe_forward
from strata.reference.ops import rms_norm, rope_tables
from strata.reference.ple import PleState, ple_forward
from strata.reference.qsa import IndexerShape, IndexerState, qsa_select
from strata.reference.weights import FileWeights, Weights


def _written(streams: np.ndarray, inj: np.ndarray | None, y: np.ndarray) -> np.ndarray:
    """A block output y [T, n] written back: with hyper-connections by the injection weights inj [T, hc], else
    added to the one stream."""
    return hc_write(streams, inj, y) if inj is not None else (streams + y[:, None, :]).astype(np.float32)


def _checked_steering(vectors: Mapping[int, np.ndarray], n_layer: int, n_embd: int) -> dict[int, np.ndarray]:
    checked = {}
    for layer, vector in vectors.items():
        vector = np.asarray(vector, dtype=np.float32)
        if not 0 <= layer < n_layer or vector.shape != (n_embd,):
            raise InvalidArgument(f"control vector for layer {layer}: need a layer in 0..{n_layer - 1} and "
                                  f"shape ({n_embd},), got shape {vector.shape}")
        checked[layer] = vector
    return checked


@dataclass(frozen=True)
class Deferred:
    """A layer's deferred expert row [T, n] and that layer's own FFN write-back weights (None: one stream)."""

    inj: np.ndarray | None
    row: np.ndarray

    def added_to(self, streams: np.ndarray) -> np.ndarray:
        return _written(streams, self.inj, self.row)


class Reference:
    """Token-stateful float oracle: `forward(ids)` continues the sequence; `reset()` starts a new one.

    Build it from a strata.format.ModelFile, or from `geometry=` (a strata.models.Geometry) and `weights=`
    (GGUF-named float32 arrays, numpy shape = reversed ggml ne). With `activation_quant`, every weight product
    uses strata.quant.matvec (the q8_32 activation contract of docs/forms.md); with `kv` (a strata.KV), the
    attention caches hold their rows as a session's cache of that format does (strata.reference.kv_formats),
    else as computed (float32). With `defer_experts` d > 0, the d routed experts of lowest weight of every layer
    but the last reach the streams one layer late, as the GPU engine's decode token applies them
    (docs/session.md, "Expert deferral"): layer l's deferred row is added with l's own write-back weights
    just before layer l + 1's MoE output. It applies to every token forward() runs (this oracle has no
    separate prompt path). `control_vectors` ({layer: float32 [n_embd]}, strata.control_vectors.steering_table)
    are added to those layers' outputs, on every stream, after the layer's last write (llama.cpp's build_cvec).
    """

    def __init__(self, model_file: Any = None, *, geometry: Any = None,
                 weights: Mapping[str, np.ndarray] | None = None, activation_quant: bool = False,
                 kv: KV | str | None = None, defer_experts: int = 0,
                 control_vectors: Mapping[int, np.ndarray] | None = None):
        if (model_file is None) == (geometry is None or weights is None):
            raise InvalidArgument("Reference wants either a model file or both geometry= and weights=")
        if model_file is not None:
            self.geometry = model_file.geometry
            self.weights: Weights = FileWeights(model_file, activation_quant=activation_quant)
        else:
            self.geometry = geometry
            self.weights = Weights(weights, activation_quant=activation_quant)
        g = self.geometry
        self.is_hc = g.has_hyper_connections
        self._gdn_shape = GdnShape(g.ssm_n_k_heads, g.ssm_n_v_heads, g.ssm_head_k_dim, g.ssm_head_v_dim,
                                   g.ssm_conv_kernel, tiled_heads=g.gdn_tiled_heads,
                                   interleaved_ba=g.gdn_interleaved_ba, sigmoid_gate=g.gdn_sigmoid_gate)
        self._attn_shape = AttentionShape(g.n_head, g.n_head_kv, g.head_dim)
        self._kv = None if kv is None else KV.parse(kv)
        if self._kv is not None and g.attention_layers and g.head_dim % kv_formats.GROUP:
            raise InvalidArgument(f"kv={self._kv.value}: head_dim {g.head_dim} is not a multiple of "
                                  f"{kv_formats.GROUP} (KV groups)")
        self._ple_shape = g.ple
        self.defer_experts = check_defer_experts(defer_experts, g.n_expert_used)
        self.control_vectors = _checked_steering(control_vectors or {}, g.n_layer, g.n_embd)
        self.reset()

    def set_control_vectors(self, vectors: Mapping[int, np.ndarray]) -> None:
        """The control vectors ({layer: float32 [n_embd]}) added from the next forward on; the state is kept."""
        g = self.geometry
        self.control_vectors = _checked_steering(vectors, g.n_layer, g.n_embd)

    def _indexer_shape(self, layer: int) -> IndexerShape | None:
        g = self.geometry
        if not (g.qsa_block and self.weights.has(f"blk.{layer}.indexer.q_proj.weight")):
            return None
        return IndexerShape(g.indexer_n_heads, g.indexer_head_dim, g.qsa_ratio(layer), g.indexer_top_k, g.rope_dim,
                            g.rope_theta)

    def reset(self) -> None:
        """Forget the sequence: every per-layer state back to empty."""
        g = self.geometry
        self.n_past = 0
        self.last_hidden: np.ndarray | None = None  # [T, n] the normed rows the LM head read last (MTP input)
        # [T, streams * n] the residual streams the final norm or mixer read last (qwen4exp's MTP input)
        self.last_streams: np.ndarray | None = None
        self.state: list[dict[str, Any]] = []
        width = g.hc_count * g.n_embd
        for layer in range(g.n_layer):
            st: dict[str, Any] = {}
            if g.recurrent[layer]:
                st["gdn"] = GdnState(self._gdn_shape)
            else:
                st["kv"] = KvState(self._attn_shape, self._kv)
                shape = self._indexer_shape(layer)
                if shape is not None:
                    st["indexer"] = IndexerState(shape)
            if self._ple_shape is not None and layer in tuple(g.ple_layers):
                st["ple"] = PleState(self._ple_shape, width)
            self.state.append(st)

    def forward(self, token_ids: Sequence[int] | np.ndarray, dump: bool = False):
        """Logits [len(token_ids), vocab] float32 for the next tokens of the sequence.

        With `dump`, returns (logits, per-layer list of dicts): "mixer_out" [T, n], "streams_after_mixer" and
        "streams_after_ffn" [T, streams, n] (1 stream for qwen3next/qwen35moe; the layer's output, its control
        vector added), "router_ids"/"router_weights"
        [T, k], on QSA layers "qsa_blocks" and "qsa_scores" (per row: chosen block indices, scores of every complete
        block), on the PLE layer "ple_out" [T, hc, n].
        """
        g = self.geometry
        ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        if ids.size == 0:
            raise InvalidArgument("forward needs at least one token id, got none")
        if ids.min() < 0 or ids.max() >= g.n_vocab:
            raise InvalidArgument(f"token ids must lie in [0, {g.n_vocab}), got [{ids.min()}, {ids.max()}]")
        if self.n_past + ids.size > g.context_length:
            raise InvalidArgument(f"sequence of {self.n_past + ids.size} tokens exceeds the context length "
                                  f"{g.context_length}")
        positions = self.n_past + np.arange(ids.size)
        cos, sin = rope_tables(positions, g.rope_dim, g.rope_theta)
        dumps: list[dict[str, Any]] = []
        hidden = self.weights.rows("token_embd.weight", ids)
        if self.is_hc:
            streams = np.repeat(hidden[:, None, :], g.hc_count, axis=1)
        else:
            streams = hidden[:, None, :]
        deferred: Deferred | None = None
        for layer in range(g.n_layer):
            d: dict[str, Any] = {}
            streams, deferred = self._layer(layer, streams, ids, positions, cos, sin, d, deferred)
            dumps.append(d)
        logits = self._head(streams)
        self.n_past += ids.size
        return (logits, dumps) if dump else logits

    def _mixer(self, layer: int, x: np.ndarray, positions: np.ndarray, cos: np.ndarray, sin: np.ndarray,
               d: dict[str, Any]) -> np.ndarray:
        g, st = self.geometry, self.state[layer]
        if "gdn" in st:
            return gdn_forward(self.weights, layer, x, st["gdn"], self._gdn_shape, g.rms_eps)
        selected = None
        if "indexer" in st:
            selected, d["qsa_blocks"], d["qsa_scores"] = qsa_select(self.weights, layer, x, positions, st["indexer"],
                                                   self._indexer_shape(layer), cos, sin, g.rms_eps)
        return gated_attention(self.weights, layer, x, st["kv"], self._attn_shape, cos, sin, g.rms_eps, selected)

    def _layer(self, layer: int, streams: np.ndarray, ids: np.ndarray, positions: np.ndarray, cos: np.ndarray,
               sin: np.ndarray, d: dict[str, Any], earlier: Deferred | None) -> tuple[np.ndarray, Deferred | None]:
        """The streams after `layer`, and what it defers to the next layer; `earlier`: the layer before's."""
        g, w, st = self.geometry, self.weights, self.state[layer]
        b = f"blk.{layer}."
        if "ple" in st:
            d["ple_out"] = ple_forward(w, layer, streams, ids, st["ple"], self._ple_shape, g.rms_eps)
            streams = (streams + d["ple_out"]).astype(np.float32)
        if self.is_hc:
            x, inj = hc_read(w, b + "hc_attn", streams, g.rms_eps)
            y = self._mixer(layer, x, positions, cos, sin, d)
            streams = hc_write(streams, inj, y)
        else:
            x = rms_norm(streams[:, 0], w.get(b + "attn_norm.weight"), g.rms_eps).astype(np.float32)
            y = self._mixer(layer, x, positions, cos, sin, d)
            streams = (streams + y[:, None, :]).astype(np.float32)
        d["mixer_out"], d["streams_after_mixer"] = y, streams
        if self.is_hc:
            x, inj = hc_read(w, b + "hc_ffn", streams, g.rms_eps)
        else:
            x = rms_norm(streams[:, 0], w.get(b + "post_attention_norm.weight"), g.rms_eps).astype(np.float32)
        defer = self.defer_experts if layer + 1 < g.n_layer else 0  # the last layer has none to hide behind
        y, d["router_ids"], d["router_weights"], late = moe_forward(w, layer, x, g.n_expert_used, g.expert_ff, defer)
        if earlier is not None:
            streams = earlier.added_to(streams)
        streams = _written(streams, inj if self.is_hc else None, y)
        if layer in self.control_vectors:
            streams = (streams + self.control_vectors[layer]).astype(np.float32)  # every stream alike
        d["streams_after_ffn"] = streams
        return streams, Deferred(inj if self.is_hc else None, late) if defer else None

    def _head(self, streams: np.ndarray) -> np.ndarray:
        g, w = self.geometry, self.weights
        if self.is_hc:
            x, _ = hc_read(w, "output_hc", streams, g.rms_eps, inject=False)
        else:
            x = rms_norm(streams[:, 0], w.get("output_norm.weight"), g.rms_eps).astype(np.float32)
        self.last_hidden, self.last_streams = x, streams.reshape(len(streams), -1)
        head = "output.weight" if w.has("output.weight") else "token_embd.weight"
        return w.matmul(head, x)
