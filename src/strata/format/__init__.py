"""GGUF model files: strict validation, memory-mapped tensor views, the tokenizer from metadata."""

from strata.format.model_file import ModelFile, inspect
from strata.format.scanner import TensorInfo
from strata.format.tokenizer import Tokenizer

__all__ = ["ModelFile", "TensorInfo", "Tokenizer", "inspect"]
