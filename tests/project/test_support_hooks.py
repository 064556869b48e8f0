"""The test hooks' absence skips what needs them: the marker at collection (tests/conftest.py), and the stand-in
support.hooks gives for the extension where a test reaches it anyway."""

import pytest

from conftest import _skip_where_absent
from support import hooks


class FakeItem:
    def __init__(self, *markers: str):
        self.markers = [getattr(pytest.mark, name).mark for name in markers]

    def get_closest_marker(self, name: str):
        return next((m for m in self.markers if m.name == name), None)

    def add_marker(self, marker) -> None:
        self.markers.append(marker.mark)


def skip_reasons(item: FakeItem) -> list[str]:
    return [m.kwargs["reason"] for m in item.markers if m.name == "skip"]


def test_marked_items_skip_where_absent_and_run_where_present():
    items = [FakeItem("hooks"), FakeItem("gpu"), FakeItem()]
    _skip_where_absent(items, "hooks", lambda: False, "absent")
    assert [skip_reasons(item) for item in items] == [["absent"], [], []]
    items = [FakeItem("hooks")]
    _skip_where_absent(items, "hooks", lambda: True, "absent")
    assert skip_reasons(items[0]) == []


def test_presence_is_asked_only_when_an_item_is_marked():
    def never() -> bool:
        raise AssertionError("asked")

    _skip_where_absent([FakeItem("gpu")], "hooks", never, "absent")


def test_a_test_that_reaches_absent_hooks_skips_with_the_reason():
    absent = hooks._Absent()
    with pytest.raises(pytest.skip.Exception, match="no test hooks .*: gemv needs them"):
        absent.gemv
    assert not hasattr(absent, "__bases__")  # collection's questions are answered, not skipped


def test_the_hooks_are_the_extension_where_built():
    if hooks.available():
        import strata._native_check

        assert hooks.native_check is strata._native_check
    else:
        assert isinstance(hooks.native_check, hooks._Absent)
