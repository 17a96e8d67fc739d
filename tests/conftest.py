"""Shared fixtures: tiny models and paths to the optional real corpora."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from tfx.model import ModelConfig, Transformer

# Tests run tiny models: one thread avoids oversubscription (and 10x slowdowns on a busy 2-core box).
torch.set_num_threads(1)
# Every Python process the tests start (mp.spawn's ranks, `python -m tfx.train` subprocesses) prints all its threads'
# stacks on a fatal signal (SIGSEGV, SIGABRT, ...): mp.spawn alone reports "process 1 terminated with signal SIGSEGV".
# Their stderr is the test's (pytest captures it). pytest's own process has pytest's faulthandler.
os.environ.setdefault("PYTHONFAULTHANDLER", "1")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO / ".." / "shared" / "data"
VOCAB, PAD = 50, 0
# The device `gpu`-marked tests use; TFX_GPU_TEST_DEVICE=cpu runs them on CPU (checks the tests themselves).
GPU_TEST_DEVICE = os.environ.get("TFX_GPU_TEST_DEVICE", "cuda")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip `gpu`-marked tests cleanly where CUDA is missing (unless TFX_GPU_TEST_DEVICE names another device);
    with TFX_LONG_TESTS=0 leave out the `long` ones (CI runs them once, in its other pass: .ci/run)."""
    if os.environ.get("TFX_LONG_TESTS") == "0":
        skip_long = pytest.mark.skip(reason="TFX_LONG_TESTS=0: run in CI's other pass")
        for item in items:
            if item.get_closest_marker("long"):
                item.add_marker(skip_long)
    if GPU_TEST_DEVICE != "cuda" or torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (TFX_GPU_TEST_DEVICE=cpu runs it on CPU)")
    for item in items:
        if item.get_closest_marker("gpu"):  # the marker, not a keyword: tests/scripts/gpu/ is a folder named gpu
            item.add_marker(skip)


def tiny_model(norm: str = "none", enc: int = 2, dec: int = 2, d: int = 32, **kw) -> Transformer:
    kw = {"dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0, **kw}
    return Transformer(
        ModelConfig(encoder_layers=enc, decoder_layers=dec, d_model=d, ffn_dim=2 * d, heads=4, norm=norm, **kw),
        VOCAB,
        PAD,
    )


def random_batch(b: int = 3, s: int = 7, t: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded source and decoder input with ids >= 4 (0-3 are specials)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, VOCAB, (b, s), generator=g)
    tgt = torch.randint(4, VOCAB, (b, t), generator=g)
    src[0, s - 2 :] = PAD
    return src, tgt


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is not present on this machine")
    return SHARED_DATA


def load_script(name: str) -> ModuleType:
    """Import ``scripts/<name>.py`` (``name`` as ``bench/bench_train``) as a module named by its file (scripts are not
    part of the package), with its folder on the path as when it runs as a file (for its `import _require_tfx`)."""
    path = REPO / "scripts" / f"{name}.py"
    if str(path.parent) not in sys.path:
        sys.path.append(str(path.parent))
    module_name = path.stem
    if (loaded := sys.modules.get(module_name)) is not None and Path(getattr(loaded, "__file__", "")) == path:
        return loaded  # loaded already by another test module: one module, as when the script runs
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve string annotations through sys.modules
    spec.loader.exec_module(module)
    return module
