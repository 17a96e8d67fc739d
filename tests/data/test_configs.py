"""Every conf/data/*.yaml holds only DataConfig fields and passes its validation."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tfx.config import DataConfig

CONF = Path(__file__).parents[2] / "conf" / "data"


@pytest.mark.parametrize("path", sorted(CONF.glob("*.yaml")), ids=lambda p: p.stem)
def test_data_config_composes(path):
    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(DataConfig), OmegaConf.load(path)))
    assert isinstance(cfg, DataConfig)


def test_all_groups_present():
    expected = {"toy", "multi30k", "iwslt17", "iwslt14_local"}
    assert {p.stem for p in CONF.glob("*.yaml")} >= expected
