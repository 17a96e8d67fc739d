"""``convert(model, method)``: T-Fixup (or a LayerNorm replacement) on a user's own PyTorch Transformer, in place."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from tfx.conversion.methods import RemovedNorm, method_named
from tfx.conversion.report import ConversionReport, NormChange, StackSummary
from tfx.conversion.structure import Block, Structure, find_structure
from tfx.conversion.weights import init_base, layer_factor, scale_depth


def replace_norms(model: nn.Module, names: list[str], method: str) -> list[NormChange]:
    """Put the method's module where each named norm is (same attribute, so every other name stays)."""
    replace = method_named(method).replace_norm
    changes = []
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent, norm = model.get_submodule(parent_name), model.get_submodule(name)
        new = replace(norm)
        setattr(parent, child, new)
        changes.append(
            NormChange(name, repr(norm), "removed (identity)" if isinstance(new, RemovedNorm) else repr(new))
        )
    return changes


def switch_off_fast_paths(model: nn.Module) -> list[str]:
    """Keep torch's fused encoder kernels away from converted layers.

    In eval mode without grad, ``nn.TransformerEncoderLayer.forward`` may call ``torch._transformer_encoder_layer_fwd``,
    which applies LayerNorm itself from ``norm1.eps``/``norm1.weight``: on a removed norm it would crash, on a
    replaced one it would run LayerNorm anyway. The layer takes that path only while ``activation_relu_or_gelu`` is
    non-zero, a flag read by nothing else (its forward applies ``self.activation``), so it is set to 0. Likewise
    ``nn.TransformerEncoder.use_nested_tensor``, the stack's nested-tensor path built on the same kernel. The
    attention's own fast path (``nn.MultiheadAttention``) holds no norm and computes the same function: kept.
    """
    names = []
    for name, module in model.named_modules():
        if isinstance(module, nn.TransformerEncoderLayer) and module.activation_relu_or_gelu:
            module.activation_relu_or_gelu = 0
            names.append(name)
        elif isinstance(module, nn.TransformerEncoder) and getattr(module, "use_nested_tensor", False):
            module.use_nested_tensor = False
            names.append(name)
    return names


def _untouched(model: nn.Module, report: ConversionReport) -> list[str]:
    changed = {p.name for p in report.parameters}
    new_norms = tuple(f"{n.name}." for n in report.norms)
    return [n for n, _ in model.named_parameters() if n not in changed and not n.startswith(new_norms)]


def _report(
    model: nn.Module, method: str, structure: Structure, changes: dict, norms: list, fast: list
) -> ConversionReport:
    depth_scaled = method_named(method).depth_scaled
    stacks = [StackSummary(s.name, s.side, s.depth, layer_factor(s) if depth_scaled else 1.0) for s in structure.stacks]
    report = ConversionReport(method, stacks, list(changes.values()), norms, fast_paths_off=fast)
    report.untouched = _untouched(model, report)
    return report


def convert(
    model: nn.Module,
    method: str = "tfixup",
    *,
    blocks: Sequence[Block] = (),
    embeddings: Mapping[str, str] | None = None,
    extra_norms: Sequence[str] = (),
    seed: int | None = None,
) -> tuple[nn.Module, ConversionReport]:
    """Convert ``model`` in place and return it with a report of every parameter and norm changed.

    - ``method``: ``"tfixup"`` (norms removed, T-Fixup init), ``"dyt"``/``"derf"`` (DyT/Derf where each norm
      was, Xavier), or one registered with ``tfx.conversion.register_method``;
    - ``blocks``: ``Block`` descriptions of layers that are not torch's ``nn.TransformerEncoderLayer``/``DecoderLayer``;
    - ``embeddings``: token embedding name -> ``"encoder"``/``"decoder"`` (or a stack's name), replacing the default
      rule (docs/convert.md);
    - ``extra_norms``: norms outside the layers to remove too (glob patterns, e.g. a final ``"ln_f"``);
    - ``seed``: ``torch.manual_seed`` before the draws, as ``tfx.init.apply_init`` does (None: the global generator).

    Everything is checked before anything changes: a model it cannot account for raises ``ValueError`` untouched.
    """
    method_named(method)  # refuse an unknown or refused method before looking at the model
    named = None if embeddings is None else dict(embeddings)
    structure = find_structure(model, tuple(blocks), tuple(extra_norms), named)
    norms = replace_norms(model, structure.norms, method)
    fast = switch_off_fast_paths(model)
    if seed is not None:
        torch.manual_seed(seed)
    changes = init_base(model, structure)
    if method_named(method).depth_scaled:
        scale_depth(model, structure, changes)
    return model, _report(model, method, structure, changes, norms, fast)
