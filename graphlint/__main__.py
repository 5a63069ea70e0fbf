"""`python -m graphlint` runs the command line."""

import sys

from graphlint.cli import main

sys.exit(main())
