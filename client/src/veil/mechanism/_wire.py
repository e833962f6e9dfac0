"""One home for a mechanism's wire shape: the registry of mechanisms and how their reports travel.

A mechanism is registered once, with ``register``: its spec class, its value in the wire's
``veil.wire.v1.Mechanism`` enum, and the aggregator's batch sampler that can draw its reports.
Everything else reads it here: ``spec_for`` and the config find a mechanism by name, the SDK
and the aggregator translate spec messages by enum value, the SDK's encoder picks an encoding,
and the aggregator's decoder, message-size limit, simulator and CLI follow the same rules.

Encodings are the UploadRequest's ``reports`` oneof. ``index_sets``: q little-endian uint32
indices per report, only for designs whose every report holds exactly q categories
(``spec.q`` is not None). ``bitmaps``: ceil(k/8) bytes per report, for every design. The SDK
sends whichever is shorter (index sets on a tie); the aggregator accepts any the design allows.
``hashed``: a strings round's reports (HashedSpec, never registered), REPORT_BYTES each, alone.

Batch samplers (the aggregator's numba kernels, which draw exactly what ``randomize`` draws
from the same random words): ``q-subset`` draws SubsetSpec's randomization from ``spec.k``,
``spec.q`` and ``spec.keep_threshold``; ``rappor`` draws RapporSpec's from ``spec.k`` and
``spec.flip_threshold``, redrawing all-zeros and all-ones reports when ``spec.admissible``.
A mechanism without a sampler is encoded, decoded, counted and estimated as any other, but not
simulated in batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from ._errors import MechanismError
from ._rappor import AdmissibleRapporSpec, RapporSpec
from ._specs import KrrSpec, MechanismSpec, SubsetSpec, WarnerSpec
from ._strings import REPORT_BYTES, HashedSpec

__all__ = [
    "WireShape",
    "MECHANISMS",
    "SAMPLERS",
    "INDEX_SETS",
    "BITMAPS",
    "HASHED_REPORTS",
    "register",
    "wire_shape",
    "wire_shape_of",
    "encodings",
    "encoding",
    "report_bytes",
    "max_report_bytes",
]

INDEX_SETS = "index_sets"
BITMAPS = "bitmaps"
HASHED_REPORTS = "hashed"
SAMPLERS = ("q-subset", "rappor")
_INDEX_BYTES = 4  # each index is a little-endian uint32


@dataclass(frozen=True)
class WireShape:
    """One registered mechanism: its spec class, its wire enum value, and its batch sampler."""

    spec: type[MechanismSpec]
    proto: int  # its value in veil.wire.v1.Mechanism
    sampler: str | None = None  # one of SAMPLERS, or None: no batch sampler

    @property
    def name(self) -> str:
        return self.spec.name


_SHAPES: dict[str, WireShape] = {}
# Every registered mechanism by name, in registration order; a live view, so a mechanism
# registered later is found by everything that reads it.
MECHANISMS: Mapping[str, WireShape] = MappingProxyType(_SHAPES)


def register(spec: type[MechanismSpec], *, proto: int, sampler: str | None = None) -> WireShape:
    """Register a mechanism under its spec class's name; MechanismError when the name or enum
    value is taken, or the sampler is not one of SAMPLERS."""
    named = isinstance(spec, type) and issubclass(spec, MechanismSpec) and isinstance(getattr(spec, "name", None), str)
    if not named:
        raise MechanismError("A mechanism is registered by its MechanismSpec subclass, which names it.")
    if isinstance(proto, bool) or not isinstance(proto, int) or proto < 1:
        raise MechanismError(f"A mechanism's wire enum value must be a whole number of at least 1, not {proto!r}.")
    if sampler is not None and sampler not in SAMPLERS:
        raise MechanismError(f"Unknown batch sampler {sampler!r}; choose one of {', '.join(SAMPLERS)}, or None.")
    taken = next((s.name for s in _SHAPES.values() if spec.name == s.name or proto == s.proto), None)
    if taken is not None:
        raise MechanismError(f"Mechanism {taken!r} is already registered with that name or wire enum value.")
    shape = WireShape(spec, proto, sampler)
    _SHAPES[spec.name] = shape
    return shape


def wire_shape(mechanism: str) -> WireShape:
    """The registered mechanism of this name; MechanismError naming the choices."""
    try:
        return _SHAPES[mechanism]
    except (KeyError, TypeError):
        raise MechanismError(f"Unknown mechanism {mechanism!r}; choose one of {', '.join(_SHAPES)}.") from None


def wire_shape_of(proto: int) -> WireShape:
    """The registered mechanism of this wire enum value; MechanismError when there is none."""
    shape = next((s for s in _SHAPES.values() if s.proto == proto), None)
    if shape is None:
        raise MechanismError(f"No mechanism is registered with wire enum value {proto!r}.")
    return shape


def encodings(spec: MechanismSpec) -> tuple[str, ...]:
    """The encodings this design's reports may take."""
    if isinstance(spec, HashedSpec):
        return (HASHED_REPORTS,)
    return (BITMAPS,) if spec.q is None else (INDEX_SETS, BITMAPS)


def encoding(spec: MechanismSpec) -> str:
    """The encoding the SDK sends: the shorter one (at k = 1024, epsilon = 1: 128 bytes against
    1100), index sets on a tie."""
    if isinstance(spec, HashedSpec):
        return HASHED_REPORTS
    if spec.q is None or report_bytes(spec, BITMAPS) < report_bytes(spec, INDEX_SETS):
        return BITMAPS
    return INDEX_SETS


def report_bytes(spec: MechanismSpec, encoding: str) -> int:
    """The size of one report of this design in an encoding it may take."""
    if encoding not in encodings(spec):
        raise MechanismError(f"Reports of {spec.name} are not sent as {encoding}.")
    if encoding == HASHED_REPORTS:
        return REPORT_BYTES
    return (spec.k + 7) // 8 if encoding == BITMAPS or spec.q is None else _INDEX_BYTES * spec.q


def max_report_bytes(spec: MechanismSpec) -> int:
    """The size of one report in the design's widest encoding: what a valid upload may spend."""
    return max(report_bytes(spec, e) for e in encodings(spec))


# Veil's mechanisms, in the wire enum's order.
register(SubsetSpec, proto=1, sampler="q-subset")
register(RapporSpec, proto=2, sampler="rappor")
register(AdmissibleRapporSpec, proto=3, sampler="rappor")
register(KrrSpec, proto=4, sampler="q-subset")
register(WarnerSpec, proto=5, sampler="q-subset")
