"""Checkpoints: what one holds (train_state), loading one (load), numbered ones, a run's checkpoints/ (manager)."""
