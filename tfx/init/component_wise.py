"""Component-wise init often recommended for LayerNorm Transformers (a comparison baseline).

Attention q/k/v: Xavier gain 1/sqrt(2) times a per-head multiplier drawn from [0.9, 1.0];
attention output: Xavier gain 0.8; FFN fc1: Kaiming-normal (fan_in, relu) with bias 0.01;
fc2: Xavier gain 0.8; LayerNorm weight 1 + 0.01 * noise, bias 0; embeddings N(0, d^-1/2);
an untied output layer: Xavier with half the bound. Not a recommendation: the depth study
shows how it fares without LayerNorm.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from tfx.init.scheme import Scheme, register
from tfx.init.xavier import ModelInputs, init_xavier
from tfx.model import FeedForward, MultiheadAttention, Transformer


def _init_attention(attn: MultiheadAttention) -> None:
    for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
        nn.init.xavier_uniform_(proj.weight, gain=1 / math.sqrt(2))
        per_head = torch.empty(attn.heads).uniform_(0.9, 1.0).repeat_interleave(attn.head_dim)  # (D,)
        with torch.no_grad():
            proj.weight.mul_(per_head[:, None])  # rows of a head share its multiplier
    nn.init.xavier_uniform_(attn.out_proj.weight, gain=0.8)


def _init_ffn(ffn: FeedForward) -> None:
    nn.init.kaiming_normal_(ffn.fc1.weight, mode="fan_in", nonlinearity="relu")
    nn.init.constant_(ffn.fc1.bias, 0.01)
    nn.init.xavier_uniform_(ffn.fc2.weight, gain=0.8)


def init_component_wise(model: Transformer, seed: int = 1, batch: ModelInputs | None = None) -> None:
    init_xavier(model, seed)  # biases 0, embeddings N(0, d^-1/2)
    for module in model.modules():
        if isinstance(module, MultiheadAttention):
            _init_attention(module)
        elif isinstance(module, FeedForward):
            _init_ffn(module)
        elif isinstance(module, nn.LayerNorm):
            with torch.no_grad():
                module.weight.copy_(1 + 0.01 * torch.randn_like(module.weight))
    head = model.decoder.output_projection
    if head is not None:
        nn.init.xavier_uniform_(head.weight, gain=0.5)  # half the Xavier bound


SCHEME = register(Scheme("component_wise", init_component_wise))
