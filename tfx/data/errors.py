"""The one exception the data pipeline raises for bad input.

The trainer catches ``DataError`` and prints only its message, so every message is one line that
names the file, field or setting at fault and says what to do about it.
"""


class DataError(Exception):
    """Bad or missing data, explained in one actionable line."""
