# The routed experts' tiers below VRAM (strata/expert_tiers.hpp): the file's block types the pool repacks, the
# places of a layer's matrices in the file and the policy of a tiered layer's arena. strata.runtime.pool builds the
# arguments from the file's tensors; the pool (expert_pool.pxi) takes them.
from strata.libstrata.expert_tiers cimport BlockType, FileMatrix, TierLayerStats, TierPolicy, cpp_block_type_supported

_TIER_POLICY_KEYS = frozenset({"replace", "admit_after", "window", "max_moves"})


def tier_block_types() -> frozenset:
    """The ggml type ids whose expert blocks the pool repacks itself as it reads them from the file."""
    return frozenset(t for t in range(256) if cpp_block_type_supported(t))


cdef int file_matrices(list files, FileMatrix* out) except -1:
    """out[0..2] from files [(offset, expert_stride, ggml type id)] of gate, up and down in the file."""
    if len(files) != 3:
        raise InvalidArgument(f"files: gate, up and down, found {len(files)} entries")
    for m, (offset, stride, ggml_type) in enumerate(files):
        if not cpp_block_type_supported(ggml_type):
            raise InvalidArgument(f"ggml type {ggml_type} is not one the disk tier repacks")
        out[m].offset = offset
        out[m].expert_stride = stride
        out[m].type = <BlockType><int>ggml_type
    return 0


cdef TierPolicy tier_policy(dict policy) except *:
    """The native policy from {"replace", "admit_after", "window", "max_moves"} (missing keys keep its defaults)."""
    unknown = sorted(policy.keys() - _TIER_POLICY_KEYS)
    if unknown:
        raise InvalidArgument(f"tier policy: unknown {', '.join(unknown)} ({', '.join(sorted(_TIER_POLICY_KEYS))})")
    cdef TierPolicy p
    p.replace = policy.get("replace", p.replace)
    p.admit_after = policy.get("admit_after", p.admit_after)
    p.window = policy.get("window", p.window)
    p.max_moves = policy.get("max_moves", p.max_moves)
    return p


cdef dict tier_layer_stats(const TierLayerStats& s):
    return {"layer": s.layer, "slots": s.slots, "hits": s.hits, "misses": s.misses, "moves": s.moves,
            "bytes_read": s.bytes_read, "experts": list(s.experts)}
