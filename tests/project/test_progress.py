"""Progress: one line per 10% when not on a terminal, a live bar on one; both end at 100 % with a newline,
in units that suit the size."""

import io

from strata.progress import ByteProgress, byte_text


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_a_log_gets_one_line_per_decile_ending_at_100_percent():
    stream = io.StringIO()
    progress = ByteProgress("synth", stream)
    for done in range(0, 1001, 7):
        progress(done, 1000)
    progress(1000, 1000)
    progress(1000, 1000)  # a repeat after the end prints nothing
    lines = stream.getvalue().splitlines()
    assert len(lines) == 11  # 0%, 10%, ..., 100%
    assert lines[-1].startswith("synth: 1.00 kB of 1.00 kB (100%") and stream.getvalue().endswith("/s)\n")


def test_a_terminal_gets_a_live_bar_that_ends_with_a_newline():
    stream = FakeTerminal()
    progress = ByteProgress("convert", stream)
    progress(5_000_000, 10_000_000)
    progress(10_000_000, 10_000_000)
    text = stream.getvalue()
    assert "\r" in text and "convert" in text and "100%" in text and "10.0M/10.0M" in text and text.endswith("\n")


def test_units_suit_the_size():
    assert [byte_text(n) for n in (512, 2_500, 3_000_000, 25.6e9, 1.2e12)] == [
        "512 B", "2.50 kB", "3.00 MB", "25.60 GB", "1.20 TB"]
