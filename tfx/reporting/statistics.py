"""Per-layer numbers the training step logs for LayerNorm-free Transformers: is training stable?

Without LayerNorm nothing rescales the residual stream, so a bad init or an unstable run shows up as
output or gradient norms that grow (or shrink) with depth:

- ``layer_grad_norms`` / ``ActivationRMS`` / ``layer_stats``: cheap per-layer numbers the
  trainer logs every K updates, as a flat dict (``"enc/act_rms/0"``, ``"dec/grad_norm/3"``).
- ``OutputChange``: the per-update change of the model's output on a fixed batch, the quantity
  T-Fixup's analysis bounds (``train.probe_updates``).

The one-batch report on a fresh init (``python -m tfx.diagnostics``) is ``tfx.reporting.init_report``.
Layers are always listed encoder first, then decoder, in stack order.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from tfx.model import Transformer
from tfx.runtime.sharding import all_reduce_norms, is_dtensor, local_tensor

PAD_ID = 0  # tfx.data.vocab.PAD; not imported so the init-report CLI stays free of the data stack


def named_layers(model: Transformer) -> list[tuple[str, nn.Module]]:
    """``("enc/0", layer), ..., ("dec/N-1", layer)``: the order every report uses."""
    enc = [(f"enc/{i}", layer) for i, layer in enumerate(model.encoder.layers)]
    dec = [(f"dec/{i}", layer) for i, layer in enumerate(model.decoder.layers)]
    return enc + dec


def _stat_key(layer_name: str, stat: str) -> str:
    """``("enc/3", "act_rms")`` -> ``"enc/act_rms/003"`` (groups one statistic per TensorBoard panel)."""
    stack, index = layer_name.split("/")
    return f"{stack}/{stat}/{int(index):03d}"  # zero-padded: TensorBoard sorts tags as text


def _norm_of(tensors: list[Tensor | None]) -> Tensor:
    """L2 norm over all given tensors (None = no gradient, counts as zero); of the local shards under FSDP."""
    norms = [local_tensor(t).detach().float().norm() for t in tensors if t is not None]
    return torch.stack(norms).norm() if norms else torch.zeros(())


def layer_grad_norms(model: Transformer) -> dict[str, float]:
    """Per-layer L2 norm of the existing ``.grad``s (call after backward, before ``zero_grad``).

    One host sync for all layers (``tolist``), so it is cheap enough to log every K updates.
    """
    layers = named_layers(model)
    norms = torch.stack([_norm_of([p.grad for p in layer.parameters()]) for _, layer in layers])
    if any(is_dtensor(p) for p in model.parameters()):  # FSDP: each rank holds a shard of every layer
        norms = all_reduce_norms(norms)
    norms = norms.cpu()
    return {_stat_key(name, "grad_norm"): value for (name, _), value in zip(layers, norms.tolist(), strict=True)}


def _masked_rms(x: Tensor, padding_mask: Tensor | None) -> Tensor:
    """RMS of a (B, T, D) activation over non-pad positions (all positions without a usable mask)."""
    sq = x.detach().float().pow(2).mean(dim=-1)  # (B, T)
    if padding_mask is None or padding_mask.shape != sq.shape:
        return sq.mean().sqrt()
    keep = (~padding_mask).to(sq.dtype)
    return ((sq * keep).sum() / keep.sum().clamp(min=1.0)).sqrt()


class ActivationRMS:
    """Context manager: record each layer's output RMS (non-pad positions) during normal forwards.

    ``with ActivationRMS(model) as act: loss = model(src, prev)...`` then ``act.stats()``.
    Hooks only live inside the ``with``; values are kept as device scalars and read once in
    ``stats()``. The last forward wins, so a layer recomputed by activation checkpointing in
    backward just overwrites its own (identical) value.
    """

    def __init__(self, model: Transformer) -> None:
        self.model = model
        self.values: dict[str, Tensor] = {}
        self._masks: dict[str, Tensor | None] = {"enc": None, "dec": None}
        self._handles: list[torch.utils.hooks.RemovableHandle] = []

    def _mask_hook(self, stack: str):
        def hook(_module: nn.Module, args: tuple, kwargs: dict) -> None:
            tokens = args[0] if args else next(iter(kwargs.values()), None)
            self._masks[stack] = tokens.eq(self.model.pad_id) if isinstance(tokens, Tensor) else None

        return hook

    def _layer_hook(self, name: str):
        stack = name.split("/")[0]

        def hook(_module: nn.Module, _args: tuple, output: Tensor) -> None:
            with torch.no_grad():
                self.values[name] = _masked_rms(output, self._masks[stack])

        return hook

    def __enter__(self) -> ActivationRMS:
        self.values.clear()
        register = nn.Module.register_forward_pre_hook
        self._handles.append(register(self.model.encoder, self._mask_hook("enc"), with_kwargs=True))
        self._handles.append(register(self.model.decoder, self._mask_hook("dec"), with_kwargs=True))
        for name, layer in named_layers(self.model):
            self._handles.append(layer.register_forward_hook(self._layer_hook(name)))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._masks = {"enc": None, "dec": None}

    def stats(self) -> dict[str, float]:
        """``{"enc/act_rms/0": float, ...}`` for the layers that ran, in layer order."""
        names = [name for name, _ in named_layers(self.model) if name in self.values]
        if not names:
            return {}
        values = torch.stack([self.values[n].cpu() for n in names]).tolist()
        return {_stat_key(n, "act_rms"): v for n, v in zip(names, values, strict=True)}


def layer_stats(model: Transformer, activations: ActivationRMS | None = None) -> dict[str, float]:
    """The trainer's per-layer log line: grad norms from ``.grad`` plus recorded activation RMS."""
    stats = layer_grad_norms(model)
    if activations is not None:
        stats.update(activations.stats())
    return stats


def rms_change(new: Tensor, old: Tensor, keep: Tensor) -> float:
    """sqrt(mean over kept positions and the last dim of (new - old)^2); ``keep`` is (B, T) bool."""
    diff = (new - old)[keep]  # (P, V)
    return float(diff.pow(2).mean().sqrt())


class OutputChange:
    """Delta f_t = RMS over non-pad positions and the vocabulary of z_t - z_{t-1}, z the logits of a fixed batch.

    T-Fixup (Huang et al. 2020, Sec. 3-5) argues its init bounds ||f(x; theta_{t+1}) - f(x; theta_t)|| = Theta(eta)
    independently of depth; this measures it. The RMS (not the norm) does not grow with the batch or V;
    ``logprob_change`` is the same on log-probabilities (shift-invariant). The forward runs in eval mode with
    no grad and no autocast: it draws no random numbers, so probing leaves training bit-identical. Under
    FSDP every rank must call ``measure`` (the forward all-gathers each layer).
    """

    def __init__(self, model: nn.Module, batch: Any, device: torch.device) -> None:
        self.batch = batch.to(device)
        self.keep = batch.target.ne(PAD_ID).to(device)
        self.previous = self._logits(model)

    @torch.no_grad()
    def _logits(self, model: nn.Module) -> Tensor:
        was_training = model.training
        model.eval()
        try:
            return model(self.batch.src_tokens, self.batch.prev_output_tokens).float()  # (B, T, V)
        finally:
            model.train(was_training)

    def measure(self, model: nn.Module) -> dict[str, float]:
        """The change since the previous call (or since construction); then remember these logits."""
        logits = self._logits(model)
        old, self.previous = self.previous, logits
        return {
            "probe/output_change": rms_change(logits, old, self.keep),
            "probe/logprob_change": rms_change(logits.log_softmax(-1), old.log_softmax(-1), self.keep),
        }
