"""What the benchmarks in ``scripts/bench/`` share beyond tfx itself: the plain-PyTorch peer they time tfx against.

The scripts are command lines over this code (``scripts/bench/torch_peer.py`` runs the peer alone,
``scripts/bench/bench_train.py --torch-peer`` beside tfx's own update), so no script imports another.
"""
