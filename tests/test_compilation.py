"""tfx/compilation.py: per-layer (regional) compile gives the eager model's loss and gradients with one graph per
layer kind whatever the depth, a second update recompiles nothing, and decoding inside ``eager()`` compiles
nothing. CPU, fp32; the ``aot_eager`` backend traces forward and backward as inductor would, without code
generation (seconds, not minutes); the last test runs tfx.train with the real default (inductor)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from tests.test_train import tiny_cfg
from tfx.compilation import compile_for_training, eager
from tfx.decode import greedy_decode
from tfx.model import build_model
from tfx.model.packing import Packing
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


@pytest.mark.slow
def test_a_compiled_packed_run_trains_validates_and_compiles_each_layer_kind_once(tmp_path: Path) -> None:
    """tfx.train, train.compile=true (inductor, layers), packed batches, 6 updates with layer statistics and
    a validation at update 3: the losses are the eager run's (fp32, no dropout, relative 1e-4) and dynamo compiled
    2 frames."""
    kw = {"max_updates": 6, "validate_every_updates": 3, "layer_stats_every_updates": 2}
    data, model = {"batching": "packed"}, {"dropout": 0.0}  # inductor draws its own dropout masks
    eager_run = train(tiny_cfg(tmp_path / "eager", data, model, **kw), tmp_path / "eager" / "run")
    compiled = train(tiny_cfg(tmp_path / "compiled", data, model, compile=True, **kw), tmp_path / "compiled" / "run")
    assert compiled["losses"] == pytest.approx(eager_run["losses"], rel=1e-4)
    assert counters["frames"]["ok"] == 2
