"""`python -m veil.aggregator ARGS` is `veil serve ARGS`."""

import sys

from veil.cli import main

sys.exit(main(["serve", *sys.argv[1:]]))
