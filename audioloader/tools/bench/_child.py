"""Entry point of one contender's process: ``python -m audioloader.tools.bench._child '<json spec>'``.

Separate from `audioloader.tools.bench.contenders` because the package imports that
module, and running an already imported module with ``-m`` is unreliable.
"""

import sys

from .contenders import main

if __name__ == "__main__":
    sys.exit(main())
