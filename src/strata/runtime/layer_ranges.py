"""The plan of a split: a model's layers in contiguous ranges over several GPUs, one range per device in device
order (docs/layer_ranges.md, issue 34). The engine cannot run ranges yet; this is the plan `strata info --devices`
explains, for the native work to follow.

A range holds, on its device, the dense weights of its layers and its layers' share of the session's state (KV and
QSA keys of its attention layers, recurrent and conv state of its GDN layers, the PLE history where it holds the PLE
layer, and the snapshots of that recurrent state); the first range holds the token embedding, the last the head
(final norm, LM head). Each range also holds what every device needs for itself (PER_DEVICE): the residual streams
the hidden state arrives in, the decode scratch (with the sampler's workspace on the last range only), the prompt
chunk's scratch and the allocation slack. Every figure is the one-device plan's (strata.runtime.plan), per layer:
the ranges' bytes sum to the one-device plan's, but for the per-device parts, which each range after the first
holds again. The n-gram table stays in the file (its rows read on the host) and the routed experts in the one CPU
pool; what a device has left beside its range is its expert cache's room, for its own layers' experts only.

Without a given split, the layers are split so that each range fits its device and the smallest of the ranges' room
ratios (room / routed expert bytes of its layers: the share of them its cache could hold) is as large as any
contiguous split allows; among equal splits, the one with the shortest first ranges.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from strata.errors import InvalidArgument, OutOfMemory
from strata.generation.arguments import checked_integer
from strata.models import Geometry, Role
from strata.options import DEFAULT_SNAPSHOTS, KV
from strata.runtime.plan import (
    DENSE_ROLES, RECURRENT_STATE, SESSION_SLACK_BYTES, Tensors, bytes_by_layer, check_context, prompt_scratch_bytes,
    scratch_bytes, session_regions, session_state_bytes, size_text,
)

EMBEDDING = "token embedding"
HEAD = "head (final norm, LM head)"
# What every range holds for its own device, whatever its layers
PER_DEVICE = ("residual streams", "scratch", "prompt scratch", "allocation slack")


def room_ratio(room: int, experts: int) -> float:
    """The share of `experts` bytes of routed experts that `room` bytes could hold (a range without any: the room)."""
    return room / max(experts, 1)


@dataclass(frozen=True)
class LayerRange:
    """Layers first..last-1 on GPU `device`, which has `free` bytes of VRAM for the model."""

    device: int
    first: int
    last: int               # exclusive
    free: int
    vram: dict[str, int]    # bytes by kind: the one-device plan's part names, EMBEDDING and HEAD
    host: dict[str, int]    # its layers' state in page-locked host memory (KV streaming)
    experts: int            # routed expert bytes of its layers (host RAM): what its expert cache may hold

    @property
    def layers(self) -> int:
        return self.last - self.first

    @property
    def vram_total(self) -> int:
        return sum(self.vram.values())

    @property
    def room(self) -> int:
        """VRAM left for the expert cache of its layers' experts; negative where the range does not fit."""
        return self.free - self.vram_total

    @property
    def room_ratio(self) -> float:
        """room / its layers' routed expert bytes: the share of them the room could hold (the balance measure)."""
        return room_ratio(self.room, self.experts)

    @property
    def name(self) -> str:
        return f"GPU {self.device} (layers {self.first}..{self.last - 1})"


@dataclass(frozen=True)
class _Figures:
    """The one-device plan's figures, per layer and per device."""

    dense: list[int]              # dense weights of each layer
    state: list[dict[str, int]]   # VRAM state of each layer by part (snapshots included)
    host: list[dict[str, int]]    # page-locked host state of each layer by part
    experts: list[int]            # routed expert bytes of each layer
    embedding: int
    head: int
    device: dict[str, int]        # PER_DEVICE parts of a range that runs no head
    last_device: dict[str, int]   # ... and of the last range (its scratch holds the sampler's workspace)
    order: list[str]              # the parts in the one-device plan's order

    def vram(self, position: int, count: int, first: int, last: int) -> dict[str, int]:
        """VRAM by part of range `position` of `count`, over layers first..last-1."""
        out = {"dense weights": sum(self.dense[first:last]), EMBEDDING: self.embedding if position == 0 else 0,
               HEAD: self.head if position == count - 1 else 0}
        for layer in range(first, last):
            _add(out, self.state[layer])
        _add(out, self.last_device if position == count - 1 else self.device)
        return {part: out[part] for part in self.order if out.get(part)}

    @functools.cached_property
    def _sums(self) -> tuple[list[int], list[int]]:
        """Prefix sums over the layers: (dense weights and state, routed experts)."""
        fixed, experts = [0], [0]
        for dense, state, routed in zip(self.dense, self.state, self.experts):
            fixed.append(fixed[-1] + dense + sum(state.values()))
            experts.append(experts[-1] + routed)
        return fixed, experts

    def fixed(self, position: int, count: int, first: int, last: int) -> int:
        """sum(vram(...).values()), from the prefix sums: the balanced split asks it of every candidate range."""
        is_last = position == count - 1
        own = (self.embedding if position == 0 else 0) + (self.head if is_last else 0)
        device = sum((self.last_device if is_last else self.device).values())
        return self._sums[0][last] - self._sums[0][first] + own + device

    def routed(self, first: int, last: int) -> int:
        """Routed expert bytes of layers first..last-1."""
        return self._sums[1][last] - self._sums[1][first]


def _add(into: dict[str, int], parts: dict[str, int]) -> None:
    for part, nbytes in parts.items():
        into[part] = into.get(part, 0) + nbytes


def _figures(g: Geometry, tensors: Tensors, context: int, kv: KV, snapshots: int, kv_streaming: bool,
             prompt_chunk: int) -> _Figures:
    by_layer = bytes_by_layer(g, tensors)
    layers = range(g.n_layer)
    state: list[dict[str, int]] = [{} for _ in layers]
    host: list[dict[str, int]] = [{} for _ in layers]
    device: dict[str, int] = {}
    for region in session_regions(g, context, kv, snapshots, kv_streaming=kv_streaming):
        if region.name == "state snapshots":
            continue  # a range snapshots its own layers' recurrent state: below, region by region
        layer = g.ple_layers[0] if region.name == "ple history" else region.layer
        if layer < 0:  # the sequence's own (the residual streams): every range holds it
            _add(device, {region.part: region.nbytes})
            continue
        _add((host if region.host else state)[layer], {region.part: region.nbytes})
        if snapshots and region.name in RECURRENT_STATE:
            _add(state[layer], {"state snapshots": snapshots * region.span})
    prompt = ({"prompt scratch": prompt_scratch_bytes(g, prompt_chunk, context, kv, kv_streaming)}
              if prompt_chunk else {})
    slack = {"allocation slack": SESSION_SLACK_BYTES}
    one_device = session_state_bytes(g, context, kv, snapshots, kv_streaming=kv_streaming)[0]
    model = by_layer[None]  # the token embedding (row-gathered) and the head: the rest of the model's own
    return _Figures(
        dense=[sum(by_layer[layer][role] for role in DENSE_ROLES) for layer in layers],
        state=state, host=host, experts=[by_layer[layer][Role.ROUTED_EXPERT] for layer in layers],
        embedding=model[Role.ROW_GATHERED], head=sum(model[role] for role in DENSE_ROLES) - model[Role.ROW_GATHERED],
        device={**device, "scratch": scratch_bytes(g, context, sampler=False), **prompt, **slack},
        last_device={**device, "scratch": scratch_bytes(g, context), **prompt, **slack},
        order=["dense weights", EMBEDDING, HEAD, *one_device, "scratch", "prompt scratch", "allocation slack"],
    )


def _checked_devices(devices_free: Sequence[tuple[int, int]], n_layer: int) -> list[tuple[int, int]]:
    devices = [(checked_integer("device", device), checked_integer(f"free memory of GPU {device}", free))
               for device, free in devices_free]
    if not devices:
        raise InvalidArgument("a split of the layers needs at least one device")
    seen: set[int] = set()
    for device, free in devices:
        if device < 0 or device in seen:
            raise InvalidArgument(f"device {device} is {'named twice' if device in seen else 'not a GPU index'}")
        if free < 0:
            raise InvalidArgument(f"free memory of GPU {device} must be >= 0 bytes, got {free}")
        seen.add(device)
    if len(devices) > n_layer:
        raise InvalidArgument(f"{len(devices)} devices for {n_layer} layers: each device runs a range of at least "
                              "one layer")
    return devices


def _checked_split(split: Sequence[int], devices: list[tuple[int, int]], n_layer: int) -> list[int]:
    counts = [checked_integer("layer split", count) for count in split]
    text = ",".join(map(str, counts))
    if len(counts) != len(devices):
        raise InvalidArgument(f"layer split {text} gives {len(counts)} ranges for {len(devices)} devices "
                              f"(GPUs {', '.join(str(device) for device, _ in devices)}): one range per device")
    for (device, _), count in zip(devices, counts):
        if count < 1:
            raise InvalidArgument(f"layer split {text}: the range of GPU {device} has {count} layers; each device "
                                  "runs at least one")
    if sum(counts) != n_layer:
        raise InvalidArgument(f"layer split {text} covers {sum(counts)} layers; the model has {n_layer}")
    return counts


def _balanced_split(fig: _Figures, frees: list[int]) -> list[int]:
    """Layer counts of the contiguous split whose smallest room ratio is largest (exact: over every split)."""
    n, count = len(fig.dense), len(frees)

    def ratio(position: int, first: int, last: int) -> float:
        return room_ratio(frees[position] - fig.fixed(position, count, first, last), fig.routed(first, last))

    # best[position][first]: (the smallest ratio of the best split of layers first.. over devices position..,
    # where that device's range ends)
    best: list[dict[int, tuple[float, int]]] = [{} for _ in frees]
    for first in range(count - 1, n):
        best[-1][first] = (ratio(count - 1, first, n), n)
    for position in range(count - 2, -1, -1):
        for first in range(position, n - (count - 1 - position)):
            choices = ((min(ratio(position, first, last), best[position + 1][last][0]), last)
                       for last in range(first + 1, n - (count - 2 - position)))
            best[position][first] = max(choices, key=lambda choice: (choice[0], -choice[1]))
    counts, first = [], 0
    for position in range(count):
        last = best[position][first][1]
        counts.append(last - first)
        first = last
    return counts


def plan_ranges(g: Geometry, tensors: Tensors, context: int, kv: KV | str, devices_free: Sequence[tuple[int, int]],
                *, split: Sequence[int] | None = None, snapshots: int = DEFAULT_SNAPSHOTS, kv_streaming: bool = False,
                prompt_chunk: int = 0) -> list[LayerRange]:
    """The ranges of a split of `g`'s layers (tensors {name: (ggml_type, ne)}) over `devices_free`, (GPU index,
    free bytes) in device order, for one session of `context` tokens in `kv` with `snapshots` state slots (KV
    streaming and a prompt chunk as strata.runtime.plan.memory_plan takes them). `split`: the layer count of each
    range, checked; without it the balanced split (the module's docstring). InvalidArgument for a split that is
    not one range of at least one layer per device covering every layer, OutOfMemory where a range does not fit."""
    kv = KV.parse(kv)
    check_context(g, context)
    devices = _checked_devices(devices_free, g.n_layer)
    fig = _figures(g, tensors, context, kv, snapshots, kv_streaming, prompt_chunk)
    frees = [free for _, free in devices]
    counts = _balanced_split(fig, frees) if split is None else _checked_split(split, devices, g.n_layer)
    ranges, first = [], 0
    for position, ((device, free), layers) in enumerate(zip(devices, counts)):
        last = first + layers
        host: dict[str, int] = {}
        for layer in range(first, last):
            _add(host, fig.host[layer])
        ranges.append(LayerRange(device, first, last, free, fig.vram(position, len(devices), first, last), host,
                                 fig.routed(first, last)))
        first = last
    short = min(ranges, key=lambda r: r.room)
    if short.room < 0:
        given = (f"layer split {','.join(map(str, counts))}" if split is not None else
                 f"no split of the {g.n_layer} layers over GPUs {', '.join(str(d) for d, _ in devices)} fits: the "
                 f"most balanced, {','.join(map(str, counts))}")
        hint = "another split, " if split is not None else "more devices, "
        raise OutOfMemory(f"{given}: {short.name} needs {size_text(short.vram_total)} ({_parts(short.vram)}) and "
                          f"has {size_text(short.free)} free; try {hint}a shorter context or a smaller KV format")
    return ranges


def _parts(parts: dict[str, int]) -> str:
    return ", ".join(f"{part} {size_text(nbytes)}" for part, nbytes in parts.items())


def describe(g: Geometry, ranges: Sequence[LayerRange]) -> list[str]:
    """Text lines for `strata info`: per device its layers, its bytes by kind and its expert cache's room."""
    lines = [f"layer split   {' + '.join(str(r.layers) for r in ranges)} layers over {len(ranges)} GPU(s)"]
    for r in ranges:
        share = f"{min(r.room_ratio, 1):.0%}" if r.experts else "no routed experts"
        lines += [f"  {r.name}: {size_text(r.vram_total)} of {size_text(r.free)} free; expert cache room "
                  f"{size_text(r.room)} for {size_text(r.experts)} of its layers' routed experts ({share})",
                  f"    {_parts(r.vram)}"]
        if r.host:
            lines.append(f"    host (page-locked): {_parts(r.host)}")
    if g.ple_layers:
        (holder,) = [r for r in ranges if r.first <= g.ple_layers[0] < r.last]
        lines.append(f"  the n-gram table stays in the file, read on the host; its rows go to GPU {holder.device}, "
                     f"which runs the PLE layer {g.ple_layers[0]}")
    lines += [f"  every range holds its own {', '.join(PER_DEVICE)}; the one CPU pool answers every range's routed "
              "experts",
              "  planned only: load, run and serve use one GPU until the engine runs ranges (docs/layer_ranges.md)"]
    return lines
