"""What the API's arguments must be, each refused with an InvalidArgument that names it (a bool is not a
number here, nor a string an integer): shared by the sessions' calls and both engines' `session()`."""

from __future__ import annotations

import numbers
from typing import Any

from strata.errors import InvalidArgument


def checked_integer(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidArgument(f"{name} must be an integer, got {value!r:.80}")
    return int(value)


def checked_number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgument(f"{name} must be a number, got {value!r:.80}")
    return float(value)


def checked_flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{name} must be True or False, got {value!r:.80}")
    return value


class OptionRefused(InvalidArgument):
    """A call's option refused, naming it (`option`): what a server reports as the request's field."""

    def __init__(self, option: str, message: str):
        super().__init__(message)
        self.option = option
