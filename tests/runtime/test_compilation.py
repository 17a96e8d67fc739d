"""tfx/runtime/compilation.py: per-layer (regional) compile gives the eager model's loss and gradients with one graph
per layer kind whatever the depth, a second update recompiles nothing, and decoding inside ``eager()`` compiles
nothing. CPU, fp32; the ``aot_eager`` backend traces forward and backward as inductor would, without code
generation (seconds, not minutes); the last tests run tfx.train with the real default (inductor): CI's check that
the compiler a GPU run will use takes the update whole (no graph breaks, no recompiles, the eager losses)."""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

import tfx.training.build
from tests.test_train import tiny_cfg
from tfx.evaluation.decode import greedy_decode
from tfx.model import build_model
from tfx.model.layers import EncoderLayer
from tfx.model.packing import Packing
from tfx.runtime.compilation import (
    GRAPHS_PER_SCOPE,
    CompileCounts,
    compile_counts,
    compile_for_training,
    compile_problems,
    eager,
    reset_compile_counts,
)
from tfx.train import train

PAD = 1


def packed_batch(rows: int = 4, sentences: int = 3, length: int = 5) -> tuple[torch.Tensor, torch.Tensor, Packing]:
    torch.manual_seed(3)
    width = sentences * length
    src, tgt = torch.randint(4, 50, (rows, width)), torch.randint(4, 50, (rows, width))
    segments = torch.arange(1, sentences + 1).repeat_interleave(length)[None].expand(rows, -1).contiguous()
    positions = torch.arange(length).repeat(sentences)[None].expand(rows, -1).contiguous()
    return src, tgt, Packing(segments, segments, positions, positions)


def loss_and_grads(net: torch.nn.Module, model: torch.nn.Module, batch: tuple) -> tuple[torch.Tensor, list]:
    src, tgt, packing = batch
    model.zero_grad()
    loss = net(src, tgt, packing=packing).float().logsumexp(-1).mean()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def tiny_model(layers: int) -> torch.nn.Module:
    torch.manual_seed(0)
    sizes = {"d_model": 32, "ffn_dim": 64, "heads": 4, "dropout": 0.0, "attention_dropout": 0.0,
             "activation_dropout": 0.0, "max_positions": 64}  # fmt: skip
    return build_model({"encoder_layers": layers, "decoder_layers": layers, **sizes}, vocab_size=50, pad_id=PAD)


@pytest.fixture(autouse=True)
def cold_dynamo() -> None:
    torch._dynamo.reset()
    counters.clear()


@pytest.mark.parametrize("layers", [2, 8])
def test_layers_scope_is_the_eager_model_with_one_graph_per_layer_kind(layers: int) -> None:
    model, batch = tiny_model(layers), packed_batch()
    reference = copy.deepcopy(model)
    net = compile_for_training(model, "layers", dynamic=False, backend="aot_eager")
    assert net is model  # compiled in place: the state dict keeps its keys
    loss, grads = loss_and_grads(net, model, batch)
    ref_loss, ref_grads = loss_and_grads(reference, reference, batch)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=0)
    flat, ref_flat = torch.cat([g.flatten() for g in grads]), torch.cat([g.flatten() for g in ref_grads])
    assert (flat - ref_flat).norm() / ref_flat.norm() < 1e-5  # whole gradient (op order differs in single elements)
    assert counters["frames"]["ok"] == 2  # an encoder layer and a decoder layer, reused down both stacks
    loss_and_grads(net, model, batch)
    assert counters["frames"]["ok"] == 2  # the second update: no recompile
    assert list(model.state_dict()) == list(reference.state_dict())


def test_layers_scope_under_activation_checkpointing_as_the_deep_recipe() -> None:
    model, batch = tiny_model(3), packed_batch()
    model.encoder.checkpoint_activations = model.decoder.checkpoint_activations = True  # conf/model/deep.yaml
    reference = copy.deepcopy(model)
    net = compile_for_training(model, "layers", dynamic=False, backend="aot_eager")
    loss, grads = loss_and_grads(net, model, batch)
    ref_loss, ref_grads = loss_and_grads(reference, reference, batch)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=0)
    flat, ref_flat = torch.cat([g.flatten() for g in grads]), torch.cat([g.flatten() for g in ref_grads])
    assert (flat - ref_flat).norm() / ref_flat.norm() < 1e-5
    assert counters["frames"]["ok"] == 2


def test_decoding_inside_eager_compiles_nothing() -> None:
    model, batch = tiny_model(2), packed_batch()
    net = compile_for_training(model, "layers", dynamic=False, backend="aot_eager")
    loss_and_grads(net, model, batch)
    model.eval()
    src = torch.cat([batch[0][:2, :6], torch.full((2, 1), 2)], dim=1)  # two sentences ending in EOS (id 2)
    with torch.no_grad(), eager():
        hyps = greedy_decode(model, src, max_len_b=4)
    assert counters["frames"]["ok"] == 2 and len(hyps) == 2
    with torch.no_grad():
        greedy_decode(model, src, max_len_b=4)  # what eager() prevents: every step's new shape compiles again
    assert counters["frames"]["ok"] > 2


def test_model_scope_wraps_the_whole_forward() -> None:
    model, batch = tiny_model(2), packed_batch()
    net = compile_for_training(model, "model", dynamic=False, backend="aot_eager")
    assert net is not model and isinstance(net, torch._dynamo.eval_frame.OptimizedModule)
    loss_and_grads(net, model, batch)
    assert counters["frames"]["ok"] == 1
    with pytest.raises(ValueError, match="compile scope 'blocks'"):
        compile_for_training(model, "blocks", dynamic=False)


# ---------------------------------------------------------------- CI's inductor check
UPDATES = 20  # toy sentences of 3-10 words: each packed batch holds other lengths, each padded batch another shape
NATIVE_BF16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())  # the hardware's answer, not TFX_CPU_NATIVE_BF16's
# Relative tolerance of each update's loss against eager. Measured (2026-12-06, AMD EPYC with AVX512-BF16, torch
# 2.13 CPU, one thread): fp32 1.2e-7 at most, bf16 0 (inductor keeps autocast's casts). The bounds leave room for
# another CPU's kernels: fp32 about 100 float ulps, bf16 half a bf16 ulp (2^-9).
LOSS_RTOL = {"fp32": 1e-5, "bf16": 2e-3}


@dataclass
class CompiledRun:
    losses: list[float]  # per update, as tfx.train logs them
    eager_losses: list[float]  # the same run without train.compile
    counts: CompileCounts  # what dynamo compiled over the whole run
    recompiles: int  # frames compiled after the first compiled update

    def problems(self, scope: str) -> list[str]:
        """``tfx.runtime.compilation.compile_problems``, as bench_train.py warns: none when the compile was clean."""
        return compile_problems(graphs=self.counts.graphs, graph_breaks=self.counts.graph_breaks,
                                recompiles=self.recompiles, max_graphs=GRAPHS_PER_SCOPE[scope])  # fmt: skip


def compiled_run(tmp_path: Path, batching: str, scope: str, precision: str, layers: int) -> CompiledRun:
    """tfx.train for ``UPDATES`` updates eagerly, then with ``train.compile`` (the trainer's own compile, packed
    static or padded with symbolic shapes, as tfx.training.build.wrap decides), counting what dynamo compiles after the
    first compiled update. Update 1 records layer statistics and update 10 validates: both run eagerly
    (``tfx.runtime.compilation.eager``), and the updates after them must not recompile. No dropout: inductor draws its
    own masks."""
    data, model = {"batching": batching}, {"dropout": 0.0, "encoder_layers": layers, "decoder_layers": layers}
    kw = {"max_updates": UPDATES, "precision": precision, "compile_scope": scope, "validate_every_updates": 10}
    eager_run = train(tiny_cfg(tmp_path / "eager", data, model, **kw), tmp_path / "eager" / "run")
    reset_compile_counts()
    after_first: list[CompileCounts] = []

    def count_first(trainer: object, metrics: dict[str, float]) -> None:
        counts = compile_counts()
        if not after_first and counts.frames:
            after_first.append(counts)

    cfg = tiny_cfg(tmp_path / "compiled", data, model, compile=True, **kw)
    compiled = train(cfg, tmp_path / "compiled" / "run", on_update=count_first)
    counts = compile_counts()
    recompiles = counts.minus(after_first[0]).frames
    return CompiledRun(compiled["losses"], eager_run["losses"], counts, recompiles)


# Each batching, scope and precision twice, and each pair of their values once (padded x model, ...): four
# inductor compiles instead of eight. Layers scope at 2+2 layers (one graph per layer kind down the stack), model
# scope at 1+1 (its one graph grows with depth, and so does its compile time).
CASES = [
    ("packed", "layers", "fp32", 2),
    ("packed", "model", "bf16", 1),
    ("padded", "model", "fp32", 1),
    ("padded", "layers", "bf16", 2),
]


@pytest.mark.slow
@pytest.mark.fixed_precision
@pytest.mark.parametrize(("batching", "scope", "precision", "layers"), CASES, ids=["-".join(c[:3]) for c in CASES])
def test_inductor_compiles_the_update_whole_and_matches_eager(
    tmp_path: Path, batching: str, scope: str, precision: str, layers: int
) -> None:
    """CI's check of what a GPU run will compile, on CPU: tfx.train with ``train.compile`` and inductor (code
    generated, not only traced), d 32, 20 updates of varying real sentence lengths, validating at update 10. No
    graph break, at most 2 graphs (layers) or 1 (model), no recompile after the first compiled update (packed:
    static shapes; padded: symbolic), and every update's loss equal to eager's within ``LOSS_RTOL`` (CPU; fp32, or
    bf16 autocast where the CPU has it natively)."""
    if precision == "bf16" and not NATIVE_BF16:
        pytest.skip("this CPU has no native bf16 (AVX512-BF16/AMX): oneDNN would emulate it, ~100x slower than fp32")
    run = compiled_run(tmp_path, batching, scope, precision, layers)
    assert run.problems(scope) == []
    assert run.counts.graphs == GRAPHS_PER_SCOPE[scope]  # compiled at all, one graph per layer kind (or model)
    assert len(run.losses) == UPDATES
    assert run.losses == pytest.approx(run.eager_losses, rel=LOSS_RTOL[precision])


@pytest.mark.fixed_precision
def test_a_planted_graph_break_fails_the_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An encoder layer that reads a value on the host (``.item()``, as a stray log line would) breaks its graph:
    the check above names the break and the extra graphs. Traced by aot_eager, not inductor: dynamo finds graph
    breaks before any backend runs, and this test then takes seconds."""
    forward = EncoderLayer.forward

    def reads_the_host(self: EncoderLayer, x: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        if x.float().abs().sum().item() < 0:  # never true: only the read matters
            x = -x
        return forward(self, x, *args, **kwargs)

    monkeypatch.setattr(EncoderLayer, "forward", reads_the_host)
    monkeypatch.setattr(
        tfx.training.build, "compile_for_training", functools.partial(compile_for_training, backend="aot_eager")
    )
    run = compiled_run(tmp_path, "packed", "layers", "fp32", layers=2)
    problems = run.problems("layers")
    assert run.counts.graph_breaks >= 1 and run.counts.graphs > GRAPHS_PER_SCOPE["layers"]
    assert any(p.startswith(f"{run.counts.graph_breaks} graph break(s): Unsupported Tensor.item()") for p in problems)
    assert any("graphs compiled (expected at most 2)" in p for p in problems)
