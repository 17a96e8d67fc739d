"""``python -m tfx.diagnostics``: the init report's command line (``tfx.reporting.init_report``)."""

import sys

from tfx.reporting.init_report import main

if __name__ == "__main__":
    sys.exit(main())
