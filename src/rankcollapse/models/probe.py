"""Per-layer metrics of a pretrained model on token windows, as a tidy table (docs/models.md, "Probe: a tidy table")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import inspect

import pandas as pd
import torch

from .._validate import check_int
from ..data import Windows, distinct_tokens
from ..errors import ConfigError, ModelError
from .._progress import steps
from ..metrics import compute_metrics
from ..metrics.registry import ATTENTION_METRICS
from ..summary import SUMMARY_COLUMNS, summary_table
from ..masks import dense_mask
from ..masks.schedule import MaskSchedule, schedule_or_mask
from . import families
from .edits import EditFn, HeadAblation, ablation_edits, check_ablation, edit_settings, head_means, n_heads
from .interventions import (check_d_qk, d_qk_scale_for, decoder_padding, intervene, parse_drop, split_drop,
                            stack_padding)
from .lens import LibraryModel, open_model
from .loading import LoadedModel, as_loaded
from .memory import ProbeMemory, predict
from .positions import check_positions
from .recorder import MODULE_PREFIX, Recorder, module_depth, module_tap
from .sinks import SINK_METRICS, VALUE_METRICS, ValueRecorder, sink_values, zeroed_heads

TABLE_COLUMNS = SUMMARY_COLUMNS  # the one per-layer table layout (rankcollapse.summary)
PROBE_DEFAULT_METRICS = ("mu", "mu_relative", "rank_fraction", "sigma_min", "avg_abs_cos")


def model_inputs(loaded: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Keyword arguments for one forward pass of ``loaded.model`` on a batch: no KV cache,
    position ids that follow the padding (:func:`position_ids`, by the family's rule), and
    for T5 the window as decoder input too, shifted right behind :func:`decoder_start_id`.
    :class:`ModelError` for an encoder-decoder other than T5."""
    loaded = as_loaded(loaded)
    model = loaded.model
    device = loaded.device
    kw: dict[str, Any] = {"input_ids": input_ids.to(device), "attention_mask": attention_mask.to(device)}
    if getattr(model.config, "is_encoder_decoder", False):
        if loaded.family != "t5":
            raise ModelError(f"encoder-decoder model {type(model).__name__} is only supported for the t5 family")
        if getattr(model, "decoder", None) is not None:
            ids = kw["input_ids"]
            start = torch.full_like(ids[:, :1], decoder_start_id(model))
            kw["decoder_input_ids"] = torch.cat([start, ids[:, :-1]], dim=1)
            kw["decoder_attention_mask"] = decoder_padding(kw["attention_mask"])
    params = inspect.signature(model.forward).parameters
    rule = families.position_rule(loaded.family, getattr(model.config, "model_type", ""))
    if rule is not None and "position_ids" in params:
        kw["position_ids"] = position_ids(kw["attention_mask"], rule, getattr(model.config, "pad_token_id", None))
    if "use_cache" in params:
        kw["use_cache"] = False
    return kw


def decoder_start_id(model: Any) -> int:
    """``config.decoder_start_token_id``, else the generation config's; :class:`ModelError`
    when neither names one."""
    for source in (model.config, getattr(model, "generation_config", None)):
        value = getattr(source, "decoder_start_token_id", None) if source is not None else None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    raise ModelError(
        f"{type(model).__name__} has no decoder_start_token_id (in its config or generation config), so its "
        "decoder input is undefined; set model.config.decoder_start_token_id (T5 checkpoints use the pad "
        "token, 0), or load the encoder alone (transformers.T5EncoderModel) to probe it")


def position_ids(attention_mask: torch.Tensor, rule: str = "count", padding_idx: int | None = None) -> torch.Tensor:
    """Position ids ``(B, N)`` that follow the padding mask ``(B, N)`` (1 = real): ``"count"``,
    the k-th real token gets k and padding 0; ``"padding_idx"`` (RoBERTa), ``padding_idx + 1 + k``
    and padding ``padding_idx``. :class:`ModelError` for an unknown rule or no ``padding_idx``."""
    real = attention_mask.bool()
    count = real.long().cumsum(dim=-1) - 1
    if rule == "count":
        return torch.where(real, count, torch.zeros_like(count))
    if rule == "padding_idx":
        if padding_idx is None:
            raise ModelError("RoBERTa-style position ids need config.pad_token_id")
        return torch.where(real, count + padding_idx + 1, torch.full_like(count, padding_idx))
    raise ModelError(f"unknown position-id rule {rule!r}; use 'count' or 'padding_idx'")


@torch.no_grad()
def embed(loaded: Any, windows: Windows, *, batch_size: int = 8, positions: bool = True) -> torch.Tensor:
    """The token embeddings X(0) ``(B, N, d)`` of ``windows`` (``hidden_states[0]``), in the
    model's dtype on CPU, without running the blocks; ``positions=False`` leaves the absolute
    position embeddings out (:mod:`rankcollapse.models.content`; windows of any length).
    :class:`ConfigError` for windows too long or unknown token ids; :class:`ModelError` for
    ``positions=False`` without absolute position embeddings."""
    loaded = as_loaded(loaded)
    if not positions:
        from .content import content_embeddings

        check_token_ids(loaded, windows)
        return content_embeddings(loaded, windows, batch_size=batch_size)
    check_positions(loaded, windows.n_tokens)
    check_token_ids(loaded, windows)
    name = families.stacks(loaded.model, loaded.family)[0].prefix + "embeddings"
    return record_points(loaded, windows, [name], batch_size=batch_size)[name]


@torch.no_grad()
def record_points(loaded: LoadedModel, windows: Windows, points: Sequence[str], *, batch_size: int = 8,
                  **interventions: Any) -> dict[str, torch.Tensor]:
    """The tensors at ``points`` for every window, on CPU, under ``interventions`` (keywords
    of :func:`~rankcollapse.models.intervene`), each forward pass stopped once they are
    recorded; :class:`ModelError` for an unknown point or a module that did not run."""
    parts: dict[str, list[torch.Tensor]] = {p: [] for p in points}
    for rows, w in windows.batches(batch_size):
        rec, _, _ = _record_batch(loaded, w, interventions, list(points), window_rows=rows, stop=True)
        for p in points:
            parts[p].append(rec.outputs[p].cpu())
    return {p: torch.cat(chunks, dim=0) for p, chunks in parts.items()}


def default_points(loaded: Any, detail: str = "hidden_states") -> list[str]:
    """Point names probed by default (every ``hidden_states`` entry of every stack)."""
    loaded = as_loaded(loaded)
    return [n for s in families.stacks(loaded.model, loaded.family) for n in families.point_names(s, detail)]


def check_token_ids(loaded: Any, windows: Windows) -> None:
    """:class:`ConfigError` for token ids the model has no embedding for (another tokenizer's)."""
    embeddings = loaded.model.get_input_embeddings()
    rows = getattr(embeddings, "num_embeddings", None)
    top = int(windows.input_ids.max())
    if isinstance(rows, int) and top >= rows:
        raise ConfigError(f"token id {top} is beyond {getattr(loaded, 'name', 'the model')}'s {rows} embeddings: "
                          "the windows were made with another model's tokenizer")


@dataclass(frozen=True)
class Intervention:
    """What :func:`probe` changes in the network; the default is the model unchanged
    (docs/models.md, "Interventions").

    Attributes
    ----------
    mask : replacement self-attention mask (``Mask``, spec string, ``"schedule:..."`` or
        bool ``(N, N)`` tensor); None keeps the model's own.
    d_qk_scale : logits divided by sqrt(s) (:mod:`rankcollapse.models.interventions`).
    d_qk : the attention temperature ``q·k / sqrt(d_qk)``; sets ``d_qk_scale``; giving both
        is refused.
    drop : components to remove, ``("mlp",)`` or ``"skip:0-3,norm"`` (:func:`~rankcollapse.models.interventions.parse_drop`).
    clip_massive : clip each window's massive token (:mod:`rankcollapse.models.massive`);
        ``df.attrs["massive_clips"]`` lists the clips.
    edits : point name or ``module:PATH`` -> ``fn(tensor, context) -> tensor``
        (:mod:`rankcollapse.models.edits`).
    ablate_heads : :class:`~rankcollapse.models.edits.HeadAblation`.
    """

    mask: Any = None
    d_qk_scale: float = 1.0
    d_qk: float | None = None
    drop: Sequence[str] | str = ()
    clip_massive: bool = False
    edits: Mapping[str, EditFn] | None = None
    ablate_heads: HeadAblation | None = None

    def given(self) -> list[str]:
        """Names of the fields that change the model, in field order."""
        changed = {"mask": self.mask is not None, "d_qk_scale": self.d_qk_scale != 1, "d_qk": self.d_qk is not None,
                   "drop": bool(self.drop), "clip_massive": self.clip_massive, "edits": bool(self.edits),
                   "ablate_heads": self.ablate_heads is not None}
        return [k for k, v in changed.items() if v]


def _settings_record(net: Intervention, d_qk_scale: float = 1.0) -> dict[str, Any]:
    """``mask`` (its spec), ``d_qk_scale``, ``d_qk`` and ``drop`` as a table or states sidecar records them."""
    return {"mask": str(getattr(net.mask, "spec", net.mask)) if net.mask is not None else None,
            "d_qk_scale": float(d_qk_scale), "d_qk": None if net.d_qk is None else float(net.d_qk),
            "drop": split_drop(net.drop) if isinstance(net.drop, str) else list(net.drop)}


def as_intervention(intervention: Any, n_tokens: int | None = None) -> Intervention:
    """``intervention`` (None: the empty one), its fields checked before any model runs:
    :class:`ConfigError` for another type or a bad field; with ``n_tokens``, :class:`MaskError`
    for a ``mask`` that is no mask of ``n_tokens`` tokens."""
    net = intervention if intervention is not None else Intervention()
    if not isinstance(net, Intervention):
        raise ConfigError(f"expects a rankcollapse.models.Intervention, got {type(net).__name__}",
                          argument="intervention")
    if not isinstance(net.clip_massive, bool):  # a truthy "no" would clip
        raise ConfigError(f"must be True or False, got {net.clip_massive!r}", argument="clip_massive")
    drop = [net.drop] if isinstance(net.drop, str) else net.drop
    if not isinstance(drop, Sequence) or not all(isinstance(item, str) for item in drop):
        raise ConfigError(f"must be a string or a sequence of strings such as ('mlp', 'skip:0-3'), got "
                          f"{net.drop!r}", argument="drop")
    parse_drop(net.drop, None)
    if net.d_qk is not None:
        check_d_qk(net.d_qk)
    if net.mask is not None and n_tokens is not None:
        mask = schedule_or_mask(net.mask, n_tokens)
        if not isinstance(mask, MaskSchedule):
            dense_mask(mask, n_tokens)
    if net.edits is not None and (not isinstance(net.edits, Mapping) or not all(isinstance(k, str) for k in net.edits)):
        raise ConfigError(f"must map point names to functions, {{'layer.3.output': fn}}, got {net.edits!r}",
                          argument="edits")
    if net.ablate_heads is not None and not isinstance(net.ablate_heads, HeadAblation):
        raise ConfigError(f"must be a rankcollapse.models.edits.HeadAblation (e.g. "
                          f"HeadAblation(((3, 1),))), got {type(net.ablate_heads).__name__}", argument="ablate_heads")
    return net


def probe_metrics(metrics: Sequence[str] | str | None) -> tuple[str, ...] | None:
    """``metrics`` as :func:`probe` measures them, each once (None: the default; ``"all"``:
    every token metric); :class:`ConfigError` for none or an unknown name."""
    from ..metrics import METRICS

    if metrics is None:
        return None
    names = tuple(dict.fromkeys([metrics] if isinstance(metrics, str) else metrics))
    if names == ("all",):
        return tuple(METRICS)
    for name in names:
        if name not in METRICS and name not in ATTENTION_METRICS and name not in SINK_METRICS:
            raise ConfigError(f"names an unknown metric {name!r}; choose from "
                              f"{', '.join((*METRICS, *ATTENTION_METRICS, *SINK_METRICS))} or all", argument="metrics")
    if not names:
        raise ConfigError("is empty; give metric names or all", argument="metrics")
    return names


def check_windows(windows: Any) -> None:
    """:class:`ConfigError` for anything but :class:`~rankcollapse.data.Windows`."""
    if not isinstance(windows, Windows):
        raise ConfigError(f"expects rankcollapse.data.Windows (make_windows, Windows.load or Windows(input_ids, "
                          f"attention_mask, special_tokens_mask)), got {type(windows).__name__}", argument="windows")


def probe(loaded: Any, windows: Windows, intervention: Intervention | None = None, *,
          metrics: Sequence[str] | None = None, points: Sequence[str] | str = "hidden_states", batch_size: int = 8,
          exclude_special: bool = False, per_window: bool = False, progress: bool | None = None,
          max_memory: int | str | None = None) -> pd.DataFrame:
    """Metrics per layer and recorded point, summarised over windows.

    Parameters
    ----------
    loaded : LoadedModel, a ``transformers.PreTrainedModel`` (task head allowed), or a
        TransformerLens ``TransformerBridge`` / nnsight model (:mod:`rankcollapse.models.lens`:
        token metrics of the ``hidden_states`` points, no interventions).
    windows : token windows ``(B, N)``.
    intervention : what is changed in the model (:class:`Intervention`); None: nothing.
    metrics : names from ``METRICS`` (hidden states), ``ATTENTION_METRICS`` (every block's
        attention probabilities, at ``{prefix}layer.k.attention``) or ``SINK_METRICS``;
        ``"all"``: every ``METRICS``; None: :data:`PROBE_DEFAULT_METRICS`.
    points : ``"hidden_states"``, ``"all"`` (also block inputs, norms, sublayer outputs), a
        list of point names, or a comma-separated string adding ``module:PATH`` items.
    batch_size : windows per forward pass (at most, with ``max_memory``).
    exclude_special : also leave special tokens out of metrics (padding always is).
    per_window : also a ``values`` column, float64 ``(B,)`` per row in window order.
    progress : a progress bar on stderr; None = only on a terminal.
    max_memory : bytes (or ``"8GiB"``), weights included: the largest batch size that fits
        (:func:`probe_memory`); ``df.attrs`` then holds ``batch_size`` and
        ``predicted_peak_bytes``.

    Returns
    -------
    pandas.DataFrame
        The layout of :mod:`rankcollapse.summary`; ``layer`` is the ``hidden_states`` index
        (points inside block k count as k+1). ``df.attrs``: ``model``, ``family``, ``notes``
        and the intervention settings.

    Raises
    ------
    ModelError, MaskError, ConfigError
        A bad intervention, metric or point, an unsupported intervention, a mask of
        another size, windows too long or token ids beyond the embeddings.

    See Also
    --------
    Recorder : the hidden states behind each row, by point name.
    Intervention : what is changed in the model.
    intervene : applies an intervention's mask, temperature, drops, clip and edits around each forward pass.
    rankcollapse.data.make_windows : windows of real text.

    Examples
    --------
    >>> import torch, transformers
    >>> _ = torch.manual_seed(0)
    >>> config = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=50, bos_token_id=0, eos_token_id=0)
    >>> model = transformers.GPT2Model(config).eval()  # a tiny randomly initialised GPT-2
    >>> from rankcollapse.data import Windows
    >>> ids = torch.randint(0, 50, (4, 8), generator=torch.Generator().manual_seed(0))
    >>> windows = Windows(ids, torch.ones_like(ids), torch.zeros_like(ids, dtype=torch.bool))
    >>> df = probe(model, windows, metrics=["rank_fraction"], progress=False)
    >>> print(df[["layer", "point", "metric", "mean", "n_samples"]].to_string(index=False))
     layer          point        metric  mean  n_samples
         0     embeddings rank_fraction   1.0          4
         1 layer.0.output rank_fraction   1.0          4
         2 layer.1.output rank_fraction   1.0          4
         2     final_norm rank_fraction   1.0          4
    """
    net = as_intervention(intervention)
    check_windows(windows)
    batch_size = check_int(batch_size, "batch_size", low=1)
    metrics = probe_metrics(metrics)
    loaded, library = open_model(loaded)
    planned = {}
    if max_memory is not None:
        plan = _memory_plan(loaded, library, windows.n_tokens, points, metrics)
        batch_size = plan.batch_size(max_memory, batch_size)
        planned = {"batch_size": int(batch_size), "predicted_peak_bytes": plan.peak(batch_size)}
    if library is not None:
        refused = net.given() + (["points"] if points != "hidden_states" else [])
        df = _probe_library(library, windows, metrics, batch_size, exclude_special, progress, per_window, refused)
        df.attrs.update(planned)
        return df
    d_qk_scale = d_qk_scale_for(loaded, net.d_qk, net.d_qk_scale)
    check_positions(loaded, windows.n_tokens)
    check_token_ids(loaded, windows)
    settings = dict(mask=schedule_or_mask(net.mask, windows.n_tokens), d_qk_scale=d_qk_scale, drop=net.drop,
                    clip_massive=net.clip_massive)
    names, attn_names, sink_names = _metric_kinds(metrics)
    zeroed = zeroed_heads(sink_names, net.edits, net.ablate_heads, loaded)
    all_edits = _with_ablation(loaded, windows, net.edits, net.ablate_heads, batch_size, settings)
    stack_list = families.stacks(loaded.model, loaded.family)
    point_list = _point_list(loaded, points) if names else []
    attn_points = [f"{s.prefix}layer.{k}.attention" for s in stack_list for k in range(s.n_layers)] if attn_names else []
    values: dict[tuple[str, str], list[torch.Tensor]] = {}
    clip_records: list[dict[str, Any]] = []  # intervene yields no clips without clip_massive
    value_stacks = stack_list if set(sink_names) & set(VALUE_METRICS) else []
    with steps(-(-windows.n_samples // batch_size), "probe: batches", progress) as bar:
        for rows, w in windows.batches(batch_size):  # one forward pass each
            rec, vrec, clips = _record_batch(loaded, w, settings, point_list, bool(attn_names) or bool(sink_names),
                                             value_stacks, all_edits, rows)
            clip_records.extend(r for clip in clips for r in clip.records(rows.start))
            add_point_metrics(rec.outputs, tuple(w.input_ids.shape), w.real(exclude_special), names, values)
            if sink_names:
                found = sink_values(rec.attention_maps, vrec.outputs, stack_list, loaded.model.config,
                                    w.attention_mask.bool(), sink_names, zeroed)
                for key, v in found.items():
                    values.setdefault(key, []).append(v.detach().cpu().double())
            if attn_names:
                add_attention_metrics(rec.attention_maps, loaded.family, loaded.model.config.model_type,
                                      settings["mask"], w.attention_mask, attn_names, values)
            bar.advance()
    sink_points = [(p, (m,)) for p, m in values if m in SINK_METRICS]  # per head and per block, as recorded
    point_metrics = [(p, names) for p in point_list] + [(p, attn_names) for p in attn_points] + sink_points
    n_layers = {s.prefix: s.n_layers for s in stack_list}
    depths = {p: module_depth(stack_list, module_tap(loaded.model, p).module, p[len(MODULE_PREFIX):])
              if p.startswith(MODULE_PREFIX) else families.point_layer(p, n_layers) for p, _ in point_metrics}
    df = _summarise(values, point_metrics, per_window, depths)
    df.attrs.update(model=loaded.name, family=loaded.family, notes=list(loaded.notes), **_settings_record(net, d_qk_scale),
                    n_samples=windows.n_samples, n_tokens=windows.n_tokens,
                    **({"clip_massive": True, "massive_clips": clip_records} if net.clip_massive else {}),
                    **edit_settings(net.edits, net.ablate_heads), **planned)
    return df


def _metric_kinds(metrics: Sequence[str] | None) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """The token, attention and sink metrics of ``metrics`` (None: :data:`PROBE_DEFAULT_METRICS`)."""
    names = tuple(metrics) if metrics is not None else PROBE_DEFAULT_METRICS
    return (tuple(n for n in names if n not in ATTENTION_METRICS and n not in SINK_METRICS),
            tuple(n for n in names if n in ATTENTION_METRICS), tuple(n for n in names if n in SINK_METRICS))


def probe_memory(loaded: Any, n_tokens: int, *, points: Sequence[str] | str = "hidden_states",
                 metrics: Sequence[str] | None = None) -> ProbeMemory:
    """Predicted memory of :func:`probe` on windows of ``n_tokens`` tokens
    (:mod:`rankcollapse.models.memory`); :class:`ModelError` for unknown points."""
    return _memory_plan(*open_model(loaded), n_tokens, points, metrics)


def _memory_plan(loaded: LoadedModel, library: LibraryModel | None, n_tokens: int, points: Sequence[str] | str,
                 metrics: Sequence[str] | None) -> ProbeMemory:
    kinds = _metric_kinds(metrics)
    n_points = (len(library.points) if library is not None else len(_point_list(loaded, points))) if kinds[0] else 0
    return predict(loaded, n_tokens, n_points, *kinds)


def _probe_library(library: LibraryModel, windows: Windows, metrics: Sequence[str] | None, batch_size: int,
                   exclude_special: bool, progress: bool | None, per_window: bool, refused: list[str]) -> pd.DataFrame:
    """:func:`probe` of a TransformerLens or nnsight model; ConfigError for ``refused`` or non-token metrics."""
    names = tuple(metrics) if metrics is not None else PROBE_DEFAULT_METRICS
    refused = refused + [n for n in names if n in ATTENTION_METRICS or n in SINK_METRICS]
    if refused:
        raise ConfigError(f"{refused[0]}: not available for a {library.library} model, which is probed unchanged at "
                          "its hidden_states points with token metrics; pass the transformers model itself")
    loaded = library.loaded
    check_positions(loaded, windows.n_tokens)
    check_token_ids(loaded, windows)
    values: dict[tuple[str, str], list[torch.Tensor]] = {}
    with steps(-(-windows.n_samples // batch_size), "probe: batches", progress) as bar, torch.no_grad():
        for _, w in windows.batches(batch_size):
            add_point_metrics(library.record(model_inputs(loaded, w.input_ids, w.attention_mask)),
                              tuple(w.input_ids.shape), w.real(exclude_special), names, values)
            bar.advance()
    df = _summarise(values, [(p, names) for p in library.points], per_window, library.points)
    df.attrs.update(model=loaded.name, family=loaded.family, notes=list(loaded.notes), library=library.library,
                    **_settings_record(Intervention()), n_samples=windows.n_samples, n_tokens=windows.n_tokens)
    return df


def _with_ablation(loaded: LoadedModel, windows: Windows, edits: Mapping[str, EditFn] | None,
                   ablation: HeadAblation | None, batch_size: int, settings: dict[str, Any]) -> dict[str, EditFn]:
    """``edits`` plus those of ``ablation`` (after a user's edit at the same point; mean ablation measures first)."""
    out = dict(edits or {})
    if ablation is None:
        return out
    prefix = check_ablation(loaded, ablation)
    means = None
    if ablation.mode == "mean":
        recorded = record_points(loaded, windows, [ablation.point(k, prefix) for k in ablation.by_layer()],
                                 batch_size=batch_size, **settings)
        H = n_heads(loaded.model)
        means = {p: head_means(Z, windows.attention_mask, H) for p, Z in recorded.items()}
    for point, fn in ablation_edits(ablation, means, prefix).items():
        first = out.get(point)
        out[point] = fn if first is None else (lambda Z, ctx, f=first, g=fn: g(f(Z, ctx), ctx))
    return out


def add_attention_metrics(maps: dict[str, torch.Tensor], family_name: str, model_type: str | None, mask: Any,
                          am: torch.Tensor, metrics: Sequence[str],
                          values: dict[tuple[str, str], list[torch.Tensor]]) -> None:
    """Appends the ``metrics`` of each attention map ``(B, H, N, N)`` of one batch to
    ``values[(point, metric)]``; allowed keys as :func:`allowed_keys`, less padding (``am``)."""
    for name, A in maps.items():
        pad = stack_padding(am.bool(), name)  # keys: every real token
        allowed = allowed_keys(family_name, model_type, mask, name, int(am.shape[-1]))
        for metric in metrics:
            v = ATTENTION_METRICS[metric].fn(A, allowed, padding_mask=pad.to(A.device))
            values.setdefault((name, metric), []).append(v.detach().cpu().double())


def _record_batch(loaded: LoadedModel, w: Windows, settings: dict[str, Any], point_list: list[str],
                  attentions: bool = False, value_stacks: Sequence[Any] = (), edits: Mapping[str, EditFn] | None = None,
                  window_rows: range | None = None, stop: bool = False) -> tuple[Recorder, ValueRecorder, list[Any]]:
    """One forward pass on ``w`` under ``settings``: the Recorder, ValueRecorder and MassiveClips."""
    inputs = model_inputs(loaded, w.input_ids, w.attention_mask)
    with intervene(loaded, **settings, attention_mask=w.attention_mask, edits=edits, windows=window_rows) as clips:
        with Recorder(loaded, point_list, stop=stop, attentions=attentions) as rec, \
                ValueRecorder(loaded.model, value_stacks) as vrec:
            loaded.model(**inputs)
    silent = [p for p in point_list if p not in rec.outputs]
    if silent:
        raise ModelError(f"{silent[0]}: the module was not called in the forward pass (a container such as a "
                         "ModuleList, or an unused branch); record a module that runs")
    return rec, vrec, clips


def add_point_metrics(outputs: dict[str, Any], shape: tuple[int, int], real: torch.Tensor, names: Sequence[str],
                      values: dict[tuple[str, str], list[torch.Tensor]]) -> None:
    """Appends the token metrics ``(batch,)`` of each point of ``outputs`` (tokens
    ``(B, N, d)``, ``B, N = shape``; ``real``: bool ``(B, N)``) to ``values[(point, metric)]``;
    :class:`ModelError` for a ``module:PATH`` output that is not tokens."""
    for name, X in outputs.items():
        pad = stack_padding(real, name)
        if name.startswith(MODULE_PREFIX) and (not isinstance(X, torch.Tensor) or X.ndim != 3
                                               or tuple(X.shape[:2]) != shape):
            got = tuple(X.shape) if isinstance(X, torch.Tensor) else type(X).__name__
            raise ModelError(f"{name}: the module's output {got} is not tokens (B, N, width) for B, N = {shape}; "
                             "record a module whose output (or element 0 of it) holds one vector per token")
        result = compute_metrics(X, list(names), padding_mask=pad.to(X.device), dtype=torch.float64)
        for metric, v in result.items():
            values.setdefault((name, metric), []).append(v.detach().cpu().double())


def allowed_keys(family_name: str, model_type: str | None, mask: Any, point: str, n_tokens: int) -> torch.Tensor:
    """Bool ``(N, N)``: the keys each query of the attention at ``point`` may attend to
    before padding: ``mask`` (a schedule's layer k), else the family's own pattern."""
    k = int(point.rsplit(".", 2)[-2])
    if mask is None:
        causal = point.startswith("decoder.")  # T5's decoder
        return dense_mask("causal" if causal else families.native_mask(family_name, model_type), n_tokens)
    if isinstance(mask, MaskSchedule):
        return mask.layer(k).to_dense()
    return dense_mask(mask, n_tokens)


def _checked_run(loaded: Any, windows: Windows, intervention: Any, batch_size: int
                ) -> tuple[Intervention, LoadedModel, int, float]:
    """``(intervention, model, batch_size, d_qk_scale)`` checked for a run on ``windows``, raising as :func:`probe`."""
    net = as_intervention(intervention)
    check_windows(windows)
    batch_size = check_int(batch_size, "batch_size", low=1)
    loaded = as_loaded(loaded)
    d_qk_scale = d_qk_scale_for(loaded, net.d_qk, net.d_qk_scale)
    check_positions(loaded, windows.n_tokens)
    check_token_ids(loaded, windows)
    return net, loaded, batch_size, d_qk_scale


@torch.no_grad()
def attention_maps(loaded: Any, windows: Windows, intervention: Intervention | None = None, *,
                   batch_size: int = 8) -> dict[str, torch.Tensor]:
    """Self-attention probabilities of every block on ``windows`` under ``intervention``,
    installed by the code of :func:`probe`: ``{prefix}layer.k.attention`` -> float32
    ``(B, H, N, N)`` on CPU (padding keys 0). :class:`ModelError` when the model gives no
    probabilities; :class:`ConfigError` for unknown token ids or windows longer than the
    model's positions."""
    net, loaded, batch_size, d_qk_scale = _checked_run(loaded, windows, intervention, batch_size)
    settings = dict(mask=schedule_or_mask(net.mask, windows.n_tokens), d_qk_scale=d_qk_scale, drop=net.drop,
                    clip_massive=net.clip_massive)
    all_edits = _with_ablation(loaded, windows, net.edits, net.ablate_heads, batch_size, settings)
    parts: dict[str, list[torch.Tensor]] = {}
    for rows, w in windows.batches(batch_size):
        rec, _, _ = _record_batch(loaded, w, settings, [], True, edits=all_edits, window_rows=rows)
        for name, a in rec.attention_maps.items():
            parts.setdefault(name, []).append(a.float().cpu())
    return {name: torch.cat(chunks) for name, chunks in parts.items()}


def _point_list(loaded: Any, points: Sequence[str] | str) -> list[str]:
    """Point names of ``points`` (a list, or a string as :func:`check_points`)."""
    if not isinstance(points, str):
        return list(points)
    base, modules = check_points(points)
    return default_points(loaded, base) + modules


def check_points(points: str) -> tuple[str, list[str]]:
    """``(base, module items)`` of a comma-separated ``points`` string, checked without a
    model (``base``: ``hidden_states`` or ``all``); :class:`ModelError` for anything else, no
    item, or a ``module:`` item without a path."""
    items = [p.strip() for p in points.split(",") if p.strip()]
    if not items:  # "," would otherwise read as the default points
        raise ModelError(f"--points {points!r} names no point: give hidden_states or all, plus any module:PATH items")
    modules = [p for p in items if p.startswith(MODULE_PREFIX)]
    rest = [p for p in items if not p.startswith(MODULE_PREFIX)]
    if len(rest) > 1 or (rest and rest[0] not in ("hidden_states", "all")):
        raise ModelError(f"--points {points!r}: give hidden_states or all, plus any module:PATH items")
    empty = [p for p in modules if not p[len(MODULE_PREFIX):].strip()]
    if empty:
        raise ModelError(f"--points {points!r}: {empty[0]!r} names no module; write module:PATH "
                         "(a named_modules() path)")
    return (rest[0] if rest else "hidden_states"), modules


def _summarise(values: dict, point_metrics: list[tuple[str, Sequence[str]]], per_window: bool,
               depths: dict[str, int]) -> pd.DataFrame:
    """``point_metrics``: ``(point, metric names)`` in table order; ``depths``: each point's layer."""
    keyed = {(depths[name], name, metric): values[(name, metric)] for name, names in point_metrics for metric in names}
    return summary_table(keyed, per_window=per_window)


def layernorm_rank_note(loaded: Any, windows: Windows, table: pd.DataFrame) -> str | None:
    """One line explaining rank ``d − 1`` at LayerNorm outputs (centring, with zero bias),
    or None: when the model has a ``LayerNorm``, every window has >= ``d`` real tokens and
    some point's mean ``rank_fraction`` is exactly ``(d − 1) / d``."""
    d = int(loaded.model.config.hidden_size)
    if (not any(isinstance(m, torch.nn.LayerNorm) for m in loaded.model.modules())
            or int(windows.attention_mask.sum(dim=-1).min()) < d):
        return None
    rows = table[table["metric"] == "rank_fraction"]
    points = [p for p, v in zip(rows["point"], rows["mean"]) if abs(float(v) - (d - 1) / d) < 0.5 / d**2]
    if not points:
        return None
    shown = ", ".join(points[:4]) + (f" and {len(points) - 4} more" if len(points) > 4 else "")
    return (f"note: rank_fraction {d - 1}/{d} at {shown} is LayerNorm's centring, not collapse: LayerNorm makes "
            f"every token's {d} entries sum to 0 before its affine map, so with zero bias (untrained) its N >= d "
            f"outputs span at most d - 1 = {d - 1} dimensions (sigma_min ~ 0 there)")


def distinct_token_fraction(windows: Windows, dim: int) -> torch.Tensor:
    """Per window, ``#distinct real token ids / min(n_real, dim)``, shape ``(B,)``."""
    real = windows.attention_mask.bool()
    return distinct_tokens(windows.input_ids, real) / torch.clamp(real.sum(dim=-1), max=dim)


def embedding_rank_note(loaded: Any, windows: Windows, table: pd.DataFrame) -> str | None:
    """One line explaining a rank-deficient embedding layer (position inside attention:
    repeated tokens give identical rows), or None when repetition does not explain it."""
    how = families.family(loaded.family).position_in_attention
    name = families.stacks(loaded.model, loaded.family)[0].prefix + "embeddings"
    rows = table[(table["point"] == name) & (table["metric"] == "rank_fraction")]
    if how is None or rows.empty or float(rows["mean"].iloc[0]) >= 1.0:
        return None
    measured = float(rows["mean"].iloc[0])
    expected = float(distinct_token_fraction(windows, int(loaded.model.config.hidden_size)).double().mean())
    if abs(measured - expected) > 1e-6:
        return None
    return (f"note: layer 0 ({name}) rank_fraction {measured:.3g} < 1 is not collapse: {how} acts inside attention, "
            f"so the input embeddings carry no position and repeated tokens give identical rows "
            f"({expected:.3g} of tokens are distinct; sigma_min ~ 0 there)")
