"""What T-Fixup touches in a PyTorch model: its stacks of layers, each layer's value path and norms, its embeddings.

Two sources of layers. ``nn.TransformerEncoderLayer`` and ``nn.TransformerDecoderLayer`` are recognised by type
(any ``batch_first`` / ``norm_first``), and the layers sharing one parent form a stack (``nn.TransformerEncoder``
holds them in ``.layers``; its ``.norm`` is the stack's final norm). Any other layer is described by a ``Block``
of glob patterns. Beyond that only the token embeddings follow a default rule (by name, ``default_embedding_stack``),
and where it cannot tell, the model is refused, as it is for a norm outside every described layer or for no stack
at all (``ConversionError``, naming what): a conversion never silently leaves a LayerNorm in or scales the wrong
weight.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Literal

import torch
from torch import nn

Side = Literal["encoder", "decoder"]
SIDES: tuple[Side, ...] = ("encoder", "decoder")
# the normalisation layers a method removes or replaces (nn.RMSNorm since torch 2.4)
NORM_TYPES: tuple[type[nn.Module], ...] = tuple(t for t in (nn.LayerNorm, getattr(nn, "RMSNorm", None)) if t)
NATIVE_LAYERS = (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)
ROOT = "(model)"  # the name a stack that is the model itself goes by
HOW = "describe it with tfx.conversion.Block or name it in extra_norms= (docs/convert.md)"

# "qkv[2/3]": rows of the third of three equal row chunks of a packed projection's weight
CHUNK = re.compile(r"^(?P<name>.+)\[(?P<index>\d+)/(?P<chunks>\d+)\]$")


class ConversionError(ValueError):
    """A model, or a description of one, that the converter cannot account for (a one-line message)."""


@dataclass(frozen=True)
class Block:
    """One layer kind of a stack that tfx does not know by type, as glob patterns over module names.

    ``layers`` matches the layers themselves (names from the model root, e.g. ``"blocks.*"``); every match is one
    layer of one stack, whose depth N is the number of matches. The other patterns are relative to a layer and each
    must match in every layer. ``*`` never crosses a dot (``fnmatch`` per dotted segment).

    - ``attention``: ``nn.MultiheadAttention`` modules: their v rows and ``out_proj`` are scaled;
    - ``value``: value projections (``nn.Linear``); ``"qkv[2/3]"`` is the third of three row chunks of a packed
      q/k/v projection: that Linear is Xavier-initialised chunk by chunk, as tfx's separate projections are;
    - ``out``: attention output projections; ``ffn``: the feed-forward projections (only ``nn.Linear`` matches
      count, so ``"mlp.*"`` may also match the activation);
    - ``norms``: the layer's norms, removed (or replaced) by the method;
    - ``side``: which T-Fixup factor the layers get: ``"encoder"`` 0.67 N^-1/4, ``"decoder"`` (9N)^-1/4.
    """

    layers: str
    attention: tuple[str, ...] = ()
    value: tuple[str, ...] = ()
    out: tuple[str, ...] = ()
    ffn: tuple[str, ...] = ()
    norms: tuple[str, ...] = ()
    side: Side = "encoder"

    def __post_init__(self) -> None:
        for role in ("attention", "value", "out", "ffn", "norms"):
            patterns = getattr(self, role)
            if isinstance(patterns, str):
                raise ConversionError(f"Block.{role} takes a list of patterns, got the string {patterns!r}")
            object.__setattr__(self, role, tuple(patterns))
        if self.side not in SIDES:
            raise ConversionError(f"Block.side={self.side!r}: use 'encoder' or 'decoder'")
        if not (self.attention or self.value or self.out or self.ffn):
            raise ConversionError(f"Block(layers={self.layers!r}) names no attention, value, out or ffn module")


@dataclass(frozen=True)
class Target:
    """One weight T-Fixup scales: ``param`` (named ``name`` in the model), or only its ``rows`` (packed q/k/v)."""

    name: str
    param: torch.Tensor
    rows: tuple[int, int] | None = None


@dataclass
class Layer:
    name: str
    scaled: list[Target]
    norms: list[str]  # module names from the model root


@dataclass
class Stack:
    name: str
    side: Side
    layers: list[Layer]
    final_norms: list[str] = field(default_factory=list)
    native: nn.Module | None = None  # the nn.TransformerEncoder holding the layers, if it is one

    @property
    def depth(self) -> int:
        return len(self.layers)


@dataclass
class Structure:
    """Everything the conversion touches, found before anything is changed."""

    stacks: list[Stack]
    norms: list[str]  # every norm to remove or replace
    chunked: dict[str, int]  # Linear module name -> row chunks to Xavier-initialise separately
    embeddings: dict[str, Stack]  # token embedding name -> the stack it feeds


def join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix and name else prefix or name


def matches(pattern: str, name: str) -> bool:
    """``fnmatch`` per dotted segment: ``blocks.*`` matches ``blocks.3`` but not ``blocks.3.attn``."""
    want, have = pattern.split("."), name.split(".")
    return len(want) == len(have) and all(fnmatchcase(h, w) for h, w in zip(have, want, strict=True))


def attention_targets(prefix: str, attn: nn.MultiheadAttention) -> list[Target]:
    """The value path of an ``nn.MultiheadAttention``: the v rows of its packed ``in_proj_weight`` (or its separate
    ``v_proj_weight`` when kdim/vdim differ) and ``out_proj.weight``."""
    d = attn.embed_dim
    if attn._qkv_same_embed_dim:
        value = Target(join(prefix, "in_proj_weight"), attn.in_proj_weight, (2 * d, 3 * d))
    else:
        value = Target(join(prefix, "v_proj_weight"), attn.v_proj_weight)
    return [value, Target(join(prefix, "out_proj.weight"), attn.out_proj.weight)]


def native_layer(name: str, layer: nn.Module) -> Layer:
    """nn.TransformerEncoderLayer: self_attn, linear1/2, norm1/2; the decoder layer adds multihead_attn and norm3."""
    attns = ["self_attn"] + (["multihead_attn"] if isinstance(layer, nn.TransformerDecoderLayer) else [])
    scaled = [t for a in attns for t in attention_targets(join(name, a), getattr(layer, a))]
    scaled += [Target(join(name, f"{fc}.weight"), getattr(layer, fc).weight) for fc in ("linear1", "linear2")]
    norms = [join(name, n) for n, m in layer.named_children() if isinstance(m, NORM_TYPES)]
    return Layer(name, scaled, norms)


def native_stacks(model: nn.Module, claimed: set[str]) -> list[Stack]:
    """The stacks of torch's own layers not described by a Block: the layers sharing one parent, in model order."""
    groups: dict[str, list[tuple[str, nn.Module]]] = defaultdict(list)
    for name, module in model.named_modules():
        if isinstance(module, NATIVE_LAYERS) and not any(name == c or name.startswith(c + ".") for c in claimed):
            groups[name.rpartition(".")[0]].append((name, module))
    stacks = []
    for parent, members in groups.items():
        kinds = {type(m) for _, m in members}
        if len(kinds) > 1:
            raise ConversionError(f"{parent or type(model).__name__!r} holds both encoder and decoder layers; {HOW}")
        in_layers = parent.rpartition(".")[2] == "layers"  # nn.TransformerEncoder/Decoder hold them in .layers
        holder_name = parent.rpartition(".")[0] if in_layers else parent
        holder = model.get_submodule(holder_name) if in_layers else None
        native = holder if isinstance(holder, nn.TransformerEncoder | nn.TransformerDecoder) else None
        finals = [join(holder_name, "norm")] if native is not None and isinstance(native.norm, NORM_TYPES) else []
        side: Side = "decoder" if kinds == {nn.TransformerDecoderLayer} else "encoder"
        name = (holder_name if native is not None else parent) or ROOT
        stacks.append(Stack(name, side, [native_layer(n, m) for n, m in members], finals, native))
    return stacks


def _role_modules(block: Block, layer_name: str, layer: nn.Module, role: str, kinds: tuple[type, ...]) -> list:
    """(pattern, chunk, name, module) for every module of ``kinds`` a ``role`` pattern matches in one layer."""
    found = []
    for pattern in getattr(block, role):
        chunk = CHUNK.match(pattern) if role == "value" else None
        glob = chunk["name"] if chunk else pattern
        hits = [(n, m) for n, m in layer.named_modules() if n and matches(glob, n) and isinstance(m, kinds)]
        if not hits:
            what = " or ".join(k.__name__ for k in kinds)
            raise ConversionError(
                f"Block(layers={block.layers!r}): {role} pattern {pattern!r} matches no {what} in layer {layer_name!r}"
            )
        found += [(pattern, chunk, join(layer_name, n), m) for n, m in hits]
    return found


def _chunk_target(name: str, linear: nn.Linear, chunk: re.Match | None, chunked: dict[str, int]) -> Target:
    if chunk is None:
        return Target(join(name, "weight"), linear.weight)
    index, chunks = int(chunk["index"]), int(chunk["chunks"])
    rows = linear.out_features // chunks if chunks else 0
    if not (0 <= index < chunks) or rows * chunks != linear.out_features:
        raise ConversionError(f"{chunk.string!r}: {name} has {linear.out_features} rows, not {chunks} equal chunks")
    chunked[name] = chunks
    return Target(join(name, "weight"), linear.weight, (index * rows, (index + 1) * rows))


def block_stack(model: nn.Module, block: Block, chunked: dict[str, int]) -> Stack:
    members = [(n, m) for n, m in model.named_modules() if n and matches(block.layers, n)]
    if not members:
        raise ConversionError(f"Block(layers={block.layers!r}) matches no module of {type(model).__name__}")
    layers = []
    for name, module in members:
        scaled = []
        for _, _, n, attn in _role_modules(block, name, module, "attention", (nn.MultiheadAttention,)):
            scaled += attention_targets(n, attn)
        for role in ("value", "out", "ffn"):
            for _, chunk, n, linear in _role_modules(block, name, module, role, (nn.Linear,)):
                scaled.append(_chunk_target(n, linear, chunk, chunked))
        norms = [n for _, _, n, _ in _role_modules(block, name, module, "norms", NORM_TYPES)]
        layers.append(Layer(name, scaled, norms))
    return Stack(block.layers, block.side, layers)


def _check_disjoint(stacks: list[Stack]) -> None:
    """A weight scaled twice (two Blocks, or two roles of one) is a description error, not a larger factor."""
    seen: dict[tuple[int, tuple[int, int] | None], str] = {}
    for stack in stacks:
        for layer in stack.layers:
            for t in layer.scaled:
                key = (id(t.param), t.rows)
                if key in seen:
                    raise ConversionError(f"{t.name} is described twice (stacks {seen[key]!r} and {stack.name!r})")
                seen[key] = stack.name


def accounted_norms(model: nn.Module, stacks: list[Stack], extra_norms: tuple[str, ...]) -> list[str]:
    """Every norm of the model, refused unless a stack or ``extra_norms`` accounts for it."""
    known = {n for s in stacks for n in s.final_norms + [x for layer in s.layers for x in layer.norms]}
    for pattern in extra_norms:
        hits = [n for n, m in model.named_modules() if n and matches(pattern, n) and isinstance(m, NORM_TYPES)]
        if not hits:
            raise ConversionError(f"extra_norms pattern {pattern!r} matches no LayerNorm/RMSNorm")
        known.update(hits)
    norms = [n for n, m in model.named_modules() if isinstance(m, NORM_TYPES)]
    if stray := [n for n in norms if n not in known]:
        raise ConversionError(f"cannot account for {', '.join(map(repr, stray))} (outside every matched layer); {HOW}")
    return norms


SOURCE_WORDS, TARGET_WORDS = ("src", "enc", "source"), ("tgt", "trg", "dec", "target")


def _stack_for(model_name: str, where: str, stacks: list[Stack]) -> Stack:
    """``where``: a stack's name, or a side when one stack has it."""
    by_name = [s for s in stacks if s.name == where] or [s for s in stacks if s.side == where]
    if len(by_name) != 1:
        names = [s.name for s in stacks]
        raise ConversionError(f"embeddings[{model_name!r}]={where!r}: name one stack of {names} (or its side)")
    return by_name[0]


def default_embedding_stack(name: str, stacks: list[Stack], n_tables: int) -> Stack | None:
    """The rule without ``embeddings=``: one side present -> its stack; both -> by name (src/enc/source: encoder,
    tgt/trg/dec/target: decoder), else a single table is shared -> the encoder's (as tfx)."""
    sides = {s.side for s in stacks}
    words = name.lower().replace("_", ".").split(".")
    if len(sides) == 2:
        if any(w.startswith(SOURCE_WORDS) for w in words):
            sides = {"encoder"}
        elif any(w.startswith(TARGET_WORDS) for w in words):
            sides = {"decoder"}
        elif n_tables == 1:
            sides = {"encoder"}
    candidates = [s for s in stacks if s.side in sides]
    return candidates[0] if len(candidates) == 1 else None


def find_embeddings(model: nn.Module, stacks: list[Stack], named: dict[str, str] | None) -> dict[str, Stack]:
    """Token embeddings and the stack each feeds; tables named like positions (``pos``) are left out by default."""
    tables = {n: m for n, m in model.named_modules() if isinstance(m, nn.Embedding)}
    if named is not None:
        if missing := [n for n in named if n not in tables]:
            raise ConversionError(f"embeddings= names {missing}, which are not nn.Embedding modules of the model")
        return {n: _stack_for(n, w, stacks) for n, w in named.items()}
    positions = [n for n in tables if "pos" in n.rpartition(".")[2].lower()]
    tokens = [n for n in tables if n not in positions]
    found = {n: default_embedding_stack(n, stacks, len(tokens)) for n in tokens}
    if unresolved := [n for n, s in found.items() if s is None]:
        raise ConversionError(
            f"cannot tell which stack embedding(s) {unresolved} feed; pass embeddings={{name: 'encoder' or 'decoder'}}"
        )
    return {n: s for n, s in found.items() if s is not None}


def find_structure(
    model: nn.Module, blocks: tuple[Block, ...], extra_norms: tuple[str, ...], embeddings: dict[str, str] | None
) -> Structure:
    chunked: dict[str, int] = {}
    described = [block_stack(model, b, chunked) for b in blocks]
    claimed = {layer.name for s in described for layer in s.layers}
    stacks = native_stacks(model, claimed) + described
    if not stacks:
        raise ConversionError(
            f"found no nn.TransformerEncoderLayer/DecoderLayer in {type(model).__name__}, and no Block was given; "
            "describe its layers with tfx.conversion.Block (docs/convert.md)"
        )
    _check_disjoint(stacks)
    norms = accounted_norms(model, stacks, extra_norms)
    return Structure(stacks, norms, chunked, find_embeddings(model, stacks, embeddings))
