"""Label-smoothed cross-entropy over non-pad target tokens (fairseq's formula)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def label_smoothed_loss(logits: Tensor, target: Tensor, epsilon: float, pad_id: int) -> tuple[Tensor, Tensor]:
    """Summed (loss, nll_loss) over non-pad tokens; divide by the token count yourself.

    loss = (1 - eps) * nll + eps * mean_v(-log p_v): computed from one fp32 log-softmax,
    so bf16 logits never make the loss itself low-precision.
    """
    lprobs = F.log_softmax(logits.float(), dim=-1).view(-1, logits.size(-1))  # (B*T, V)
    target = target.reshape(-1)
    keep = target.ne(pad_id)
    nll = F.nll_loss(lprobs, target, ignore_index=pad_id, reduction="sum")
    smooth = -(lprobs.sum(dim=-1) * keep).sum() / lprobs.size(-1)
    return (1.0 - epsilon) * nll + epsilon * smooth, nll
