"""KV cache formats (architecture.md, 'KV formats')."""

from __future__ import annotations

import enum


class KV(enum.Enum):
    """How attention keys and values are stored per cell."""

    BF16 = "bf16"
    INT8 = "int8"  # int8 with one fp16 scale per 32 elements
    Q4 = "q4"  # 4-bit after a 256-wide Walsh-Hadamard rotation of K and V, fp16 scale per 32
    K8V4 = "k8v4"  # int8 K, rotated 4-bit V

    @property
    def key_bytes_per_element(self) -> float:
        return {"bf16": 2.0, "int8": 1 + 2 / 32, "q4": 0.5 + 2 / 32, "k8v4": 1 + 2 / 32}[self.value]

    @property
    def value_bytes_per_element(self) -> float:
        return {"bf16": 2.0, "int8": 1 + 2 / 32, "q4": 0.5 + 2 / 32, "k8v4": 0.5 + 2 / 32}[self.value]

    @classmethod
    def parse(cls, value: KV | str) -> KV:
        if isinstance(value, KV):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            from strata.errors import InvalidArgument

            raise InvalidArgument(
                f"unknown KV format {value!r}; choose one of {', '.join(k.value for k in cls)}"
            ) from None
