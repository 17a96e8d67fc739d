"""scripts/studies/deep_width_table.py: losses come from the run's log, and the pass criterion is issue 13's."""

from __future__ import annotations

import math
from types import ModuleType

import pytest
import torch

from tests.conftest import load_script
from tfx.config import OptimConfig
from tfx.init import apply_init
from tfx.model import ModelConfig, Transformer
from tfx.optim.loss import label_smoothed_loss


@pytest.fixture(scope="module")
def dw() -> ModuleType:
    return load_script("studies/deep_width_table")


LOG = """\
[2026-11-30 08:35:31,692][tfx.train][INFO] - run folder x | deep | 6+6 layers d512 norm=none init=tfixup
[2026-11-30 08:35:37,692][tfx.train][INFO] - update 1/3 | epoch 1 | loss 8.248 | lr 5.00e-04
[2026-11-30 08:35:43,692][tfx.train][INFO] - update 2/3 | epoch 1 | loss 14.868 | lr 5.00e-04
[2026-11-30 08:35:49,692][tfx.train][INFO] - update 3/3 | epoch 1 | loss 7.802 | lr 5.00e-04
[2026-11-30 08:35:53,000][tfx.train][INFO] - validation at update 3 (0.1 train min): loss 7.9 | BLEU 0.4
"""


def test_parse_log_reads_every_update_and_its_time(dw: ModuleType) -> None:
    losses, per_update, diverged = dw.parse_log(LOG)
    assert losses == [8.248, 14.868, 7.802]
    assert per_update == pytest.approx(6.0) and not diverged


def test_parse_log_sees_divergence_and_nan(dw: ModuleType) -> None:
    text = LOG.replace("loss 7.802", "loss nan") + "[x][tfx.train][ERROR] - 10 consecutive non-finite steps at update 3"
    losses, _, diverged = dw.parse_log(text)
    assert math.isnan(losses[-1]) and diverged


@pytest.mark.parametrize(
    ("losses", "diverged", "passed"),
    [
        ([8.2, 7.5, 7.9, 6.0], False, True),
        ([8.2, 14.9, 7.0, 6.0], False, False),  # a spike above update 1 fails even if it recovers
        ([8.2, 8.1, 8.3], False, False),  # the last update not below the first
        ([8.2, 7.0, 6.0], True, False),
        ([8.2, math.nan, 6.0], False, False),
        ([8.2], False, False),
    ],
)
def test_pass_criterion(dw: ModuleType, losses: list[float], diverged: bool, passed: bool) -> None:
    assert dw.Row("c", 6, losses, 1.0, diverged).passed is passed


def test_every_candidate_is_a_valid_override_set(dw: ModuleType, tmp_path) -> None:
    from tests.test_config import load

    for name in dw.CANDIDATES:
        args = dw.overrides(name, 3, 30, "fp32", tmp_path)
        cfg = load([a for a in args if not a.startswith("hydra.")])
        assert cfg.model.encoder_layers == 3 and cfg.train.log_every_updates == 1 and cfg.data.max_tokens == 256
        assert (cfg.train.device, cfg.train.threads) == ("cpu", 1)  # two runs at once on 2 cores
    cfg = load([a for a in dw.overrides("adam_3e-5", 3, 30, "bf16", tmp_path, "cuda") if not a.startswith("hydra.")])
    assert (cfg.train.device, cfg.train.precision, cfg.optim.lr) == ("cuda", "bf16", 3e-5)
    assert cfg.train.threads == 0  # beside a GPU every CPU thread builds and initializes the model


def tiny_batch(seed: int):
    from tfx.data import Batch

    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, 40, (3, 7), generator=g)
    target = torch.randint(4, 40, (3, 6), generator=g)
    prev = torch.cat([torch.full((3, 1), 2), target[:, :-1]], dim=1)
    return Batch(src, torch.full((3,), 7), prev, target, target.numel(), [0, 1, 2])


def tiny_model() -> Transformer:
    model = Transformer(
        ModelConfig(
            encoder_layers=2,
            decoder_layers=2,
            d_model=16,
            ffn_dim=32,
            heads=4,
            norm="none",
            dropout=0.0,
            attention_dropout=0.0,
            activation_dropout=0.0,
        ),
        40,
        0,
    )
    apply_init(model, "tfixup", seed=1)
    return model


def test_first_step_probe_is_adamw_first_update_and_restores_the_weights(dw: ModuleType) -> None:
    """The probe's loss after update 1 equals torch AdamW's real first step; the weights come back."""
    first, second = tiny_batch(1), tiny_batch(2)
    optim = OptimConfig(lr=3e-3)
    model = tiny_model()
    start = [p.detach().clone() for p in model.parameters()]
    before, after = dw.first_step_probe(model, first, second, optim, [3e-3, 0.0])
    for p, q in zip(model.parameters(), start, strict=True):
        torch.testing.assert_close(p.detach(), q, rtol=1e-5, atol=1e-7)
    assert after[0.0] == pytest.approx(before, abs=1e-5)

    reference = tiny_model()
    opt = torch.optim.AdamW(reference.parameters(), lr=3e-3, betas=optim.betas, eps=optim.eps,
                            weight_decay=optim.weight_decay)  # fmt: skip
    reference.train()
    loss, _ = label_smoothed_loss(reference(first.src_tokens, first.prev_output_tokens), first.target, 0.1, 0)
    (loss / first.ntokens).backward()
    opt.step()
    reference.eval()
    with torch.no_grad():
        loss, _ = label_smoothed_loss(reference(second.src_tokens, second.prev_output_tokens), second.target, 0.1, 0)
    assert after[3e-3] == pytest.approx(loss.item() / second.ntokens / math.log(2), rel=1e-4)
    assert after[3e-3] != pytest.approx(before, abs=1e-3)  # the step did something


def test_table_marks_unfinished_runs(dw: ModuleType) -> None:
    rows = [dw.Row("a", 6, [8.2, 7.0], 1.0, False), dw.Row("b", 6, [8.2, 9.0, 7.0], 1.0, False)]
    lines = dw.table(rows, updates=2).splitlines()
    assert lines[2].endswith("| yes |") and lines[3].endswith("| 9.00 | 7.00 | 3 | 1.00 | no |")
    assert dw.table(rows[:1], updates=30).splitlines()[2].endswith("| yes (so far: 2 of 30 updates) |")
