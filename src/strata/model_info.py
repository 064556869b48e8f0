"""What `strata info` says about a model file: architecture, geometry, tensor types, bytes by part."""

from __future__ import annotations

from collections import Counter

from strata.format import ModelFile
from strata.plan import is_ngram_table, is_routed_expert

GIB = 1024**3


def part_of(name: str) -> str:
    """Where a tensor lives at run time (architecture.md, 'What lives where')."""
    if is_routed_expert(name):
        return "routed experts (host RAM)"
    if is_ngram_table(name):
        return "n-gram table (memory-mapped)"
    if name.startswith(("token_embd", "output.")):
        return "embedding + LM head (VRAM)"
    return "dense layers (VRAM)"


def describe(model: ModelFile) -> list[str]:
    g = model.geometry
    attention = len(g.attention_layers)
    lines = [
        f"file          {model.path}",
        f"architecture  {g.arch}: {g.n_layer} layers ({g.n_layer - attention} Gated DeltaNet, "
        f"{attention} attention), width {g.n_embd}, vocab {g.n_vocab}, context {g.context_length}",
        f"experts       {g.n_expert} routed (top {g.n_expert_used}, {g.expert_ff} wide), shared {g.shared_ff} wide",
        f"attention     {g.n_head} query / {g.n_head_kv} KV heads of {g.head_dim}, RoPE on {g.rope_dim} dims, "
        f"theta {g.rope_theta:g}",
    ]
    if g.hc_count:
        lines.append(
            f"qwen4exp      {g.hc_count} residual streams (rank {g.hc_rank}); QSA budget {g.indexer_top_k} tokens; "
            f"PLE at layer(s) {list(g.ple_layers)} over {g.ple_rows} x {g.ple_head_dim} rows"
        )
    types = Counter(info.ggml_type.name for info in model.tensors.values())
    lines.append("tensor types  " + ", ".join(f"{name} x{count}" for name, count in types.most_common()))
    parts: Counter[str] = Counter()
    for name, info in model.tensors.items():
        parts[part_of(name)] += info.nbytes
    total = sum(parts.values())
    lines.append(f"bytes         {total / GIB:.2f} GiB in {len(model.tensors)} tensors")
    lines += [f"  {part:<30} {nbytes / GIB:9.2f} GiB" for part, nbytes in parts.most_common()]
    lines += [f"warning       {warning}" for warning in model.warnings]
    return lines
