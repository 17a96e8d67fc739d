"""Shared fixtures: tiny models and paths to the optional real corpora."""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import pytest
import torch

from tfx.model import ModelConfig, Transformer
from tfx.runtime.precision import CPU_BF16_TRACE_ENV

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


# The tests whose runs ask what train.precision=auto is on this CPU (tfx.runtime.precision.cpu_has_native_bf16, in
# the test's process or a subprocess): marked `reads_auto`, the ones CI's pass with the other answer runs. A test that
# asks and is not listed fails the session (pytest_sessionfinish), so the list cannot fall behind.
AUTO_TESTS = Path(__file__).with_name("precision_auto_tests.txt")
_AUTO_TRACE: list[Path] = []  # the session's trace file (CPU_BF16_TRACE_ENV), set in pytest_configure
_ASKED_UNLISTED: list[str] = []


@functools.cache
def listed_auto_tests() -> frozenset[str]:
    lines = AUTO_TESTS.read_text().splitlines() if AUTO_TESTS.exists() else []
    return frozenset(line.strip() for line in lines if line.strip() and not line.startswith("#"))


def pytest_configure(config: pytest.Config) -> None:
    """Every process of the session (subprocesses inherit the environment) appends to one trace file when it asks
    the CPU's bf16 answer."""
    handle, name = tempfile.mkstemp(prefix="tfx_precision_auto_")
    os.close(handle)
    trace = Path(name)
    os.environ[CPU_BF16_TRACE_ENV] = str(trace)
    _AUTO_TRACE[:] = [trace]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Note a test (setup, call, teardown) during which the trace grew and which is neither listed nor marked
    `fixed_precision` (it pins its precision and asks the hardware on purpose)."""
    before = _AUTO_TRACE[0].stat().st_size if _AUTO_TRACE else 0
    yield
    grew = bool(_AUTO_TRACE) and _AUTO_TRACE[0].stat().st_size > before
    if grew and item.nodeid not in listed_auto_tests() and not item.get_closest_marker("fixed_precision"):
        _ASKED_UNLISTED.append(item.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    for trace in _AUTO_TRACE:
        trace.unlink(missing_ok=True)
    if _ASKED_UNLISTED:
        lines = "\n".join(_ASKED_UNLISTED)
        session.config.get_terminal_writer().line(
            f"\n{len(_ASKED_UNLISTED)} test(s) read train.precision=auto's CPU answer but are not in "
            f"tests/{AUTO_TESTS.name}, so CI's pass with the other answer would leave them out; add these lines:\n"
            f"{lines}",
            red=True,
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip `gpu`-marked tests cleanly where CUDA is missing (unless TFX_GPU_TEST_DEVICE names another device);
    with TFX_LONG_TESTS=0 leave out the `long` ones, with =first all but those marked `ci_first_pass`, with =second
    those (CI runs each once, split between its passes to end them together: .ci/run); mark the listed tests
    `reads_auto`."""
    listed = listed_auto_tests()
    for item in items:
        if item.nodeid in listed:
            item.add_marker(pytest.mark.reads_auto)
    long_tests = os.environ.get("TFX_LONG_TESTS", "1")
    for item in items:
        if not item.get_closest_marker("long"):
            continue
        first = item.get_closest_marker("ci_first_pass") is not None
        if long_tests == "0" or (long_tests == "first" and not first) or (long_tests == "second" and first):
            item.add_marker(pytest.mark.skip(reason=f"TFX_LONG_TESTS={long_tests}: run in CI's other pass"))
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
