"""Canonical weight forms (docs/forms.md): repack from GGUF types, numpy dequant, q8_32 activations."""

from strata.quant.activation import matvec, quantize_activation
from strata.quant.dequant import dequantize, dequantize_raw
from strata.quant.forms import Form, form_for
from strata.quant.repacking import repack
from strata.quant.tensor import QuantTensor

__all__ = ["Form", "QuantTensor", "dequantize", "dequantize_raw", "form_for", "matvec", "quantize_activation", "repack"]
