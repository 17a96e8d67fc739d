"""tfx: encoder-decoder Transformers without LayerNorm or warmup, trained with T-Fixup initialization."""

__version__ = "0.1.0"
