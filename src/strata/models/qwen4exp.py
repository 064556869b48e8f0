"""qwen4exp (Qwen3.8-Flash-Next): 4 hyper-connection streams, QSA attention, PLE n-gram embedding.

Keys and tensors: docs/models/qwen4exp.md §2.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from strata.models import common
from strata.models.common import U32, U64, I32, spec
from strata.models.geometry import Alternative, Geometry, Role, TensorSpec
from strata.models.keys import MetadataReader, check

ARCH = "qwen4exp"
# Tokens per indexer block where an attention layer's compress ratio is 0 (the released model's ratio): a
# checkpoint re-saved by transformers >= 5 loses the ratio's layer mapping but still runs QSA (§5.3).
DEFAULT_QSA_BLOCK = 4
PLE_ROW_PADDING = 128         # HF make_ngram_vocab_size_divisible_by: the table's rows are padded to this
# qwen35moe's GDN layout with a sigmoid output gate (§3(b)), the gate llama.cpp hard-codes; a file may say
# otherwise (common.OUTPUT_GATE_KEY). Indexed sparse attention in blocks of each layer's compress ratio.
VARIANT = dict(gdn_tiled_heads=True, gdn_interleaved_ba=False, gdn_sigmoid_gate=True, qsa_block=DEFAULT_QSA_BLOCK)


def geometry(kv: Mapping[str, Any], n_vocab: int) -> Geometry:
    r = MetadataReader(kv, ARCH)
    fields = common.read_common(r, n_vocab, VARIANT)
    n_layer = fields["n_layer"]
    fields.update(
        hc_count=r.int("hyper_connection.count", minimum=2), hc_rank=r.int("hyper_connection.low_rank"),
        indexer_n_heads=r.int("attention.indexer.head_count"),
        indexer_head_dim=r.int("attention.indexer.key_length"),
        indexer_top_k=r.int("attention.indexer.top_k"),
        compress_ratios=_read_ratios(r, n_layer, fields["n_mtp"]),
    )
    ple_layers = r.ints("ple.layers", default=[])
    if ple_layers:
        ngram = r.int("ple.ngram_size", minimum=2)
        n_heads = (ngram - 1) * r.int("ple.heads_per_ngram")
        sizes = r.ints("ple.head_vocab_sizes", length=n_heads, minimum=1)
        fields.update(
            ple_layers=ple_layers, ple_ngram=ngram, ple_heads_per_ngram=r.int("ple.heads_per_ngram"),
            ple_conv_kernel=r.int("ple.conv_kernel"), ple_eos=r.int("ple.eos_token_id", minimum=0),
            ple_head_dim=r.int("embedding_length_per_layer_input"),
            ple_multipliers=r.ints("ple.layer_multipliers", length=ngram, minimum=1),
            ple_head_offsets=r.ints("ple.head_offsets", length=n_heads), ple_head_sizes=sizes,
            ple_rows=-(-sum(sizes) // PLE_ROW_PADDING) * PLE_ROW_PADDING,
        )
    g = Geometry(**fields)
    validate(g)
    return g


def _read_ratios(r: MetadataReader, n_layer: int, n_mtp: int) -> tuple[int, ...]:
    """The main layers' compress ratios. llama.cpp's converter writes one entry per block, the MTP block's 0
    (its graph attends densely); strata runs the block's QSA in blocks of DEFAULT_QSA_BLOCK, as every attention
    layer whose ratio is 0 (docs/models/qwen4exp.md §7), so an MTP entry must be 0 or that block."""
    key = "attention.compress_ratios"
    listed = r.kv.get(r.key(key))
    if not (n_mtp and isinstance(listed, (list, tuple)) and len(listed) == n_layer + n_mtp):
        return r.ints(key, length=n_layer)
    ratios = r.ints(key, length=n_layer + n_mtp)
    check(all(x in (0, DEFAULT_QSA_BLOCK) for x in ratios[n_layer:]), r.key(key),
          f"0 or {DEFAULT_QSA_BLOCK} for the MTP blocks (entries {n_layer}..{n_layer + n_mtp - 1})", ratios[n_layer:])
    return ratios[:n_layer]


def validate(g: Geometry) -> None:
    common.validate_common(g)
    a = ARCH
    check(g.indexer_head_dim >= g.rope_dim, f"{a}.attention.indexer.key_length",
          f">= rope.dimension_count ({g.rope_dim}): the indexer heads are roped", g.indexer_head_dim)
    check(len(g.compress_ratios) == g.n_layer, f"{a}.attention.compress_ratios", f"{g.n_layer} entries",
          len(g.compress_ratios))
    for layer, (ratio, recurrent) in enumerate(zip(g.compress_ratios, g.recurrent)):
        if recurrent:
            check(ratio == 0, f"{a}.attention.compress_ratios", f"0 at layer {layer} (GDN)", ratio)
            continue
        # transformers requires budget % ratio == 0: the budget is a whole number of blocks
        block = g.qsa_ratio(layer)
        check(g.indexer_top_k >= block and g.indexer_top_k % block == 0, f"{a}.attention.indexer.top_k",
              f"a positive multiple of layer {layer}'s QSA block of {block} tokens ({a}.attention.compress_ratios)",
              g.indexer_top_k)
    if g.ple_layers:
        _validate_ple(g)


def _validate_ple(g: Geometry) -> None:
    a = ARCH
    check(len(g.ple_layers) == 1, f"{a}.ple.layers", "exactly one PLE layer (the released layout)", g.ple_layers)
    layer = g.ple_layers[0]
    check(0 <= layer < g.n_layer and g.recurrent[layer], f"{a}.ple.layers",
          f"the index of a GDN layer in 0..{g.n_layer - 1}", layer)
    check(g.ple_head_dim * g.ple_n_heads == g.n_embd, f"{a}.embedding_length_per_layer_input",
          f"embedding_length / {g.ple_n_heads} PLE heads = {g.n_embd / g.ple_n_heads}", g.ple_head_dim)
    check(g.ple_eos < g.n_vocab, f"{a}.ple.eos_token_id", f"a token id < {g.n_vocab}", g.ple_eos)
    expected = tuple(sum(g.ple_head_sizes[:h]) for h in range(g.ple_n_heads))
    check(g.ple_head_offsets == expected, f"{a}.ple.head_offsets",
          f"the running sums of ple.head_vocab_sizes {expected[:4]}...", g.ple_head_offsets)
    check(g.ple_rows >= sum(g.ple_head_sizes), "per_layer_token_embd.weight",
          f"at least {sum(g.ple_head_sizes)} rows (the sum of ple.head_vocab_sizes)", g.ple_rows)


def metadata(g: Geometry) -> list[common.MetadataItem]:
    a = ARCH
    items = common.write_common(g) + common.variant_items(g, VARIANT)
    items += [
        (f"{a}.hyper_connection.count", g.hc_count, U32),
        (f"{a}.hyper_connection.low_rank", g.hc_rank, U32),
        (f"{a}.attention.indexer.head_count", g.indexer_n_heads, U32),
        (f"{a}.attention.indexer.key_length", g.indexer_head_dim, U32),
        (f"{a}.attention.indexer.top_k", g.indexer_top_k, U32),
        # one entry per block as llama.cpp's converter writes it: 0 for the MTP blocks
        (f"{a}.attention.compress_ratios", [*g.compress_ratios, *[0] * g.n_mtp], I32),
    ]
    if g.ple_layers:
        items += [
            (f"{a}.ple.layers", list(g.ple_layers), I32),
            (f"{a}.ple.ngram_size", g.ple_ngram, U32),
            (f"{a}.ple.heads_per_ngram", g.ple_heads_per_ngram, U32),
            (f"{a}.ple.conv_kernel", g.ple_conv_kernel, U32),
            (f"{a}.ple.eos_token_id", g.ple_eos, U32),
            (f"{a}.embedding_length_per_layer_input", g.ple_head_dim, U32),
            (f"{a}.ple.layer_multipliers", list(g.ple_multipliers), U64),
            (f"{a}.ple.head_offsets", list(g.ple_head_offsets), U64),
            (f"{a}.ple.head_vocab_sizes", list(g.ple_head_sizes), U64),
        ]
    return items


def _hc_tensors(g: Geometry, prefix: str, layer: int | None, inject: bool) -> list[TensorSpec]:
    s, rank = g.hc_width, g.hc_rank
    specs = [spec(prefix + "_norm.weight", (s,), layer), spec(prefix + "_down.weight", (s, rank), layer),
             spec(prefix + "_up.weight", (rank, s), layer)]
    if inject:
        specs.append(spec(prefix + "_inject.weight", (s, g.hc_count), layer))
    return specs


def _qsa_tensors(g: Geometry, layer: int) -> list[TensorSpec]:
    p, e, ih = f"blk.{layer}.", g.n_embd, g.indexer_head_dim
    return common.attention_tensors(g, layer) + [
        spec(p + "indexer.q_proj.weight", (e, g.indexer_n_heads * ih), layer),
        spec(p + "indexer.k_proj.weight", (e, ih), layer),
        spec(p + "indexer.q_norm.weight", (ih,), layer),
        spec(p + "indexer.k_norm.weight", (ih,), layer),
    ]


def _gdn_tensors(g: Geometry, layer: int) -> list[TensorSpec]:
    p, e, hv = f"blk.{layer}.", g.n_embd, g.ssm_n_v_heads
    return common.gdn_tensors(g, layer, [spec(p + "ssm_beta.weight", (e, hv), layer),
                                         spec(p + "ssm_alpha.weight", (e, hv), layer)])


def _ple_tensors(g: Geometry, layer: int) -> list[TensorSpec]:
    p, e, s = f"blk.{layer}.", g.n_embd, g.hc_width
    width = g.ple_head_dim * g.ple_n_heads
    return [
        spec(p + "ple_key.weight", (width, s), layer),
        spec(p + "ple_value.weight", (width, e), layer),
        spec(p + "ple_norm_key.weight", (s,), layer),
        spec(p + "ple_norm_query.weight", (s,), layer),
        spec(p + "ple_norm_conv.weight", (s,), layer),
        spec(p + "ple_conv1d.weight", (g.ple_conv_kernel, s), layer),   # outtype, not forced F32 (§2.2)
    ]


def inventory(g: Geometry) -> list[TensorSpec]:
    specs = [common.embedding(g)]
    if g.ple_layers:
        specs.append(spec("per_layer_token_embd.weight", (g.ple_head_dim, g.ple_rows), None, Role.NGRAM_TABLE))
    for layer in range(g.n_layer):
        specs += _hc_tensors(g, f"blk.{layer}.hc_attn", layer, inject=True)
        specs += _gdn_tensors(g, layer) if g.recurrent[layer] else _qsa_tensors(g, layer)
        if layer in g.ple_layers:
            specs += _ple_tensors(g, layer)
        specs += _hc_tensors(g, f"blk.{layer}.hc_ffn", layer, inject=True)
        specs += common.moe_tensors(g, layer)
    specs += _hc_tensors(g, "output_hc", None, inject=False)
    specs.append(spec("output.weight", (g.n_embd, g.n_vocab), None))
    return specs


def alternatives(g: Geometry) -> list[Alternative]:
    return [common.merged_experts(g, layer) for layer in range(g.n_layer)]


def mtp_inventory(g: Geometry) -> list[TensorSpec]:
    """The MTP block's required tensors as llama.cpp's converter writes the checkpoint's `mtp.*` (§7): block
    n_layer is an attention layer as the main model's, hyper-connection mixers and QSA indexer included, plus the
    input projection (`fc_embedding` and `fc_hidden` side by side), the two input norms (the hidden one over
    all the streams) and the block's own output mixer. Norms are stored 1 + w, as the main layers'."""
    layer, e, s = g.n_layer, g.n_embd, g.hc_width
    p = f"blk.{layer}."
    return [
        spec(p + "nextn.eh_proj.weight", (2 * e, e), layer),      # inputs: [enorm(embed) | hnorm(stream k)]
        spec(p + "nextn.enorm.weight", (e,), layer),
        spec(p + "nextn.hnorm.weight", (s,), layer),
        *_hc_tensors(g, p + "hc_attn", layer, inject=True),
        *_qsa_tensors(g, layer),
        *_hc_tensors(g, p + "hc_ffn", layer, inject=True),
        *common.moe_tensors(g, layer),
        *_hc_tensors(g, p + "nextn.hc_head", layer, inject=False),
    ]


def mtp_optional(g: Geometry) -> list[TensorSpec]:
    """The MTP block's own embedding and LM head, which llama.cpp's loader accepts (the checkpoint has none:
    mtp_use_dedicated_embeddings is false; the main model's are read)."""
    layer, p = g.n_layer, f"blk.{g.n_layer}."
    return [spec(p + "nextn.embed_tokens.weight", (g.n_embd, g.n_vocab), layer, Role.ROW_GATHERED),
            spec(p + "nextn.shared_head_head.weight", (g.n_embd, g.n_vocab), layer)]


# PLE constants of the released checkpoint (qwen4exp.md §2.1): splitmix64 multipliers and prime head sizes
_MULTIPLIERS = (23703573157769, 20109073645365, 8052911324071)
_HEAD_SIZES = (20000003, 20000023, 20000033, 20000047, 20000059, 20000063, 20000069, 20000077,
               20000081, 20000093, 20000107, 20000147, 20000153, 20000159, 20000161, 20000171)


def released() -> Geometry:
    """The released Qwen3.8-Flash-Next text model (qwen4exp.md §1)."""
    recurrent = tuple((i + 1) % 4 != 0 for i in range(48))
    return Geometry(
        arch=ARCH, n_layer=48, n_embd=2560, n_vocab=248320, context_length=262144,
        n_head=24, n_head_kv=2, head_dim=256, rope_dim=64, rope_theta=1e7, rope_sections=(11, 11, 10, 0),
        rms_eps=1e-6, recurrent=recurrent,
        ssm_n_k_heads=16, ssm_n_v_heads=48, ssm_head_k_dim=128, ssm_head_v_dim=128, ssm_conv_kernel=4,
        n_expert=512, n_expert_used=10, expert_ff=640, shared_ff=640,
        hc_count=4, hc_rank=320, indexer_n_heads=4, indexer_head_dim=128, indexer_top_k=2048,
        compress_ratios=tuple(0 if r else DEFAULT_QSA_BLOCK for r in recurrent),
        ple_layers=(1,), ple_ngram=3, ple_heads_per_ngram=8, ple_conv_kernel=4, ple_eos=248044, ple_head_dim=160,
        ple_multipliers=_MULTIPLIERS,
        ple_head_offsets=tuple(sum(_HEAD_SIZES[:h]) for h in range(16)), ple_head_sizes=_HEAD_SIZES,
        ple_rows=320001536, **VARIANT,
    )
