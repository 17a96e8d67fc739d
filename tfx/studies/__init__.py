"""What the studies in ``scripts/`` share: the arms (a method plus overrides) and one study's harness.

``scripts/depth_study.py`` (methods x depth) and ``scripts/budget_study.py`` (methods at a fixed
CPU budget) import it as part of the installed package (``pip install -e .``), not from each other.
"""
