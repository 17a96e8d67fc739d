"""What a conversion changed, parameter by parameter and norm by norm: returned by ``convert`` and printable."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ParameterChange:
    """``init``: how the base set it; ``factor``: T-Fixup's factor on top (1.0: none), on ``rows`` if not None
    (a packed q/k/v weight: only its v rows are scaled)."""

    name: str
    init: str
    factor: float = 1.0
    rows: tuple[int, int] | None = None


@dataclass(frozen=True)
class NormChange:
    name: str
    was: str
    now: str


@dataclass(frozen=True)
class StackSummary:
    """A stack and the factors its depth gave: ``layer_factor`` for its v/out/FFN weights."""

    name: str
    side: str
    depth: int
    layer_factor: float


@dataclass
class ConversionReport:
    method: str
    stacks: list[StackSummary] = field(default_factory=list)
    parameters: list[ParameterChange] = field(default_factory=list)
    norms: list[NormChange] = field(default_factory=list)
    untouched: list[str] = field(default_factory=list)  # parameters the conversion left as they were
    fast_paths_off: list[str] = field(default_factory=list)  # modules whose fused LayerNorm kernels were switched off

    def change(self, name: str) -> ParameterChange:
        """The change to the parameter ``name`` (KeyError if it was not changed)."""
        for p in self.parameters:
            if p.name == name:
                return p
        raise KeyError(name)

    def factor(self, name: str) -> float:
        return self.change(name).factor

    def __str__(self) -> str:
        lines = [f"tfx.convert method={self.method}"]
        lines += [f"  stack {s.name} ({s.side}, N={s.depth}): layer factor {s.layer_factor:.4f}" for s in self.stacks]
        for p in self.parameters:
            rows = "" if p.rows is None else f" rows {p.rows[0]}:{p.rows[1]}"
            scaled = "" if p.factor == 1.0 else f" x {p.factor:.4f}{rows}"
            lines.append(f"  {p.name}: {p.init}{scaled}")
        lines += [f"  {n.name}: {n.was} -> {n.now}" for n in self.norms]
        lines += [f"  {name}: fused fast path off (it would run LayerNorm kernels)" for name in self.fast_paths_off]
        lines += [f"  {name}: left as it was" for name in self.untouched]
        return "\n".join(lines)
