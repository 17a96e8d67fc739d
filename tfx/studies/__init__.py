"""What the studies in ``scripts/studies/`` share: the arms, one study's harness and run queue, the converged study's
run layout and report, and the look of the figures drawn from docs/ tables.

``arms`` (a method plus overrides), ``harness`` (record, runs, train-or-replot), ``queue`` (slots for dependent runs),
``converged_runs`` (where a converged study keeps its runs and what they hold), ``converged_report`` (its table and
figures, from the folder alone: ``--replot``), ``doc_figures`` (``scripts/figures/``' shared row reader and finish),
``depth_map`` / ``depth_cells`` / ``depth_map_report`` (the depth map on Multi30k: its stages, cells and outcome rule,
table and figure), ``peak_memory`` (a run's peak resident memory, as its parent process), ``encoder_only`` (T-Fixup#6:
a converted ``nn.TransformerEncoder`` against Pre-LN and Post-LN on generated sorting).
The scripts import these as part of the installed package (``pip install -e .``), never from each other.
"""
