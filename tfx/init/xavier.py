"""Xavier base initialization: the explicit starting point of every scheme.

Xavier-uniform (gain 1) for every linear weight, zero biases, token embeddings
N(0, d^-1/2) with the padding row zeroed, LayerNorm (if any) at weight 1 / bias 0.
fairseq's own default differs (q/k/v at gain 1/sqrt(2)); tfx uses plain Xavier, as
the T-Fixup paper states, so that no later scheme has to undo a hidden gain.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from tfx.init.scheme import Scheme, register
from tfx.model import DecoderLayer, EncoderLayer, Transformer


class ModelInputs(Protocol):
    """What a data-dependent scheme (Admin) runs the model on: a ``tfx.data.Batch`` or anything alike."""

    src_tokens: torch.Tensor  # (B, S)
    prev_output_tokens: torch.Tensor  # (B, T)


def embedding_std(d_model: int) -> float:
    """N(0, d^-1/2) for token embeddings (Vaswani et al.; fairseq; T-Fixup Sec. 3)."""
    return d_model**-0.5


def init_embedding(embed: nn.Embedding) -> None:
    nn.init.normal_(embed.weight, mean=0.0, std=embedding_std(embed.embedding_dim))
    if embed.padding_idx is not None:
        with torch.no_grad():
            embed.weight[embed.padding_idx].zero_()


def token_embeddings(model: Transformer) -> list[nn.Embedding]:
    """The distinct input embedding tables (one when all embeddings are shared)."""
    enc, dec = model.encoder.embedding.embed, model.decoder.embedding.embed
    return [enc] if enc is dec else [enc, dec]


def value_path_weights(layer: EncoderLayer | DecoderLayer) -> list[torch.Tensor]:
    """v_proj and out_proj of every attention in the layer, fc1 and fc2: the weights T-Fixup and
    DeepNorm scale (q/k only set attention temperatures and are left alone)."""
    attns = [layer.self_attn] + ([layer.encoder_attn] if isinstance(layer, DecoderLayer) else [])
    weights = [w for a in attns for w in (a.v_proj.weight, a.out_proj.weight)]
    return weights + [layer.ffn.fc1.weight, layer.ffn.fc2.weight]


def scale_(weights: list[torch.Tensor], factor: float) -> None:
    with torch.no_grad():
        for w in weights:
            w.mul_(factor)


def init_xavier(model: Transformer, seed: int = 1, batch: ModelInputs | None = None) -> None:
    torch.manual_seed(seed)
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
    for embed in token_embeddings(model):
        init_embedding(embed)


SCHEME = register(Scheme("xavier", init_xavier))
