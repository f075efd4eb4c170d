"""``python -m audioloader``: the same command line as ``audioloader``."""

import sys

from audioloader.tools.cli import main

sys.exit(main())
