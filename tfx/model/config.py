"""The model's configuration, one typed object: ``ModelConfig`` is what ``Transformer`` takes.

It lives beside the model (karpathy/nanoGPT's ``GPTConfig`` beside its ``GPT``) so the model imports its
config from below; ``tfx.config`` nests it in the run's ``Config`` and Hydra checks ``conf/model/*.yaml``
against it. Model code never sees Hydra: a run, a checkpoint and a test all hand the model this dataclass.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tfx.model.registry import RESIDUALS, resolve_options


def require(ok: bool, message: str) -> None:
    """A ``ValueError`` carrying ``message`` unless ``ok``: a bad setting named where it is read."""
    if not ok:
        raise ValueError(message)


@dataclass
class ModelConfig:
    """Encoder-decoder Transformer shape (fairseq ``transformer_iwslt_de_en`` names)."""

    encoder_layers: int = 6  # encoder depth N_enc
    decoder_layers: int = 6  # decoder depth N_dec
    d_model: int = 512  # embedding / residual width
    ffn_dim: int = 1024  # FFN hidden width
    heads: int = 4  # attention heads (d_model % heads == 0)
    norm: str = "none"  # residual kind: a key of RESIDUALS (tfx/model/residual.py, kinds/; set by conf/method/)
    # the options of model.norm's kind, by name (Derf's alpha and shift): the kind declares them with their defaults
    # (its ``Options`` dataclass, docs/layout.md "Adding a method"), which fill in what is not set here; its method
    # YAML lists them, so ``model.norm_options.NAME=V`` overrides one. A name the kind lacks is refused
    norm_options: dict[str, Any] = field(default_factory=dict)
    dropout: float = 0.3  # dropout on embeddings, residual branches
    attention_dropout: float = 0.1  # dropout on attention probabilities
    activation_dropout: float = 0.1  # dropout after the FFN ReLU
    share_decoder_embeddings: bool = True  # tie decoder input and output embeddings
    share_all_embeddings: bool = False  # one embedding for encoder, decoder and output
    max_positions: int = 1024  # longest sequence the sinusoidal table covers
    checkpoint_activations: bool = False  # recompute each layer in backward to save memory
    # norm=dyt: alpha of every DyT(x) = weight * tanh(alpha * x) + bias at init (the reference's 0.5 for
    # non-LLM models; its issues #6 and #18: alpha init and lr matter); other kinds ignore it
    dyt_alpha: float = 0.5
    # norm=rezero: one resweight per layer, shared by its sublayers, as majumderb/rezero's rztx.py layers hold it;
    # false: one per sublayer. Other kinds ignore it. (dyt_alpha and rezero_shared predate norm_options: published
    # commands and checkpoints name them, so they stay fields)
    rezero_shared: bool = True

    def __post_init__(self) -> None:
        require(self.encoder_layers >= 1 and self.decoder_layers >= 1, "model.*_layers must be >= 1")
        require(self.d_model > 0 and self.ffn_dim > 0 and self.heads > 0, "model sizes must be positive")
        require(
            self.d_model % self.heads == 0,
            f"model.d_model={self.d_model} must be divisible by model.heads={self.heads}",
        )
        require(self.norm in RESIDUALS, f"model.norm={self.norm!r}: use one of {tuple(RESIDUALS)}")
        self.norm_options = resolve_options(self.norm, self.norm_options)
        require(self.dyt_alpha > 0, f"model.dyt_alpha={self.dyt_alpha} must be positive")
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            value = getattr(self, name)
            require(0.0 <= value < 1.0, f"model.{name}={value} must be in [0, 1)")

    @classmethod
    def from_fields(cls, fields: ModelConfig | Mapping[str, Any]) -> ModelConfig:
        """The config of a checkpoint's ``config["model"]`` (a plain dict), or ``fields`` itself if typed.

        A field the dict lacks was added after the checkpoint was written (``dyt_alpha``, ``rezero_shared``,
        ``norm_options``): its default is what the code of that time built, so the old model is rebuilt as it was.
        A field the schema lacks is refused by name.
        """
        if isinstance(fields, ModelConfig):
            return fields
        known = {f.name for f in dataclasses.fields(cls)}
        if unknown := sorted(set(fields) - known):
            raise ValueError(f"model config: unknown fields {unknown} (known: {sorted(known)})")
        return cls(**fields)
