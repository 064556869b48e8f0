"""QuantTensor: a weight matrix held in the planes of a quantized form (docs/forms.md)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from strata.errors import FormatError
from strata.quant.forms import Form

PLANE_NAMES = ("codes", "d", "sub_scales", "mins", "sub_mins")


def plane_layout(form: Form, rows: int, cols: int) -> dict[str, tuple[np.dtype, tuple[int, int]]]:
    """dtype and shape of every plane ``form`` has for a ``rows x cols`` tensor, in PLANE_NAMES order."""
    n_super = cols // form.super_size
    n_group = cols // form.group_size
    layout = {
        "codes": (np.dtype(np.uint8), (rows, cols * form.code_bits // 8)),
        "d": (np.dtype(form.scale_dtype), (rows, n_super)),
    }
    if form.has_sub_scales:
        layout["sub_scales"] = (np.dtype(np.int8), (rows, n_group))
    if form.has_mins:
        layout["mins"] = (np.dtype(np.float16), (rows, n_super))
    if form.has_sub_mins:
        layout["sub_mins"] = (np.dtype(np.uint8), (rows, n_group))
    return layout


@dataclass
class QuantTensor:
    """``rows x cols`` weights as numpy planes; a plane the form lacks is None."""

    form: Form
    rows: int
    cols: int
    codes: np.ndarray
    d: np.ndarray
    sub_scales: np.ndarray | None = None
    mins: np.ndarray | None = None
    sub_mins: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.validate()

    @classmethod
    def empty(cls, form: Form, rows: int, cols: int) -> QuantTensor:
        """Uninitialised planes for a ``rows x cols`` tensor of ``form``."""
        check_shape(form, rows, cols, "QuantTensor.empty")
        planes = {name: np.empty(shape, dtype) for name, (dtype, shape) in plane_layout(form, rows, cols).items()}
        return cls(form, rows, cols, **planes)

    def planes(self) -> dict[str, np.ndarray]:
        """The planes this form has, by name, in PLANE_NAMES order."""
        return {name: getattr(self, name) for name in PLANE_NAMES if getattr(self, name) is not None}

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.planes().values())

    def validate(self) -> None:
        """FormatError unless every plane the form needs is present with the right dtype and shape."""
        check_shape(self.form, self.rows, self.cols, "QuantTensor")
        layout = plane_layout(self.form, self.rows, self.cols)
        for name in PLANE_NAMES:
            plane = getattr(self, name)
            if name not in layout:
                if plane is not None:
                    raise FormatError(f"form {self.form.name} has no plane {name!r}, but one was given")
                continue
            dtype, shape = layout[name]
            if plane is None or plane.dtype != dtype or plane.shape != shape:
                found = "nothing" if plane is None else f"{plane.dtype}{list(plane.shape)}"
                raise FormatError(f"form {self.form.name} plane {name!r}: expected {dtype}{list(shape)}, found {found}")


def check_shape(form: Form, rows: int, cols: int, what: str) -> None:
    if rows < 1 or cols < 1 or cols % form.super_size:
        raise FormatError(f"{what}: {form.name} needs rows >= 1 and cols a positive multiple of "
                          f"{form.super_size}; found rows={rows}, cols={cols}")
