"""examples/convert_transformer.py, shortened to seconds: both translators learn, the converted one has no LayerNorm.
CPU, fp32, one thread (deterministic for its seed)."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

import pytest
from torch import nn

from tests.conftest import REPO

SHORT = ["--steps", "60", "--d-model", "32", "--batch", "16", "--log-every", "20", "--threads", "1"]
EASY = ["--lr", "3e-3", "--symbols", "8", "--max-len", "6"]  # a smaller task, so that 60 updates show learning


def load_example() -> ModuleType:
    path = REPO / "examples" / "convert_transformer.py"
    spec = importlib.util.spec_from_file_location("convert_transformer_example", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True", "ignore:The PyTorch API of nested tensors")
def test_the_example_trains_both_models_and_the_converted_one_has_no_layernorm(capsys: pytest.CaptureFixture) -> None:
    results = load_example().main(SHORT + EASY)
    for name, run in results.items():
        first, last = sum(run["losses"][:5]) / 5, sum(run["losses"][-10:]) / 10
        assert last < 0.7 * first, f"{name}: loss {first:.3f} -> {last:.3f}"
    has_norm = {name: any(isinstance(m, nn.LayerNorm) for m in run["model"].modules()) for name, run in results.items()}
    assert has_norm == {"tfixup": False, "layernorm": True}
    printed = capsys.readouterr().out
    assert "17 LayerNorms removed" not in printed and "12 LayerNorms removed" in printed
    assert "held-out exact-match accuracy" in printed
