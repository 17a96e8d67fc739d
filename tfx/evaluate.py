"""``python -m tfx.evaluate``: the command line of ``tfx.evaluation.evaluate`` (kept at the path users type)."""

import sys

from tfx.evaluation.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
