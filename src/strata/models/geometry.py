"""The records every architecture fills: Geometry (sizes and the flags the engines need), PleShape, TensorSpec
with each tensor's Role. The engines read these, never an architecture's name."""

from __future__ import annotations

import enum
from dataclasses import dataclass

ARCHITECTURES: tuple[str, ...] = ("qwen4exp", "qwen3next", "qwen35moe")


class Role(enum.Enum):
    """What a tensor is to the engines: where it lives at run time and how a token reads it
    (architecture.md, 'What lives where')."""

    DENSE = "dense"                  # a matrix in VRAM that a token reads whole (a GEMV)
    ELEMENTWISE = "elementwise"      # a vector or conv kernel in VRAM, read elementwise as float32
    ROW_GATHERED = "row-gathered"    # in VRAM; a token reads only its own rows (the token embedding)
    ROUTED_EXPERT = "routed expert"  # host RAM: the CPU pool reads the experts a token routes to
    NGRAM_TABLE = "n-gram table"     # memory-mapped: the host gathers the rows of each token


@dataclass(frozen=True)
class PleShape:
    """The PLE block's hashing and conv geometry (models/qwen4exp.md §3(d))."""

    ngram: int                    # largest n-gram order; also the conv dilation
    heads_per_ngram: int
    head_dim: int                 # row width of per_layer_token_embd
    conv_kernel: int
    eos: int
    multipliers: tuple[int, ...]  # one per context slot c0..c_{ngram-1}
    head_offsets: tuple[int, ...]
    head_sizes: tuple[int, ...]

    @property
    def n_heads(self) -> int:
        return (self.ngram - 1) * self.heads_per_ngram

    @property
    def history(self) -> int:
        """Normalised gated rows the conv needs from before a chunk: dilation * (kernel - 1)."""
        return self.ngram * (self.conv_kernel - 1)


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
    # The architecture's variant, as flags its module sets (models/<arch>.py VARIANT)
    gdn_tiled_heads: bool              # GDN value head h reads key head h % n_k (else h // (n_v / n_k))
    gdn_interleaved_ba: bool           # GDN b and a come from one ssm_ba projection, interleaved per key head
    gdn_sigmoid_gate: bool             # GDN output gate sigmoid(z) (else silu(z))
    qsa_block: int                     # tokens per QSA indexer block; 0: no indexed attention
    # MTP (next-token-prediction) blocks after the main layers ({arch}.nextn_predict_layers): block_count counts
    # them, n_layer does not; the main model never runs them (docs/models.md, "MTP block")
    n_mtp: int = 0

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

    @property
    def has_hyper_connections(self) -> bool:
        return self.hc_count > 0

    @property
    def ple(self) -> PleShape | None:
        """The PLE block's shape, or None where the model has no PLE layer."""
        if not self.ple_layers:
            return None
        return PleShape(self.ple_ngram, self.ple_heads_per_ngram, self.ple_head_dim, self.ple_conv_kernel,
                        self.ple_eos, tuple(self.ple_multipliers), tuple(self.ple_head_offsets),
                        tuple(self.ple_head_sizes))

    def qsa_ratio(self, layer: int) -> int:
        """Tokens per indexer block of attention layer `layer`: its compress ratio, or the architecture's block
        where the file says 0 (a checkpoint re-saved by transformers >= 5 still runs QSA, qwen4exp.md §5.3)."""
        ratios = self.compress_ratios
        return ratios[layer] if layer < len(ratios) and ratios[layer] > 0 else self.qsa_block


@dataclass(frozen=True)
class TensorSpec:
    """One tensor an architecture requires."""

    name: str                 # GGUF name, e.g. "blk.3.attn_q.weight"
    ne: tuple[int, ...]       # ggml order (ne0 fastest): a weight is {in, out}; as llama.cpp's converter writes
                              # it (a file may drop trailing 1s: to ggml {n} and {n, 1} are one shape)
    layer: int | None
    forced_f32: bool          # the converter always writes it F32 (norms, ssm_a, ffn_gate_inp, conv1d, ...)
    quantizable: bool         # llama-quantize may give it a quantized type
    role: Role


@dataclass(frozen=True)
class Alternative:
    """A tensor set a file may hold instead of some inventory tensors (e.g. merged expert gate+up)."""

    replaces: tuple[str, ...]
    spec: TensorSpec
