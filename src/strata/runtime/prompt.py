"""The prompt path from Python (docs/prompt.md): its staging for routed experts, its chunk size and when a feed
takes it.

A prompt of `PROMPT_MIN_TOKENS` or more runs in chunks, each layer once per chunk on the GPU; the routed experts
the VRAM cache lacks are copied per chunk into the staging, two buffers of a whole layer's experts each (one
fills over PCIe while the other is read), and for a small chunk the CPU pool computes a share of them beside it.
A chunk is `DEFAULT_CHUNK` tokens unless the session's context is shorter or the free VRAM holds less: a chunk
that does not fit is halved, not refused.
"""

from __future__ import annotations

from strata.errors import InvalidArgument
from strata.models import Geometry
from strata.options import DEFAULT_KV, KV
from strata.runtime.expert_cache import moe_layers
from strata.runtime.plan import prompt_scratch_bytes

# Every chunk of a few hundred tokens or more touches nearly every expert of every layer, so its PCIe copies cost
# about the same whatever its size: the longest chunk that fits amortizes them best.
DEFAULT_CHUNK = 4096
MIN_CHUNK = 64
# Shorter feeds step token by token: measured on the box (docs/performance.md, "Prompt processing"), the prompt
# path with the pool's share of small chunks breaks even with stepping at 8 tokens of the benchmark model (1.1x;
# 0.8x at 4), and is 1.7x at 32.
PROMPT_MIN_TOKENS = 8


def staging_bytes(pool, n_layer: int, slots: int | None = None) -> int:
    """VRAM the native staging of `slots` experts per buffer (default: a whole layer's) over `pool` (a
    strata.runtime.pool.ExpertPool of `n_layer` layers) allocates: the native figure; 0 without routed experts."""
    from strata import _native

    moe = moe_layers(pool, n_layer)
    if not moe:
        return 0
    whole_layer = max(pool.n_expert(layer) for layer in moe)
    return _native.ExpertStaging.bytes_for(pool.native, whole_layer if slots is None else slots)


def fitting_chunk(g: Geometry, context: int, vram_free: int, asked: int | None = None, kv: KV = DEFAULT_KV,
                  kv_streaming: bool = False) -> int:
    """The prompt chunk for a session of `context` tokens in `kv` (with or without KV streaming): `asked`
    (default DEFAULT_CHUNK) and at most the context, halved while its scratch exceeds `vram_free`; 0 when not
    even MIN_CHUNK fits."""
    if asked is not None and asked < 1:
        raise InvalidArgument(f"prompt_chunk must be >= 1 token (or None for the default), got {asked}")

    def scratch(chunk: int) -> int:
        return prompt_scratch_bytes(g, chunk, context, kv, kv_streaming)

    chunk = min(asked or DEFAULT_CHUNK, context)
    while chunk > MIN_CHUNK and scratch(chunk) > vram_free:
        chunk //= 2
    return chunk if scratch(chunk) <= vram_free else 0


def build_staging(pool, device: int, slots: int):
    """The native staging of `slots` experts per buffer over `pool` (strata.runtime.pool.ExpertPool)."""
    from strata import _native

    return _native.ExpertStaging(pool.native, slots, device, host_weights=pool.host_weights())
