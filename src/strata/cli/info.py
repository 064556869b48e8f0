"""`strata info`: what a model file holds: architecture, geometry, tensor types, bytes by part."""

from __future__ import annotations

import argparse
from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from strata.format import ModelFile
    from strata.models import TensorSpec

GIB = 1024**3
HEAD = "output.weight"


def register(commands) -> None:
    sub = commands.add_parser("info", help="validate a GGUF model file and describe it")
    sub.add_argument("model", help="path of a .gguf file")
    sub.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from strata.format import inspect

    with inspect(args.model) as model:
        print("\n".join(describe(model)))
    return 0


def part_of(spec: TensorSpec | None) -> str:
    """Where a tensor lives at run time (architecture.md, 'What lives where'), from its role."""
    from strata.models import Role

    if spec is None:
        return "not run (ignored)"
    if spec.role is Role.ROUTED_EXPERT:
        return "routed experts (host RAM)"
    if spec.role is Role.NGRAM_TABLE:
        return "n-gram table (memory-mapped)"
    if spec.role is Role.ROW_GATHERED or spec.name == HEAD:
        return "embedding + LM head (VRAM)"
    return "dense layers (VRAM)"


def describe(model: ModelFile) -> list[str]:
    from strata.models import tensor_specs

    g = model.geometry
    specs = tensor_specs(g)
    attention = len(g.attention_layers)
    lines = [
        f"file          {model.path}",
        f"architecture  {g.arch}: {g.n_layer} layers ({g.n_layer - attention} Gated DeltaNet, "
        f"{attention} attention), width {g.n_embd}, vocab {g.n_vocab}, context {g.context_length}",
        f"experts       {g.n_expert} routed (top {g.n_expert_used}, {g.expert_ff} wide), shared {g.shared_ff} wide",
        f"attention     {g.n_head} query / {g.n_head_kv} KV heads of {g.head_dim}, RoPE on {g.rope_dim} dims, "
        f"theta {g.rope_theta:g}",
    ]
    if g.has_hyper_connections:
        lines.append(
            f"{g.arch:<13} {g.hc_count} residual streams (rank {g.hc_rank}); QSA budget {g.indexer_top_k} tokens; "
            f"PLE at layer(s) {list(g.ple_layers)} over {g.ple_rows} x {g.ple_head_dim} rows"
        )
    types = Counter(info.ggml_type.name for info in model.tensors.values())
    lines.append("tensor types  " + ", ".join(f"{name} x{count}" for name, count in types.most_common()))
    parts: Counter[str] = Counter()
    for name, info in model.tensors.items():
        parts[part_of(specs.get(name))] += info.nbytes
    total = sum(parts.values())
    lines.append(f"bytes         {total / GIB:.2f} GiB in {len(model.tensors)} tensors")
    lines += [f"  {part:<30} {nbytes / GIB:9.2f} GiB" for part, nbytes in parts.most_common()]
    lines += tokenizer_lines(model)
    from strata.runtime.loader import gpu_refusals

    refusals = gpu_refusals(model)
    lines.append("GPU engine    " + ("runs this file as it is" if not refusals else "cannot run this file as it is:"))
    lines += [f"  {reason}" for reason in refusals]
    lines += [f"warning       {warning}" for warning in model.warnings]
    return lines


def tokenizer_lines(model: ModelFile) -> list[str]:
    """The tokenizer, the ids that end a generation and the chat template, as the file holds them."""
    if "tokenizer.ggml.model" not in model.metadata:
        return ["tokenizer     none (the file has no tokenizer.ggml.* keys)"]
    tokenizer = model.tokenizer()
    eos = ", ".join(f"{tokenizer.tokens[i]!r} ({i})" for i in tokenizer.eos_ids) or "none"
    template = tokenizer.chat_template
    return [f"tokenizer     {model.metadata['tokenizer.ggml.model']} BPE, {len(tokenizer.tokens)} tokens, "
            f"pre-tokenizer {tokenizer.pre}; generation ends at {eos}",
            f"chat template {f'{len(template)} characters' if template else 'none (strata chat needs one)'}"]
