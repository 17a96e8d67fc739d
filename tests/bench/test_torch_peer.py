"""tfx.bench.torch_peer on CPU as on a GPU: bf16 autocast where the CPU has it natively, compiled with inductor,
so bench_train.py's tfx / peer ratio compares the same arithmetic on every device."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch
from torch._dynamo.utils import counters
from torch._inductor.compile_fx import compile_fx

from tfx.bench import torch_peer
from tfx.runtime.compilation import reset_compile_counts

NATIVE_BF16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())  # the hardware's answer (AVX512-BF16/AMX)
SIZES = {"d_model": 32, "heads": 4, "ffn_dim": 64, "n_enc": 1, "n_dec": 1}
VOCAB = 50
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def peer() -> ModuleType:
    return torch_peer


def batch(rows: int = 4, length: int = 8) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(src, prev, target, ntokens) of full rows (no padding), as bench_train.py hands the peer."""
    g = torch.Generator().manual_seed(1)
    src, target = (
        torch.randint(4, VOCAB, (rows, length), generator=g),
        torch.randint(4, VOCAB, (rows, length), generator=g),
    )
    prev = torch.cat([torch.full((rows, 1), 2), target[:, :-1]], dim=1)
    return src, prev, target, target.numel()


def ffn_dtype(trainer: object) -> torch.dtype:
    """The dtype of the first encoder layer's FFN matmul in one eager update: what autocast runs the GEMMs in
    (the layers' outputs are fp32 either way: autocast runs LayerNorm in fp32)."""
    seen = []
    linear = trainer.model.transformer.encoder.layers[0].linear1
    handle = linear.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    try:
        trainer.step(*batch())
    finally:
        handle.remove()
    return seen[0]


def test_the_peer_autocasts_to_bf16_where_the_cpu_has_it(peer: ModuleType) -> None:
    """On CPU the peer used to run fp32 whatever the CPU, while tfx ran bf16 on bf16-native CPUs."""
    assert peer.native_bf16(CPU) == NATIVE_BF16
    default = peer.PeerTrainer(VOCAB, SIZES, CPU, compile_model=False)
    assert default.bf16 == NATIVE_BF16
    assert ffn_dtype(default) == (torch.bfloat16 if NATIVE_BF16 else torch.float32)
    forced = peer.PeerTrainer(VOCAB, SIZES, CPU, compile_model=False, bf16=False)  # bench_train.py at fp32
    assert ffn_dtype(forced) == torch.float32


@pytest.mark.slow
@pytest.mark.fixed_precision
def test_the_compiled_peer_runs_inductor_in_bf16_as_eager(peer: ModuleType) -> None:
    """Compiled (inductor, code generated; about 30 s on CPU) where the CPU has native bf16: one graph, no graph
    break, bf16 autocast inside it, and three updates' losses equal to the eager peer's (dropout 0; measured
    equal to 1e-7 on an AMD EPYC with AVX512-BF16, torch 2.13)."""
    if not NATIVE_BF16:
        pytest.skip("this CPU has no native bf16 (AVX512-BF16/AMX): the peer runs fp32 here, as tfx")
    graphs = []

    def recording_inductor(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(gm)  # what dynamo captured, before inductor lowers it
        return compile_fx(gm, example_inputs)

    losses = {}
    for compiled in (False, True):
        reset_compile_counts()
        torch.manual_seed(0)
        trainer = peer.PeerTrainer(VOCAB, SIZES, CPU, compiled, backend=recording_inductor, dropout=0.0)
        losses[compiled] = [float(trainer.step(*batch())) for _ in range(3)]
    assert len(graphs) == 1 and counters["frames"]["ok"] == 1 and not counters["graph_break"]
    autocasts = [n.args for n in graphs[0].graph.nodes if getattr(n.target, "__name__", "") == "_enter_autocast"]
    assert autocasts == [("cpu", torch.bfloat16, True, None)]
    assert losses[True] == pytest.approx(losses[False], rel=2e-3)  # half a bf16 ulp
