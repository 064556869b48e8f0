"""`python -m strata.cli`: the `strata` command."""

import sys

from strata.cli import main

sys.exit(main())
