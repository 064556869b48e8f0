"""KV cache formats the engine stores (architecture.md, 'KV formats'; the rotated Q4 and K8V4 formats
of that page are not built yet)."""

from __future__ import annotations

import enum

from strata.errors import InvalidArgument


class KV(enum.Enum):
    """How attention keys and values are stored per cell."""

    BF16 = "bf16"
    INT8 = "int8"  # int8 with one fp16 scale per 32 elements

    @classmethod
    def parse(cls, value: KV | str) -> KV:
        if isinstance(value, KV):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            raise InvalidArgument(
                f"unknown KV format {value!r}; choose one of {', '.join(k.value for k in cls)}"
            ) from None
