"""Axes of the phase sweep (docs/phase.md, "Axes") and their expansion into cells, dicts of
every axis; ``--axis NAME=v1,v2,...`` with ``;`` between a spec's keys (``bigbird:w=3;globals=1``).
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

from .._memory import default_limit, human
from .._validate import KINDS, check_float, check_int
from ..errors import ConfigError, MaskError, MemoryLimitError

from ..dynamics.config import NORMS as NORM_NAMES, PLACEMENTS, BlockConfig, default_alpha
from ..dynamics.operators import parse_attention
from ..dynamics.temperature_laws import LLAMA4_FLOOR_SCALE, is_law, parse_law

VALUE_FAMILIES = ("gaussian", "orthogonal", "near_identity", "constructed", "pretrained")


def _choice(options: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in options:
            raise ConfigError(f"expected one of {', '.join(options)}, got {text!r}")
        return text
    return parse


def _input(text: str) -> str:
    from ..dynamics.inputs import canonical_input

    return canonical_input(text)


def _value(kind: str, low: float | None = None, high: float | None = None) -> Callable[[str], Any]:
    """A parser of one value of a :data:`~rankcollapse._validate.KINDS` kind, a number in ``[low, high]``."""
    convert, want = KINDS[kind]

    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            raise ConfigError(f"expected {want}, got {text!r}") from None
        if kind == "bool":
            return value
        return (check_int if kind == "int" else check_float)(value, "the value", low=low, high=high)
    return parse


_float = _value("float", 0)


def _beta(text: str) -> float | str:
    """A number ``β >= 0`` or a temperature law, kept as its canonical string (``log:2.0``)."""
    if is_law(text):
        return parse_law(text).spec
    return _float(text)


def cell_beta(cell: dict[str, Any]) -> float | None:
    """``β`` of a cell's scores ``β <x_i, x_j>`` at its N and d; None for a ``qk_scale`` cell."""
    value = cell["beta"]
    if value is None:
        return None
    if is_law(value):
        return parse_law(value).beta(int(cell["n_tokens"]), int(cell["d_model"]))
    return float(value)


def temperature_columns(table: Any) -> Any:
    """``table`` (a DataFrame of cells) with ``qk_scale`` as floats and ``beta`` in one Parquet
    type (every value given as a string when numbers and laws mix)."""
    table["qk_scale"] = table["qk_scale"].astype(float)
    given = table["beta"].map(lambda v: v is not None and v == v)  # None and NaN: no beta
    if len({isinstance(v, str) for v in table["beta"][given]}) > 1:
        table["beta"] = table["beta"].where(~given, table["beta"].map(str)).where(given, None)
    return table


#: cells with more tokens run on the windowed kernel (:mod:`.batched`)
DENSE_MAX_TOKENS = 4096
BACKENDS = ("auto", "dense", "blocked")


def attention_backend(n_tokens: int, backend: str = "auto") -> str:
    """``"dense"`` or ``"blocked"``: ``backend``, or for ``"auto"`` blocked above
    :data:`DENSE_MAX_TOKENS` tokens; :class:`ConfigError` for another ``backend``."""
    if backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "auto":
        return "blocked" if n_tokens > DENSE_MAX_TOKENS else "dense"
    return backend


def _mask(spec: str) -> str:
    """A mask spec, checked; a schedule is refused (a cell's columns are of one graph)."""
    from ..masks.spec import check_spec

    if spec.strip().startswith(("schedule:", "[")):
        raise ConfigError(f"{spec!r} is a mask schedule; a phase cell runs one mask (its regime and theory "
                          "columns are of one graph): run a schedule with 'rankcollapse simulate --mask SPEC' "
                          "or 'rankcollapse theory bound --mask SPEC'")
    try:
        return check_spec(spec)
    except MaskError as exc:
        raise ConfigError(str(exc)) from None


def _attention(text: str) -> str:
    return parse_attention(text).spec


#: axis name -> (parser of one value, default); meanings in docs/phase.md, "Axes". ``d_qk`` 0
#: means "= d_model"; a cell that sets ``beta`` has ``qk_scale`` None (:func:`expand_grid`).
AXES: dict[str, tuple[Callable[[str], Any], Any]] = {
    "qk_scale": (_float, 1.0),
    "beta": (_beta, None),
    "value": (_choice(VALUE_FAMILIES), "gaussian"),
    "value_scale": (_float, 1.0),
    "norm": (_choice(NORM_NAMES), "none"),
    "placement": (_choice(PLACEMENTS), "none"),
    "alpha": (_float, 0.0),
    "mask": (_mask, "complete"),
    "d_qk": (_value("int", 0, 4096), 0),
    "n_tokens": (_value("int", 2, 65536), 32),
    "d_model": (_value("int", 2, 4096), 16),
    "depth": (_value("int", 1, 1024), 64),
    "shared": (_value("bool"), False),
    "input": (_input, "gaussian"),
    "attention": (_attention, "softmax"),
    "qk_norm": (_value("bool"), False),
    "headwise_rmsnorm": (_value("bool"), False),
}
DEFAULTS = {name: default for name, (_, default) in AXES.items()}


def parse_axis(text: str) -> tuple[str, list[Any]]:
    """``"NAME=v1,v2"`` -> ``(NAME, [parsed values])``; :class:`ConfigError` for anything else."""
    if not isinstance(text, str):
        raise ConfigError(f"--axis expects a string NAME=v1,v2,..., got {type(text).__name__} {text!r}")
    name, eq, values = text.partition("=")
    name = name.strip()
    if not eq or name not in AXES:
        raise ConfigError(f"--axis expects NAME=v1,v2,... with NAME one of {', '.join(AXES)}, got {text!r}")
    items = [v.strip().replace(";", ",") for v in values.split(",") if v.strip()]  # ';': a spec's commas
    if not items:
        raise ConfigError(f"--axis {name}: no values")
    parse = AXES[name][0]
    try:
        return name, [parse(v) for v in items]
    except ConfigError as exc:
        raise ConfigError(f"--axis {name}: {exc}") from None


def parse_axes(texts: list[str]) -> dict[str, list[Any]]:
    """``["NAME=v1,v2", ...]`` -> ``{NAME: [parsed values]}`` (:func:`parse_axis`); an axis twice is refused."""
    axes: dict[str, list[Any]] = {}
    for text in texts:
        name, values = parse_axis(text)
        if name in axes:
            raise ConfigError(f"--axis {name} given twice")
        axes[name] = values
    return axes


def expand_grid(axes: dict[str, list[Any]], fixed: dict[str, Any] | None = None,
                zipped: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Every combination of ``axes`` (last axis fastest) over the defaults updated by
    ``fixed``; the axes in ``zipped`` vary together (value ``i`` of each with value ``i`` of
    the others). :class:`ConfigError` for an unknown axis, a bad ``zipped``, a value given
    twice, or a cell :func:`check_cells` refuses.
    """
    if not isinstance(axes, dict) or not isinstance(fixed or {}, dict):
        raise ConfigError(f"axes and fixed must be dicts {{name: values}}, got {type(axes).__name__} and "
                          f"{type(fixed).__name__}")
    fixed = dict(fixed or {})
    unknown = (set(axes) | set(fixed) | set(zipped)) - set(AXES)
    if unknown:
        raise ConfigError(f"unknown axes {sorted(unknown)}; choose from {', '.join(AXES)}")
    empty = [name for name, values in axes.items() if len(values) == 0]
    if empty:
        raise ConfigError(f"axis {empty[0]!r} has no values: the grid would have no cells")
    base = {**DEFAULTS, **fixed}
    factors: list[list[dict[str, Any]]] = []
    if zipped:
        if len(set(zipped)) < 2 or any(z not in axes for z in zipped):
            raise ConfigError(f"--zip needs two or more distinct axes given with --axis, got {', '.join(zipped)}")
        lengths = {z: len(axes[z]) for z in zipped}
        if len(set(lengths.values())) != 1:
            raise ConfigError(f"zipped axes need lists of equal length, got {lengths}")
    for name in axes:  # the zipped axes make one factor, where the first of them is given
        if name not in zipped:
            factors.append([{name: v} for v in axes[name]])
        elif name == next(z for z in axes if z in zipped):
            factors.append([dict(zip(zipped, combo)) for combo in zip(*(axes[z] for z in zipped))])
    for factor in factors:  # the same cells twice over, drawn on one square of the heatmap
        twice = next((part for k, part in enumerate(factor) if part in factor[:k]), None)
        if twice is not None:
            said = ", ".join(f"{k}={v!r}" for k, v in twice.items())
            raise ConfigError(f"{'axis' if len(twice) == 1 else 'zipped axes'} {said} given twice: "
                              "each cell once")
    alpha_given = "alpha" in axes or "alpha" in fixed
    cells = []
    for combo in itertools.product(*factors):
        cell = dict(base)
        for part in combo:
            cell.update(part)
        if not alpha_given:  # the placement's own alpha
            cell["alpha"] = default_alpha(cell["placement"])
        if cell["placement"] == "post_ln" and cell["alpha"] == 0:
            cell["placement"] = "none"  # norm(0 X + SA(X)) is norm(SA(X)): one block, one name
        if cell["beta"] is not None:  # one temperature: a cell that sets beta has qk_scale None
            if cell["qk_scale"] != DEFAULTS["qk_scale"]:
                raise ConfigError(f"phase cell qk_scale={cell['qk_scale']} and beta={cell['beta']}: give one temperature, "
                                  "qk_scale (Gaussian W_Q, W_K of that scale) or beta (scores β <x_i, x_j>)")
            cell["qk_scale"] = None
        cells.append(cell)
    check_cells(cells)
    return cells


def block_config(cell: dict[str, Any]) -> BlockConfig:
    """The :class:`BlockConfig` of a cell's block axes; ``mix`` gets ``mix_layers = depth // 4``
    (Mix-LN's ``floor(0.25 L)``, Li et al. 2024, §3)."""
    placement = cell["placement"]
    return BlockConfig(norm=cell["norm"], placement=placement, alpha=float(cell["alpha"]),
                       attention=cell.get("attention", "softmax"), qk_norm=bool(cell.get("qk_norm", False)),
                       headwise_rmsnorm=bool(cell.get("headwise_rmsnorm", False)),
                       mix_layers=int(cell["depth"]) // 4 if placement == "mix" else None)


def cell_bytes(cell: dict[str, Any], n_samples: int) -> int:
    """Estimated peak bytes of running ``cell`` with ``n_samples`` inputs per weight seed: the
    weights, recorded states and attention of :func:`.cell.run_cell`, or above
    :data:`DENSE_MAX_TOKENS` the windowed kernel's states and per-thread chunks
    (docs/phase.md, "Axes")."""
    N, d, depth = int(cell["n_tokens"]), int(cell["d_model"]), int(cell["depth"])
    d_qk = int(cell["d_qk"]) or d
    layers = 1 if cell["shared"] else depth
    weights = 2 * layers * (2 * d * d_qk + d * d)
    if N > DENSE_MAX_TOKENS:
        import torch

        from ..dynamics.sparse import DEFAULT_BLOCK_SIZE, SCORE_BUDGET

        chunk = 3 * max(n_samples * DEFAULT_BLOCK_SIZE * N, SCORE_BUDGET // 8) + 2 * n_samples * N * d_qk
        return 8 * (weights + 8 * n_samples * N * d + torch.get_num_threads() * chunk)
    states = (depth + 1) * n_samples * N * d
    attention = 2 * depth * n_samples * N * N
    return 8 * (weights + states + attention)


def check_cell(cell: Any) -> None:
    """Refuse (:class:`ConfigError`) a cell that is not a dict of every axis with values its
    axes accept and one temperature."""
    if not isinstance(cell, dict):
        raise ConfigError(f"a phase cell is a dict of its axes, got {type(cell).__name__}")
    missing, unknown = sorted(set(AXES) - set(cell)), sorted(set(cell) - set(AXES))
    if missing or unknown:
        what = "; ".join(part for part in (f"missing axes {missing}" if missing else "",
                                          f"unknown axes {unknown}" if unknown else "") if part)
        raise ConfigError(f"phase cell has {what}; make cells with rankcollapse.phase.expand_grid")
    for name, (parse, _) in AXES.items():
        value = cell[name]
        if value is None and name in ("qk_scale", "beta"):
            continue
        if isinstance(value, float) and name in ("d_qk", "n_tokens", "d_model", "depth"):
            raise ConfigError(f"phase cell axis {name}: expected an integer, got {value!r}")
        try:
            parse(str(value))
        except ConfigError as exc:
            raise ConfigError(f"phase cell axis {name}: {exc}") from None
    beta = cell["beta"]
    if (cell["qk_scale"] is None) == (beta is None):
        raise ConfigError(f"phase cell qk_scale={cell['qk_scale']}, beta={beta}: give one temperature, qk_scale or "
                          "beta, and None for the other (expand_grid does)")
    if beta is not None and int(cell["d_qk"]) not in (0, int(cell["d_model"])):
        raise ConfigError(f"phase cell beta={beta} sets W_Q = W_K = I (d_qk = d_model = "
                          f"{cell['d_model']}), got d_qk = {cell['d_qk']}; give d_qk 0")
    if is_law(beta) and parse_law(beta).varies_with_position(int(cell["n_tokens"])):
        raise ConfigError(f"phase cell beta={beta}: its β depends on the query's position from "
                          f"position {LLAMA4_FLOOR_SCALE - 1} on, and a cell's layer has one β; give n_tokens "
                          f"< {LLAMA4_FLOOR_SCALE}, or measure it with 'rankcollapse theory temperature'")
    try:
        block_config(cell)
    except ConfigError as exc:
        raise ConfigError(f"phase cell norm={cell['norm']}, placement={cell['placement']}, alpha={cell['alpha']}: "
                          f"{exc} (cross placement and alpha with --zip, or give none with alpha 0)") from None


def check_long_cell(cell: dict[str, Any]) -> None:
    """Refuse (:class:`ConfigError`) a cell above :data:`DENSE_MAX_TOKENS` tokens with
    ``qk_norm`` or a non-softmax ``attention``: the windowed kernel takes plain softmax scores."""
    attention, qk_norm = cell.get("attention", "softmax"), bool(cell.get("qk_norm", False))
    if attention_backend(int(cell["n_tokens"])) == "blocked" and (qk_norm or attention != "softmax"):
        asked = ", ".join(p for p in ("qk_norm=on" if qk_norm else "",
                                      f"attention={attention}" if attention != "softmax" else "") if p)
        raise ConfigError(f"phase cell n_tokens={cell['n_tokens']} with {asked}: cells above {DENSE_MAX_TOKENS} "
                          "tokens run on the windowed kernel, which takes softmax attention without qk_norm only; "
                          f"use n_tokens <= {DENSE_MAX_TOKENS}, or qk_norm=off and attention=softmax")


def check_cells(cells: Any, n_samples: int | None = None, *, seeds: int = 1) -> None:
    """:func:`check_cell` and :func:`check_long_cell` for every cell, each mask built once per
    ``N`` (:class:`ConfigError`, :class:`MaskError`); with ``n_samples``, every cell's
    :func:`cell_bytes` of its ``seeds n_samples`` trajectories against half the physical
    memory (:class:`MemoryLimitError`)."""
    from ..masks import parse_mask

    if not isinstance(cells, (list, tuple)) or len(cells) == 0:
        raise ConfigError("the phase grid has no cells")
    built: set[tuple[str, int]] = set()
    limit = default_limit()
    for cell in cells:
        check_cell(cell)
        check_long_cell(cell)
        key = (cell["mask"], int(cell["n_tokens"]))
        if key not in built:
            parse_mask(*key)
            built.add(key)
        if n_samples is not None and cell_bytes(cell, n_samples * seeds) > limit:
            runs = f"{seeds} seeds x {n_samples} samples" if seeds > 1 else f"{n_samples} samples"
            raise MemoryLimitError(
                f"phase cell N = {cell['n_tokens']}, d = {cell['d_model']}, depth = {cell['depth']} with "
                f"{runs} needs about {human(cell_bytes(cell, n_samples * seeds))} of memory, more than the "
                f"limit {human(limit)} (half the physical memory); lower n_tokens, d_model, depth, n_samples"
                f"{' or seeds' if seeds > 1 else ''}")
