"""Imported at start-up where tools/side_by_side.sh puts this folder on PYTHONPATH: strata comes from the build
in $STRATA_SRC, even where an editable install's import hook would hand out the checkout's."""

import os
import sys

_src = os.environ.get("STRATA_SRC")
if _src:
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__.lower()]
    sys.path.insert(0, _src)
