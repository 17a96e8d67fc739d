"""tfx.reporting.init_report: real gradients, untouched model state, the CLI (``python -m tfx.diagnostics``)."""

from __future__ import annotations

import math
import runpy
import sys

import pytest
import torch

from tests.conftest import random_batch, tiny_model
from tfx.init import apply_init
from tfx.reporting.init_report import format_report, init_report, main

ENC, DEC = 2, 3


def _model(init: str = "tfixup"):
    model = tiny_model(enc=ENC, dec=DEC)
    apply_init(model, init, seed=0)
    return model


def _expected_keys(stat: str) -> set[str]:
    return {f"enc/{stat}/{i:03d}" for i in range(ENC)} | {f"dec/{stat}/{i:03d}" for i in range(DEC)}


@pytest.mark.parametrize("init", ["tfixup", "xavier"])
def test_init_report_computes_real_gradients_even_under_no_grad(init: str) -> None:
    model = _model(init)
    src, prev = random_batch()
    assert all(p.grad is None for p in model.parameters())
    with torch.no_grad():  # the classic broken check runs here and reads empty .grad
        report = init_report(model, src, prev)
    assert report.layers == [f"enc/{i}" for i in range(ENC)] + [f"dec/{i}" for i in range(DEC)]
    assert len(report.grad_norms) == len(report.act_rms) == ENC + DEC
    assert all(math.isfinite(g) and g > 0 for g in report.grad_norms)
    assert all(math.isfinite(a) and a > 0 for a in report.act_rms)
    assert report.grad_norm_ratio == pytest.approx(max(report.grad_norms) / min(report.grad_norms))
    assert math.isfinite(report.loss) and report.output_std > 0
    assert all(p.grad is None for p in model.parameters())


def test_init_report_keeps_existing_grads_and_modes() -> None:
    model = _model()
    src, prev = random_batch()
    model.train()
    model.decoder.eval()  # a mixed state must come back exactly
    model(src, prev).sum().backward()
    grads = {p: p.grad.clone() for p in model.parameters() if p.grad is not None}
    modes = [m.training for m in model.modules()]
    init_report(model, src, prev)
    assert all(torch.equal(p.grad, g) for p, g in grads.items())
    assert [m.training for m in model.modules()] == modes


def test_init_report_same_with_activation_checkpointing() -> None:
    model = _model()
    src, prev = random_batch()
    plain = init_report(model, src, prev)
    model.set_activation_checkpointing(True)
    ckpt = init_report(model, src, prev)
    assert ckpt.grad_norms == pytest.approx(plain.grad_norms, rel=1e-5)
    assert ckpt.act_rms == pytest.approx(plain.act_rms, rel=1e-5)


def test_format_report_has_a_row_per_layer() -> None:
    model = _model()
    report = init_report(model, *random_batch())
    text = format_report(report)
    for name in report.layers:
        assert sum(line.startswith(name + " ") for line in text.splitlines()) == 1


TINY = ["--encoder-layers", "2", "--decoder-layers", "2", "--d-model", "16", "--ffn-dim", "32", "--vocab", "30"]


def test_cli_prints_a_row_per_layer(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # runpy runs the real `python -m tfx.diagnostics` entry point without paying a new torch import
    argv = ["tfx.diagnostics", *TINY, "--batch", "2", "--src-len", "5", "--tgt-len", "5"]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.delitem(sys.modules, "tfx.diagnostics", raising=False)  # fresh __main__ run; restored afterwards
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_module("tfx.diagnostics", run_name="__main__")
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    rows = [line.split()[0] for line in out.splitlines() if line.startswith(("enc/", "dec/"))]
    assert rows == ["enc/0", "enc/1", "dec/0", "dec/1"]


def test_cli_refuses_tfixup_with_layer_norm(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*TINY, "--norm", "post", "--init", "tfixup"]) != 0
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error:") and captured.err.count("\n") == 1
