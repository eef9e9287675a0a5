"""Hidden states on disk: capture them where the model runs, measure them anywhere.

The folder layouts, ``states.safetensors`` + ``states.json`` (:func:`save_states`) and a
transformers ``output_hidden_states`` dump (``hidden_states.safetensors`` + ``config.json``),
are documented in docs/models.md, "Hidden states on disk". :func:`states_table` measures
either with the probe's own code, so states saved by a probe give its table back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
import torch

from .._io import read_regular, read_user_json, write_json_atomic
from ..data import Windows
from ..errors import ConfigError, StatesError
from . import families

#: The files of a states folder.
STATES_FILE = "states.safetensors"
SIDECAR = "states.json"
STATE_NAMES = (STATES_FILE, SIDECAR)
#: The tensor file of a transformers ``output_hidden_states`` dump.
DUMP_FILE = "hidden_states.safetensors"
FORMAT = "rankcollapse.states"
VERSION = 1
LAYOUT = ("window", "point", "token", "d")
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
#: The sidecar keys naming the interventions the states were captured under.
SETTINGS = ("mask", "d_qk_scale", "d_qk", "drop", "clip_massive", "edits", "ablate_heads")


@dataclass(frozen=True)
class States:
    """Recorded hidden states ``(n_samples, n_points, N, d)`` and what their axes mean (the
    fields of ``states.json``, docs/models.md, "Hidden states on disk"); ``attentions``:
    float32 ``(n_samples, n_attention_points, H, N, N)`` when captured."""

    hidden_states: torch.Tensor
    points: tuple[str, ...]
    attention_mask: torch.Tensor
    n_layers: dict[str, int]
    window_ids: tuple[int, ...]
    model: str | None = None
    family: str | None = None
    model_type: str | None = None
    input_ids: torch.Tensor | None = None
    special_tokens_mask: torch.Tensor | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    attentions: torch.Tensor | None = None
    attention_points: tuple[str, ...] = ()

    def layer(self, point: str) -> int:
        """The ``layer`` column of ``point``."""
        return families.point_layer(point, self.n_layers)


@torch.no_grad()
def capture_states(loaded: Any, windows: Windows, intervention: Any = None, *, batch_size: int = 8,
                   points: Sequence[str] | str = "hidden_states", attentions: bool = False) -> States:
    """The hidden states :func:`~rankcollapse.models.probe` measures, under the same
    :class:`~rankcollapse.models.Intervention`, on CPU in the model's dtype (with
    ``attentions``, also every block's float32 attention probabilities). Raises as the probe,
    and :class:`ConfigError` for ``module:PATH`` points or a mask without a spec."""
    from ..masks import schedule_or_mask
    from .edits import edit_settings
    from .probe import _checked_run, _point_list, _record_batch, _settings_record, _with_ablation
    from .recorder import MODULE_PREFIX

    net, loaded, batch_size, d_qk_scale = _checked_run(loaded, windows, intervention, batch_size)
    point_list = _point_list(loaded, points)
    modules = [p for p in point_list if p.startswith(MODULE_PREFIX)]
    if modules:
        raise ConfigError(f"saved states hold the residual-stream points; {modules[0]} (a module's output) is not "
                          "one of them: record it with --points, not --save-states")
    if net.mask is not None and not isinstance(net.mask, str) and not hasattr(net.mask, "spec"):
        raise ConfigError(f"a mask given as {type(net.mask).__name__} has no spec for states.json to record; "
                          "give a mask spec string or a rankcollapse.masks.Mask")
    applied = dict(mask=schedule_or_mask(net.mask, windows.n_tokens), d_qk_scale=d_qk_scale, drop=net.drop,
                   clip_massive=net.clip_massive)
    all_edits = _with_ablation(loaded, windows, net.edits, net.ablate_heads, batch_size, applied)
    stack_list = families.stacks(loaded.model, loaded.family)
    attn_points = [f"{s.prefix}layer.{k}.attention" for s in stack_list for k in range(s.n_layers)] if attentions else []
    parts: list[torch.Tensor] = []
    maps: list[torch.Tensor] = []
    for rows, w in windows.batches(batch_size):
        rec, _, _ = _record_batch(loaded, w, applied, point_list, attentions=attentions, edits=all_edits,
                                  window_rows=rows)
        parts.append(torch.stack([rec.outputs[p].detach().cpu() for p in point_list], dim=1))  # (b, P, N, d)
        if attentions:  # (b, A, H, N, N)
            maps.append(torch.stack([rec.attention_maps[p].detach().float().cpu() for p in attn_points], dim=1))
    settings = {**_settings_record(net, d_qk_scale), "clip_massive": bool(net.clip_massive),
                **edit_settings(net.edits, net.ablate_heads)}
    return States(torch.cat(parts), tuple(point_list), windows.attention_mask.long().clone(),
                  {s.prefix: s.n_layers for s in stack_list}, tuple(range(windows.n_samples)),
                  model=loaded.name, family=loaded.family, model_type=loaded.model.config.model_type, settings=settings,
                  input_ids=windows.input_ids.clone(), special_tokens_mask=windows.special_tokens_mask.clone(),
                  attentions=torch.cat(maps) if attentions else None, attention_points=tuple(attn_points))


def save_states(folder: str | Path, states: States, *, allow_nonempty: bool = False,
                flags: bool | str = False) -> None:
    """Write ``states`` as ``folder/states.safetensors`` and ``folder/states.json`` through
    :mod:`rankcollapse._outdir` (``allow_nonempty`` and ``flags`` as
    :func:`rankcollapse._outdir.check_out`, whose errors it raises)."""
    from safetensors.torch import save_file

    from .._io import atomic_path
    from .._outdir import writing

    tensors = {"hidden_states": states.hidden_states.contiguous(), "attention_mask": states.attention_mask.long()}
    if states.input_ids is not None:
        tensors["input_ids"] = states.input_ids.long().contiguous()
    if states.special_tokens_mask is not None:
        tensors["special_tokens_mask"] = states.special_tokens_mask.bool().contiguous()
    if states.attentions is not None:
        tensors["attentions"] = states.attentions.contiguous()
    with writing(folder, "states\n", STATE_NAMES, allow_nonempty=allow_nonempty, flags=flags) as stage:
        with atomic_path(stage / STATES_FILE) as tmp:
            save_file(tensors, str(tmp))
        write_json_atomic(stage / SIDECAR, {
            "format": FORMAT, "version": VERSION, "layout": list(LAYOUT), "points": list(states.points),
            "n_layers": dict(states.n_layers), "window_ids": list(states.window_ids), "model": states.model,
            "family": states.family, "model_type": states.model_type,
            "dtype": str(states.hidden_states.dtype).removeprefix("torch."),
            **({"attention_points": list(states.attention_points)} if states.attentions is not None else {}),
            **states.settings,
        })


def read_states(folder: str | Path) -> States:
    """The states in ``folder`` (either layout), checked whole before any metric.

    Raises
    ------
    StatesError
        No such folder or neither layout, or anything malformed (names what).
    UnsafePathError
        A tensor file that is a link or not a regular file.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise StatesError(f"states folder {str(folder)!r} does not exist or is not a folder")
    if (folder / SIDECAR).exists() or (folder / STATES_FILE).exists():
        return _read_own(folder)
    if (folder / DUMP_FILE).exists():
        return _read_dump(folder)
    raise StatesError(f"{str(folder)!r} holds neither {SIDECAR} + {STATES_FILE} (probe --save-states) nor "
                      f"{DUMP_FILE} + config.json (a transformers output_hidden_states dump)")


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        raw = read_regular(path, "states file")
    except FileNotFoundError:
        raise StatesError(f"states file {str(path)!r} is missing") from None
    try:
        return load(raw)
    except (SafetensorError, ValueError, TypeError) as exc:
        raise StatesError(f"states file {str(path)!r} is not a readable safetensors file "
                          f"({str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__})") from None


def _read_own(folder: Path) -> States:
    side = folder / SIDECAR
    if not side.exists():
        raise StatesError(f"{str(side)!r} is missing: the sidecar names the points and windows of {STATES_FILE}")
    meta = read_user_json(side, "states sidecar", error=StatesError)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise StatesError(f"{str(side)!r} is not a {FORMAT} sidecar of version {VERSION}")
    _check_fields(meta, str(side))
    points, n_layers, ids = meta.get("points"), meta.get("n_layers"), meta.get("window_ids")
    if (meta.get("layout") != list(LAYOUT) or not isinstance(points, list) or not points
            or not all(isinstance(p, str) for p in points) or len(set(points)) != len(points)
            or not isinstance(n_layers, dict) or not n_layers
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in n_layers.values())
            or not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                    for i in ids) or len(set(ids)) != len(ids)):
        raise StatesError(f"{str(side)!r} needs layout {list(LAYOUT)}, points (distinct names), n_layers "
                          "({prefix: blocks >= 1}) and window_ids (distinct rows >= 0)")
    t = _tensors(folder / STATES_FILE)
    settings = {k: meta.get(k) for k in SETTINGS if k in meta}
    model_type = meta.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise StatesError(f"{str(side)!r}: model_type must be a string")
    attn = meta.get("attention_points", [])
    if not isinstance(attn, list) or not all(isinstance(p, str) for p in attn):
        raise StatesError(f"{str(side)!r}: attention_points must be a list of names")
    states = _checked(t, tuple(points), n_layers, tuple(ids), folder / STATES_FILE, model=meta.get("model"),
                      family=meta.get("family"), model_type=model_type, settings=settings, attention_points=tuple(attn))
    dtype = str(states.hidden_states.dtype).removeprefix("torch.")
    if meta.get("dtype") != dtype:
        raise StatesError(f"{str(side)!r} says dtype {meta.get('dtype')!r} but hidden_states is {dtype}")
    return states


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


#: Sidecar fields that :func:`save_states` writes with one type: (key, check, what it must be).
_SETTING_TYPES = (
    ("model", lambda v: v is None or isinstance(v, str), "null or a string"),
    ("mask", lambda v: v is None or (isinstance(v, str) and bool(v.strip())), "null or a mask spec string"),
    ("drop", _is_str_list, "a list of components such as [\"mlp\", \"skip:0-2\"]"),
    ("clip_massive", lambda v: isinstance(v, bool), "true or false"),
    ("edits", _is_str_list, "a list of point names"),
    ("ablate_heads", lambda v: isinstance(v, dict) and isinstance(v.get("heads"), list), '{"heads": [[layer, head], ...], ...}'),
)


def _check_fields(meta: dict[str, Any], side: str) -> None:
    """:class:`StatesError` for a sidecar field that :func:`save_states` never writes: a
    ``version`` that is not the integer :data:`VERSION` (``true`` equals 1 in Python), a
    ``d_qk_scale`` (or a ``d_qk`` other than null) that is not a finite number > 0, a field of
    :data:`_SETTING_TYPES` of another type, a ``drop`` that :func:`~.interventions.parse_drop`
    refuses, a ``family`` (other than null) outside :data:`~.loading.FAMILIES`."""
    version = meta["version"]
    if type(version) is not int:  # noqa: E721 - a bool or a float equal to 1 is not the version
        raise StatesError(f"{side!r}: version must be the integer {VERSION}, got {version!r}")
    for key in ("d_qk_scale", "d_qk"):
        value = meta.get(key)
        if value is None and (key == "d_qk" or key not in meta):
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
            raise StatesError(f"{side!r}: {key} must be a finite number > 0, got {value!r}")
    for key, ok, what in _SETTING_TYPES:
        if key in meta and not ok(meta[key]):
            raise StatesError(f"{side!r}: {key} must be {what}, got {meta[key]!r}")
    from .interventions import parse_drop

    try:
        parse_drop(meta.get("drop") or [], None)
    except ConfigError as exc:
        raise StatesError(f"{side!r}: drop {meta['drop']!r}: {exc}") from None
    from .loading import FAMILIES

    family = meta.get("family")
    if family is not None and (not isinstance(family, str) or family not in FAMILIES):
        raise StatesError(f"{side!r}: family {family!r} is not a model family; known: {', '.join(FAMILIES)}")


def _read_dump(folder: Path) -> States:
    t = _tensors(folder / DUMP_FILE)
    dump = str(folder / DUMP_FILE)
    config_path = folder / "config.json"
    if not config_path.exists():
        raise StatesError(f"{str(folder)!r} has {DUMP_FILE} but no config.json: save the model's config beside it "
                          "(model.config.save_pretrained(DIR)), which says how to label the last entry")
    config = read_user_json(config_path, "model config", error=StatesError)
    model_type = config.get("model_type") if isinstance(config, dict) else None
    family = families.family_of(model_type) if isinstance(model_type, str) else families.GENERIC.name
    if family == families.GENERIC.name:
        raise StatesError(f"{str(config_path)!r}: model_type {model_type!r} is not a family whose last hidden_states "
                          f"entry is known (known: {', '.join(families.MODEL_TYPES)}); save the states with "
                          "probe --save-states instead")
    stacked = t.pop("hidden_states", None)
    numbered = [k for k in t if k.startswith("hidden_states.")]
    if stacked is not None and numbered:
        raise StatesError(f"{dump!r} holds both hidden_states and {numbered[0]}: give one")
    if stacked is None:
        want = [f"hidden_states.{i}" for i in range(len(numbered))]
        if not numbered or set(numbered) != set(want):
            raise StatesError(f"{dump!r} needs hidden_states (L + 1, B, N, d) or "
                              "hidden_states.0 ... hidden_states.L (B, N, d)")
        shapes = {tuple(t[k].shape) for k in want}
        if len(shapes) != 1:
            raise StatesError(f"{dump!r}: hidden_states.0 ... have different shapes {sorted(shapes)}")
        stacked = torch.stack([t.pop(k) for k in want])
    if stacked.ndim != 4 or stacked.shape[0] < 2:
        raise StatesError(f"{dump!r}: hidden_states has shape {tuple(stacked.shape)}, "
                          "expected (L + 1, B, N, d) with L >= 1")
    n_layers = int(stacked.shape[0]) - 1
    said = next((config[k] for k in ("num_hidden_layers", "n_layer", "num_layers") if k in config), None)
    if said != n_layers:  # labels from another count would name every entry wrongly
        raise StatesError(f"{dump!r} holds {n_layers + 1} hidden states, but {str(config_path)!r} gives the model "
                          f"{said!r} layers (L + 1 entries expected): save the config of the model that made them")
    points = tuple(families.hidden_states_points(family, n_layers))
    B, N = int(stacked.shape[1]), int(stacked.shape[2])
    t["hidden_states"] = stacked.transpose(0, 1)  # (B, L + 1, N, d)
    t.setdefault("attention_mask", torch.ones(B, N, dtype=torch.long))
    name = config.get("_name_or_path") or model_type
    return _checked(t, points, {"": n_layers}, tuple(range(B)), folder / DUMP_FILE, model=str(name), family=family,
                    model_type=model_type)


def _checked(t: dict[str, torch.Tensor], points: tuple[str, ...], n_layers: dict[str, int],
             window_ids: tuple[int, ...], path: Path, **kw: Any) -> States:
    """``States`` from a file's tensors, every shape, dtype and value checked."""
    where = str(path)
    extra = sorted(set(t) - {"hidden_states", "attention_mask", "input_ids", "special_tokens_mask", "attentions"})
    if extra:
        raise StatesError(f"{where!r} holds the unknown tensor {extra[0]!r}")
    X = t.get("hidden_states")
    if X is None:
        raise StatesError(f"{where!r} has no tensor hidden_states")
    if X.ndim != 4 or X.dtype not in _FLOATS:
        raise StatesError(f"{where!r}: hidden_states is {X.dtype} {tuple(X.shape)}; expected a float tensor "
                          "(n_samples, n_points, N, d)")
    W, P, N, d = X.shape
    if P != len(points) or W != len(window_ids) or W == 0 or N == 0 or d == 0:
        raise StatesError(f"{where!r}: hidden_states (n_samples, n_points, N, d) = {tuple(X.shape)} does not match "
                          f"the {len(window_ids)} window ids and {len(points)} points of the sidecar")
    for p in points:
        try:
            families.point_layer(p, n_layers)
        except (ValueError, KeyError):
            raise StatesError(f"{where!r}: {p!r} is not a point name of a network of {n_layers} layers "
                              "(embeddings, layer.k.output, final_norm...)") from None
    for name in ("attention_mask", "input_ids", "special_tokens_mask"):
        v = t.get(name)
        if v is not None and (tuple(v.shape) != (W, N) or v.is_floating_point() or v.is_complex()):
            raise StatesError(f"{where!r}: {name} is {v.dtype} {tuple(v.shape)}; expected integers or bools ({W}, {N})")
    am = t["attention_mask"]
    if not bool(((am == 0) | (am == 1)).all()):
        raise StatesError(f"{where!r}: attention_mask holds values other than 0 and 1")
    real = am.bool()
    bad = ~torch.isfinite(X).all(dim=-1) & real[:, None, :]  # (W, P, N): padding may hold anything
    if bool(bad.any()):
        w, p, _ = (int(i) for i in bad.nonzero()[0])
        raise StatesError(f"{where!r}: hidden_states holds NaN or inf at {points[p]} of window {window_ids[w]}")
    attn_points = kw.get("attention_points", ())
    A = t.get("attentions")
    if (A is None) != (not attn_points):
        raise StatesError(f"{where!r}: the sidecar's attention_points and the tensor attentions come together")
    if A is not None:
        if A.ndim != 5 or A.dtype not in _FLOATS or tuple(A.shape[:2]) != (W, len(attn_points)) \
                or tuple(A.shape[3:]) != (N, N):
            raise StatesError(f"{where!r}: attentions is {A.dtype} {tuple(A.shape)}; expected a float tensor "
                              f"({W}, {len(attn_points)}, heads, {N}, {N})")
        for p in attn_points:
            try:
                if not p.endswith(".attention"):
                    raise ValueError(p)
                families.point_layer(p, n_layers)
            except (ValueError, KeyError):
                raise StatesError(f"{where!r}: {p!r} is not an attention point (layer.k.attention) of a network of "
                                  f"{n_layers} layers") from None
        if not bool(torch.isfinite(A).all()):
            raise StatesError(f"{where!r}: attentions holds NaN or inf")
    return States(X, points, am.long(), dict(n_layers), window_ids, input_ids=t.get("input_ids"),
                  special_tokens_mask=t.get("special_tokens_mask"), attentions=A, **kw)


def state_metrics(metrics: Sequence[str] | None) -> tuple[str, ...]:
    """The metric names :func:`states_table` measures (None: the probe's default);
    :class:`ConfigError` for a name that is no metric of hidden states or attention maps."""
    from ..metrics import ATTENTION_METRICS, METRICS
    from .probe import PROBE_DEFAULT_METRICS

    names = tuple(metrics) if metrics is not None else PROBE_DEFAULT_METRICS
    unknown = [n for n in names if n not in METRICS and n not in ATTENTION_METRICS]
    if unknown:
        raise ConfigError(f"{unknown[0]!r} is not a metric of hidden states or of saved attentions (the sink "
                          "metrics need the model: a live probe); rankcollapse.metrics.METRICS and "
                          "ATTENTION_METRICS list the names")
    return names


def states_table(states: States, metrics: Sequence[str] | None = None, *, batch_size: int = 8,
                 exclude_special: bool = False, per_window: bool = False) -> pd.DataFrame:
    """The per-layer table of :func:`~rankcollapse.models.probe` from recorded states (the
    same metric code, batches and summary; arguments as there); :class:`ConfigError` for an
    unknown metric, an attention metric without saved attentions, or ``exclude_special``
    without a ``special_tokens_mask``."""
    from ..masks import schedule_or_mask
    from .probe import Intervention, _metric_kinds, _settings_record, _summarise, add_attention_metrics, add_point_metrics

    names, attn_names, _ = _metric_kinds(state_metrics(metrics))
    if attn_names and states.attentions is None:
        raise ConfigError(f"{attn_names[0]} needs attention rows, which these states do not hold: save them with "
                          "probe --save-states DIR --attentions")
    if exclude_special and states.special_tokens_mask is None:
        raise ConfigError("exclude_special needs the states' special_tokens_mask, which they do not hold")
    X, W = states.hidden_states, states.hidden_states.shape[0]
    mask = schedule_or_mask(states.settings.get("mask"), int(X.shape[2])) if attn_names else None
    values: dict[tuple[str, str], list[torch.Tensor]] = {}
    for start in range(0, W, batch_size):
        b = slice(start, start + batch_size)
        real = states.attention_mask[b].bool()
        if exclude_special:
            real = real & ~states.special_tokens_mask[b].bool()
        if names:  # X[b, i]: (b, N, d)
            add_point_metrics({p: X[b, i] for i, p in enumerate(states.points)}, tuple(real.shape), real, names, values)
        if attn_names:
            maps = {p: states.attentions[b, i] for i, p in enumerate(states.attention_points)}
            add_attention_metrics(maps, states.family or families.GENERIC.name, states.model_type, mask,
                                  states.attention_mask[b], attn_names, values)
    attn = list(states.attention_points) if attn_names else []
    df = _summarise(values, [(p, names) for p in (states.points if names else ())] + [(p, attn_names) for p in attn],
                    per_window, {p: states.layer(p) for p in (*states.points, *attn)})  # layer.k.attention: k + 1
    settings = {**_settings_record(Intervention()), **states.settings}
    clip = settings.pop("clip_massive", False)
    df.attrs.update(model=states.model, family=states.family, notes=[], **settings, n_samples=int(W),
                    n_tokens=int(X.shape[2]), **({"clip_massive": True} if clip else {}))
    return df


