"""Imported first by every script that uses tfx: a one-line error instead of a traceback when it is not installed.

The scripts run as files (`python scripts/x.py`), so only their own folder is on the path; tfx and its
dependencies come from `pip install -e .` (README, Install). Without it the user would see
`ModuleNotFoundError: No module named 'tfx'` halfway down a traceback.
"""

import importlib.util
import sys

if importlib.util.find_spec("tfx") is None:
    sys.exit(
        f"error: {sys.executable} cannot import tfx; install it from the repository root with "
        "`pip install -e .` (README, Install) or run the script with the Python that has it"
    )
