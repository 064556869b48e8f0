"""Where a written model may go, and what ends the write: only a regular file (or a name not taken yet) is
written, an existing one replaced only when asked; SIGTERM and SIGHUP unwind the write as Ctrl-C does, so the
temporary file beside the output is removed, and then end the process by the same signal."""

from __future__ import annotations

import os
import signal
import stat
import threading
from pathlib import Path

from strata.errors import InvalidArgument

# Signals whose default action ends the process without running any cleanup (SIGHUP: not on Windows).
ENDING_SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s)


def check_target(path: Path, overwrite: bool) -> None:
    """InvalidArgument unless `path` is free in a folder this process may write in, or a regular file and
    `overwrite`. A symbolic link is refused, not followed: replacing a link's target through it would write where
    the name does not say. Checked before the long work, so that a bad name is said in its own words (the write
    itself goes to a temporary name beside it, which the system's error would name instead)."""
    try:
        mode = path.lstat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        _check_folder(path)
        return
    except OSError as exc:
        raise InvalidArgument(f"{path}: cannot reach it ({exc.strerror})") from None
    if stat.S_ISLNK(mode):
        raise InvalidArgument(f"{path} is a symbolic link; name the file to write itself (strata replaces regular "
                              "files only)")
    if stat.S_ISDIR(mode):
        raise InvalidArgument(f"{path} is a directory; name the .gguf file to write")
    if not stat.S_ISREG(mode):
        raise InvalidArgument(f"{path} is not a regular file (a FIFO, socket or device); strata writes regular "
                              "files only")
    if not overwrite:
        raise InvalidArgument(f"{path} exists; pass --force (overwrite=True) to replace it")


def _check_folder(path: Path) -> None:
    folder = path.parent
    if not folder.is_dir():
        raise InvalidArgument(f"{path}: the folder {folder} does not exist" if not folder.exists()
                              else f"{path}: {folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InvalidArgument(f"{path}: this process may not write in {folder}")


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived during a write: unwinds it like KeyboardInterrupt, then ends the process."""

    def __init__(self, signum: int):
        super().__init__(f"ended by {signal.Signals(signum).name}")
        self.signum = signum


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated(signum)


class EndingSignals:
    """While held, SIGTERM and SIGHUP raise Terminated in the main thread where they would have ended the process
    at once (their default action); a signal ignored (nohup) or handled by the program stays as it was."""

    def __init__(self) -> None:
        self._taken: list[int] = []
        if threading.current_thread() is threading.main_thread():
            for signum in ENDING_SIGNALS:
                if signal.getsignal(signum) == signal.SIG_DFL:
                    signal.signal(signum, _raise_terminated)
                    self._taken.append(signum)

    def release(self, ended: BaseException | None = None) -> None:
        """Give the signals back their default action; when `ended` is a Terminated, deliver its signal again,
        which now ends the process as it would have without the write."""
        for signum in self._taken:
            signal.signal(signum, signal.SIG_DFL)
        self._taken = []
        if isinstance(ended, Terminated):
            signal.raise_signal(ended.signum)
