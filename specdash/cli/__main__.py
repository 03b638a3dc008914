"""`python -m specdash.cli`: the `specdash` command."""

import sys

from specdash.cli import main

sys.exit(main())
