"""Progress lines: one per 10% when not on a terminal, a live line on one."""

import io

from strata.progress import ByteProgress


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_a_log_gets_one_line_per_decile():
    stream = io.StringIO()
    progress = ByteProgress("synth", stream)
    for done in range(0, 1001, 7):
        progress(done, 1000)
    progress(1000, 1000)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 11  # 0%, 10%, ..., 100%
    assert lines[-1].startswith("synth: 0.00 / 0.00 GB (100%")


def test_a_terminal_gets_one_rewritten_line():
    stream = FakeTerminal()
    progress = ByteProgress("convert", stream)
    progress(5, 10)
    progress(10, 10)
    text = stream.getvalue()
    assert text.count("\r") == 2 and text.endswith("(100%, " + text.split("(100%, ")[1])
    assert text.endswith("GB/s)\n")
