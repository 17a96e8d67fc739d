"""The training loop: the ``Trainer``, the queue of updates read later, and the schedule of what is due when."""
