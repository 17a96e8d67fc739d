"""tfx.reporting.statistics: what the step logs per layer (grad norms, activation RMS, the output-change probe)."""

from __future__ import annotations

import math

import pytest
import torch

from tests.conftest import PAD, random_batch, tiny_model
from tfx.init import apply_init
from tfx.reporting.statistics import ActivationRMS, _masked_rms, layer_grad_norms, layer_stats, rms_change

ENC, DEC = 2, 3


def _model(init: str = "tfixup"):
    model = tiny_model(enc=ENC, dec=DEC)
    apply_init(model, init, seed=0)
    return model


def _expected_keys(stat: str) -> set[str]:
    return {f"enc/{stat}/{i:03d}" for i in range(ENC)} | {f"dec/{stat}/{i:03d}" for i in range(DEC)}


def test_activation_rms_ignores_padding() -> None:
    model = _model()
    src, prev = random_batch()
    pad = lambda t, k: torch.cat([t, torch.full((t.size(0), k), PAD)], dim=1)  # noqa: E731
    with ActivationRMS(model) as short:
        model(src, prev)
    with ActivationRMS(model) as padded:
        model(pad(src, 3), pad(prev, 2))
    assert padded.stats() == pytest.approx(short.stats(), rel=1e-5)


def test_layer_stats_keys_and_hooks_removed() -> None:
    model = _model()
    src, prev = random_batch()
    with ActivationRMS(model) as acts:
        model(src, prev).sum().backward()
    stats = layer_stats(model, acts)
    assert set(stats) == _expected_keys("grad_norm") | _expected_keys("act_rms")
    assert all(math.isfinite(v) and v > 0 for v in stats.values())
    assert all(not layer._forward_hooks for layer in [*model.encoder.layers, *model.decoder.layers])
    assert not model.encoder._forward_pre_hooks and not model.decoder._forward_pre_hooks
    model.zero_grad(set_to_none=True)
    assert layer_grad_norms(model) == dict.fromkeys(_expected_keys("grad_norm"), 0.0)


def test_layer_grad_norms_are_l2_norms_over_each_layer() -> None:
    """Gradient j of a layer filled with j + 1: the layer's norm is sqrt(sum_j (j+1)^2 numel_j), the
    L2 norm of all its gradients together (not a sum of per-tensor norms, not squared)."""
    model = _model()
    expected = {}
    for stack, layers in (("enc", model.encoder.layers), ("dec", model.decoder.layers)):
        for i, layer in enumerate(layers):
            total = 0.0
            for j, p in enumerate(layer.parameters()):
                p.grad = torch.full_like(p, float(j + 1) * (i + 1))
                total += ((j + 1) * (i + 1)) ** 2 * p.numel()
            expected[f"{stack}/grad_norm/{i:03d}"] = math.sqrt(total)
    assert layer_grad_norms(model) == pytest.approx(expected, rel=1e-6)


def test_layer_grad_norms_count_missing_gradients_as_zero() -> None:
    model = _model()
    first = list(model.encoder.layers[0].parameters())
    first[0].grad = torch.full_like(first[0], 2.0)
    norms = layer_grad_norms(model)
    assert norms["enc/grad_norm/000"] == pytest.approx(2.0 * math.sqrt(first[0].numel()))
    assert norms["dec/grad_norm/000"] == 0.0


def test_masked_rms_literal_values() -> None:
    x = torch.tensor([[[3.0, 4.0], [1.0, 1.0], [100.0, 100.0]]])  # (1, 3, 2); position 2 is padding
    mask = torch.tensor([[False, False, True]])
    assert _masked_rms(x, mask).item() == pytest.approx(math.sqrt((12.5 + 1.0) / 2))
    assert _masked_rms(x, None).item() == pytest.approx(math.sqrt((12.5 + 1.0 + 10000.0) / 3))


def test_activation_rms_is_the_rms_of_each_layer_output() -> None:
    """Each layer's recorded value equals sqrt(mean of squares) of its output over non-pad positions,
    computed here from the outputs themselves."""
    model = _model().eval()
    src, prev = random_batch()
    outputs = {}
    hooks = [
        layer.register_forward_hook(lambda _m, _a, out, key=f"{stack}/act_rms/{i:03d}": outputs.update({key: out}))
        for stack, layers in (("enc", model.encoder.layers), ("dec", model.decoder.layers))
        for i, layer in enumerate(layers)
    ]
    with ActivationRMS(model) as acts:
        model(src, prev)
    for h in hooks:
        h.remove()
    keep = {"enc": src.ne(PAD), "dec": prev.ne(PAD)}
    expected = {k: out[keep[k[:3]]].double().pow(2).mean().sqrt().item() for k, out in outputs.items()}
    assert src.eq(PAD).any() and acts.stats() == pytest.approx(expected, rel=1e-5)


def test_rms_change_is_the_rms_over_kept_positions() -> None:
    """The probe's Delta f: sqrt(mean (new - old)^2) over non-pad positions and the vocabulary, by hand."""
    old = torch.zeros(2, 3, 4)
    new = torch.zeros(2, 3, 4)
    new[0, 0] = torch.tensor([3.0, 0.0, 0.0, 0.0])  # (9 + 0 * 19) / 20 over the 5 kept positions x 4
    new[1, 2] = 1e6  # a padded position: must not count
    keep = torch.tensor([[True, True, True], [True, True, False]])
    assert rms_change(new, old, keep) == pytest.approx((9 / 20) ** 0.5)
