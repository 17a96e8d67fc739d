"""``torch.compile`` for training (``train.compile``): by default each layer is one graph, reused down its stack.

``train.compile_scope=layers`` is regional compilation (PyTorch's recipe for repeated blocks; torchtitan
compiles per Transformer block too): every encoder layer runs one compiled graph and every decoder layer
another, with each layer's parameters as graph inputs. The cold compile then costs one encoder and one
decoder layer whatever the depth: on the development CPU (fp32, inductor, one thread, d 128), 38 s at 6+6 and
44 s at 48+48 layers, against 126 s at 6+6 and 200 s at 12+12 for ``model``, the whole forward as one graph
(docs/gpu-and-scaling.md). The embeddings, output projection and loss stay eager.

What runs between updates, validation, decoding, the output-change probe and the layer statistics, runs
eagerly inside ``eager()``: decoding changes shape every step, the statistics hook into layers, and each
would otherwise be a recompile of a layer graph.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager

import torch
from torch import nn

from tfx.config import COMPILE_SCOPES
from tfx.model import Transformer


def compile_for_training(model: Transformer, scope: str, dynamic: bool, backend: str = "inductor") -> nn.Module:
    """What the step calls: ``model`` with its layers compiled in place (``layers``), or the whole model wrapped
    (``model``). ``dynamic``: symbolic shapes, for padded batches whose shape changes every step; packed batches
    have one shape per run and compile statically, once."""
    if scope == "model":
        return torch.compile(model, dynamic=dynamic, backend=backend)
    if scope != "layers":
        raise ValueError(f"compile scope {scope!r}: use one of {COMPILE_SCOPES}")
    for layer in (*model.encoder.layers, *model.decoder.layers):
        layer.compile(dynamic=dynamic, backend=backend)
    return model


def eager() -> AbstractContextManager:
    """Compiled modules run their eager code inside (torch >= 2.6; older torch compiles there too)."""
    set_stance = getattr(torch.compiler, "set_stance", None)
    return set_stance("force_eager") if set_stance is not None else contextlib.nullcontext()
