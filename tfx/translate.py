"""``python -m tfx.translate``: the command line of ``tfx.evaluation.translate`` (kept at the path users type)."""

import sys

from tfx.evaluation.translate import main

if __name__ == "__main__":
    sys.exit(main())
