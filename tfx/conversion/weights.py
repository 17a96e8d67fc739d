"""The weights a conversion sets: tfx's Xavier base on a torch model, then T-Fixup's depth factors.

The base is ``tfx.init.xavier``'s, module by module in model order: Xavier-uniform (gain 1) for every linear
weight, zero biases, token embeddings N(0, d^-1/2) with the padding row zeroed, drawn after all linear weights.
``nn.MultiheadAttention`` packs q, k and v into one (3d, d) ``in_proj_weight``; torch initialises it as one matrix
(fan_out 3d), tfx as three (d, d) projections, so here each third is drawn as its own matrix, q then k then v. The
draws are then the ones tfx makes for its separate q_proj/k_proj/v_proj, in the same order: with one seed, a
torch model whose modules come in tfx's order starts from tfx's exact values (tests/conversion/test_equivalence.py).
"""

from __future__ import annotations

import torch
from torch import nn

from tfx.conversion.report import ParameterChange
from tfx.conversion.structure import Stack, Structure, join
from tfx.init.tfixup import tfixup_decoder_scale, tfixup_embedding_scale, tfixup_encoder_scale
from tfx.init.xavier import init_embedding

XAVIER = "xavier_uniform"


def layer_factor(stack: Stack) -> float:
    """T-Fixup's factor for a stack's v/out/FFN weights: 0.67 N^-1/4 (encoder side), (9N)^-1/4 (decoder side)."""
    return tfixup_encoder_scale(stack.depth) if stack.side == "encoder" else tfixup_decoder_scale(stack.depth)


def xavier_rows_(weight: torch.Tensor, chunks: int) -> None:
    """Xavier-uniform each of ``chunks`` equal row blocks as a matrix of its own (its own fan-in and fan-out)."""
    for block in weight.detach().chunk(chunks, dim=0):
        nn.init.xavier_uniform_(block)


def _zero_bias(name: str, bias: torch.Tensor | None, changes: dict[str, ParameterChange]) -> None:
    if bias is not None:
        nn.init.zeros_(bias)
        changes[name] = ParameterChange(name, "zeros")


def _init_attention(name: str, attn: nn.MultiheadAttention, changes: dict[str, ParameterChange]) -> None:
    """q, k, v as three matrices; ``out_proj`` is a Linear of its own and comes next in model order."""
    if attn._qkv_same_embed_dim:
        xavier_rows_(attn.in_proj_weight, 3)
        key = join(name, "in_proj_weight")
        changes[key] = ParameterChange(key, f"{XAVIER} per q/k/v third")
    else:
        for proj in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
            nn.init.xavier_uniform_(getattr(attn, proj))
            changes[join(name, proj)] = ParameterChange(join(name, proj), XAVIER)
    _zero_bias(join(name, "in_proj_bias"), attn.in_proj_bias, changes)


def init_base(model: nn.Module, structure: Structure) -> dict[str, ParameterChange]:
    """tfx's Xavier base on every linear weight and token embedding; returns the change per parameter name."""
    changes: dict[str, ParameterChange] = {}
    embeddings = {name: model.get_submodule(name) for name in structure.embeddings}
    done = {id(e.weight) for e in embeddings.values()}  # a Linear tied to an embedding keeps the embedding's init
    for name, module in model.named_modules():
        if isinstance(module, nn.MultiheadAttention):
            _init_attention(name, module, changes)
        elif isinstance(module, nn.Linear) and id(module.weight) not in done:
            done.add(id(module.weight))
            chunks = structure.chunked.get(name, 1)
            xavier_rows_(module.weight, chunks)
            what = XAVIER if chunks == 1 else f"{XAVIER} per row chunk (1/{chunks})"
            changes[join(name, "weight")] = ParameterChange(join(name, "weight"), what)
            _zero_bias(join(name, "bias"), module.bias, changes)
    for name, embed in embeddings.items():
        init_embedding(embed)
        pad = "" if embed.padding_idx is None else f", row {embed.padding_idx} zero"
        changes[join(name, "weight")] = ParameterChange(join(name, "weight"), f"normal(0, d^-1/2){pad}")
    return changes


def _scale(tensor: torch.Tensor, rows: tuple[int, int] | None, factor: float) -> None:
    with torch.no_grad():
        (tensor if rows is None else tensor[rows[0] : rows[1]]).mul_(factor)


def scale_depth(model: nn.Module, structure: Structure, changes: dict[str, ParameterChange]) -> None:
    """T-Fixup's factors on the base: each stack's v/out/FFN weights by its depth, each token embedding by the
    depth of the stack it feeds ((9N)^-1/4 on both sides, as the paper and the reference)."""
    for stack in structure.stacks:
        factor = layer_factor(stack)
        for layer in stack.layers:
            for t in layer.scaled:
                _scale(t.param, t.rows, factor)
                init = changes[t.name].init if t.name in changes else "as it was"
                changes[t.name] = ParameterChange(t.name, init, factor, t.rows)
    for name, stack in structure.embeddings.items():
        key = join(name, "weight")
        factor = tfixup_embedding_scale(stack.depth)
        _scale(model.get_submodule(name).weight, None, factor)
        changes[key] = ParameterChange(key, changes[key].init, factor)
