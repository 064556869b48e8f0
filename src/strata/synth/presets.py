"""Geometries and type mixes of the synthetic presets: tiny (tests), bench (16 released-width layers), full."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from strata import models
from strata.errors import InvalidArgument

PRESETS = ("tiny", "bench", "full")
_MASK64 = (1 << 64) - 1
_PLE_ROW_PADDING = 128          # HF make_ngram_vocab_size_divisible_by
BENCH_PLE_BASE = 65536          # 16 prime heads just above 2^16: about 1M table rows


@dataclass(frozen=True)
class TypeMix:
    """GGML type names per tensor class; forced-F32 tensors (norms, router, conv, ssm_a...) ignore them."""
    experts: str = "f32"        # ffn_gate_exps / ffn_up_exps
    expert_down: str = "f32"    # ffn_down_exps
    dense: str = "f32"          # every other matrix (attention, GDN, shared expert, HC, PLE projections)
    embeddings: str = "f32"     # token_embd, output
    ple: str = "f32"            # per_layer_token_embd (the n-gram table)


BENCH_TYPES = TypeMix(experts="q4_k", expert_down="q4_0", dense="q8_0", embeddings="q8_0", ple="q8_0")
# tiny: float everywhere (exact for the reference) but the routed experts, q8_0 so that the default model
# runs the CPU pool's quantized path (`--experts-type f16` etc. write float experts, which it runs too).
TINY_TYPES = TypeMix(experts="q8_0", expert_down="q8_0")


def _splitmix64(v: int) -> int:
    v = (v + 0x9E3779B97F4A7C15) & _MASK64
    v = ((v ^ (v >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    v = ((v ^ (v >> 27)) * 0x94D049BB133111EB) & _MASK64
    return v ^ (v >> 31)


def ple_multipliers(n_vocab: int, ngram: int, seed: int = 1234, ple_index: int = 0) -> tuple[int, ...]:
    """The HF n-gram hash multipliers (qwen4exp.md §3(d)): odd, and small enough that t*m never overflows."""
    half = ((2**63 - 1) // n_vocab) // 2
    return tuple(2 * (_splitmix64((seed + 10007 * ple_index + 0x9E3779B97F4A7C15 * (i + 1)) & _MASK64) % half) + 1
                 for i in range(ngram))


def _is_prime(n: int) -> bool:
    if n < 2 or n % 2 == 0:
        return n == 2
    f = 3
    while f * f <= n:
        if n % f == 0:
            return False
        f += 2
    return True


def _primes_from(base: int, count: int) -> tuple[int, ...]:
    out, n = [], base
    while len(out) < count:
        if _is_prime(n):
            out.append(n)
        n += 1
    return tuple(out)


def with_ple_table(g: models.Geometry, base: int) -> models.Geometry:
    """g with an n-gram table of prime head sizes >= base (the HF construction, smaller)."""
    sizes = _primes_from(base, g.ple_n_heads)
    rows = -(-sum(sizes) // _PLE_ROW_PADDING) * _PLE_ROW_PADDING
    return dataclasses.replace(g, ple_head_sizes=sizes, ple_head_offsets=tuple(sum(sizes[:h]) for h in range(len(sizes))),
                               ple_rows=rows, ple_multipliers=ple_multipliers(g.n_vocab, g.ple_ngram))


def with_layers(g: models.Geometry, n_layer: int) -> models.Geometry:
    """g with n_layer layers, attention every 4th; PLE kept on layer 1 when that layer exists."""
    if not 1 <= n_layer <= 4096:
        raise InvalidArgument(f"n_layer must be in 1..4096, got {n_layer}")
    recurrent = tuple((i + 1) % 4 != 0 for i in range(n_layer))
    changes: dict = dict(n_layer=n_layer, recurrent=recurrent)
    if g.qsa_block:
        ratio = max(g.compress_ratios, default=0) or g.qsa_block
        changes["compress_ratios"] = tuple(0 if r else ratio for r in recurrent)
    if g.ple_layers and not (g.ple_layers[0] < n_layer and recurrent[g.ple_layers[0]]):
        changes.update(ple_layers=(), ple_ngram=0, ple_heads_per_ngram=0, ple_conv_kernel=0, ple_eos=0,
                       ple_head_dim=0, ple_multipliers=(), ple_head_offsets=(), ple_head_sizes=(), ple_rows=0)
    return dataclasses.replace(g, **changes)


def _tiny(arch: str) -> models.Geometry:
    # n_embd 256 so that K-quants (256-element super-blocks) fit the expert and dense matrices
    base = models.released(arch)
    g = dataclasses.replace(
        base, n_embd=256, n_vocab=512, context_length=4096, n_head=4, n_head_kv=2, head_dim=64, rope_dim=16,
        rope_sections=(4, 2, 2, 0) if base.rope_sections else (),
        ssm_n_k_heads=2, ssm_n_v_heads=6 if arch == "qwen4exp" else 4, ssm_head_k_dim=32, ssm_head_v_dim=32,
        n_expert=8, n_expert_used=2, expert_ff=64, shared_ff=64)
    if arch == "qwen4exp":
        g = dataclasses.replace(g, hc_rank=32, indexer_n_heads=2, indexer_head_dim=32, indexer_top_k=8,
                                ple_eos=511, ple_head_dim=256 // g.ple_n_heads)
        g = with_ple_table(g, 1000)
    return with_layers(g, 4)


def geometry(arch: str, preset: str = "tiny", n_layer: int | None = None, full_ple: bool = False) -> models.Geometry:
    """The Geometry of a preset; `full_ple` keeps the released 320M-row PLE table in the `full` preset."""
    if arch not in models.ARCHITECTURES:
        raise InvalidArgument(f"architecture {arch!r} is not one of {list(models.ARCHITECTURES)}")
    if preset == "tiny":
        g = _tiny(arch)
    elif preset in ("bench", "full"):
        g = models.released(arch)
        if preset == "bench":
            g = with_layers(g, 16)
        if arch == "qwen4exp" and not (preset == "full" and full_ple):
            g = with_ple_table(g, BENCH_PLE_BASE)
    else:
        raise InvalidArgument(f"preset {preset!r} is not one of {list(PRESETS)}")
    if n_layer is not None:
        g = with_layers(g, n_layer)
    models.validate(g)
    return g


def default_types(preset: str) -> TypeMix:
    return TINY_TYPES if preset == "tiny" else BENCH_TYPES
