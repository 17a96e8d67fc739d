"""``python -m tfx.average``: the command line of ``tfx.evaluation.average`` (kept at the path users type)."""

import sys

from tfx.evaluation.average import main

if __name__ == "__main__":
    sys.exit(main())
