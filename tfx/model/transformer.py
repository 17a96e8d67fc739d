"""The encoder-decoder Transformer (Vaswani et al. 2017; fairseq ``transformer_iwslt_de_en``).

Leaf modules live in ``attention.py``, ``layers.py`` and ``residual.py``; this file
assembles them. Token embeddings are scaled by sqrt(d_model) as in fairseq, so
T-Fixup's embedding factors mean what they mean in the reference implementation.
Tensors are batch-first: (B, T, D).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from tfx.model.attention import KVCache, key_mask
from tfx.model.config import ModelConfig
from tfx.model.dropout import Dropout
from tfx.model.layers import DecoderLayer, EncoderLayer
from tfx.model.packing import Packing, segment_mask
from tfx.model.residual import ResidualContext, Side, final_norm, make_residual


def sinusoidal_table(max_positions: int, d_model: int) -> Tensor:
    """fairseq's sinusoidal positions: sin in the first half of the channels, cos in the second."""
    half = d_model // 2
    freq = torch.exp(torch.arange(half, dtype=torch.float) * -(math.log(10000.0) / max(half - 1, 1)))
    angles = torch.arange(max_positions, dtype=torch.float)[:, None] * freq[None, :]  # (P, half)
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    if d_model % 2:
        table = torch.cat([table, torch.zeros(max_positions, 1)], dim=1)
    return table  # (P, D)


class TokenEmbedding(nn.Module):
    """sqrt(d)-scaled token embedding + sinusoidal positions + dropout."""

    def __init__(self, embed: nn.Embedding, max_positions: int, dropout: float) -> None:
        super().__init__()
        self.embed = embed
        self.scale = math.sqrt(embed.embedding_dim)
        self.register_buffer("positions", sinusoidal_table(max_positions, embed.embedding_dim), persistent=False)
        self.dropout = Dropout(dropout)

    def forward(self, tokens: Tensor, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        """``positions`` (B, T): each token's own position (packed rows restart them per sentence)."""
        t = tokens.size(1)
        if positions is not None:
            return self.dropout(self.scale * self.embed(tokens) + self.positions[positions])
        if offset + t > self.positions.size(0):
            raise ValueError(f"sequence of {offset + t} tokens exceeds model.max_positions={self.positions.size(0)}")
        x = self.scale * self.embed(tokens) + self.positions[offset : offset + t]
        return self.dropout(x)


def _layer_sizes(cfg: ModelConfig) -> dict[str, int | float]:
    """The plain arguments every encoder and decoder layer takes besides its residual connections."""
    return dict(
        d_model=cfg.d_model,
        heads=cfg.heads,
        ffn_dim=cfg.ffn_dim,
        attention_dropout=cfg.attention_dropout,
        activation_dropout=cfg.activation_dropout,
    )


def _residuals(cfg: ModelConfig, side: Side, layer: int) -> functools.partial:
    """What layer ``layer`` of the ``side`` stack calls once per sublayer for a fresh residual connection."""
    return functools.partial(make_residual, cfg, ResidualContext.of(cfg, side, layer))


def _run_layer(layer: nn.Module, use_checkpoint: bool, *args: object) -> Tensor:
    """Call a layer, recomputing its activations in backward when asked (saves memory at depth)."""
    if use_checkpoint and torch.is_grad_enabled():
        return checkpoint(layer, *args, use_reentrant=False)
    return layer(*args)


@dataclass
class EncoderOut:
    hidden: Tensor  # (B, S, D)
    padding_mask: Tensor  # (B, S), True at padding


@dataclass
class DecoderState:
    """Key/value caches for incremental decoding, one ``{"self", "cross"}`` pair per decoder layer."""

    layers: list[dict[str, KVCache]]
    step: int = 0

    @classmethod
    def empty(cls, n_layers: int, capacity: int = 0) -> DecoderState:
        """``capacity``: the steps to preallocate self-attention caches for (they grow past it)."""
        return cls([{"self": KVCache(capacity), "cross": KVCache()} for _ in range(n_layers)])

    def reorder(self, order: Tensor, cross: Tensor | None) -> None:
        """Follow beam search: keep self-attention cache row ``order[i]`` as row i, and encoder-decoder
        cache row ``cross[j]`` as row j. ``cross=None`` leaves those alone: right while rows only move
        among the beams of one sentence, which share one row of source keys and values.
        """
        for layer in self.layers:
            layer["self"].reorder(order)
            if cross is not None:
                layer["cross"].reorder(cross)


class Encoder(nn.Module):
    def __init__(self, embedding: TokenEmbedding, layers: list[EncoderLayer], norm: nn.Module, pad_id: int):
        super().__init__()
        self.embedding = embedding
        self.layers = nn.ModuleList(layers)
        self.final_norm = norm
        self.pad_id = pad_id
        self.checkpoint_activations = False

    def forward(self, src_tokens: Tensor, packing: Packing | None = None) -> EncoderOut:
        padding_mask = src_tokens.eq(self.pad_id)  # (B, S)
        positions = None if packing is None else packing.src_positions
        x = self.embedding(src_tokens, positions=positions)
        # Zero padded positions so they carry nothing (fairseq does the same).
        x = x.masked_fill(padding_mask[..., None], 0.0)
        # One mask for every layer: (B, 1, S, S) within each packed sentence, else (B, 1, 1, S).
        mask = key_mask(padding_mask) if packing is None else segment_mask(packing.src_segments, packing.src_segments)
        for layer in self.layers:
            x = _run_layer(layer, self.checkpoint_activations, x, None, mask)
        return EncoderOut(self.final_norm(x), padding_mask)


class Decoder(nn.Module):
    def __init__(
        self,
        embedding: TokenEmbedding,
        layers: list[DecoderLayer],
        norm: nn.Module,
        output_projection: nn.Linear | None,
    ):
        super().__init__()
        self.embedding = embedding
        self.layers = nn.ModuleList(layers)
        self.final_norm = norm
        # None = tied: logits use the decoder input embedding matrix.
        self.output_projection = output_projection
        self.checkpoint_activations = False

    def output_weight(self) -> Tensor:
        return self.embedding.embed.weight if self.output_projection is None else self.output_projection.weight

    def forward(
        self,
        prev_tokens: Tensor,
        encoder_out: EncoderOut,
        state: DecoderState | None = None,
        packing: Packing | None = None,
    ) -> Tensor:
        """Logits (B, T, V). With ``state``, ``prev_tokens`` holds only the newest step(s)."""
        offset = state.step if state is not None else 0
        x = self.embedding(prev_tokens, offset, None if packing is None else packing.tgt_positions)
        self_mask = cross_mask = None  # padded batches: causal, and the source's padding
        if packing is not None:
            self_mask = segment_mask(packing.tgt_segments, packing.tgt_segments, causal=True)
            cross_mask = segment_mask(packing.tgt_segments, packing.src_segments)
        elif encoder_out.padding_mask is not None:
            cross_mask = key_mask(encoder_out.padding_mask)  # once for every layer
        for i, layer in enumerate(self.layers):
            cache = state.layers[i] if state is not None else None
            if cache is None:
                x = _run_layer(
                    layer, self.checkpoint_activations, x, encoder_out.hidden, None, None, self_mask, cross_mask
                )
            else:
                x = layer(x, encoder_out.hidden, None, cache, None, cross_mask)
        if state is not None:
            state.step += prev_tokens.size(1)
        x = self.final_norm(x)
        return nn.functional.linear(x, self.output_weight())


class Transformer(nn.Module):
    """Encoder-decoder Transformer over one joint vocabulary, built from one ``ModelConfig``.

    ``cfg.norm`` is the residual kind (``tfx.model.residual.RESIDUALS``): ``none`` (T-Fixup; no
    LayerNorm module exists), ``post``, ``pre`` (adds a final LayerNorm to each stack),
    ``deepnorm``, ``admin``, ``dyt`` (Pre-LN with DyT for every LayerNorm), ``rezero`` or ``fixup``.
    Each residual connection is made from ``cfg`` and where it sits (``ResidualContext``); a kind reads
    its own settings (``dyt_alpha``, ``rezero_shared``) from ``cfg`` itself.
    """

    def __init__(self, cfg: ModelConfig, vocab_size: int, pad_id: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.norm = cfg.norm
        self.pad_id = pad_id
        self.vocab_size = vocab_size
        enc_embed = nn.Embedding(vocab_size, cfg.d_model, padding_idx=pad_id)
        dec_embed = enc_embed if cfg.share_all_embeddings else nn.Embedding(vocab_size, cfg.d_model, padding_idx=pad_id)
        tied = cfg.share_decoder_embeddings or cfg.share_all_embeddings
        self.encoder = Encoder(
            TokenEmbedding(enc_embed, cfg.max_positions, cfg.dropout),
            [
                EncoderLayer(residual=_residuals(cfg, "encoder", i), **_layer_sizes(cfg))
                for i in range(cfg.encoder_layers)
            ],
            final_norm(cfg, "encoder"),
            pad_id,
        )
        self.decoder = Decoder(
            TokenEmbedding(dec_embed, cfg.max_positions, cfg.dropout),
            [
                DecoderLayer(residual=_residuals(cfg, "decoder", i), **_layer_sizes(cfg))
                for i in range(cfg.decoder_layers)
            ],
            final_norm(cfg, "decoder"),
            None if tied else nn.Linear(cfg.d_model, vocab_size, bias=False),
        )
        self.set_activation_checkpointing(cfg.checkpoint_activations)

    @property
    def embeddings_shared(self) -> bool:
        return self.encoder.embedding.embed is self.decoder.embedding.embed

    def set_activation_checkpointing(self, enabled: bool) -> None:
        self.encoder.checkpoint_activations = enabled
        self.decoder.checkpoint_activations = enabled

    def encode(self, src_tokens: Tensor, packing: Packing | None = None) -> EncoderOut:
        return self.encoder(src_tokens, packing)

    def decode_step(self, prev_tokens: Tensor, encoder_out: EncoderOut, state: DecoderState) -> Tensor:
        """Logits (B, V) for the next token, extending ``state``'s key/value caches."""
        return self.decoder(prev_tokens, encoder_out, state)[:, -1]

    def new_decoder_state(self, capacity: int = 0) -> DecoderState:
        """Empty caches; ``capacity`` = the most steps expected (preallocated, grown past it)."""
        return DecoderState.empty(len(self.decoder.layers), capacity)

    def forward(self, src_tokens: Tensor, prev_output_tokens: Tensor, packing: Packing | None = None) -> Tensor:
        """Teacher-forced logits (B, T, V); ``packing``: rows of several sentences (``tfx.model.packing``)."""
        return self.decoder(prev_output_tokens, self.encode(src_tokens, packing), packing=packing)
