"""scripts/studies/residual_precision.py: emulated bf16 rounding moves the output, a bf16 residual stream moves it more,
and the emulation leaves torch as it found it. CPU, fp32 (bf16 rounding emulated)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import load_script
from tfx.model import residual, transformer


def test_a_bf16_residual_stream_adds_error_to_autocasts_and_the_patches_are_undone(
    capsys: pytest.CaptureFixture,
) -> None:
    rp = load_script("studies/residual_precision")
    originals = F.linear, residual.Residual.forward, transformer.TokenEmbedding.forward
    rp.main(["--depths", "4", "--d-model", "32", "--batch", "2", "--length", "6", "--vocab", "50", "--threads", "1"])
    row = capsys.readouterr().out.splitlines()[-1]
    logits_32, logits_16, grad_32, grad_16 = map(float, row.strip("|").split("|")[1:])
    assert 0 < logits_32 < logits_16 < 0.1 and 0 < grad_32 < grad_16 < 0.2
    assert (F.linear, residual.Residual.forward, transformer.TokenEmbedding.forward) == originals
    assert torch.equal(rp.bf16(torch.tensor([1.0 + 2**-8])), torch.tensor([1.0]))  # 8 significant bits: lost
