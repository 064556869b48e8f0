"""The limit of one decoded token: the time to read what a token must read, at the rates this machine moves.

The routed experts it selects from host RAM (at the CPU pool's read bandwidth), the dense weights from HBM (at
the device copy's rate), plus one doorbell round trip per layer that rings (GPU -> host loop -> GPU).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from strata.bench.rates import Rates

if TYPE_CHECKING:
    from strata.models import Geometry

Tensors = Mapping[str, tuple[int, tuple[int, ...]]]  # name -> (ggml_type, ne)


@dataclass(frozen=True)
class Limit:
    """The machine's limit for one decoded token, its parts and the rates they were divided by."""

    routed_bytes: int  # routed expert weight bytes one token reads from host RAM (the experts not in VRAM)
    dense_bytes: int  # dense and cached expert weight bytes one token reads from HBM
    read_bandwidth: float  # host bytes/s, measured by the CPU pool's workers
    routed_seconds: float
    dense_seconds: float
    doorbell_seconds: float
    cached_bytes: int = 0  # of dense_bytes, the routed experts the VRAM cache holds
    hbm_copy_rate: float = 0.0  # HBM bytes/s of the device copy, measured
    doorbell_round_trip: float = 0.0  # seconds, measured
    ringing_layers: int = 0  # layers whose experts are not all cached: each rings the doorbell once a token

    @property
    def seconds(self) -> float:
        return self.routed_seconds + self.dense_seconds + self.doorbell_seconds


def machine_limit(g: Geometry, tensors: Tensors, rates: Rates, slots: list[int] | None = None) -> Limit:
    """The limit for `g` whose tensors are {name: (ggml_type, ne)} at the machine's `rates`: a token reads
    n_expert_used of every layer's experts (each routed tensor holds all n_expert of one matrix), from HBM the
    share `slots[l]` / n_expert the VRAM cache holds (routing spread evenly over the experts, as the synthetic
    models' is) and from host RAM the rest, and every VRAM weight it reads whole (dense and elementwise; of the
    row-gathered embedding only its own row); a layer whose experts are all cached rings no doorbell."""
    from strata.models import Role
    from strata.runtime.expert_cache import expert_bytes
    from strata.runtime.plan import bytes_by_role

    slots = slots or [0] * g.n_layer
    parts = bytes_by_role(g, tensors)
    per_expert = expert_bytes(g, tensors)
    cached = round(sum(b * g.n_expert_used * s / g.n_expert for b, s in zip(per_expert, slots)))
    routed = parts[Role.ROUTED_EXPERT] * g.n_expert_used // g.n_expert - cached
    dense = parts[Role.DENSE] + parts[Role.ELEMENTWISE] + cached
    ringing = sum(1 for s in slots if s < g.n_expert)
    return Limit(routed, dense, rates.host_read, routed / rates.host_read, dense / rates.hbm_copy,
                 ringing * rates.doorbell_round_trip, cached, rates.hbm_copy, rates.doorbell_round_trip, ringing)
