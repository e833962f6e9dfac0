"""A metric: a name, its ordered category labels, and the mechanism that randomizes it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from ._errors import MechanismError
from ._rappor import AdmissibleRapporSpec, RapporSpec
from ._specs import KrrSpec, MechanismSpec, SubsetSpec, WarnerSpec, fingerprint_of

__all__ = ["MECHANISMS", "DEFAULT_MECHANISM", "spec_for", "MetricSpec"]

_SPECS: dict[str, type[MechanismSpec]] = {
    cls.name: cls for cls in (SubsetSpec, RapporSpec, AdmissibleRapporSpec, KrrSpec, WarnerSpec)
}
MECHANISMS: tuple[str, ...] = tuple(_SPECS)
DEFAULT_MECHANISM = SubsetSpec.name


def spec_for(mechanism: str, k: int, epsilon: float) -> MechanismSpec:
    """The spec of a mechanism by name (one of MECHANISMS)."""
    try:
        cls = _SPECS[mechanism]
    except (KeyError, TypeError):
        raise MechanismError(
            f"Unknown mechanism {mechanism!r}; choose one of {', '.join(MECHANISMS)}."
        ) from None
    return cls(k=k, epsilon=epsilon)


@dataclass(frozen=True)
class MetricSpec:
    """What a device needs to report one metric; its fingerprint names it on the wire."""

    name: str
    labels: tuple[str, ...]
    mechanism: MechanismSpec

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise MechanismError("A metric needs a non-empty name.")
        labels = tuple(self.labels)
        if len(set(labels)) != len(labels) or not all(isinstance(x, str) and x for x in labels):
            raise MechanismError(f"Metric {self.name!r} needs distinct, non-empty category labels.")
        if len(labels) != self.mechanism.k:
            raise MechanismError(
                f"Metric {self.name!r} has {len(labels)} labels but its mechanism has k = {self.mechanism.k}."
            )
        object.__setattr__(self, "labels", labels)

    @classmethod
    def create(cls, name: str, labels: Sequence[str], mechanism: str = DEFAULT_MECHANISM,
               epsilon: float = 1.0) -> MetricSpec:
        return cls(name, tuple(labels), spec_for(mechanism, len(labels), epsilon))

    @property
    def k(self) -> int:
        return self.mechanism.k

    def canonical(self) -> dict[str, object]:
        return {"name": self.name, "labels": list(self.labels), **self.mechanism.canonical()}

    @cached_property
    def fingerprint(self) -> str:
        return fingerprint_of(self.canonical())

    def index(self, value: str | int) -> int:
        """The category index of a label (or of an index, checked)."""
        if isinstance(value, str):
            try:
                return self.labels.index(value)
            except ValueError:
                raise MechanismError(f"{value!r} is not a category of metric {self.name!r}.") from None
        return self.mechanism.check_value(value)
