"""`python -m tfx.train --help` (conf/hydra/help/tfx.yaml): a newcomer's page, not Hydra's generic dump (issue 67)."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import REPO
from tests.test_docs import module_exists


def test_help_shows_the_experiment_pattern_the_methods_the_knobs_and_cfg_job() -> None:
    done = subprocess.run([sys.executable, "-m", "tfx.train", "--help"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "+experiment=" in text and "--cfg job" in text and "is powered by Hydra" not in text
    methods = sorted(p.stem for p in (REPO / "conf" / "method").glob("*.yaml"))
    experiments = sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml"))
    assert f"method: {', '.join(methods)}" in text and f"experiment: {', '.join(experiments)}" in text
    for knob in ("optim.lr", "optim.warmup_updates", "train.max_updates", "train.max_minutes", "train.seed",
                 "model.encoder_layers", "data.local_dir", "hydra.run.dir"):  # fmt: skip
        assert knob in text, knob
    entry_points = re.findall(r"python -m (tfx(?:\.\w+)+)", text)
    assert {"tfx.train", "tfx.evaluate", "tfx.translate", "tfx.average", "tfx.data.pretokenize"} <= set(entry_points)
    assert all(module_exists(name, REPO) for name in entry_points)
