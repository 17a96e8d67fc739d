from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import PAD, random_batch, tiny_model
from tfx.init import apply_init
from tfx.optim.loss import label_smoothed_loss


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


def reference_loss(logits: torch.Tensor, target: torch.Tensor, epsilon: float, pad_id: int) -> torch.Tensor:
    """The formula through autograd: fp32 log-softmax, nll + eps * mean over the vocabulary."""
    lprobs = F.log_softmax(logits.float(), dim=-1).view(-1, logits.size(-1))
    target = target.reshape(-1)
    nll = F.nll_loss(lprobs, target, ignore_index=pad_id, reduction="sum")
    smooth = -(lprobs.sum(-1) * target.ne(pad_id)).sum() / lprobs.size(-1)
    return (1 - epsilon) * nll + epsilon * smooth


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_closed_form_gradient_equals_autograd(epsilon: float) -> None:
    """The hand-written backward (in place on the saved log-probs) against autograd, float64, pad rows zero."""
    torch.manual_seed(0)
    logits = torch.randn(3, 7, 13, dtype=torch.float64)
    target = torch.randint(1, 13, (3, 7))
    target[2, 4:] = 0
    ours = logits.clone().requires_grad_()
    theirs = logits.clone().requires_grad_()
    loss, _ = label_smoothed_loss(ours, target, epsilon, 0)
    (0.37 * loss).backward()
    (0.37 * reference_loss(theirs, target, epsilon, 0)).backward()
    torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-6, atol=1e-7)
    assert ours.grad[2, 4:].abs().max() == 0


def test_bf16_logits_get_a_bf16_gradient_from_an_fp32_loss() -> None:
    logits = torch.randn(2, 3, 11).to(torch.bfloat16).requires_grad_()
    loss, nll = label_smoothed_loss(logits, torch.randint(1, 11, (2, 3)), 0.1, 0)
    loss.backward()
    assert loss.dtype == torch.float32 and logits.grad.dtype == torch.bfloat16
    assert not nll.requires_grad


def loss_curve(criterion, updates: int = 60) -> list[float]:
    """Per-update loss of a tiny T-Fixup model under AdamW, dropout on, one fixed seed."""
    torch.manual_seed(0)
    model = tiny_model(enc=1, dec=1, dropout=0.3)
    apply_init(model, "tfixup")
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4, betas=(0.9, 0.98), weight_decay=1e-4)
    batches = [random_batch(b=8, s=9, t=7, seed=i) for i in range(4)]
    curve = []
    for step in range(updates):
        src, tgt = batches[step % len(batches)]
        loss, _ = criterion(model(src, tgt), tgt, 0.1, PAD)
        ntokens = int(tgt.ne(PAD).sum())
        (loss / ntokens).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        curve.append(loss.item() / ntokens)
    return curve


def test_first_60_updates_follow_the_autograd_loss_curve() -> None:
    """The closed-form backward leaves training unchanged: same seed, same 60-update loss curve."""

    def autograd(logits, target, eps, pad):
        return reference_loss(logits, target, eps, pad), None

    ours, theirs = loss_curve(label_smoothed_loss), loss_curve(autograd)
    assert theirs[-1] < theirs[0] - 0.5  # it does train
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(theirs), rtol=1e-5, atol=0)
