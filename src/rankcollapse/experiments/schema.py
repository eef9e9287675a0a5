"""Schema of the configs (``configs/*.yaml``), checked with pydantic: the experiment
configs (:class:`ExperimentConfig`) and the schedule study (:class:`ScheduleStudy`).
Every mapping whose keys the code reads forbids unknown keys (a typo is an error naming
the key); free-form mappings (``scales``, ``grid``/``params``, ``select``, ``nearby``)
keep any key. A unit's ``kind`` must be registered for experiments.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..errors import ConfigError, excerpt
from ..sweep.units import unit_kinds
# the modules that register the experiments' unit kinds (:func:`.units.register`)
from . import influence_units, temperature_units, power_units, energy_units, sink_units, units  # noqa: F401


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Data(_Strict):
    corpus: str
    n_tokens: int = Field(gt=1)
    embed_model: Optional[str] = None
    path: Optional[str] = None
    seed: Optional[int] = None


class UnitSpec(_Strict):
    """A config's ``units`` entry: a kind, a grid and fixed parameters (one unit per grid point)."""

    kind: str
    grid: dict[str, list[Any]] = Field(default_factory=dict)
    params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("kind")
    @classmethod
    def _registered(cls, kind: str) -> str:
        kinds = unit_kinds("experiments")
        if kind not in kinds:
            raise ValueError(f"unknown unit kind; experiment configs take {', '.join(kinds)}")
        return kind


class Plot(_Strict):
    id: str
    title: str
    metric: str
    lines: str
    caption: str = ""
    select: dict[str, Any] = Field(default_factory=dict)
    panels: Optional[str] = None
    loglog: bool = False
    x: Optional[str] = None
    xlabel: Optional[str] = None
    ylabel: Optional[str] = None
    yscale: Optional[Literal["log", "linear", "symlog"]] = None
    ncols: Optional[int] = Field(default=None, ge=1)
    sharey: Union[bool, Literal["auto"], None] = None
    line_label: Optional[str] = None
    panel_label: Optional[str] = None
    legend_title: Optional[str] = None
    aliases: list[str] = Field(default_factory=list)


class Quantity(_Strict):
    stat: Optional[str] = None
    metric: Optional[str] = None
    layer: Any = None
    from_layer: Any = None
    floor: Optional[float] = None
    select: dict[str, Any] = Field(default_factory=dict)
    num: Optional["Quantity"] = None
    den: Optional["Quantity"] = None
    const: Optional[float] = None
    n_tokens: Optional[int] = Field(default=None, ge=2)  # for stat: envelope_rate
    where: Optional[dict[str, Any]] = None  # stat: min | max, layers where another metric passes a bound
    with_: Optional[str] = Field(default=None, alias="with")  # stat: spearman, the other metric or "layer"
    against: Optional[dict[str, Any]] = None  # stat: profile_spearman, the other profile's select changes
    over: Optional[Literal["median", "min", "max"]] = None  # stat: profile_spearman, reduction over layers


class Check(_Strict):
    lhs: Quantity
    op: Literal[">=", "<=", ">", "<", "within"]
    rhs: Optional[Quantity] = None
    name: Optional[str] = None
    factor: Any = None
    compare: Optional[Literal["ratio", "difference"]] = None
    informational: bool = False
    for_each: dict[str, list[Any]] = Field(default_factory=dict)
    band: Optional[tuple[float, float]] = None  # a stated threshold band (.claims); default x1/2 to x2
    null_hypothesis: Optional[str] = None  # a check on a control condition: the null it tests, in the claim's direction (.controls)


class Rule(_Strict):
    statement: str
    checks: list[Check] = Field(min_length=1)
    expect: Optional[Literal["all", "mixed"]] = None


class Original(_Strict):
    verdict: str
    rule: Optional[str] = None
    reason: Optional[str] = None
    earlier: list[dict[str, Any]] = Field(default_factory=list)  # amendments before this one


class ControlEdit(_Strict):
    where: dict[str, Any] = Field(default_factory=dict)
    side: Literal["lhs", "rhs", "both"] = "both"
    replace: dict[str, dict[str, Any]] = Field(default_factory=dict)
    set: dict[str, Any] = Field(default_factory=dict)
    drop: list[str] = Field(default_factory=list)
    quantity: dict[str, Any] = Field(default_factory=dict)


class Control(_Strict):
    why: str
    edits: list[ControlEdit] = Field(min_length=1)


class Controls(_Strict):
    positive: Control
    negative: Control


class Factor(_Strict):
    """The factor a claim is about, and the edits that switch it off (.claims)."""

    name: str
    without: list[ControlEdit] = Field(min_length=1)  # the edits that switch the factor off


class NTokensAxis(_Strict):
    """A claim's sequence-length axis (:mod:`.axis`)."""

    n_tokens: list[int] = Field(min_length=1)
    units: dict[str, Any] = Field(min_length=1)
    params: dict[str, Any] = Field(default_factory=dict)
    max_windows: Optional[dict[int, int]] = None  # N -> most windows a unit at that N reads
    why: str

    @field_validator("max_windows")
    @classmethod
    def _windows(cls, max_windows: dict[int, int] | None) -> dict[int, int] | None:
        if max_windows is not None and any(w < 1 for w in max_windows.values()):
            raise ValueError("window counts must be >= 1")
        return max_windows

    @field_validator("n_tokens")
    @classmethod
    def _lengths(cls, n_tokens: list[int]) -> list[int]:
        if any(n < 2 for n in n_tokens) or len(set(n_tokens)) != len(n_tokens):
            raise ValueError("window lengths must be distinct integers >= 2")
        return n_tokens


class Claim(_Strict):
    id: str
    effect: str
    rule: Rule
    paper_effect: Optional[str] = None
    where: Optional[str] = None
    measured_quantity: Optional[str] = None
    comparison: Optional[str] = None
    plot: Optional[str] = None
    notes: Optional[str] = None
    original: Optional[Original] = None
    controls: Optional[Controls] = None
    factor: Optional[Factor] = None
    nearby_units: dict[str, Any] = Field(default_factory=dict)
    nearby: list[dict[str, Any]] = Field(default_factory=list)
    n_tokens_axis: Optional[NTokensAxis] = None


class ExperimentConfig(_Strict):
    name: str
    title: str
    data: Data
    scales: dict[str, dict[str, Any]]
    units: list[UnitSpec]
    plots: list[Plot] = Field(default_factory=list)
    claims: list[Claim] = Field(default_factory=list)
    claims_from: Any = None


class StudySimulation(_Strict):
    d_model: int = Field(ge=1)
    depth: int = Field(ge=1)
    n_samples: int = Field(ge=1)
    d_qk: float = Field(gt=0)


class StudyScale(_Strict):
    """A scale's overrides of the study: its budgets and any simulation key."""

    budget_widths: Optional[list[int]] = Field(default=None, min_length=1)
    d_model: Optional[int] = Field(default=None, ge=1)
    depth: Optional[int] = Field(default=None, ge=1)
    n_samples: Optional[int] = Field(default=None, ge=1)
    d_qk: Optional[float] = Field(default=None, gt=0)


class ScheduleStudy(_Strict):
    """``configs/schedules.yaml`` (docs/schedules.md)."""

    name: str
    title: str
    n_tokens: int = Field(ge=2)
    budget_widths: list[int] = Field(min_length=1)
    budget_tolerance: float = Field(ge=0)
    families: dict[str, str] = Field(min_length=1)
    simulation: StudySimulation
    scales: dict[str, StudyScale]


def validate_study(cfg: Any, name: str = "schedules") -> ScheduleStudy:
    """Check ``cfg`` (the parsed schedule study) against :class:`ScheduleStudy`; raises as :func:`validate_config`."""
    return _validated(ScheduleStudy, cfg, name)


def validate_config(cfg: Any, name: str) -> ExperimentConfig:
    """Check ``cfg`` (a parsed YAML config) against :class:`ExperimentConfig`.

    Raises
    ------
    ConfigError
        One line per problem: where (``claims[2].rule.checks[0]``) and what (``unknown key 'factr'``).
    """
    return _validated(ExperimentConfig, cfg, name)


def _validated(model: type[BaseModel], cfg: Any, name: str) -> Any:
    try:
        return model.model_validate(cfg)
    except ValidationError as exc:
        raise ConfigError(f"config {name}: " + "; ".join(_problem(e) for e in exc.errors())) from None


def _problem(err: dict[str, Any]) -> str:
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"][:-1]).lstrip(".")
    last = err["loc"][-1] if err["loc"] else ""
    prefix = f"{where}: " if where else ""
    if err["type"] == "extra_forbidden":
        return f"{prefix}unknown key {last!r}"
    if err["type"] == "missing":
        return f"{prefix}missing key {last!r}"
    msg = err["msg"].removeprefix("Value error, ")  # a validator's own message, without pydantic's prefix
    return f"{prefix}{last}: {msg} (got {excerpt(err.get('input'))})"
