"""strata.reference: the numpy oracle forward pass (float32 values, float64 accumulation).

`Reference(model_file)` or `Reference(geometry=..., weights=...)`; see strata.reference.model.
"""

from strata.reference.model import Reference

__all__ = ["Reference"]
