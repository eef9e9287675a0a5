"""Axes of the phase sweep and their expansion into cells.

A cell is a dict of every axis (defaults filled in). Values are parsed from the CLI's
``--axis NAME=v1,v2,...``; a spec with several keys (a mask, an input) is written with
``;`` between them (``bigbird:w=3;globals=1;random=2``, ``wikipedia:model=minilm;block=1``).

Every cell is checked before anything runs (:func:`check_cells`): all axes present, each
value one its axis accepts, its mask built at its N (an unknown mask or key is refused
when the grid is made, not when its cell is reached), and its memory estimate
(:func:`cell_bytes`) within half the physical memory. A schedule is one mask per layer
and a cell's regime and theory columns are of one graph, so the mask axis refuses it.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

from .._validate import KINDS, check_float, check_int
from ..errors import ConfigError, MaskError, MemoryLimitError

from ..dynamics.config import NORMS as NORM_NAMES, PLACEMENTS, BlockConfig, default_alpha
from ..dynamics.temperature_laws import LLAMA4_FLOOR_SCALE, is_law, parse_law

VALUE_FAMILIES = ("gaussian", "orthogonal", "near_identity", "constructed", "pretrained")


def _choice(options: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in options:
            raise ConfigError(f"expected one of {', '.join(options)}, got {text!r}")
        return text
    return parse


def _input(text: str) -> str:
    """An input spec of the registry (:data:`rankcollapse.dynamics.inputs.INPUTS`), as its canonical spec."""
    from ..dynamics.inputs import canonical_input

    return canonical_input(text)


def _value(kind: str, low: float | None = None, high: float | None = None) -> Callable[[str], Any]:
    """A parser of one value of a spec key's kind (:data:`~rankcollapse._validate.KINDS`),
    a number in ``[low, high]``."""
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
    """An inverse temperature on the tokens themselves, scores ``β <x_i, x_j>``
    (:func:`.cell.build_weights`): a number ``β >= 0`` or a temperature law (``log:γ``,
    ``pow:c``, ``ssmax:s``, ``llama4``; :mod:`rankcollapse.dynamics.temperature_laws`)
    whose ``β`` is taken at the cell's N and d, kept as the law's canonical string
    (``log:2.0``)."""
    if is_law(text):
        return parse_law(text).spec
    return _float(text)


def cell_beta(cell: dict[str, Any]) -> float | None:
    """``β`` of a cell's scores ``β <x_i, x_j>`` at its N and d; None for a cell whose
    scores come from Gaussian ``W_Q, W_K`` of scale ``qk_scale``."""
    value = cell["beta"]
    if value is None:
        return None
    if is_law(value):
        return parse_law(value).beta(int(cell["n_tokens"]), int(cell["d_model"]))
    return float(value)


def temperature_columns(table: Any) -> Any:
    """``table`` (a pandas DataFrame of cells) with ``qk_scale`` as floats (NaN in the
    cells that set ``beta``) and ``beta`` in one Parquet type: as it is when every value
    given is a number or every one a law string, else every value given as a string
    (``"1.0"``, ``"log:1.0"``); None where a cell sets ``qk_scale``."""
    table["qk_scale"] = table["qk_scale"].astype(float)
    given = table["beta"].map(lambda v: v is not None and v == v)  # None and NaN: no beta
    if len({isinstance(v, str) for v in table["beta"][given]}) > 1:
        table["beta"] = table["beta"].where(~given, table["beta"].map(str)).where(given, None)
    return table


#: cells with more tokens run on the windowed kernel (:mod:`.batched`)
DENSE_MAX_TOKENS = 4096
BACKENDS = ("auto", "dense", "blocked")


def attention_backend(n_tokens: int, backend: str = "auto") -> str:
    """``"dense"`` or ``"blocked"``: ``backend`` itself, or for ``"auto"`` blocked above
    :data:`DENSE_MAX_TOKENS` tokens.

    Raises
    ------
    ConfigError
        ``backend`` not one of :data:`BACKENDS`.
    """
    if backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "auto":
        return "blocked" if n_tokens > DENSE_MAX_TOKENS else "dense"
    return backend


def _mask(spec: str) -> str:
    """A mask spec, checked by name, keys and values."""
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
    """An attention operator spec, as its canonical spec."""
    from ..dynamics.operators import parse_attention

    return parse_attention(text).spec


#: axis name -> (parser of one value, default). ``d_qk`` 0 means "= d_model". ``qk_scale``
#: is the scale of Gaussian ``W_Q, W_K``; ``beta`` (default None: not set) a number or a
#: temperature law such as ``log:γ`` (:func:`_beta`) for scores ``β <x_i, x_j>``, and a cell
#: that sets it has ``qk_scale`` None (:func:`expand_grid`). ``n_tokens`` above
#: :data:`DENSE_MAX_TOKENS` runs on the windowed kernel. ``norm``,
#: ``placement``, ``alpha``, ``qk_norm``, ``headwise_rmsnorm`` and ``attention`` (softmax or an operator of
#: :mod:`rankcollapse.dynamics.operators`) are the :class:`~rankcollapse.dynamics.config.BlockConfig`
#: fields of the cell's layer; ``alpha`` not given is the placement's own (0 for ``none``,
#: 1 for the others); ``mix`` runs with ``mix_layers = depth // 4`` (:func:`block_config`).
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
_PARSERS = {name: parse for name, (parse, _) in AXES.items()}


def parse_axis(text: str) -> tuple[str, list[Any]]:
    """``"NAME=v1,v2"`` -> ``(NAME, [parsed values])``.

    Raises
    ------
    ConfigError
        Not a string, unknown axis, missing ``=``, empty list, a value the axis does not accept.
    """
    if not isinstance(text, str):
        raise ConfigError(f"--axis expects a string NAME=v1,v2,..., got {type(text).__name__} {text!r}")
    name, eq, values = text.partition("=")
    name = name.strip()
    if not eq or name not in _PARSERS:
        raise ConfigError(f"--axis expects NAME=v1,v2,... with NAME one of {', '.join(AXES)}, got {text!r}")
    items = [v.strip().replace(";", ",") for v in values.split(",") if v.strip()]  # ';': a spec's commas
    if not items:
        raise ConfigError(f"--axis {name}: no values")
    parse = _PARSERS[name]
    try:
        return name, [parse(v) for v in items]
    except ConfigError as exc:
        raise ConfigError(f"--axis {name}: {exc}") from None


def parse_axes(texts: list[str]) -> dict[str, list[Any]]:
    """``["NAME=v1,v2", ...]`` -> ``{NAME: [parsed values]}`` in order (:func:`parse_axis`).

    Raises
    ------
    ConfigError
        As :func:`parse_axis`; an axis given twice.
    """
    axes: dict[str, list[Any]] = {}
    for text in texts:
        name, values = parse_axis(text)
        if name in axes:
            raise ConfigError(f"--axis {name} given twice")
        axes[name] = values
    return axes


def expand_grid(axes: dict[str, list[Any]], fixed: dict[str, Any] | None = None,
                zipped: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Every combination of ``axes`` (in the given order, last axis fastest) over the
    defaults updated by ``fixed``; a combination the dynamics cannot run raises.

    The axes named in ``zipped`` vary together instead of being crossed: value ``i`` of
    each goes with value ``i`` of the others (equal-length lists, repeats allowed), and
    that list of tuples is crossed with the other axes at the position of the first
    zipped axis. This runs a stratified subset: the full product of the other axes
    against a short design of the zipped ones that still holds every value of each.

    Raises
    ------
    ConfigError
        ``axes`` or ``fixed`` not a dict; unknown axis name in ``axes``, ``fixed`` or ``zipped``; a zipped axis not in
        ``axes``; fewer than two zipped axes; zipped lists of different lengths; a value of
        an axis (or a tuple of the zipped axes) given twice.
    """
    if not isinstance(axes, dict) or not isinstance(fixed or {}, dict):
        raise ConfigError(f"axes and fixed must be dicts {{name: values}}, got {type(axes).__name__} and "
                          f"{type(fixed).__name__}")
    fixed = dict(fixed or {})
    unknown = (set(axes) | set(fixed) | set(zipped)) - set(_PARSERS)
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
    done = False
    for name in axes:
        if name in zipped:
            if not done:
                factors.append([dict(zip(zipped, combo)) for combo in zip(*(axes[z] for z in zipped))])
                done = True
            continue
        factors.append([{name: v} for v in axes[name]])
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
        cells.append(_temperature_fields(_block_fields(cell, alpha_given)))
    check_cells(cells)
    return cells


def _block_fields(cell: dict[str, Any], alpha_given: bool) -> dict[str, Any]:
    """``cell`` with its layer in :class:`BlockConfig` fields: ``alpha`` not given is the
    placement's own. ``post_ln`` with ``alpha = 0`` is the block ``none`` and is named so."""
    if not alpha_given:
        cell["alpha"] = default_alpha(cell["placement"])
    if cell["placement"] == "post_ln" and cell["alpha"] == 0:
        cell["placement"] = "none"  # norm(0 X + SA(X)) is norm(SA(X)): one block, one name
    return cell


def _temperature_fields(cell: dict[str, Any]) -> dict[str, Any]:
    """``cell`` with one temperature: a cell that sets ``beta`` has ``qk_scale`` None.

    Raises
    ------
    ConfigError
        ``beta`` with a ``qk_scale`` other than its default 1.
    """
    if cell["beta"] is not None:
        if cell["qk_scale"] != DEFAULTS["qk_scale"]:
            raise ConfigError(f"phase cell qk_scale={cell['qk_scale']} and beta={cell['beta']}: give one temperature, "
                              "qk_scale (Gaussian W_Q, W_K of that scale) or beta (scores β <x_i, x_j>)")
        cell["qk_scale"] = None
    return cell


def block_config(cell: dict[str, Any]) -> BlockConfig:
    """The :class:`BlockConfig` of a cell: its ``norm``, ``placement``, ``alpha``,
    ``attention``, ``qk_norm`` and ``headwise_rmsnorm`` axes are the config's fields (``placement="none"``: the
    theory's ``X <- norm(SA(X))``); ``mix`` gets ``mix_layers = depth // 4`` (Mix-LN's
    ``floor(0.25 L)``, Li et al. 2024, §3). A cell without ``qk_norm`` or
    ``headwise_rmsnorm`` runs without it."""
    placement = cell["placement"]
    return BlockConfig(norm=cell["norm"], placement=placement, alpha=float(cell["alpha"]),
                       attention=cell.get("attention", "softmax"), qk_norm=bool(cell.get("qk_norm", False)),
                       headwise_rmsnorm=bool(cell.get("headwise_rmsnorm", False)),
                       mix_layers=int(cell["depth"]) // 4 if placement == "mix" else None)


def cell_bytes(cell: dict[str, Any], n_samples: int) -> int:
    """Estimated peak bytes of running ``cell`` with ``n_samples`` inputs per weight seed
    (float64, one head), the arrays :func:`.cell.run_cell` keeps for the whole cell:

    - weights: ``L (2 d d_qk + d^2)`` values, twice (the shared draw and its scaled copy),
      with ``L = depth`` (or 1 when ``shared``);
    - recorded states: ``(depth + 1) samples N d``;
    - recorded attention: ``depth samples N^2`` (plus the equal ``eps`` reduction over it).

    The transient scores of one layer are sized by :func:`rankcollapse.dynamics.simulate`.

    Cells above :data:`DENSE_MAX_TOKENS` tokens run only in the phase sweep, on the
    windowed kernel (:func:`.batched.run_group`), which keeps no attention and a few states:

    - states: ``8 samples N d`` (X(0), X, two recorded states, queries, keys, the
      attention output and its product with ``W_V``);
    - per worker thread (:func:`torch.get_num_threads`), one chunk of
      :func:`rankcollapse.dynamics.sparse.blocked_attention`: scores, weights and their
      ``p log p``, ``3 max(samples B_q K_w, SCORE_BUDGET / 8)`` with ``B_q`` the block size
      and ``K_w = N`` the keys a block reads (exact for the complete mask, an upper bound
      for sparse masks, whose windows are narrower), and the ``2 samples K_w d`` window
      keys and values it gathers."""
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
    """Refuse a cell that :func:`.cell.run_cell` cannot run: not a dict, missing or unknown
    axes, a value its axis does not accept, a mask that cannot be built at the cell's N.

    Raises
    ------
    ConfigError
        Naming the missing or unknown keys, or the axis and its value.
    MaskError
        The cell's mask at its ``n_tokens`` (:func:`rankcollapse.masks.parse_mask`).
    """
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
    """Refuse a cell the windowed kernel cannot run: above :data:`DENSE_MAX_TOKENS` tokens
    a cell runs on :func:`rankcollapse.dynamics.sparse.blocked_attention`, which computes
    softmax of the plain scores ``q k^T * scale``, so ``qk_norm`` on or an ``attention``
    operator other than softmax is refused here, before anything is written.

    Raises
    ------
    ConfigError
        Such a cell; the message names the axes and the limit.
    """
    attention, qk_norm = cell.get("attention", "softmax"), bool(cell.get("qk_norm", False))
    if attention_backend(int(cell["n_tokens"])) == "blocked" and (qk_norm or attention != "softmax"):
        asked = ", ".join(p for p in ("qk_norm=on" if qk_norm else "",
                                      f"attention={attention}" if attention != "softmax" else "") if p)
        raise ConfigError(f"phase cell n_tokens={cell['n_tokens']} with {asked}: cells above {DENSE_MAX_TOKENS} "
                          "tokens run on the windowed kernel, which takes softmax attention without qk_norm only; "
                          f"use n_tokens <= {DENSE_MAX_TOKENS}, or qk_norm=off and attention=softmax")


def check_cells(cells: Any, n_samples: int | None = None, *, seeds: int = 1) -> None:
    """:func:`check_cell` for every cell (each mask built once per ``N``), refusing an
    empty grid; with ``n_samples``, also every cell's :func:`cell_bytes` of its ``seeds
    n_samples`` trajectories (the sweep runs a cell's seeds in one batch) against half the
    physical memory (:func:`rankcollapse._memory.default_limit`).

    Raises
    ------
    ConfigError
        No cells, a cell :func:`check_cell` refuses, or a cell above
        :data:`DENSE_MAX_TOKENS` tokens with ``qk_norm`` on or an ``attention`` other than
        softmax (such cells run on the windowed kernel, which computes softmax of the
        plain scores: :func:`check_long_cell`).
    MemoryLimitError
        A cell whose estimate exceeds the limit (the message names its size).
    """
    from .._memory import default_limit, human
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
