"""Label-smoothed cross-entropy over non-pad target tokens (fairseq's formula), with a hand-written backward.

loss = (1 - eps) * nll + eps * mean_v(-log p_v), summed over non-pad tokens (fairseq 0.9's
``label_smoothed_cross_entropy``, which the T-Fixup reference ran; torch's ``label_smoothing``
is the same). Autograd would keep the log-probabilities, build a vocabulary-sized gradient for
them from the gather and the sum, then run log-softmax's backward into another one. The gradient
has a closed form instead: with p = softmax(logits) and w = 1 at non-pad tokens (0 at padding),

    d loss / d logits = w * (p - eps / V) - w * (1 - eps) * onehot(target),

so backward turns the saved log-probabilities into it in place: one vocabulary-sized buffer for
forward and backward together (measured figures in docs/benchmarks.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable


class _LabelSmoothedLoss(torch.autograd.Function):
    """(loss, nll) sums from (N, V) logits; backward reuses the forward's log-softmax buffer."""

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float, pad_id: int) -> tuple[Tensor, Tensor]:
        # fp32 even under bf16 autocast, so the loss itself is never low-precision.
        lprobs = F.log_softmax(logits.float(), dim=-1)  # (N, V)
        keep = target.ne(pad_id)  # (N,)
        # a gather, not F.nll_loss, whose CUDA sum has no deterministic kernel (train.deterministic refuses it)
        nll = -(lprobs.gather(1, target[:, None]).squeeze(1) * keep).sum()
        smooth = -(lprobs.sum(dim=-1) * keep).sum() / lprobs.size(-1)
        ctx.save_for_backward(lprobs, target, keep)
        ctx.epsilon, ctx.logits_dtype = epsilon, logits.dtype
        ctx.mark_non_differentiable(nll)  # metrics only; the training signal is the smoothed loss
        return (1.0 - epsilon) * nll + epsilon * smooth, nll

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor) -> tuple[Tensor | None, None, None, None]:
        lprobs, target, keep = ctx.saved_tensors
        eps, vocab = ctx.epsilon, lprobs.size(-1)
        weight = keep.to(lprobs.dtype) * grad_loss  # (N,) the upstream scalar folded into the pad mask
        grad = lprobs.exp_()  # in place: the saved buffer becomes p, then the gradient (once_differentiable)
        grad.sub_(eps / vocab).mul_(weight[:, None])
        grad.scatter_add_(1, target[:, None], (-(1.0 - eps) * weight)[:, None])  # pad rows: weight 0
        return grad.to(ctx.logits_dtype), None, None, None


def label_smoothed_loss(logits: Tensor, target: Tensor, epsilon: float, pad_id: int) -> tuple[Tensor, Tensor]:
    """Summed (loss, nll_loss) over non-pad tokens; divide by the token count yourself.

    ``logits`` (..., V) and ``target`` (...) of matching leading shape; ``nll_loss`` carries no gradient.
    """
    vocab = logits.size(-1)
    return _LabelSmoothedLoss.apply(logits.reshape(-1, vocab), target.reshape(-1), epsilon, pad_id)
