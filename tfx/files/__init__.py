"""Writing files so that a reader, or a crash mid-write, sees the old file or the new one, never half (atomic.py)."""
