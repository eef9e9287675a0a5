"""Config keys in the project's vocabulary, their old spellings, and the stored form
every hash is computed on.

Keys renamed to the vocabulary of docs/cli.md ("Renamed names"), by where they stand:

===============================  ======================  =========================
where                            old key                 key
===============================  ======================  =========================
``data`` (and a run's data)      ``length``              ``n_tokens``
``scales.<scale>``               ``n_windows``           ``n_samples``
``scales.<scale>``               ``windows_per_model``   ``n_samples_per_model``
unit ``grid``/``params``         ``n_windows``           ``n_samples``
theory unit ``grid``/``params``  ``n``, ``d``            ``n_tokens``, ``d_model``
theory unit ``params``           ``eq_n``, ``eq_d``      ``eq_n_tokens``, ``eq_d_model``
theory unit ``params``           ``rate_n``              ``rate_n_tokens``
a rule's quantity                ``n``                   ``n_tokens``
run ``overrides``                ``n_windows``           ``n_samples``
schedule study ``simulation``    ``d``                   ``d_model``
===============================  ======================  =========================

Old keys in a config or in a run's overrides are accepted with a :class:`FutureWarning`
until :data:`~rankcollapse._deprecation.REMOVAL` (0.3.0); a stored run's ``config.json``
written before the rename is read silently (:func:`current_config` with ``warn=False``).

Hashes. A unit's cache key (:attr:`rankcollapse.sweep.Unit.hash`, through the experiment
unit kinds' ``key_params``) and a run's ``config_hash`` are computed on the *stored
form*: the same mapping read backwards, so every key has the spelling it had when the
cache entries and committed runs (docs/results) were written and their hashes are
unchanged by the rename. To recompute a run's ``config_hash`` from its ``config.json``,
hash :func:`stored_run` of it.
"""

from __future__ import annotations

from typing import Any

from .._deprecation import warn_renamed
from ..errors import ConfigError

#: where -> {old key: key}; the one table of renamed config keys (see the module docstring).
RENAMED: dict[str, dict[str, str]] = {
    "data": {"length": "n_tokens"},
    "scale": {"n_windows": "n_samples", "windows_per_model": "n_samples_per_model"},
    "params": {"n_windows": "n_samples"},
    # only the theory units spelt the token count and width n, d: another kind's n_tokens
    # (mask_influence, a claim axis' pretrained_sa) was always n_tokens and hashes as such
    "theory_params": {"n_windows": "n_samples", "n": "n_tokens", "d": "d_model", "eq_n": "eq_n_tokens",
                      "eq_d": "eq_d_model", "rate_n": "rate_n_tokens"},
    "quantity": {"n": "n_tokens"},
    "overrides": {"n_windows": "n_samples"},
    "simulation": {"d": "d_model"},
}
#: where -> {key: old key}: the stored spelling hashes use.
STORED: dict[str, dict[str, str]] = {where: {new: old for old, new in table.items()} for where, table in RENAMED.items()}


def current(obj: dict[str, Any], where: str, *, warn: str | None = None, stacklevel: int = 4) -> dict[str, Any]:
    """``obj`` with the old keys of ``where`` renamed (a shallow copy; ``obj`` is left
    alone). ``warn``: the place named in the :class:`FutureWarning` of each old key (None:
    rename silently, for stored runs); ``stacklevel``: the frame the warning points at, as
    :func:`warnings.warn` counts from this function's caller's caller (4).

    Raises
    ------
    ConfigError
        ``obj`` has both an old key and its new one.
    """
    out = dict(obj)
    for old, new in RENAMED[where].items():
        if old not in out:
            continue
        if new in out:
            raise ConfigError(f"{warn or where}: give {new!r} or the deprecated {old!r}, not both")
        if warn is not None:
            warn_renamed(f"config key {warn}.{old}", new, stacklevel=stacklevel)
        out[new] = out.pop(old)
    return out


def stored(obj: dict[str, Any], where: str) -> dict[str, Any]:
    """``obj`` with the keys of ``where`` in their stored (old) spelling: what hashes read."""
    return {STORED[where].get(k, k): v for k, v in obj.items()}


def stored_params(params: dict[str, Any], where: str = "params") -> dict[str, Any]:
    """A unit's parameters as its cache key hashes them (the run's ``data`` included,
    a text file by its content's ``sha256``, not by its ``path``); ``where`` is
    ``"theory_params"`` for a theory unit (:func:`stored_theory_params`)."""
    out = stored(params, where)
    if isinstance(out.get("data"), dict):
        out["data"] = {k: v for k, v in stored(out["data"], "data").items() if k != "path"}
    return out


def stored_theory_params(params: dict[str, Any]) -> dict[str, Any]:
    """A theory unit's parameters as its cache key hashes them."""
    return stored_params(params, "theory_params")


def _walk_config(cfg: dict[str, Any], form, warn: bool) -> dict[str, Any]:
    """``cfg`` (an experiment config) with ``form(obj, where, label)`` applied to each
    mapping whose keys were renamed."""
    name = cfg.get("name", "config")
    out = dict(cfg)
    if isinstance(out.get("data"), dict):
        out["data"] = form(out["data"], "data", f"{name}.data" if warn else None)
    if isinstance(out.get("scales"), dict):
        out["scales"] = {s: form(v, "scale", f"{name}.scales.{s}" if warn else None) if isinstance(v, dict) else v
                         for s, v in out["scales"].items()}
    if isinstance(out.get("units"), list):
        out["units"] = [_walk_unit(u, form, f"{name}.units[{i}]" if warn else None) for i, u in enumerate(out["units"])]
    if isinstance(out.get("claims"), list):
        out["claims"] = [_walk_quantities(c, form, f"{name}.claims[{i}]" if warn else None)
                         for i, c in enumerate(out["claims"])]
    return out


def _walk_unit(unit: Any, form, label: str | None) -> Any:
    if not isinstance(unit, dict):
        return unit
    out = dict(unit)
    where = "theory_params" if out.get("kind") == "theory" else "params"
    for part in ("grid", "params"):
        if isinstance(out.get(part), dict):
            out[part] = form(out[part], where, label and f"{label}.{part}")
    return out


def _walk_quantities(obj: Any, form, label: str | None) -> Any:
    """Every mapping with a ``stat`` under ``obj`` (a claim: its checks' sides, their
    ``num``/``den``) renamed as a quantity."""
    if isinstance(obj, list):
        return [_walk_quantities(v, form, label) for v in obj]
    if not isinstance(obj, dict):
        return obj
    out = {k: _walk_quantities(v, form, label) for k, v in obj.items()}
    return form(out, "quantity", label) if "stat" in out else out


def _current(obj: dict[str, Any], where: str, label: str | None) -> dict[str, Any]:
    return current(obj, where, warn=label)


def _stored(obj: dict[str, Any], where: str, label: str | None) -> dict[str, Any]:
    return stored(obj, where)


def current_config(cfg: Any, *, warn: bool = True) -> Any:
    """An experiment config with every old key renamed (:data:`RENAMED`), each with a
    :class:`FutureWarning` naming where it stands unless ``warn`` is false (a stored
    run's config). A value that is not a mapping is returned as it is (the schema
    refuses it).

    Raises
    ------
    ConfigError
        A mapping with both an old key and its new one.
    """
    return _walk_config(cfg, _current, warn) if isinstance(cfg, dict) else cfg


def stored_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """An experiment config in the stored spelling (what ``config_hash`` reads)."""
    return _walk_config(cfg, _stored, False)


def stored_run(body: dict[str, Any]) -> dict[str, Any]:
    """A run's ``config.json`` body (``data``, ``overrides``, ``configs``, ...) in the
    stored spelling: its ``config_hash`` is the hash of this."""
    out = dict(body)
    if isinstance(out.get("data"), dict):
        out["data"] = stored(out["data"], "data")
    if isinstance(out.get("overrides"), dict):
        out["overrides"] = stored(out["overrides"], "overrides")
    if isinstance(out.get("configs"), list):
        out["configs"] = [stored_config(c) for c in out["configs"]]
    return out


def current_study(cfg: Any, *, warn: bool = True) -> Any:
    """The schedule study (``configs/schedules.yaml``) with its old simulation keys
    renamed (in ``simulation`` and in each scale's overrides), warning as :func:`current`."""
    if not isinstance(cfg, dict):
        return cfg
    out = dict(cfg)
    if isinstance(out.get("simulation"), dict):
        out["simulation"] = current(out["simulation"], "simulation", warn="schedules.simulation" if warn else None)
    if isinstance(out.get("scales"), dict):
        out["scales"] = {s: current(v, "simulation", warn=f"schedules.scales.{s}" if warn else None)
                         if isinstance(v, dict) else v for s, v in out["scales"].items()}
    return out
