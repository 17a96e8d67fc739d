from __future__ import annotations

import torch
import torch.nn.functional as F

from tfx.criterion import label_smoothed_loss


def test_matches_torch_cross_entropy_and_ignores_pad() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11)
    target = torch.randint(1, 11, (2, 5))
    target[1, 3:] = 0
    loss, nll = label_smoothed_loss(logits, target, epsilon=0.1, pad_id=0)
    flat_logits, flat_target = logits.view(-1, 11), target.view(-1)
    expected = F.cross_entropy(flat_logits, flat_target, ignore_index=0, label_smoothing=0.1, reduction="sum")
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(nll, F.cross_entropy(flat_logits, flat_target, ignore_index=0, reduction="sum"))
