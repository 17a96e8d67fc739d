"""A method is one registration: a throwaway method, written only to a temporary folder (a plugin module with
its init scheme and residual kind, the kind with an option of its own; a config folder with its method and init
YAMLs), composes, builds, initializes, is saved and loaded, and goes through the converged study's plan without a
line of tfx, conf/ or scripts/ edited (docs/layout.md, "Adding a method")."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

from tests.checkpoint_helpers import write_checkpoint
from tests.conftest import load_script, random_batch, tiny_model
from tfx.checkpoints.load import CheckpointError
from tfx.config import compose_config
from tfx.evaluation.translate import load_model
from tfx.init import SCHEMES, apply_init
from tfx.model import build_model
from tfx.model.residual import RESIDUALS
from tfx.studies import arms

PLUGIN = '''"""A throwaway method: x + gain * f(x), gain its kind's own option (default 0.5), no LayerNorm; Xavier,
then every output projection zeroed."""

from dataclasses import dataclass

from torch import nn

from tfx.init import Scheme, init_xavier, register
from tfx.model.residual import Residual, residual_kind


@dataclass(frozen=True)
class HalfOptions:
    gain: float = 0.5


@residual_kind("half")
class Half(Residual):
    Options = HalfOptions

    def __init__(self, at, *, gain):
        super().__init__(at)
        self.gain = gain

    def forward(self, x, branch):
        return x + self.gain * self.dropout(branch(x))


def init_throwaway(model, seed=1, batch=None):
    init_xavier(model, seed)
    for layer in [*model.encoder.layers, *model.decoder.layers]:
        nn.init.zeros_(layer.self_attn.out_proj.weight)


SCHEME = register(Scheme("throwaway", init_throwaway, needs_norm="half"))
'''

METHOD = """# @package _global_
# a throwaway method, trained without warmup by definition
defaults:
  - override /init: throwaway
model:
  norm: half
  norm_options:
    gain: 0.25
optim:
  warmup_updates: 0
warmup_free: true
plugins: [throwaway_method]
method: throwaway
"""


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The method's files in ``tmp_path`` (``throwaway_method.py`` importable, ``conf/``); the registries and
    the study's arms as they were, afterwards."""
    (tmp_path / "throwaway_method.py").write_text(PLUGIN)
    for group, text in {"method": METHOD, "init": "name: throwaway\n"}.items():
        (tmp_path / "conf" / group).mkdir(parents=True)
        (tmp_path / "conf" / group / "throwaway.yaml").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    registries = (SCHEMES, RESIDUALS, arms.ARMS, arms.METHODS)
    saved = [dict(registry) for registry in registries]
    yield tmp_path / "conf"
    for registry, items in zip(registries, saved, strict=True):
        registry.clear()
        registry.update(items)
    arms.warmup_free.cache_clear()
    sys.modules.pop("throwaway_method", None)


def test_a_plugin_method_composes_builds_and_initializes(plugin: Path) -> None:
    cfg = compose_config([f"hydra.searchpath=[file://{plugin}]", "method=throwaway"])
    assert (cfg.method, cfg.model.norm, cfg.init.name, cfg.warmup_free) == ("throwaway", "half", "throwaway", True)
    assert cfg.model.norm_options == {"gain": 0.25}  # its kind's option, as its method YAML sets it
    model = build_model(cfg.model, 50, 0)
    assert {layer.ffn_block.gain for layer in model.encoder.layers} == {0.25}
    apply_init(model, cfg.init.name, seed=cfg.train.seed)
    assert all(not layer.self_attn.out_proj.weight.any() for layer in model.encoder.layers)
    with pytest.raises(ValueError, match="needs model.norm=half"):
        apply_init(tiny_model("none"), "throwaway")
    src, tgt = random_batch()
    assert torch.isfinite(model(src % 50, tgt % 50)).all()


def test_a_plugin_kinds_option_is_overridden_saved_and_loaded(plugin: Path, tmp_path: Path) -> None:
    """``model.norm_options.gain=V`` overrides the YAML's value (no ModelConfig field involved); a checkpoint holds
    it and rebuilds the model with it; a name the kind does not declare is refused by name."""
    cfg = compose_config([f"hydra.searchpath=[file://{plugin}]", "method=throwaway", "model.norm_options.gain=0.75"])
    ckpt = write_checkpoint(tmp_path / "plugin.pt", config=dataclasses.asdict(cfg))
    model, _, config = load_model(ckpt, torch.device("cpu"))
    assert config["model"]["norm_options"] == {"gain": 0.75}
    assert {layer.self_attn_block.gain for layer in model.decoder.layers} == {0.75}
    with pytest.raises(ValueError, match=r"model\.norm_options\.gian: model\.norm=half has no such option \(its "
                       r"options: gain\)"):  # fmt: skip
        compose_config([f"hydra.searchpath=[file://{plugin}]", "method=throwaway", "+model.norm_options.gian=1"])


def test_a_plugin_method_is_an_arm_of_the_converged_study(plugin: Path, capsys: pytest.CaptureFixture) -> None:
    """Its YAML's warmup_free keeps its grid at warmup 0 (2 lrs x 2 dropouts), as T-Fixup's."""
    cs: ModuleType = load_script("studies/converged_study")
    argv = [f"hydra.searchpath=[file://{plugin}]", "--out", str(plugin / "study"), "--dry-run", "--arms", "throwaway",
            "postln"]  # fmt: skip
    assert cs.main(argv) == 0
    plan = capsys.readouterr().out.splitlines()
    assert plan[0].startswith("throwaway: grid 4 runs x 3 epochs;") and "norm=half init=throwaway" in plan[0]
    assert plan[1].startswith("postln: grid 16 runs x 3 epochs;")  # the study's own arms compose beside it


def test_a_plugin_that_is_not_importable_is_named(plugin: Path) -> None:
    with pytest.raises(ValueError, match="plugins: cannot import 'no_such_module'"):
        compose_config([f"hydra.searchpath=[file://{plugin}]", "method=throwaway", "plugins=[no_such_module]"])


def test_a_plugin_checkpoint_without_its_module_points_at_the_python_path(
    plugin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 67: a checkpoint of a plugin method, loaded where the plugin does not import, is refused in one line that
    asks for the module's folder on PYTHONPATH and does not doubt that tfx.train wrote the checkpoint."""
    cfg = compose_config([f"hydra.searchpath=[file://{plugin}]", "method=throwaway"])
    ckpt = write_checkpoint(tmp_path / "plugin.pt", config=dataclasses.asdict(cfg))
    assert load_model(ckpt, torch.device("cpu"))[2]["plugins"] == ["throwaway_method"]  # with the module: fine
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(plugin.parent)])
    sys.modules.pop("throwaway_method", None)
    with pytest.raises(CheckpointError) as info:
        load_model(ckpt, torch.device("cpu"))
    message = str(info.value)
    assert message.startswith(f"checkpoint {ckpt}: its model needs a plugin that does not import here: plugins: ")
    assert message.endswith("is its folder on PYTHONPATH?") and "written by tfx.train" not in message
