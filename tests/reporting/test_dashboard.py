"""The TensorBoard dashboard: per-layer statistics as heatmap images (not a scalar card per layer), after the
training curves on the page TensorBoard opens, the custom-scalars front page, the HParams columns; and the
heatmap's colours."""

from __future__ import annotations

import functools
import io
import math
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest

from tests.test_train import tiny_cfg
from tfx.config import compose_config
from tfx.reporting.dashboard import HPARAMS_METRICS, HPARAMS_SHOWN, LayerHistory, hparams, split_layer_stats
from tfx.reporting.heatmap import NON_FINITE, NON_POSITIVE, STOPS, colors, render
from tfx.reporting.metrics_log import FILENAME, read_metrics
from tfx.train import train

PANELS = {"~layers/enc/act_rms", "~layers/enc/grad_norm", "~layers/dec/act_rms", "~layers/dec/grad_norm"}
FRONT = ["^train/loss$", "^valid/bleu$", "^train/lr$", "^train/grad_norm$"]


def test_colours_are_log_scale_with_zero_and_non_finite_marked() -> None:
    rgb = colors(np.array([1e-3, 1e-2, 1e-1, 0.0, math.nan, math.inf]), lo=1e-3, hi=1e-1)
    assert rgb[0].tolist() == STOPS[0].tolist() and rgb[2].tolist() == STOPS[-1].tolist()
    assert rgb[1].tolist() == STOPS[2].tolist()  # 1e-2 is half way between 1e-3 and 1e-1 in log10
    assert rgb[3].tolist() == list(NON_POSITIVE)
    assert rgb[4].tolist() == rgb[5].tolist() == list(NON_FINITE)


def test_heatmap_has_a_row_band_per_layer_and_a_column_band_per_update() -> None:
    values = np.array([[1.0, 10.0, 100.0], [100.0, 10.0, 1.0]])  # (2 layers, 3 updates)
    image = render(values, "test", [1, 3, 5])
    assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
    cells = {tuple(c) for c in image.reshape(-1, 3).tolist()}
    assert {tuple(STOPS[0].astype(int)), tuple(STOPS[2].astype(int)), tuple(STOPS[-1].astype(int))} <= cells


def test_layer_history_keeps_one_column_per_recorded_update() -> None:
    history = LayerHistory()
    for step in (1, 5, 9):
        history.add(step, {f"layers/enc/act_rms/{i:03d}": float(step + i) for i in range(4)})
    assert history.panels["layers/enc/act_rms"][0] == [1, 5, 9]
    assert [c[3] for c in history.panels["layers/enc/act_rms"][1]] == [4.0, 8.0, 12.0]
    assert set(history.images()) == {"~layers/enc/act_rms"}  # the image's tag (``image_tag``)
    layers, rest = split_layer_stats({"layers/enc/act_rms/000": 1.0, "train/loss": 2.0})
    assert layers == {"layers/enc/act_rms/000": 1.0} and rest == {"train/loss": 2.0}


class DeepRun(NamedTuple):
    acc: Any  # EventAccumulator of <run>/tb, every image and scalar kept
    values: list[Any]  # every raw summary value (the custom-scalars layout and HParams are not indexed by tag)
    seen: list[dict[str, float]]  # the metrics the update hook saw
    run_dir: Path


@pytest.fixture(scope="module")
def deep_run(tmp_path_factory: pytest.TempPathFactory) -> DeepRun:
    """20+20 layers (d16), 6 updates, per-layer statistics every 2: trained once for the tests below."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

    tmp_path = tmp_path_factory.mktemp("deep")
    model = {"encoder_layers": 20, "decoder_layers": 20, "d_model": 16, "ffn_dim": 32, "heads": 2}
    cfg = tiny_cfg(tmp_path, model_kw=model, max_updates=6, layer_stats_every_updates=2, valid_max_sentences=2)
    seen: list[dict[str, float]] = []
    train(cfg, tmp_path / "run", on_update=lambda _t, m: seen.append(dict(m)))
    tb = tmp_path / "run" / "tb"
    acc = EventAccumulator(str(tb), size_guidance={"images": 0, "scalars": 0})
    acc.Reload()
    values = [v for f in tb.glob("events.*") for ev in LegacyEventFileLoader(str(f)).Load() for v in ev.summary.value]
    return DeepRun(acc, values, seen, tmp_path / "run")


def test_deep_run_writes_per_layer_images_not_a_scalar_per_layer(deep_run: DeepRun) -> None:
    """About 20 scalar tags and four layers x updates images (one per stack and statistic); before,
    the same run wrote 80 more scalar tags, one per layer and statistic."""
    from PIL import Image

    scalars, images = deep_run.acc.Tags()["scalars"], deep_run.acc.Tags()["images"]
    assert not [t for t in scalars if t.startswith("layers/")]
    assert len(scalars) <= 20, sorted(scalars)
    assert set(images) == PANELS
    shots = deep_run.acc.Images("~layers/dec/grad_norm")
    assert [e.step for e in shots] == [1, 3, 5]  # every layer_stats_every_updates, logged after the update
    last = shots[-1]
    assert Image.open(io.BytesIO(last.encoded_image_string)).size == (last.width, last.height)
    assert last.height >= 20


def test_per_layer_values_still_reach_the_hook_but_not_metrics_jsonl(deep_run: DeepRun) -> None:
    recorded = [m for m in deep_run.seen if "layers/dec/grad_norm/019" in m]
    assert len(recorded) == 3 and all(m["layers/dec/grad_norm/019"] > 0 for m in recorded)
    records = read_metrics(deep_run.run_dir / FILENAME)
    assert [r["step"] for r in records if r["event"] == "update"] == [1, 2, 3, 4, 5, 6]
    assert not [k for r in records for k in r if k.startswith("layers/")]


def test_custom_scalars_open_with_loss_bleu_lr_and_grad_norm(deep_run: DeepRun) -> None:
    from tensorboard.plugins.custom_scalar import layout_pb2

    (config,) = [v for v in deep_run.values if v.tag == "custom_scalars__config__"]
    layout = layout_pb2.Layout.FromString(config.tensor.string_val[0])
    assert [list(c.multiline.tag) for c in layout.category[0].chart[:4]] == [[t] for t in FRONT]


def session_hparams(values: list[Any]) -> Any:
    """The run's HParams row (``session_start_info.hparams``: column -> protobuf Value) among its summary values."""
    from tensorboard.plugins.hparams import plugin_data_pb2

    (start,) = [v for v in values if v.tag == "_hparams_/session_start_info"]
    return plugin_data_pb2.HParamsPluginData.FromString(start.metadata.plugin_data.content).session_start_info.hparams


def test_hparams_columns_include_method_and_optimizer(deep_run: DeepRun) -> None:
    from tensorboard.plugins.hparams import plugin_data_pb2

    columns = session_hparams(deep_run.values)
    assert columns["method"].string_value == "custom" and columns["optim"].string_value == "adam"
    # integers read as integers (TensorBoard shows a number as "20.000"); the lr stays a number
    assert columns["depth"].string_value == "20+20" and columns["lr"].number_value == 2e-3
    assert columns["seed"].string_value == "1" and columns["precision"].string_value == "fp32"
    (experiment,) = [v for v in deep_run.values if v.tag == "_hparams_/experiment"]
    data = plugin_data_pb2.HParamsPluginData.FromString(experiment.metadata.plugin_data.content)
    infos = data.experiment.hparam_infos
    # the columns TensorBoard's table displays before anyone ticks a box
    assert {i.name for i in infos if i.differs} == set(HPARAMS_SHOWN) and {"method", "optim"} <= {i.name for i in infos}
    # the metric columns are scalars the run logs anyway, under short names: no single-point hparam/* charts
    metrics = {m.name.tag: m.display_name for m in data.experiment.metric_infos}
    assert metrics == HPARAMS_METRICS and set(metrics) <= set(deep_run.acc.Tags()["scalars"])
    assert not [t for t in deep_run.acc.Tags()["scalars"] if t.startswith("hparam/")]


# The HParams table shows five columns until one ticks more (TensorBoard 2.21's tf-hparams-query-pane: the first
# five after those marked as differing): method and the grid's three axes (docs/converged.md) among them.
SHOWN_AT_MOST = 5
GRID_AXES = {"lr", "dropout", "warmup"}


def test_hparams_carry_every_axis_a_sweep_varies_and_show_the_grid_first() -> None:
    """Issue 67: HParams had no dropout column (one of the grid's three axes) and lr was unticked."""
    cfg = compose_config(["method=postln", "model.dropout=0.2", "optim.lr=1e-3", "train.seed=3"])
    row = hparams(cfg)
    assert {"lr", "dropout", "warmup", "depth", "precision", "seed", "method", "init"} <= set(row)
    assert (row["lr"], row["dropout"], row["seed"], row["depth"]) == (1e-3, 0.2, 3, "2+2")
    assert row["warmup"] == cfg.optim.warmup_updates == 400  # postln's ${optim.budget_warmup}, resolved
    assert (row["method"], row["init"], row["precision"]) == ("postln", "xavier", "auto")  # the setting, unresolved
    assert hparams(cfg, "bf16")["precision"] == "bf16"  # what the run resolved it to
    assert GRID_AXES | {"method"} <= set(HPARAMS_SHOWN) <= set(row) and len(HPARAMS_SHOWN) <= SHOWN_AT_MOST


def test_the_hparams_row_has_the_precision_the_run_resolved(tmp_path: Path) -> None:
    """``train.precision=auto`` is bf16 or fp32 by the machine: the row says which (the reporter's ``start``)."""
    import torch
    from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

    from tfx.reporting.reporter import Reporter

    cfg = tiny_cfg(tmp_path, precision="auto")
    reporter = Reporter(tmp_path / "run", 0, 1)
    reporter.start(tmp_path / "run", cfg, 1000, torch.device("cpu"), "bf16", 1)
    reporter.final(cfg)
    reporter.close()
    events = (tmp_path / "run" / "tb").glob("events.*")
    values = [v for f in events for ev in LegacyEventFileLoader(str(f)).Load() for v in ev.summary.value]
    assert session_hparams(values)["precision"].string_value == "bf16"


def _digit(c: str) -> bool:
    return "0" <= c <= "9"


def _number_end(tag: str, i: int) -> int:
    """Where the number starting at ``tag[i]`` ends: digits, then optionally ``.`` digits and an exponent."""
    state = "natural"
    while i < len(tag):
        c = tag[i]
        if state in ("natural", "real") and c in "eE":
            state = "sign"
        elif state == "natural" and c == ".":
            state = "real"
        elif state == "sign":
            if not (_digit(c) or c in "+-"):
                break
            state = "exponent"
        elif not _digit(c):
            break
        i += 1
    return i


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:  # "1e": JavaScript's Number gives NaN, which compares neither way
        return math.nan


def time_series_compare(a: str, b: str) -> int:
    """TensorBoard's tag order on its Time Series page (its ``compareTagNames``, ported from the 2.21 webfiles):
    character by character, a number as its value, ``/`` and digits before anything else."""
    i = j = 0
    while True:
        if i == len(a):
            return 0 if j == len(b) else -1
        if j == len(b):
            return 1
        if _digit(a[i]) and _digit(b[j]):
            i0, j0 = i, j
            i, j = _number_end(a, i + 1), _number_end(b, j + 1)
            x, y = _number(a[i0:i]), _number(b[j0:j])
            if x != y and not (math.isnan(x) or math.isnan(y)):
                return -1 if x < y else 1
            continue
        special_a, special_b = a[i] == "/" or _digit(a[i]), b[j] == "/" or _digit(b[j])
        if special_a != special_b:
            return -1 if special_a else 1
        if not special_a and a[i] != b[j]:
            return -1 if a[i] < b[j] else 1
        i, j = i + 1, j + 1


def time_series_groups(tags: list[str]) -> list[str]:
    """The sections of the Time Series page, top to bottom: each tag's first segment, in tag order (the first two
    start expanded, the rest collapsed)."""
    groups: list[str] = []
    for tag in sorted(tags, key=functools.cmp_to_key(time_series_compare)):
        if (group := tag.split("/", 1)[0]) not in groups:
            groups.append(group)
    return groups


def test_the_page_tensorboard_opens_on_leads_with_the_training_curves(deep_run: DeepRun) -> None:
    """Issue 67: Time Series opened on the per-layer heatmaps (a card per run and panel: 32 for 8 runs) before loss
    or BLEU. Now train/ and valid/ lead (the two sections TensorBoard expands) and the heatmaps come last."""
    tags = deep_run.acc.Tags()
    groups = time_series_groups([*tags["scalars"], *tags["images"]])
    assert groups[:2] == ["train", "valid"], groups
    assert {t.split("/", 1)[0] for t in tags["images"]} == {groups[-1]}
    # the same with the probe's scalars: a group after the heatmaps' would still sort before them
    assert time_series_groups(["probe/output_change", "zzz/x", "layers9/a", *tags["images"]])[-1] == groups[-1]
    assert time_series_compare("layers/x", "train/loss") == -1  # what led before
    assert time_series_compare("a2/x", "a10/x") == -1 and time_series_compare("a/x", "a_/x") == -1  # numbers; "/" first


@pytest.mark.parametrize("method", ["tfixup", "postln"])
def test_method_is_the_hparams_label_of_the_composed_config(method: str) -> None:
    assert compose_config([f"method={method}"]).method == method


def test_the_docs_name_the_text_tag_a_run_writes(deep_run: DeepRun) -> None:
    """TensorBoard stores add_text under ``<tag>/text_summary``; the docs said ``valid/samples``, a tag no run has."""
    from tests.conftest import REPO

    assert "valid/samples/text_summary" in deep_run.acc.Tags()["tensors"]
    for doc in ("docs/training.md", "docs/dashboard.md"):
        assert "`valid/samples/text_summary`" in (REPO / doc).read_text(), doc
