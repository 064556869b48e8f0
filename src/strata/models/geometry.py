"""The Geometry and TensorSpec records shared by every architecture."""

from __future__ import annotations

from dataclasses import dataclass

ARCHITECTURES: tuple[str, ...] = ("qwen4exp", "qwen3next", "qwen35moe")


@dataclass(frozen=True)
class Geometry:
    """Every hyperparameter strata needs; fields an architecture lacks are 0 / () / None."""

    arch: str
    n_layer: int
    n_embd: int
    n_vocab: int
    context_length: int
    n_head: int
    n_head_kv: int
    head_dim: int                      # gated attention: q_proj out = n_head * head_dim * 2
    rope_dim: int
    rope_theta: float
    rope_sections: tuple[int, ...]
    rms_eps: float
    recurrent: tuple[bool, ...]        # per layer: True = Gated DeltaNet, False = attention
    ssm_n_k_heads: int
    ssm_n_v_heads: int
    ssm_head_k_dim: int
    ssm_head_v_dim: int
    ssm_conv_kernel: int
    n_expert: int
    n_expert_used: int
    expert_ff: int
    shared_ff: int
    # qwen4exp only
    hc_count: int
    hc_rank: int
    indexer_n_heads: int
    indexer_head_dim: int
    indexer_top_k: int                 # the token budget (indexer_budget), not a block count
    compress_ratios: tuple[int, ...]
    ple_layers: tuple[int, ...]
    ple_ngram: int
    ple_heads_per_ngram: int
    ple_conv_kernel: int
    ple_eos: int
    ple_head_dim: int
    ple_multipliers: tuple[int, ...]
    ple_head_offsets: tuple[int, ...]
    ple_head_sizes: tuple[int, ...]
    ple_rows: int                      # rows of per_layer_token_embd (padded)

    def is_recurrent(self, layer: int) -> bool:
        return self.recurrent[layer]

    @property
    def attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, r in enumerate(self.recurrent) if not r)

    @property
    def recurrent_layers(self) -> tuple[int, ...]:
        return tuple(i for i, r in enumerate(self.recurrent) if r)

    @property
    def ssm_key_dim(self) -> int:
        return self.ssm_n_k_heads * self.ssm_head_k_dim

    @property
    def ssm_value_dim(self) -> int:
        return self.ssm_n_v_heads * self.ssm_head_v_dim

    @property
    def ssm_conv_dim(self) -> int:
        """Channels of the GDN conv: [q | k | v]."""
        return 2 * self.ssm_key_dim + self.ssm_value_dim

    @property
    def hc_width(self) -> int:
        """Width of the stacked residual streams (qwen4exp); n_embd where there are no hyper-connections."""
        return max(self.hc_count, 1) * self.n_embd

    @property
    def ple_n_heads(self) -> int:
        return max(self.ple_ngram - 1, 0) * self.ple_heads_per_ngram


@dataclass(frozen=True)
class TensorSpec:
    """One tensor an architecture requires."""

    name: str                 # GGUF name, e.g. "blk.3.attn_q.weight"
    ne: tuple[int, ...]       # ggml order (ne0 fastest): a weight is {in, out}
    layer: int | None
    forced_f32: bool          # the converter always writes it F32 (norms, ssm_a, ffn_gate_inp, conv1d, ...)
    quantizable: bool         # llama-quantize may give it a quantized type


@dataclass(frozen=True)
class Alternative:
    """A tensor set a file may hold instead of some inventory tensors (e.g. merged expert gate+up)."""

    replaces: tuple[str, ...]
    spec: TensorSpec
