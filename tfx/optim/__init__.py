"""What an update minimises and how: the label-smoothed loss, optimizers by name and the LR schedules."""
