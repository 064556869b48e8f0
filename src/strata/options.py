"""The choices a session is opened with, each defined once: how KV is stored (architecture.md, 'KV formats'),
how a token's GPU work is launched, and how many routed experts a layer defers; and every default a session or a
load takes, so that the API's signatures, the command line and the plan cannot disagree."""

from __future__ import annotations

import enum
import numbers

from strata.errors import InvalidArgument


class _Choice(enum.Enum):
    """An enum whose members are chosen by their value in any case ("int8", "TOKEN_GRAPH")."""

    @classmethod
    def parse(cls, value: _Choice | str):
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            raise InvalidArgument(
                f"unknown {cls.kind()} {value!r}; choose one of {', '.join(cls.values())}"
            ) from None

    @classmethod
    def values(cls) -> list[str]:
        return [member.value for member in cls]

    @classmethod
    def kind(cls) -> str:
        """What the choice is of, for messages."""
        raise NotImplementedError


class KV(_Choice):
    """How attention keys and values are stored per cell (strata.reference.kv_formats defines each in numpy),
    largest first."""

    BF16 = "bf16"  # 2 bytes per element
    INT8 = "int8"  # int8 codes with one fp16 scale per 32 elements: 1.0625 bytes
    K8V4 = "k8v4"  # keys as INT8, values as Q4: 0.8125 bytes
    Q4 = "q4"      # 4-bit codes of the Walsh-Hadamard-rotated rows, one fp16 scale per 32: 0.5625 bytes

    @classmethod
    def kind(cls) -> str:
        return "KV format"


class Mode(_Choice):
    """How the GPU engine launches a token: identical tokens in every mode (docs/session.md)."""

    UNCAPTURED = "uncaptured"      # kernels launched one by one: per-stage timing, debugging
    LAYER_GRAPHS = "layer_graphs"  # a CUDA graph per layer part, launched by the host loop
    TOKEN_GRAPH = "token_graph"    # one CUDA graph per token with device-side doorbell waits

    @classmethod
    def kind(cls) -> str:
        return "session mode"


def check_defer_experts(value: int, n_expert_used: int) -> int:
    """`value` checked as an expert deferral (docs/session.md, "Expert deferral"): of each layer's routed experts,
    how many of the lightest reach the streams one layer late; 0 (exact) up to one below the routed experts a
    token uses, so that every layer answers at least one at once."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= value < n_expert_used:
        raise InvalidArgument(f"defer_experts must be in 0..{n_expert_used - 1} (below the {n_expert_used} "
                              f"routed experts of a token), got {value!r}")
    return int(value)


# The defaults, each named once: strata.load's and Model.session's signatures, the command line and the memory
# plan's default session all read these.
DEFAULT_CONTEXT = 4096          # tokens a session holds unless asked (at most the model's context_length)
DEFAULT_KV = KV.INT8
DEFAULT_MODE = Mode.TOKEN_GRAPH
DEFAULT_TIMEOUT = 5.0           # seconds any wait on the CPU pool may take
DEFAULT_SNAPSHOTS = 2           # a conversation's last two turn boundaries (strata.generation rolls back to them)
DEFAULT_EXPERT_CACHE = "auto"   # the VRAM expert cache's budget (strata.runtime.expert_cache)
DEFAULT_CACHE_POLICY = "lfru"   # its replacement policy
