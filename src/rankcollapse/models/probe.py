"""Per-layer metrics of a pretrained model on token windows, as a tidy table.

``probe`` runs the model over the windows in batches, records the requested points
with :class:`~rankcollapse.models.recorder.Recorder` (by default every ``hidden_states``
entry, plus the last block's output before the final norm where there is one), computes
:mod:`rankcollapse.metrics` per window with padding excluded, and summarises over
windows.
"""

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
from .edits import (HEAD_KEYS, EditFn, HeadAblation, ablation_edits, check_ablation, edit_settings, head_means,
                    n_heads)
from .interventions import intervene, parse_drop, split_drop
from .lens import LibraryModel, open_model
from .loading import LoadedModel, as_loaded
from .memory import ProbeMemory
from .recorder import MODULE_PREFIX, Recorder, module_depth, module_tap
from .sinks import SINK_METRICS, VALUE_METRICS, ValueRecorder, sink_values, zeroed_heads
from .temperature import check_d_qk, d_qk_scale_for

TABLE_COLUMNS = SUMMARY_COLUMNS  # the one per-layer table layout (rankcollapse.summary)
PROBE_DEFAULT_METRICS = ("mu", "mu_relative", "rank_fraction", "sigma_min", "avg_abs_cos")


def model_inputs(loaded: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Keyword arguments for one forward pass of ``loaded.model`` on a batch.

    T5 (encoder-decoder) gets the same window as decoder input, shifted right by one
    token behind the model's ``decoder_start_token_id`` (teacher forcing, as T5's own
    ``_shift_right`` does in training with ``labels=input_ids``); the decoder's
    padding mask is shifted the same way. Causal LMs run without a KV cache.

    Raises
    ------
    ModelError
        A generic encoder-decoder (unknown decoder inputs); a T5 whose config and
        generation config name no ``decoder_start_token_id`` (a model built from a
        bare config): the decoder input is undefined, and no default is guessed.
    """
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
    """The token a T5 decoder starts from: ``config.decoder_start_token_id``, else the
    generation config's.

    Raises
    ------
    ModelError
        Neither names one (e.g. a ``T5Config`` built without it); the message says how
        to set it or how to probe the encoder alone.
    """
    for source in (model.config, getattr(model, "generation_config", None)):
        value = getattr(source, "decoder_start_token_id", None) if source is not None else None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    raise ModelError(
        f"{type(model).__name__} has no decoder_start_token_id (in its config or generation config), so its "
        "decoder input is undefined; set model.config.decoder_start_token_id (T5 checkpoints use the pad "
        "token, 0), or load the encoder alone (transformers.T5EncoderModel) to probe it")


def position_ids(attention_mask: torch.Tensor, rule: str = "count", padding_idx: int | None = None) -> torch.Tensor:
    """Position ids ``(B, N)`` that follow the padding mask ``(B, N)`` (1 = real).

    ``"count"``: the k-th real token of a row gets position k (0-based) wherever it
    sits, so left padding does not shift absolute positions (GPT-2, BERT) and a
    window gets the positions of its unpadded self; padding gets 0 (it is masked as a
    key and excluded from metrics). ``"padding_idx"``: RoBERTa's numbering
    ``padding_idx + 1 + k``, padding gets ``padding_idx`` (as
    ``create_position_ids_from_input_ids`` does from the pad token).

    Raises
    ------
    ModelError
        Unknown rule, or ``"padding_idx"`` without a ``padding_idx``.
    """
    real = attention_mask.bool()
    count = real.long().cumsum(dim=-1) - 1
    if rule == "count":
        return torch.where(real, count, torch.zeros_like(count))
    if rule == "padding_idx":
        if padding_idx is None:
            raise ModelError("RoBERTa-style position ids need config.pad_token_id")
        return torch.where(real, count + padding_idx + 1, torch.full_like(count, padding_idx))
    raise ModelError(f"unknown position-id rule {rule!r}; use 'count' or 'padding_idx'")


def decoder_padding(attention_mask: torch.Tensor) -> torch.Tensor:
    """Padding mask of the right-shifted decoder input: the start token is real, then
    the encoder's mask without its last entry. Shape ``(B, N)``."""
    first = torch.ones_like(attention_mask[:, :1])
    return torch.cat([first, attention_mask[:, :-1]], dim=1)


@torch.no_grad()
def embed(loaded: Any, windows: Windows, *, batch_size: int = 8, positions: bool = True) -> torch.Tensor:
    """The token embeddings X(0) of ``windows``: the input of the first block
    (``hidden_states[0]``; for T5 the encoder's), computed without running the blocks.

    ``positions=False`` leaves the absolute position embeddings out
    (:func:`rankcollapse.models.content.content_embeddings`): the windows may then be
    longer than the model's position table.

    Returns
    -------
    torch.Tensor, shape (B, N, d), the model's dtype, on CPU.

    Raises
    ------
    ConfigError
        Windows longer than the model's positions (:func:`check_positions`; only with
        ``positions=True``), or token ids beyond the model's embeddings
        (:func:`check_token_ids`).
    ModelError
        ``positions=False`` for a family without absolute position embeddings.
    """
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
    """The tensors at ``points`` for every window, concatenated along the windows, on CPU
    (each forward pass stops once they are recorded). ``interventions``: keywords of
    :func:`~rankcollapse.models.intervene` (``mask``, ``d_qk_scale``, ``drop``,
    ``clip_massive``, ``edits``).

    Raises
    ------
    ModelError
        An unknown point, or a ``module:PATH`` whose module did not run.
    """
    parts: dict[str, list[torch.Tensor]] = {p: [] for p in points}
    for rows, w in windows.batches(batch_size):
        with intervene(loaded, attention_mask=w.attention_mask, windows=rows, **interventions):
            with Recorder(loaded, points, stop=True) as rec:
                loaded.model(**model_inputs(loaded, w.input_ids, w.attention_mask))
        _check_ran(points, rec)
        for p in points:
            parts[p].append(rec.outputs[p].cpu())
    return {p: torch.cat(chunks, dim=0) for p, chunks in parts.items()}


def _check_ran(points: Sequence[str], rec: Recorder) -> None:
    """Refuse a point whose module did not run in the forward pass (:class:`ModelError`)."""
    silent = [p for p in points if p not in rec.outputs]
    if silent:
        raise ModelError(f"{silent[0]}: the module was not called in the forward pass (a container such as a "
                         "ModuleList, or an unused branch); record a module that runs")


def default_points(loaded: Any, detail: str = "hidden_states") -> list[str]:
    """Point names probed by default (every ``hidden_states`` entry of every stack).

    Raises
    ------
    ModelError
        ``loaded`` is not a model (:func:`~rankcollapse.models.as_loaded`).
    """
    loaded = as_loaded(loaded)
    return [n for s in families.stacks(loaded.model, loaded.family) for n in families.point_names(s, detail)]


@torch.no_grad()
def check_positions(loaded: Any, length: int) -> None:
    """Refuse windows longer than the model's position table (``max_position_embeddings``
    or ``n_positions`` in its config), before any forward pass.

    Raises
    ------
    ConfigError
        ``length`` exceeds the model's positions (names both numbers).
    """
    config = getattr(loaded.model, "config", None)
    limit = next((getattr(config, k) for k in ("max_position_embeddings", "n_positions")
                  if isinstance(getattr(config, k, None), int)), None)
    if limit is not None and length > limit:
        raise ConfigError(f"windows of {length} tokens exceed {getattr(loaded, 'name', 'the model')}'s "
                          f"{limit} positions; use windows of at most {limit} tokens")


def check_token_ids(loaded: Any, windows: Windows) -> None:
    """Refuse token ids the model has no embedding for (ids from another model's
    tokenizer, or a windows file made for another model), before any forward pass.

    Raises
    ------
    ConfigError
        An id >= the input embedding's number of rows (names both numbers).
    """
    embeddings = loaded.model.get_input_embeddings()
    rows = getattr(embeddings, "num_embeddings", None)
    top = int(windows.input_ids.max())
    if isinstance(rows, int) and top >= rows:
        raise ConfigError(f"token id {top} is beyond {getattr(loaded, 'name', 'the model')}'s {rows} embeddings: "
                          "the windows were made with another model's tokenizer")


@dataclass(frozen=True)
class Intervention:
    """What :func:`probe` changes in the network before measuring it (the measurement
    itself, metrics, points and batches, is the keywords of :func:`probe`). The default
    is the model unchanged.

    Attributes
    ----------
    mask : replacement self-attention mask (a ``rankcollapse.masks.Mask``, a spec string,
        a schedule ``"schedule:..."`` giving block ``k`` the schedule's layer ``k``, or a
        bool ``(N, N)`` tensor); None keeps the model's own mask.
    d_qk_scale : attention temperature multiplier s: logits are divided by sqrt(s)
        (as if d_qk were s times larger; paper Sec. 3); 1 leaves the model unchanged.
    d_qk : the attention temperature itself, scores ``q·k / sqrt(d_qk)`` as in
        :func:`rankcollapse.dynamics.simulate`; sets ``d_qk_scale = d_qk · scaling²``
        (:mod:`rankcollapse.models.temperature`). None keeps ``d_qk_scale``; both given
        is refused when the probe runs.
    drop : components to remove, e.g. ``("mlp",)``, ``("skip:0-3", "norm")`` or the
        string ``"skip:0-3,norm"`` (see :func:`rankcollapse.models.interventions.intervene`).
    clip_massive : scale each window's massive token to the median norm at the block
        where it appears (:mod:`rankcollapse.models.massive`), with any other intervention;
        ``df.attrs["massive_clips"]`` then lists, per clipped window, where it clipped and
        whether a later block's output is massive again
        (:meth:`~rankcollapse.models.massive.MassiveClip.records`;
        :func:`~rankcollapse.models.massive.clip_report` says it in one line).
    edits : point name (``layer.3.output``, ``layer.3.heads``...) or ``module:PATH`` ->
        ``fn(tensor, context) -> tensor``, applied in the forward pass; every point is
        measured on the edited model (:mod:`rankcollapse.models.edits`).
    ablate_heads : heads to remove from their block's attention output, with zeros or
        their mean over the windows (:class:`~rankcollapse.models.edits.HeadAblation`).
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


def as_intervention(intervention: Any, n_tokens: int | None = None) -> Intervention:
    """``intervention``, or the empty :class:`Intervention` for None, checked before any
    model runs (with ``n_tokens``, its ``mask`` too, on windows of that length).

    Raises
    ------
    ConfigError
        Anything else, or a field of the wrong type or value (``clip_massive`` not a bool,
        ``drop`` not strings or an unknown component, ``d_qk`` not positive and finite,
        ``edits`` not a mapping of point names, ``ablate_heads`` not a ``HeadAblation``).
    MaskError
        With ``n_tokens``: a ``mask`` that is no mask (or schedule) of ``n_tokens`` tokens.
    """
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
    """``metrics`` as :func:`probe` measures them, each once (None: the default); ``"all"``
    alone is every metric of tokens. :class:`ConfigError` (argument ``metrics``) for no name
    or a name in none of ``METRICS``, ``ATTENTION_METRICS``, ``SINK_METRICS``."""
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
    """Refuse anything but :class:`~rankcollapse.data.Windows` (a bare tensor of token ids
    has no attention mask).

    Raises
    ------
    ConfigError
        ``windows`` of another type.
    """
    if not isinstance(windows, Windows):
        raise ConfigError(f"expects rankcollapse.data.Windows (make_windows, Windows.load or Windows(input_ids, "
                          f"attention_mask, special_tokens_mask)), got {type(windows).__name__}", argument="windows")


def probe(
    loaded: Any,
    windows: Windows,
    intervention: Intervention | None = None,
    *,
    metrics: Sequence[str] | None = None,
    points: Sequence[str] | str = "hidden_states",
    batch_size: int = 8,
    exclude_special: bool = False,
    per_window: bool = False,
    progress: bool | None = None,
    max_memory: int | str | None = None,
) -> pd.DataFrame:
    """Metrics per layer and recorded point, summarised over windows.

    Parameters
    ----------
    loaded : LoadedModel, or any ``transformers.PreTrainedModel`` (with or without a
        task head; see :func:`rankcollapse.models.as_loaded`), or a TransformerLens
        ``TransformerBridge`` or an nnsight model around one, recorded by the library
        (:mod:`rankcollapse.models.lens`; the token metrics of the ``hidden_states``
        points, without interventions).
    windows : token windows (``rankcollapse.data.make_windows``), ``(B, N)``.
    intervention : what is changed in the model (mask, temperature, dropped components,
        massive-token clipping, edits, head ablation: :class:`Intervention`); None runs
        the model as it is.
    metrics : metric names from ``rankcollapse.metrics.METRICS`` (of the recorded
        hidden states) or from ``ATTENTION_METRICS`` (``attention_entropy``,
        ``participation_ratio``, ...: of every block's self-attention
        probabilities, recorded in the same forward pass (eager attention's own, or
        recomputed from SDPA's queries and keys: :class:`~rankcollapse.models.Recorder`), at the
        point ``{prefix}layer.k.attention``; allowed keys: the intervention's ``mask`` or
        the model's own causal/complete pattern, and real tokens) or ``SINK_METRICS``;
        ``"all"``: every metric of ``METRICS``; None = ``mu, mu_relative, rank_fraction,
        sigma_min, avg_abs_cos`` (:func:`probe_metrics`).
    batch_size : windows per forward pass (at most, with ``max_memory``).
    points : ``"hidden_states"`` (default), ``"all"`` (also block inputs, norms and
        sublayer outputs), an explicit list of point names, or a comma-separated string
        adding ``module:PATH`` items to either (``"hidden_states,module:model.layers.3.self_attn"``):
        the output (element 0 of a tuple) of any ``named_modules()`` path, at the layer of
        the block that holds it (:func:`~rankcollapse.models.recorder.module_depth`).
    exclude_special : also leave out special tokens ([CLS], [SEP], BOS) from metrics.
        Padding is always left out.
    progress : a progress bar over batches on stderr; None = only on a terminal.
    max_memory : bytes (or ``"8GiB"``) the probe may use, weights included: the batch
        size becomes the largest (up to ``batch_size``) whose predicted peak fits
        (:func:`~rankcollapse.models.memory.probe_memory`); ``df.attrs`` then holds
        ``batch_size`` and ``predicted_peak_bytes``. None runs ``batch_size`` as given.
    per_window : also return each row's per-window values (column ``values``: a float64
        array ``(B,)`` in window order, non-finite values kept), from the same batched
        forward passes, so intervals over windows need no second run.

    Returns
    -------
    pandas.DataFrame
        The summary layout of :mod:`rankcollapse.summary`: ``layer, point, metric, mean,
        std, q05, q25, q50, q75, q95, n_samples``. ``layer`` is the ``hidden_states``
        index (0 = embeddings, k = after block k; points inside block k, 0-based names,
        count as k+1); ``std`` is the population std over windows; non-finite values are
        left out of the statistics and of ``n_samples``;
        ``df.attrs`` holds ``model``, ``family``, ``notes`` and the intervention settings.
        With ``per_window``, also ``values``.

    Raises
    ------
    ModelError, MaskError, ConfigError
        ``intervention`` not an :class:`Intervention` (:func:`as_intervention`), an
        unknown metric (:func:`probe_metrics`), unknown point, unsupported
        intervention, mask size different from the windows,
        windows longer than the model's positions (:func:`check_positions`), token ids
        beyond the model's embeddings (:func:`check_token_ids`).

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
    mask = schedule_or_mask(net.mask, windows.n_tokens)
    settings = dict(mask=mask, d_qk_scale=d_qk_scale, drop=net.drop, clip_massive=net.clip_massive)
    names = tuple(metrics) if metrics is not None else PROBE_DEFAULT_METRICS
    attn_names = tuple(n for n in names if n in ATTENTION_METRICS)
    sink_names = tuple(n for n in names if n in SINK_METRICS)
    zeroed = zeroed_heads(sink_names, net.edits, net.ablate_heads, loaded)
    all_edits = _with_ablation(loaded, windows, net.edits, net.ablate_heads, batch_size, settings)
    names = tuple(n for n in names if n not in ATTENTION_METRICS and n not in SINK_METRICS)
    stack_list = families.stacks(loaded.model, loaded.family)
    point_list = _point_list(loaded, points) if names else []
    attn_points = [f"{s.prefix}layer.{k}.attention" for s in stack_list for k in range(s.n_layers)] if attn_names else []
    values: dict[tuple[str, str], list[torch.Tensor]] = {}
    clip_records: list[dict[str, Any]] | None = [] if net.clip_massive else None
    with steps(-(-windows.n_samples // batch_size), "probe: batches", progress) as bar:
        for rows, w in windows.batches(batch_size):
            _probe_batch(loaded, w, rows, settings, point_list, names, exclude_special, values,
                         attn_names, sink_names, all_edits, clip_records, zeroed)
            bar.advance()
    sink_points = [(p, (m,)) for p, m in values if m in SINK_METRICS]  # per head and per block, as recorded
    df = _summarise(values, [(p, names) for p in point_list] + [(p, attn_names) for p in attn_points] + sink_points,
                    stack_list, per_window, _module_depths(loaded, point_list, stack_list))
    df.attrs.update(
        model=loaded.name, family=loaded.family, notes=list(loaded.notes),
        mask=str(getattr(net.mask, "spec", net.mask)) if net.mask is not None else None,
        d_qk_scale=float(d_qk_scale), d_qk=None if net.d_qk is None else float(net.d_qk),
        drop=split_drop(net.drop) if isinstance(net.drop, str) else list(net.drop), n_samples=windows.n_samples,
        n_tokens=windows.n_tokens,
        **({"clip_massive": True, "massive_clips": clip_records} if net.clip_massive else {}),
        **edit_settings(net.edits, net.ablate_heads),
        **planned,
    )
    return df


def _config_int(config: Any, names: Sequence[str], default: int) -> int:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return default


def probe_memory(loaded: Any, n_tokens: int, *, points: Sequence[str] | str = "hidden_states",
                 metrics: Sequence[str] | None = None) -> ProbeMemory:
    """Predict the memory of :func:`~rankcollapse.models.probe` on windows of
    ``n_tokens`` tokens with these ``points`` and ``metrics`` (see the module docstring
    of :mod:`rankcollapse.models.memory` for the formula and its measured error band).

    ``loaded``: a transformers model, :class:`~rankcollapse.models.LoadedModel`, or a
    TransformerLens / nnsight model (the model it wraps is sized).

    Raises
    ------
    ModelError
        Unknown points (as :func:`~rankcollapse.models.probe`).
    """
    return _memory_plan(*open_model(loaded), n_tokens, points, metrics)


def _memory_plan(loaded: LoadedModel, library: LibraryModel | None, n_tokens: int, points: Sequence[str] | str,
                 metrics: Sequence[str] | None) -> ProbeMemory:
    """:func:`probe_memory` of an opened model (:func:`~rankcollapse.models.lens.open_model`)."""
    from ..metrics.registry import metrics_bytes
    from .memory import FORWARD_TOKEN_COPIES, MAP_METRIC_COPIES, SCORE_COPIES, SDPA_SCORE_COPIES, SINK_METRIC_COPIES

    model = loaded.model
    tensors = [*model.parameters(), *model.buffers()]
    weights = sum(t.numel() * t.element_size() for t in tensors)
    s = tensors[0].element_size() if tensors else 4
    config = model.config
    d = _config_int(config, ("hidden_size", "n_embd", "d_model", "dim"), 0)
    f = _config_int(config, ("intermediate_size", "n_inner", "d_ff", "ffn_dim", "hidden_dim"), 4 * d)
    heads = _config_int(config, HEAD_KEYS, 1)
    n_blocks = sum(st.n_layers for st in families.stacks(model, loaded.family))
    names = tuple(metrics) if metrics is not None else PROBE_DEFAULT_METRICS
    measured_maps = any(n in ATTENTION_METRICS for n in names)
    attention = measured_maps or any(n in SINK_METRICS for n in names)
    eager = getattr(config, "_attn_implementation", "eager") == "eager"
    token_names = [n for n in names if n not in ATTENTION_METRICS and n not in SINK_METRICS]
    n_points = (len(library.points) if library is not None else len(_point_list(loaded, points))) if token_names else 0
    N = int(n_tokens)
    records = n_points * N * d * s
    maps = n_blocks * heads * N * N * s if attention else 0
    scores = SCORE_COPIES if attention or eager else SDPA_SCORE_COPIES
    forward = (FORWARD_TOKEN_COPIES * N * d + 2 * N * f) * s + scores * heads * N * N * 4
    map_copies = MAP_METRIC_COPIES if measured_maps else SINK_METRIC_COPIES if attention else 0
    measure = max(metrics_bytes((1, N, d), token_names, 8)[0] if token_names else 0, map_copies * heads * N * N * 8)
    return ProbeMemory(int(weights), int(records + maps + max(forward, measure)))



def _probe_library(library: LibraryModel, windows: Windows, metrics: Sequence[str] | None, batch_size: int,
                   exclude_special: bool, progress: bool | None, per_window: bool, refused: list[str]) -> pd.DataFrame:
    """:func:`probe` of a TransformerLens or nnsight model (:mod:`rankcollapse.models.lens`): the
    ``hidden_states`` points the library records, measured and summarised as for a transformers model.

    Raises
    ------
    ConfigError
        ``refused`` names an option given (an intervention, other ``points``), or ``metrics``
        names attention or sink metrics: the library runs the model unchanged and records
        the ``hidden_states`` points only.
    """
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
    df = _summarise(values, [(p, names) for p in library.points], [], per_window, library.points)
    df.attrs.update(model=loaded.name, family=loaded.family, notes=list(loaded.notes), library=library.library,
                    mask=None, d_qk_scale=1.0, d_qk=None, drop=[], n_samples=windows.n_samples, n_tokens=windows.n_tokens)
    return df


def _with_ablation(loaded: LoadedModel, windows: Windows, edits: Mapping[str, EditFn] | None,
                   ablation: HeadAblation | None, batch_size: int, settings: dict[str, Any]) -> dict[str, EditFn]:
    """``edits`` plus the edits of ``ablation`` (a layer's ablation runs after a user's
    edit of the same ``layer.k.heads`` point); mean ablation measures the means first."""
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


def _probe_batch(loaded: LoadedModel, windows: Windows, rows: range, settings: dict[str, Any], point_list: list[str], names: Sequence[str], exclude_special: bool,
                 values: dict[tuple[str, str], list[torch.Tensor]], attn_names: tuple[str, ...] = (),
                 sinks: Sequence[str] = (), edits: Mapping[str, EditFn] | None = None,
                 clip_records: list[dict[str, Any]] | None = None,
                 zeroed: Mapping[str, Sequence[int]] | None = None) -> None:
    """One forward pass over the batch ``windows`` (rows ``rows`` of the probed ones) under ``settings``
    (keywords of :func:`~rankcollapse.models.intervene`, the mask resolved by
    :func:`~rankcollapse.masks.schedule_or_mask`); appends each point's
    metrics ``(batch,)`` to ``values[(point, metric)]`` (with ``attn_names``, also those
    metrics of :data:`~rankcollapse.metrics.ATTENTION_METRICS` of every block's attention; with ``sinks``, those of :mod:`~rankcollapse.models.sinks`)."""
    ids, am = windows.input_ids, windows.attention_mask
    stack_list = families.stacks(loaded.model, loaded.family) if sinks else []
    rec, vrec, clips = _record_batch(loaded, model_inputs(loaded, ids, am), am, settings, point_list,
                                     bool(attn_names) or bool(sinks),
                                     stack_list if set(sinks) & set(VALUE_METRICS) else [], edits, rows)
    if clip_records is not None:
        clip_records.extend(r for clip in clips for r in clip.records(rows.start))
    add_point_metrics(rec.outputs, tuple(ids.shape), windows.real(exclude_special), names, values)
    if sinks:
        def padding_of(point: str) -> torch.Tensor:  # keys and queries: every real token
            return decoder_padding(am.bool()) if point.startswith("decoder.") else am.bool()

        found = sink_values(rec.attention_maps, vrec.outputs, stack_list, loaded.model.config, padding_of, tuple(sinks),
                            zeroed)
        for key, v in found.items():
            values.setdefault(key, []).append(v.detach().cpu().double())
    if attn_names:
        add_attention_metrics(rec.attention_maps, loaded.family, loaded.model.config.model_type, settings["mask"], am,
                              attn_names, values)


def add_attention_metrics(maps: dict[str, torch.Tensor], family_name: str, model_type: str | None, mask: Any,
                          am: torch.Tensor, metrics: Sequence[str],
                          values: dict[tuple[str, str], list[torch.Tensor]]) -> None:
    """The ``metrics`` (names in :data:`~rankcollapse.metrics.ATTENTION_METRICS`) of each
    block's attention probabilities ``(B, H, N, N)`` of one batch, appended to
    ``values[(point, metric)]``: allowed keys as :func:`allowed_keys` (``mask`` resolved by
    :func:`~rankcollapse.masks.schedule_or_mask`), less padding (``am``, ``(B, N)``, 1 = real). The live probe and the tables of saved states both
    measure here."""
    for name, A in maps.items():
        decoder = name.startswith("decoder.")
        pad = decoder_padding(am.bool()) if decoder else am.bool()  # keys: every real token
        allowed = allowed_keys(family_name, model_type, mask, name, int(am.shape[-1]))
        for metric in metrics:
            v = ATTENTION_METRICS[metric].fn(A, allowed, padding_mask=pad.to(A.device))
            values.setdefault((name, metric), []).append(v.detach().cpu().double())


def _record_batch(loaded: LoadedModel, inputs: dict[str, torch.Tensor], am: torch.Tensor, settings: dict[str, Any],
                  point_list: list[str], attentions: bool = False, value_stacks: Sequence[Any] = (),
                  edits: Mapping[str, EditFn] | None = None,
                  window_rows: range | None = None) -> tuple[Recorder, ValueRecorder, list[Any]]:
    """One forward pass of ``inputs`` under the interventions ``settings`` (keywords of
    :func:`~rankcollapse.models.intervene`: ``mask``, ``d_qk_scale``, ``drop``,
    ``clip_massive``), recording ``point_list``
    (and attention probabilities, and the values of ``value_stacks``); also returns the
    :class:`~rankcollapse.models.massive.MassiveClip` of each stack (with ``clip_massive``).

    Raises
    ------
    ModelError
        A ``module:PATH`` point whose module did not run.
    """
    with intervene(loaded, **settings, attention_mask=am, edits=edits, windows=window_rows) as clips:
        with Recorder(loaded, point_list, attentions=attentions) as rec, ValueRecorder(list(value_stacks)) as vrec:
            loaded.model(**inputs)
    _check_ran([p for p in point_list if p.startswith(MODULE_PREFIX)], rec)
    return rec, vrec, clips


def add_point_metrics(outputs: dict[str, Any], shape: tuple[int, int], real: torch.Tensor, names: Sequence[str],
                      values: dict[tuple[str, str], list[torch.Tensor]]) -> None:
    """The token metrics of each recorded point of one batch: appends ``(batch,)`` float64
    values to ``values[(point, metric)]``.

    ``outputs``: point name -> tokens ``(B, N, d)`` of the batch (``B, N = shape``);
    ``real``: bool ``(B, N)``, the tokens that enter the metrics (a ``decoder.`` point
    uses the right-shifted mask, :func:`decoder_padding`). The live probe and the
    tables of saved states (:mod:`rankcollapse.models.states`) both measure here.
    """
    for name, X in outputs.items():
        pad = decoder_padding(real) if name.startswith("decoder.") else real
        if name.startswith(MODULE_PREFIX):
            X = _module_tokens(name, X, shape)
        result = compute_metrics(X, list(names), padding_mask=pad.to(X.device), dtype=torch.float64)
        for metric, v in result.items():
            values.setdefault((name, metric), []).append(v.detach().cpu().double())


def _module_tokens(name: str, X: Any, shape: tuple[int, int]) -> torch.Tensor:
    """A ``module:PATH`` output as tokens ``(B, N, width)``.

    Raises
    ------
    ModelError
        The output is not a tensor of shape ``(B, N, width)`` for the batch's ``(B, N)``
        (e.g. a ModuleList, a head's logits are fine, an attention map is not).
    """
    if not isinstance(X, torch.Tensor) or X.ndim != 3 or tuple(X.shape[:2]) != shape:
        got = tuple(X.shape) if isinstance(X, torch.Tensor) else type(X).__name__
        raise ModelError(f"{name}: the module's output {got} is not tokens (B, N, width) for B, N = {shape}; "
                         "record a module whose output (or element 0 of it) holds one vector per token")
    return X


def allowed_keys(family_name: str, model_type: str | None, mask: Any, point: str, n_tokens: int) -> torch.Tensor:
    """Bool ``(N, N)`` (``N = n_tokens``): the keys each query of the attention at
    ``point`` (``{prefix}layer.k.attention``) may attend to before padding: ``mask``
    (resolved by :func:`~rankcollapse.masks.schedule_or_mask`; a schedule's layer ``k``),
    else the family's own pattern (causal for causal families and T5's decoder, complete
    otherwise; :func:`~rankcollapse.models.families.native_mask`, no model needed)."""
    from ..masks import dense_mask

    k = int(point.rsplit(".", 2)[-2])
    if mask is None:
        causal = point.startswith("decoder.")  # T5's decoder
        return dense_mask("causal" if causal else families.native_mask(family_name, model_type), n_tokens)
    if isinstance(mask, MaskSchedule):
        return mask.layer(k).to_dense()
    return dense_mask(mask, n_tokens)


@torch.no_grad()
def attention_maps(loaded: Any, windows: Windows, intervention: Intervention | None = None, *,
                   batch_size: int = 8) -> dict[str, torch.Tensor]:
    """Self-attention probabilities of every block on ``windows``, under the same
    :class:`Intervention` as :func:`probe` (installed by the same code), so the maps are
    those of the forward pass whose table :func:`probe` gives.

    Recorded by :class:`Recorder` ``(attentions=True)``: an SDPA model keeps SDPA and
    its rows are recomputed from the queries and keys the kernel receives (equal to
    eager attention's within float round-off); any other model runs with eager
    attention for the call (switched and restored), so the maps are exactly its own
    ``output_attentions``.

    Returns
    -------
    dict[str, torch.Tensor]
        ``{prefix}layer.k.attention`` -> float32 ``(B, H, N, N)`` on CPU; row i of a
        real query sums to 1 over the real keys (padding keys get 0).

    Raises
    ------
    ModelError
        The model cannot switch to eager attention or returns no probabilities.
    ConfigError
        Token ids beyond the model's embeddings (:func:`check_token_ids`).
    """
    net = as_intervention(intervention)
    check_windows(windows)
    batch_size = check_int(batch_size, "batch_size", low=1)
    loaded = as_loaded(loaded)
    d_qk_scale = d_qk_scale_for(loaded, net.d_qk, net.d_qk_scale)
    check_token_ids(loaded, windows)
    settings = dict(mask=schedule_or_mask(net.mask, windows.n_tokens), d_qk_scale=d_qk_scale, drop=net.drop,
                    clip_massive=net.clip_massive)
    all_edits = _with_ablation(loaded, windows, net.edits, net.ablate_heads, batch_size, settings)
    parts: dict[str, list[torch.Tensor]] = {}
    for rows, w in windows.batches(batch_size):
        rec, _, _ = _record_batch(loaded, model_inputs(loaded, w.input_ids, w.attention_mask), w.attention_mask,
                                  settings, [], True, edits=all_edits, window_rows=rows)
        for name, a in rec.attention_maps.items():
            parts.setdefault(name, []).append(a.float().cpu())
    return {name: torch.cat(chunks) for name, chunks in parts.items()}


def _stack_of(name: str, stack_list: list[families.Stack]) -> families.Stack:
    for stack in stack_list:
        if stack.prefix and name.startswith(stack.prefix):
            return stack
    return stack_list[0]


def _point_list(loaded: Any, points: Sequence[str] | str) -> list[str]:
    """Point names of ``points``: ``"hidden_states"``/``"all"``, a list, or a comma-separated
    string whose ``module:PATH`` items are recorded beside the ``hidden_states`` points
    (beside all points with ``all`` among the items)."""
    if not isinstance(points, str):
        return list(points)
    base, modules = check_points(points)
    return default_points(loaded, base) + modules


def check_points(points: str) -> tuple[str, list[str]]:
    """``(base, module items)`` of a comma-separated ``points`` string, checked without a
    model: ``base`` is ``hidden_states`` (the default) or ``all``; each ``module:PATH``
    item names a module path (resolved once the model is loaded).

    Raises
    ------
    ModelError
        Anything else, or a ``module:`` item without a path.
    """
    items = [p.strip() for p in points.split(",") if p.strip()]
    modules = [p for p in items if p.startswith(MODULE_PREFIX)]
    rest = [p for p in items if not p.startswith(MODULE_PREFIX)]
    if len(rest) > 1 or (rest and rest[0] not in ("hidden_states", "all")):
        raise ModelError(f"--points {points!r}: give hidden_states or all, plus any module:PATH items")
    empty = [p for p in modules if not p[len(MODULE_PREFIX):].strip()]
    if empty:
        raise ModelError(f"--points {points!r}: {empty[0]!r} names no module; write module:PATH "
                         "(a named_modules() path)")
    return (rest[0] if rest else "hidden_states"), modules


def _module_depths(loaded: Any, point_list: list[str], stack_list: list) -> dict[str, int]:
    """Layer index of each ``module:PATH`` point (:func:`~rankcollapse.models.recorder.module_depth`)."""
    return {p: module_depth(stack_list, module_tap(loaded.model, p).module, p[len(MODULE_PREFIX):])
            for p in point_list if p.startswith(MODULE_PREFIX)}


def _summarise(values: dict, point_metrics: list[tuple[str, Sequence[str]]], stack_list: list,
               per_window: bool = False, depths: dict[str, int] | None = None) -> pd.DataFrame:
    """``point_metrics``: ``(point, metric names)`` in table order; ``depths`` gives the
    layer of points :func:`families.depth_of` cannot place (``module:PATH``)."""
    depths = depths or {}
    keyed = {
        (depths[name] if name in depths else families.depth_of(name, _stack_of(name, stack_list)), name, metric):
            values[(name, metric)]
        for name, names in point_metrics
        for metric in names
    }
    return summary_table(keyed, per_window=per_window)


def layernorm_rank_note(loaded: Any, windows: Windows, table: pd.DataFrame) -> str | None:
    """One line explaining rank ``d − 1`` at LayerNorm outputs, or None.

    LayerNorm centres every token (its ``d`` entries sum to 0 before the affine map), so
    with zero bias (a random-init model's, or any LayerNorm without bias) its ``(N, d)``
    outputs lie in the ``(d − 1)``-dimensional subspace orthogonal to the all-ones
    direction: with ``N >= d`` the numerical rank is at most ``d − 1`` (``rank_fraction``
    ``(d − 1) / d``, ``sigma_min`` at rounding), whatever the tokens. Returned when the
    model has a ``torch.nn.LayerNorm``, every window has at least ``d`` real tokens and
    some point's measured ``rank_fraction`` (mean over windows) is exactly ``(d − 1) / d``;
    the note names those points. Rank is measured in the full space, not the centred one.
    """
    d = int(loaded.model.config.hidden_size)
    if not any(isinstance(m, torch.nn.LayerNorm) for m in loaded.model.modules()):
        return None
    if int(windows.attention_mask.sum(dim=-1).min()) < d:
        return None
    rows = table[table["metric"] == "rank_fraction"]
    points = [p for p, v in zip(rows["point"], rows["mean"]) if abs(float(v) - (d - 1) / d) < 0.5 / d**2]
    if not points:
        return None
    shown = ", ".join(points[:4]) + (f" and {len(points) - 4} more" if len(points) > 4 else "")
    return (f"note: rank_fraction {d - 1}/{d} at {shown} is LayerNorm's centring, not collapse: LayerNorm makes "
            f"every token's {d} entries sum to 0 before its affine map, so with zero bias (untrained) its N >= d "
            f"outputs span at most d - 1 = {d - 1} dimensions (sigma_min ~ 0 there)")


# Families whose position information acts inside attention (RoPE, relative bias), so
# the embeddings of repeated tokens are identical rows.
def distinct_token_fraction(windows: Windows, dim: int) -> torch.Tensor:
    """Per window, ``#distinct real token ids / min(n_real, dim)``, shape ``(B,)``: the
    largest rank the embeddings can have when position is not in them."""
    real = windows.attention_mask.bool()
    return distinct_tokens(windows.input_ids, real) / torch.clamp(real.sum(dim=-1), max=dim)


def embedding_rank_note(loaded: Any, windows: Windows, table: pd.DataFrame) -> str | None:
    """One line explaining a rank-deficient embedding layer, or None.

    For families that add position inside attention (Llama: RoPE; T5: relative bias)
    the input embeddings carry no position, so repeated tokens give identical rows:
    ``rank_fraction`` of layer 0 is the fraction of distinct tokens and ``sigma_min`` is
    0 up to rounding. Returned only when the measured ``rank_fraction`` equals that
    fraction (mean over windows, special tokens included), i.e. repetition explains it.
    """
    how = families.family(loaded.family).position_in_attention
    name = families.stacks(loaded.model, loaded.family)[0].prefix + "embeddings"
    rows = table[(table["point"] == name) & (table["metric"] == "rank_fraction")]
    if how is None or rows.empty or float(rows["mean"].iloc[0]) >= 1.0:
        return None
    measured = float(rows["mean"].iloc[0])
    expected = float(distinct_token_fraction(windows, int(loaded.model.config.hidden_size)).double().mean())
    if abs(measured - expected) > 1e-6:
        return None
    return (
        f"note: layer 0 ({name}) rank_fraction {measured:.3g} < 1 is not collapse: {how} acts inside attention, "
        f"so the input embeddings carry no position and repeated tokens give identical rows "
        f"({expected:.3g} of tokens are distinct; sigma_min ~ 0 there)"
    )
