"""The training loop: what it is built from (build.py), one update (step.py), the Trainer, its queue and schedule."""
