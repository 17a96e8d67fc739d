"""Where a run's numbers go and what they are: metrics.jsonl, TensorBoard, layer statistics, the init report."""
