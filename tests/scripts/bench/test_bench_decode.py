"""scripts/bench/bench_decode.py --peer: reading fairseq-generate's output, and (slow, where fairseq is installed)
the same hypotheses from fairseq-generate as from tfx on a converted tiny model."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import ModuleType

import pytest
import torch

from tests.conftest import VOCAB, tiny_model
from tfx.data import EOS
from tfx.init import apply_init

GENERATE_OUTPUT = """\
2026-11-30 11:31:39 | INFO | fairseq.tasks.translation | [de] dictionary: 8000 types
S-1\tt5 t9
H-1\t-0.51\tt7 t8 t9
D-1\t-0.51\tt7 t8 t9
P-1\t-0.1 -0.2 -0.3 -0.4
H-0\t-1.2\t
P-0\t-1.7
2026-11-30 11:32:00 | INFO | fairseq_cli.generate | Translated 1,002 sentences (26,052 tokens) in 201.3s \
(4.98 sentences/s, 129.42 tokens/s)
"""


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    from tests.conftest import load_script

    return load_script("bench/bench_decode")


def test_generate_output_gives_hypotheses_and_its_own_timing(bench: ModuleType) -> None:
    hyps, run = bench.parse_generate_output(GENERATE_OUTPUT)
    assert hyps == {1: [7, 8, 9], 0: []}
    assert (run.sentences, run.tokens, run.tokens_per_s) == (1002, 26052, 129.42)
    with pytest.raises(ValueError, match="Translated"):
        bench.parse_generate_output("H-0\t-1.0\tt5\n")


@pytest.mark.slow
def test_fairseq_generate_finds_tfx_hypotheses_on_the_converted_model(bench: ModuleType, tmp_path: Path) -> None:
    """Beam 5 on a tiny random Post-LN model: every best hypothesis and the token count agree, and the
    teacher-forced log-probabilities match to float32 rounding."""
    venv = bench.FAIRSEQ_VENV
    if not (venv / "bin" / "fairseq-generate").is_file():
        pytest.skip(f"fairseq is not installed in {venv} (../shared/bench/fairseq_peer.sh installs it)")
    torch.manual_seed(0)
    model = tiny_model("post", enc=1, dec=2, d=32).eval()
    apply_init(model, "xavier")
    g = torch.Generator().manual_seed(0)
    src = [
        torch.randint(4, VOCAB, (int(n),), generator=g).tolist() + [EOS]
        for n in torch.randint(2, 9, (12,), generator=g)
    ]
    args = argparse.Namespace(beam=5, lenpen=1.0, max_len_a=0.0, max_len_b=7, max_tokens=64, bf16=False, threads=1)
    max_diff = bench.convert_for_fairseq(model, src, [[2, *x[:-1]] for x in src[:4]], tmp_path, venv, threads=1)
    assert max_diff < 1e-4
    ours, our_run = bench.run_tfx(model, src, args)
    theirs, their_run = bench.run_fairseq(tmp_path, venv, args)
    assert [bench.strip_unk(h) for h in ours] == [theirs[i] for i in range(len(src))]
    assert our_run.tokens == their_run.tokens
