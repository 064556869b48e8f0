"""Control vectors (steering): llama.cpp's control-vector files read, checked against a model and summed into
the per-layer table an engine adds (files), and made from prompt pairs on the numpy reference or from the GPU's
layer states (make)."""

from strata.control_vectors.files import (
    ControlVectorFile, layer_range, read_control_vector, steering_table, write_control_vector,
)
from strata.control_vectors.make import METHODS, LayerStates, make_control_vector, prompt_pairs, reference_states

__all__ = ["METHODS", "ControlVectorFile", "LayerStates", "layer_range", "make_control_vector", "prompt_pairs",
           "read_control_vector", "reference_states", "steering_table", "write_control_vector"]
