"""`strata info`: what a model file holds (architecture, geometry, tensor types, bytes by part) and, before any
load, where each part runs and in which canonical form, what the forms cost beside the file's types, what lands
in VRAM, pinned RAM and on disk within the RAM budget (--ram-budget, docs/tiers.md), and what the GPU engine would
refuse; with --devices, the plan of a split of its layers over several GPUs (planned only: docs/layer_ranges.md)."""

from __future__ import annotations

import argparse
import math
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from strata.options import KV

if TYPE_CHECKING:
    from strata.format import ModelFile
    from strata.models import TensorSpec

GIB = 1024**3
HEAD = "output.weight"
# A form this much larger than the file's type is called out: the type widens (e.g. Q6_K's 6-bit codes held
# as bytes, docs/forms.md), which costs memory and bandwidth where the part runs.
WIDENED = 1.05


# The options of a split's plan, which need --devices
SPLIT_OPTIONS = ("layer_split", "vram_free", "vram_limit", "context", "kv")


def register(commands) -> None:
    sub = commands.add_parser("info", help="validate a GGUF model file and describe it")
    sub.add_argument("model", help="path of a .gguf file")
    sub.add_argument("--ram-budget", default="auto", metavar="SIZE",
                     help="the host RAM a load may keep, as strata run takes it: auto (what this machine can spare) "
                          "or a size such as 16G; shows which routed experts it keeps in RAM and which on disk")
    split = sub.add_argument_group(
        "a split over several GPUs (planned only: the engine runs one GPU for now; docs/layer_ranges.md)")
    split.add_argument("--devices", default=None, metavar="0,1",
                       help="plan the layers' split in contiguous ranges over these GPUs, in this order")
    split.add_argument("--layer-split", default=None, metavar="24,24",
                       help="the layers of each device's range (default: each range fits, the expert caches' room "
                            "balanced)")
    split.add_argument("--vram-free", default=None, metavar="BYTES[,BYTES]",
                       help="plan on these free memories (one for every device, or one per device; e.g. 24G) "
                            "instead of asking the GPUs: no GPU needed")
    split.add_argument("--vram-limit", default=None, metavar="SIZE",
                       help="cap each device's free memory, as on a smaller card (e.g. 24G)")
    split.add_argument("--context", type=int, default=None,
                       help="tokens of the session the plan holds (default: the model's, at most 4096)")
    split.add_argument("--kv", choices=KV.values(), default=None,
                       help="the session's KV format (default int8)")
    sub.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from strata.format import inspect

    given = [f"--{name.replace('_', '-')}" for name in SPLIT_OPTIONS if getattr(args, name) is not None]
    if given and args.devices is None:
        from strata.errors import InvalidArgument

        raise InvalidArgument(f"{', '.join(given)} plan a split over several GPUs: name them with --devices")
    with inspect(args.model) as model:
        lines = describe(model, args.ram_budget)
        if args.devices is not None:
            lines += split_lines(model, args)
        print("\n".join(lines))
    return 0


def _numbers(option: str, text: str, parse, example: str) -> list[int]:
    """The comma-separated values of `option`, each through `parse`; InvalidArgument naming the option."""
    from strata.errors import InvalidArgument

    try:
        values = [parse(item.strip()) for item in text.split(",")]
    except (ValueError, InvalidArgument):
        values = [None]
    if any(value is None for value in values):
        raise InvalidArgument(f"{option} {text}: {example} expected")
    return values


def _bytes(text: str) -> int | None:
    from strata.runtime.expert_cache import parse_budget

    return parse_budget(text)  # None for "auto", which is no size


def split_lines(model: ModelFile, args: argparse.Namespace) -> list[str]:
    """The plan of the layers' split over --devices (strata.runtime.layer_ranges), on --vram-free's figures or
    the GPUs' free memory, each within --vram-limit."""
    from strata.errors import InvalidArgument, StrataError
    from strata.generation import session_context
    from strata.options import DEFAULT_KV
    from strata.runtime.layer_ranges import describe as describe_split
    from strata.runtime.layer_ranges import plan_ranges
    from strata.runtime.plan import file_tensors
    from strata.runtime.prompt import DEFAULT_CHUNK

    devices = _numbers("--devices", args.devices, int, "GPU indices such as 0,1")
    if args.vram_free is not None:
        free = _numbers("--vram-free", args.vram_free, _bytes, "sizes such as 24G or 24G,16G")
        if len(free) == 1:
            free *= len(devices)
        if len(free) != len(devices):
            raise InvalidArgument(f"--vram-free {args.vram_free} gives {len(free)} figures for {len(devices)} "
                                  "devices: one for all, or one per device")
    else:
        from strata.devices import device_count, free_memory

        if device_count() == 0:
            raise StrataError("no CUDA device found to ask for its free memory; give it with --vram-free")
        free = [free_memory(device) for device in devices]
    if args.vram_limit is not None:
        limit = _numbers("--vram-limit", args.vram_limit, _bytes, "one size such as 24G")
        if len(limit) != 1:
            raise InvalidArgument(f"--vram-limit {args.vram_limit}: one size such as 24G expected")
        free = [min(nbytes, limit[0]) for nbytes in free]
    split = (None if args.layer_split is None
             else _numbers("--layer-split", args.layer_split, int, "layer counts such as 24,24"))
    g = model.geometry
    context = session_context(args.context, g.context_length)
    kv = KV.parse(args.kv or DEFAULT_KV)
    chunk = min(DEFAULT_CHUNK, context)  # the default session's, as the expert cache's "auto" budget plans it
    ranges = plan_ranges(g, file_tensors(model), context, kv, list(zip(devices, free)), split=split,
                         prompt_chunk=chunk)
    return [f"split plan    one session of {context:,} tokens in kv {kv.value}, prompt chunks of {chunk} tokens",
            *describe_split(g, ranges)]


def part_of(spec: TensorSpec) -> tuple[str, str]:
    """Where a tensor lives at run time (architecture.md, 'What lives where'), from its role: (its part, what
    runs it)."""
    from strata.models import Role

    if spec.role is Role.ROUTED_EXPERT:
        return "routed experts (host RAM)", "CPU pool"
    if spec.role is Role.NGRAM_TABLE:
        return "n-gram table (read from the file)", "host"
    if spec.role is Role.ROW_GATHERED or spec.name == HEAD:
        return "embedding + LM head (VRAM)", "GPU"
    return "dense layers (VRAM)", "GPU"


def describe(model: ModelFile, ram_budget: str | int = "auto") -> list[str]:
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
    total = sum(info.nbytes for info in model.tensors.values())
    # the file's tensors past the architecture's inventory: an MTP block (the format check refuses any other)
    mtp = [name for name in model.tensors if name not in specs]
    lines.append(f"bytes         {total / GIB:.2f} GiB in {len(model.tensors)} tensors")
    if mtp:
        from strata.models import MTP_ARCHITECTURES

        use = ("--draft mtp drafts with it (reference engine; the GPU engine does not run it yet)"
               if g.arch in MTP_ARCHITECTURES else f"strata runs no MTP block of {g.arch} yet")
        lines.append(f"MTP block     {len(mtp)} tensors (e.g. {mtp[0]}): {use}")
    lines += placement_lines(model)
    lines += tier_lines(model, ram_budget)
    lines += kv_lines(model)
    lines += tokenizer_lines(model)
    from strata.runtime.loader import gpu_refusals

    refusals = gpu_refusals(model)
    lines.append("GPU engine    " + ("runs this file as it is" if not refusals else "cannot run this file as it is:"))
    lines += [f"  {reason}" for reason in refusals]
    lines += [f"warning       {warning}" for warning in model.warnings if not (mtp and "MTP tensor" in warning)]
    return lines


def tier_lines(model: ModelFile, ram_budget: str | int) -> list[str]:
    """Where a load within `ram_budget` puts the model (docs/tiers.md): the dense part in VRAM, the routed experts
    in host RAM or split between the CPU pool's pinned arenas and the file, the n-gram table in the file; a
    budget the model cannot load in says so, with the figures."""
    from strata.errors import OutOfMemory
    from strata.models import Role
    from strata.runtime.expert_cache import parse_budget
    from strata.runtime.plan import DENSE_ROLES, bytes_by_role, file_tensors
    from strata.runtime.plan import size_text as _size
    from strata.runtime.tiers import plan_ram
    from strata.runtime.tiers import ram_budget as budget_of

    roles = bytes_by_role(model.geometry, file_tensors(model))
    lines = [f"memory        VRAM: dense weights {_size(sum(roles[role] for role in DENSE_ROLES))} (and the "
             "session's state, and the expert cache that --expert-cache holds)"]
    try:
        ram = plan_ram(model, budget_of(parse_budget(ram_budget, "--ram-budget")))
    except OutOfMemory as refusal:
        return lines + [f"  cannot load: {refusal}"]
    lines += [f"  {line}" for line in ram.lines()]
    if roles[Role.NGRAM_TABLE]:
        lines.append(f"  n-gram table: {_size(roles[Role.NGRAM_TABLE])} read from the file as tokens need its rows")
    return lines


def kv_lines(model: ModelFile) -> list[str]:
    """What a session of the model's whole context keeps of its attention per KV format: the KV and QSA keys in
    VRAM, or under KV streaming the part that stays in VRAM and the part on the host (the memory plan's figures)."""
    from strata.options import KV
    from strata.runtime.plan import can_stream, session_state_bytes
    from strata.runtime.plan import size_text as _size

    g = model.geometry
    if not g.attention_layers:
        return []

    def attention_bytes(parts: dict[str, int]) -> int:
        return sum(n for name, n in parts.items() if name.startswith(("KV", "QSA")))

    resident = {kv: attention_bytes(session_state_bytes(g, g.context_length, kv, 0)[0]) for kv in KV}
    lines = [f"KV state      at {g.context_length:,} tokens of context, in VRAM: "
             + ", ".join(f"{kv.value} {_size(n)}" for kv, n in resident.items())]
    if not can_stream(g):
        return lines + ["KV streaming  not served: attention without a QSA indexer reads every cell"]
    streamed = {kv: session_state_bytes(g, g.context_length, kv, 0, kv_streaming=True) for kv in KV}
    vram = ", ".join(f"{kv.value} {_size(attention_bytes(d))}" for kv, (d, _h) in streamed.items())
    host = ", ".join(f"{kv.value} {_size(attention_bytes(h))}" for kv, (_d, h) in streamed.items())
    return lines + [f"KV streaming  in VRAM {vram}; in host memory {host} (--kv-streaming)"]


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


@dataclass
class _Placed:
    """The tensors of one GGUF type in one part: how many, their bytes in the file and once held."""

    count: int = 0
    elements: int = 0
    file_bytes: int = 0
    held_bytes: int = 0


def placement_lines(model: ModelFile) -> list[str]:
    """Per part and GGUF type: where it runs, the canonical form it is held in and bits per weight in the file
    and held (docs/forms.md), with widened forms called out. The n-gram table is read as the file holds it."""
    from strata.models import Role, tensor_specs
    from strata.quant import form_for
    from strata.runtime.plan import size_text as _size
    from strata.runtime.plan import tensor_bytes

    specs = tensor_specs(model.geometry)
    placed: dict[tuple[str, str, str, str], _Placed] = {}
    for name, info in model.tensors.items():
        spec = specs.get(name)
        if spec is None:
            continue
        as_file = spec.role is Role.NGRAM_TABLE  # rows gathered and dequantized per token, never repacked
        form = "as stored" if as_file else form_for(info.ggml_type).name
        entry = placed.setdefault((*part_of(spec), info.ggml_type.name, form), _Placed())
        entry.count += 1
        entry.elements += math.prod(info.ne)
        entry.file_bytes += info.nbytes
        entry.held_bytes += info.nbytes if as_file else tensor_bytes(info.ggml_type, tuple(info.ne))
    lines = [f"placement     {'part':<30} {'runs on':<8} {'type':<8} {'held as':<9} {'tensors':>7}  "
             "bits/weight: file -> held, bytes held"]
    for (part, where, type_name, form), e in sorted(placed.items(), key=lambda item: -item[1].held_bytes):
        file_bpw, held_bpw = 8 * e.file_bytes / e.elements, 8 * e.held_bytes / e.elements
        note = f"  widened x{e.held_bytes / e.file_bytes:.2f}" if e.held_bytes > WIDENED * e.file_bytes else ""
        lines.append(f"  {part:<42} {where:<8} {type_name:<8} {form:<9} {e.count:>7}  {file_bpw:5.2f} -> "
                     f"{held_bpw:5.2f} {_size(e.held_bytes):>10}{note}")
    lines.append("  routed experts in the VRAM expert cache run on the GPU, in the same forms: as many as "
                 "--expert-cache holds (auto: the GPU's spare memory; docs/expert_cache.md)")
    return lines
