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

``compile_counts`` and ``compile_problems`` read what dynamo did (graphs, frames, graph breaks) and say what
is wrong with it: ``scripts/bench/bench_train.py`` prints their warnings beside its figures, and CI's inductor check
(tests/runtime/test_compilation.py) asserts there are none.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from dataclasses import dataclass

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


GRAPHS_PER_SCOPE = {"layers": 2, "model": 1}  # what a clean compile of each scope makes, whatever the depth


@dataclass(frozen=True)
class CompileCounts:
    """What dynamo compiled since ``reset_compile_counts``, from its own counters (``torch._dynamo.utils``)."""

    graphs: int  # graphs handed to the backend: each is compiled (minutes for inductor on CPU)
    frames: int  # frames compiled: a recompile, or the code resumed after a graph break, is one more
    graph_breaks: int  # graph breaks, over all their reasons: each splits a graph and runs eager code between

    def minus(self, earlier: CompileCounts) -> CompileCounts:
        """What was compiled after ``earlier``: after the first update, only recompiles should be."""
        return CompileCounts(self.graphs - earlier.graphs, self.frames - earlier.frames,
                             self.graph_breaks - earlier.graph_breaks)  # fmt: skip


def _counters() -> dict:
    """Dynamo's process-wide counters, imported when first asked for: importing torch._dynamo costs 1-2 s, which
    every ``python -m tfx.train`` would pay at start-up, compiling or not."""
    from torch._dynamo.utils import counters

    return counters


def compile_counts() -> CompileCounts:
    """Dynamo's counts now (they are process-wide: ``reset_compile_counts`` first to count one run)."""
    counters = _counters()
    return CompileCounts(int(counters["stats"]["unique_graphs"]), int(counters["frames"]["ok"]),
                         sum(counters["graph_break"].values()))  # fmt: skip


def reset_compile_counts() -> None:
    """Forget earlier compilations and their counts, so what follows compiles, and is counted, from cold."""
    torch._dynamo.reset()
    _counters().clear()


def compile_problems(*, graphs: int, graph_breaks: int, recompiles: int, max_graphs: int) -> list[str]:
    """What makes a compiled run slower than it should be, one line each (none when it compiled cleanly);
    the graph breaks' reasons are read from dynamo's counters, so call it before they are reset.

    ``max_graphs``: ``GRAPHS_PER_SCOPE``, 2 for ``layers`` (an encoder and a decoder layer graph at any depth),
    1 for ``model``.
    ``recompiles``: frames compiled after the first update; with static shapes, or symbolic shapes that
    cover every batch, there should be none.
    """
    problems = []
    if graph_breaks:
        problems.append(f"{graph_breaks} graph break(s): {graph_break_reasons()}")
    if graphs > max_graphs:
        problems.append(f"{graphs} graphs compiled (expected at most {max_graphs}): graph breaks or recompiles")
    if recompiles:
        problems.append(f"{recompiles} recompile(s) after the first update")
    return problems


def graph_break_reasons() -> str:
    """The first line of each graph break's reason (dynamo's own message), so a warning names its cause."""
    return "; ".join(reason.strip().splitlines()[0] for reason in _counters()["graph_break"]) or "none"
