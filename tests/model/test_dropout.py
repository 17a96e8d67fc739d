"""tfx's CPU dropout: the right keep rate, seeded by torch's generator, exact gradients, used by the model."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tfx.model import ModelConfig, Transformer
from tfx.model.dropout import Dropout, dropout, keep_mask


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.9])
def test_keep_rate_is_one_minus_p(p):
    n = 1_000_000
    rate = keep_mask(torch.Size([n]), p).double().mean().item()
    sigma = (p * (1 - p) / n) ** 0.5
    assert abs(rate - (1 - p)) < 5 * sigma


def test_masks_follow_torch_seed_and_advance_its_stream():
    torch.manual_seed(7)
    first, second = keep_mask(torch.Size([4096]), 0.3), keep_mask(torch.Size([4096]), 0.3)
    torch.manual_seed(7)
    assert torch.equal(keep_mask(torch.Size([4096]), 0.3), first)
    assert not torch.equal(first, second)  # each call draws a fresh seed from torch's generator
    torch.manual_seed(8)
    assert not torch.equal(keep_mask(torch.Size([4096]), 0.3), first)


def test_forward_and_backward_are_the_masked_scaled_input():
    x = torch.randn(64, 33, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(3)
    y = dropout(x, 0.25, training=True)
    torch.manual_seed(3)
    keep = keep_mask(x.shape, 0.25).to(torch.float64)
    assert torch.equal(y, x.detach() * keep * (1 / 0.75))
    g = torch.randn_like(y)
    y.backward(g)
    assert torch.equal(x.grad, g * keep * (1 / 0.75))


def test_identity_when_off_and_zero_at_p_one():
    x = torch.randn(8, 8)
    assert dropout(x, 0.3, training=False) is x and dropout(x, 0.0, training=True) is x
    assert torch.equal(dropout(x, 1.0, training=True), torch.zeros_like(x))
    module = Dropout(0.3).eval()
    assert module(x) is x and module.p == 0.3
    with pytest.raises(ValueError, match="dropout probability"):
        Dropout(1.5)


class _OpNames(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.__name__)
        return func(*args, **(kwargs or {}))


def test_training_step_on_cpu_draws_no_per_element_bernoulli():
    """torch's CPU ``bernoulli_`` is per-element mt19937 on non-Intel CPUs: the model must not call it."""
    model = Transformer(
        ModelConfig(
            encoder_layers=2,
            decoder_layers=2,
            d_model=16,
            ffn_dim=32,
            heads=2,
            dropout=0.3,
            attention_dropout=0.0,
            activation_dropout=0.1,
        ),
        50,
        0,
    )
    src, prev = torch.randint(4, 50, (3, 7)), torch.randint(4, 50, (3, 6))
    with _OpNames() as ops:
        model(src, prev).sum().backward()
    assert not any(name.startswith("bernoulli") for name in ops.names), sorted(ops.names)
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
