"""What qwen4exp, qwen3next and qwen35moe share: the common keys, their checks, and the common tensors.

Key names and tensor layouts: docs/models/qwen3next.md §2 and docs/models/qwen4exp.md §2.
"""

from __future__ import annotations

from typing import Any

import gguf

from strata.models.geometry import Alternative, Geometry, Role, TensorSpec
from strata.models.keys import MetadataReader, check

U32 = gguf.GGUFValueType.UINT32
I32 = gguf.GGUFValueType.INT32
U64 = gguf.GGUFValueType.UINT64
F32 = gguf.GGUFValueType.FLOAT32
BOOL = gguf.GGUFValueType.BOOL
STRING = gguf.GGUFValueType.STRING
MetadataItem = tuple[str, Any, gguf.GGUFValueType]

MAX_LAYERS = 4096          # far above any real model; bounds the per-layer tuples built from a file
MAX_DIM = 1 << 31          # any single size above this is a corrupt value, not a model
DEFAULT_ATTENTION_INTERVAL = 4
# strata's key for the GDN output gate: llama.cpp's converter writes none (it hard-codes each architecture's
# gate), so writers add it only where a checkpoint's gate differs from its architecture's (qwen4exp.md §5).
OUTPUT_GATE_KEY = "ssm.output_gate_type"
OUTPUT_GATES = {"sigmoid": True, "silu": False}  # the key's values -> Geometry.gdn_sigmoid_gate

# Tensors the converter writes F32 whatever the outtype (qwen4exp.md §2.3.8) and llama-quantize never touches.
_FORCED_F32_BASES = ("ffn_gate_inp", "ffn_gate_inp_shexp", "ssm_conv1d")
# Left in the converter's type by llama-quantize although the converter may write them quantized (§2.3.9).
_NOT_QUANTIZED_BASES = ("indexer.q_proj", "indexer.k_proj")


def spec(name: str, ne: tuple[int, ...], layer: int | None, role: Role | None = None) -> TensorSpec:
    """A TensorSpec with the converter's dtype rule and llama-quantize's leave-alone rule applied. Its role is
    `role`, else ELEMENTWISE for vectors and conv kernels (the decode program reads them as float32), else DENSE."""
    base = name.split(".", 2)[2] if name.startswith("blk.") else name
    base = base.removesuffix(".weight")
    forced = (len(ne) <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight")
              or base in _FORCED_F32_BASES)
    if role is None:
        role = Role.ELEMENTWISE if len(ne) == 1 or base.endswith("conv1d") else Role.DENSE
    return TensorSpec(name, ne, layer, forced, not forced and base not in _NOT_QUANTIZED_BASES, role)


def embedding(g: Geometry) -> TensorSpec:
    return spec("token_embd.weight", (g.n_embd, g.n_vocab), None, Role.ROW_GATHERED)


def read_common(r: MetadataReader, n_vocab: int, variant: dict[str, Any]) -> dict[str, Any]:
    """The Geometry fields every architecture reads the same way (architecture-only sizes zeroed), with the
    flags of the architecture's `variant`."""
    n_mtp = r.int("nextn_predict_layers", minimum=0, default=0)
    n_layer = r.int("block_count") - n_mtp
    check(0 < n_layer <= MAX_LAYERS, r.key("block_count"),
          f"1..{MAX_LAYERS} main layers (block_count - nextn_predict_layers)", n_layer)
    head_dim = r.int("attention.key_length")
    value_length = r.int("attention.value_length")
    check(value_length == head_dim, r.key("attention.value_length"),
          f"equal to attention.key_length ({head_dim})", value_length)
    n_v_heads = r.int("ssm.time_step_rank")
    inner = r.int("ssm.inner_size")
    check(inner % n_v_heads == 0, r.key("ssm.inner_size"),
          f"a multiple of ssm.time_step_rank ({n_v_heads})", inner)
    return dict(
        arch=r.arch, n_layer=n_layer, n_embd=r.int("embedding_length"), n_vocab=n_vocab,
        context_length=r.int("context_length"),
        n_head=r.int("attention.head_count"), n_head_kv=r.int("attention.head_count_kv"), head_dim=head_dim,
        rope_dim=r.int("rope.dimension_count"), rope_theta=r.float("rope.freq_base"),
        rope_sections=r.ints("rope.dimension_sections", length=4) if r.arch != "qwen3next" else (),
        rms_eps=r.float("attention.layer_norm_rms_epsilon"), recurrent=_read_recurrent(r, n_layer, n_mtp),
        ssm_n_k_heads=r.int("ssm.group_count"), ssm_n_v_heads=n_v_heads,
        ssm_head_k_dim=r.int("ssm.state_size"), ssm_head_v_dim=inner // n_v_heads,
        ssm_conv_kernel=r.int("ssm.conv_kernel"),
        n_expert=r.int("expert_count"), n_expert_used=r.int("expert_used_count"),
        expert_ff=r.int("expert_feed_forward_length"), shared_ff=r.int("expert_shared_feed_forward_length"),
        hc_count=0, hc_rank=0, indexer_n_heads=0, indexer_head_dim=0, indexer_top_k=0, compress_ratios=(),
        ple_layers=(), ple_ngram=0, ple_heads_per_ngram=0, ple_conv_kernel=0, ple_eos=0, ple_head_dim=0,
        ple_multipliers=(), ple_head_offsets=(), ple_head_sizes=(), ple_rows=0, n_mtp=n_mtp,
        **_read_variant(r, variant),
    )


def _read_variant(r: MetadataReader, variant: dict[str, Any]) -> dict[str, Any]:
    """The architecture's variant flags, with the output gate the file states where it states one."""
    flags = dict(variant)
    if r.has(OUTPUT_GATE_KEY):
        flags["gdn_sigmoid_gate"] = OUTPUT_GATES[r.choice(OUTPUT_GATE_KEY, tuple(OUTPUT_GATES))]
    return flags


def variant_items(g: Geometry, variant: dict[str, Any]) -> list[MetadataItem]:
    """The output-gate key where `g`'s gate is not its architecture's `variant` (llama.cpp's files have none)."""
    if g.gdn_sigmoid_gate == variant["gdn_sigmoid_gate"]:
        return []
    name = next(name for name, sigmoid in OUTPUT_GATES.items() if sigmoid == g.gdn_sigmoid_gate)
    return [(f"{g.arch}.{OUTPUT_GATE_KEY}", name, STRING)]


def _read_recurrent(r: MetadataReader, n_layer: int, n_mtp: int) -> tuple[bool, ...]:
    # llama.cpp reads the explicit per-layer list first, then falls back to the interval rule.
    if r.has("attention.recurrent_layers"):
        # its loader reads one entry per block, MTP blocks included (those are full attention); strata's main
        # layers take the first n_layer
        listed = r.kv[r.key("attention.recurrent_layers")]
        if n_mtp and isinstance(listed, (list, tuple)) and len(listed) == n_layer + n_mtp:
            flags = r.bools("attention.recurrent_layers", length=n_layer + n_mtp)
            check(not any(flags[n_layer:]), r.key("attention.recurrent_layers"),
                  f"False for the MTP blocks (entries {n_layer}..{n_layer + n_mtp - 1}: full attention)",
                  flags[n_layer:])
            return flags[:n_layer]
        return r.bools("attention.recurrent_layers", length=n_layer)
    interval = r.int("full_attention_interval", default=DEFAULT_ATTENTION_INTERVAL)
    return tuple((i + 1) % interval != 0 for i in range(n_layer))


def validate_common(g: Geometry) -> None:
    """Checks that hold for every architecture; FormatError names the GGUF key."""
    a = g.arch
    for field, key in (("n_embd", "embedding_length"), ("n_vocab", "vocab_size"), ("head_dim", "attention.key_length"),
                       ("n_head", "attention.head_count"), ("expert_ff", "expert_feed_forward_length"),
                       ("ssm_head_k_dim", "ssm.state_size"), ("ssm_head_v_dim", "ssm.inner_size")):
        value = getattr(g, field)
        check(0 < value <= MAX_DIM, f"{a}.{key}", f"1..{MAX_DIM}", value)
    check(len(g.recurrent) == g.n_layer, f"{a}.attention.recurrent_layers", f"{g.n_layer} entries",
          len(g.recurrent))
    check(g.n_head % g.n_head_kv == 0, f"{a}.attention.head_count_kv",
          f"a divisor of attention.head_count ({g.n_head})", g.n_head_kv)
    check(g.rope_dim % 2 == 0 and g.rope_dim <= g.head_dim, f"{a}.rope.dimension_count",
          f"an even number <= attention.key_length ({g.head_dim})", g.rope_dim)
    check(g.rope_theta > 0, f"{a}.rope.freq_base", "> 0", g.rope_theta)
    check(0 < g.rms_eps < 1, f"{a}.attention.layer_norm_rms_epsilon", "a number in (0, 1)", g.rms_eps)
    if g.arch != "qwen3next":
        check(len(g.rope_sections) == 4 and sum(g.rope_sections) == g.rope_dim // 2, f"{a}.rope.dimension_sections",
              f"4 sections summing to rope.dimension_count / 2 ({g.rope_dim // 2})", g.rope_sections)
    check(g.ssm_n_v_heads % g.ssm_n_k_heads == 0, f"{a}.ssm.time_step_rank",
          f"a multiple of ssm.group_count ({g.ssm_n_k_heads})", g.ssm_n_v_heads)
    check(g.n_expert_used <= g.n_expert, f"{a}.expert_used_count", f"<= expert_count ({g.n_expert})",
          g.n_expert_used)
    check(0 <= g.n_mtp <= MAX_LAYERS, f"{a}.nextn_predict_layers", f"0..{MAX_LAYERS}", g.n_mtp)


def write_common(g: Geometry) -> list[MetadataItem]:
    """The keys llama.cpp's converter writes for every one of the three architectures. Not {arch}.vocab_size:
    the converter leaves the vocabulary size to the token list (tokenizer.ggml.tokens), and so do the loaders."""
    a = g.arch
    items: list[MetadataItem] = [
        ("general.architecture", a, STRING),
        (f"{a}.block_count", g.n_layer + g.n_mtp, U32),
        (f"{a}.context_length", g.context_length, U32),
        (f"{a}.embedding_length", g.n_embd, U32),
        (f"{a}.attention.head_count", g.n_head, U32),
        (f"{a}.attention.head_count_kv", g.n_head_kv, U32),
        (f"{a}.attention.key_length", g.head_dim, U32),
        (f"{a}.attention.value_length", g.head_dim, U32),
        (f"{a}.attention.layer_norm_rms_epsilon", g.rms_eps, F32),
        (f"{a}.rope.freq_base", g.rope_theta, F32),
        (f"{a}.rope.dimension_count", g.rope_dim, U32),
    ]
    if g.rope_sections:
        items.append((f"{a}.rope.dimension_sections", list(g.rope_sections), I32))
    items += [
        (f"{a}.expert_count", g.n_expert, U32),
        (f"{a}.expert_used_count", g.n_expert_used, U32),
        (f"{a}.expert_feed_forward_length", g.expert_ff, U32),
        (f"{a}.expert_shared_feed_forward_length", g.shared_ff, U32),
        (f"{a}.ssm.conv_kernel", g.ssm_conv_kernel, U32),
        (f"{a}.ssm.state_size", g.ssm_head_k_dim, U32),
        (f"{a}.ssm.group_count", g.ssm_n_k_heads, U32),
        (f"{a}.ssm.time_step_rank", g.ssm_n_v_heads, U32),
        (f"{a}.ssm.inner_size", g.ssm_value_dim, U32),
    ]
    # llama.cpp's converter writes the interval (from config.json, default 4) and never the per-layer list;
    # the list is written only where no interval reproduces the layer types, and its loader reads it first.
    if g.n_mtp:
        items.append((f"{a}.nextn_predict_layers", g.n_mtp, U32))
    interval = attention_interval(g)
    if interval is None:
        items.append((f"{a}.attention.recurrent_layers", [*g.recurrent, *[False] * g.n_mtp], BOOL))
    else:
        items.append((f"{a}.full_attention_interval", interval, U32))
    return items


def attention_interval(g: Geometry) -> int | None:
    """The interval that reproduces g.recurrent, or None when the pattern is not periodic."""
    for interval in range(1, g.n_layer + 2):
        if all(r == ((i + 1) % interval != 0) for i, r in enumerate(g.recurrent)):
            return interval
    return None


def moe_tensors(g: Geometry, layer: int) -> list[TensorSpec]:
    p, e, ff, sff, n = f"blk.{layer}.", g.n_embd, g.expert_ff, g.shared_ff, g.n_expert
    return [
        spec(p + "ffn_gate_inp.weight", (e, n), layer),
        spec(p + "ffn_gate_exps.weight", (e, ff, n), layer, Role.ROUTED_EXPERT),
        spec(p + "ffn_up_exps.weight", (e, ff, n), layer, Role.ROUTED_EXPERT),
        spec(p + "ffn_down_exps.weight", (ff, e, n), layer, Role.ROUTED_EXPERT),
        # HF's [1, n_embd] gate, kept 2-D by llama.cpp's converter; a file may drop the 1 (same tensor)
        spec(p + "ffn_gate_inp_shexp.weight", (e, 1), layer, Role.ELEMENTWISE),
        spec(p + "ffn_gate_shexp.weight", (e, sff), layer),
        spec(p + "ffn_up_shexp.weight", (e, sff), layer),
        spec(p + "ffn_down_shexp.weight", (sff, e), layer),
    ]


def merged_experts(g: Geometry, layer: int) -> Alternative:
    """The merged expert gate+up tensor the loaders also accept (rows [0, ff) gate, [ff, 2ff) up)."""
    p = f"blk.{layer}."
    return Alternative((p + "ffn_gate_exps.weight", p + "ffn_up_exps.weight"),
                       spec(p + "ffn_gate_up_exps.weight", (g.n_embd, 2 * g.expert_ff, g.n_expert), layer,
                            Role.ROUTED_EXPERT))


def attention_tensors(g: Geometry, layer: int) -> list[TensorSpec]:
    p, e, hd = f"blk.{layer}.", g.n_embd, g.head_dim
    return [
        spec(p + "attn_q.weight", (e, g.n_head * hd * 2), layer),   # per head [q | gate]
        spec(p + "attn_k.weight", (e, g.n_head_kv * hd), layer),
        spec(p + "attn_v.weight", (e, g.n_head_kv * hd), layer),
        spec(p + "attn_output.weight", (g.n_head * hd, e), layer),
        spec(p + "attn_q_norm.weight", (hd,), layer),
        spec(p + "attn_k_norm.weight", (hd,), layer),
    ]


def gdn_tensors(g: Geometry, layer: int, beta_alpha: list[TensorSpec]) -> list[TensorSpec]:
    """A Gated DeltaNet layer; `beta_alpha` is the architecture's b/a projection (ssm_ba or ssm_beta+ssm_alpha)."""
    p, e, hv = f"blk.{layer}.", g.n_embd, g.ssm_n_v_heads
    return [
        spec(p + "attn_qkv.weight", (e, g.ssm_conv_dim), layer),
        spec(p + "attn_gate.weight", (e, g.ssm_value_dim), layer),
        *beta_alpha,
        spec(p + "ssm_conv1d.weight", (g.ssm_conv_kernel, g.ssm_conv_dim), layer),
        spec(p + "ssm_dt.bias", (hv,), layer),
        spec(p + "ssm_a", (hv,), layer),
        spec(p + "ssm_norm.weight", (g.ssm_head_v_dim,), layer),
        spec(p + "ssm_out.weight", (g.ssm_value_dim, e), layer),
    ]
