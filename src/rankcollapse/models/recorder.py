"""Record named activations of an unmodified Hugging Face model with forward hooks, in
the manner of baukit's ``nethook.Trace``: hooks are installed on entry and removed on
exit. Point names: docs/models.md, "Point names".
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import defaultdict
from typing import Any, Iterable

import torch
from torch import nn

from torch.overrides import TorchFunctionMode

from ..errors import ModelError
from . import families
from .families import Stack, Tap
from .loading import as_loaded


class StopForward(Exception):
    """Raised once every requested point is captured (``Recorder(stop=True)``); swallowed
    by the recorder's ``with`` block."""


def resolve_points(stack_list: list[Stack]) -> dict[str, tuple[Tap, int]]:
    """Every point name of every stack -> (tap, occurrence), where occurrence counts
    earlier calls of the same module (ALBERT's shared layer fires once per depth)."""
    table: dict[str, tuple[Tap, int]] = {}
    for stack in stack_list:
        p, blocks = stack.prefix, stack.blocks
        table[f"{p}embeddings"] = (Tap(blocks[0].block, "input"), 0)
        for k, parts in enumerate(blocks):
            occ = sum(1 for j in range(k) if blocks[j].block is parts.block)
            table[f"{p}layer.{k}.input"] = (Tap(parts.block, "input"), occ)
            table[f"{p}layer.{k}.output"] = (Tap(parts.block, "output", 0), occ)
            for j, norm in enumerate(parts.norms):
                table[f"{p}layer.{k}.norm_{j + 1}"] = (Tap(norm, "output", 0), occ)
            for name, proj in (("heads", parts.out_proj), ("cross_heads", parts.cross_out_proj)):
                if proj is not None:  # its input: the heads side by side
                    table[f"{p}layer.{k}.{name}"] = (Tap(proj, "input"), occ)
            for name, sub in (("attn_output", parts.attn), ("mlp_output", parts.mlp)):
                if sub is not None:
                    table[f"{p}layer.{k}.{name}"] = (sub.branch, occ)
        if stack.final_norm is not None:
            table[f"{p}final_norm"] = (Tap(stack.final_norm, "output", 0), 0)
    return table


MODULE_PREFIX = "module:"


def module_tap(model: nn.Module, name: str) -> Tap:
    """The output (element 0 of a tuple) of the submodule a ``module:PATH`` point names
    (any ``named_modules()`` path; a leading ``model.`` is accepted); :class:`ModelError`
    when there is none."""
    path = name[len(MODULE_PREFIX):]
    names = dict(model.named_modules())
    for candidate in (path, path.partition(".")[2] if path.startswith("model.") else None):
        if candidate and candidate in names:
            return Tap(names[candidate], "output", 0)
    near = [n for n in names if n and n.split(".")[-1] == path.split(".")[-1]][:4] or [n for n in names if n][:4]
    raise ModelError(f"no module {path!r} in {type(model).__name__} for the point {name!r}; "
                     f"named_modules() has e.g. {near}")


def module_depth(stack_list: list[Stack], module: nn.Module, path: str) -> int:
    """``hidden_states`` index of a module point: k + 1 inside block k; L for a module that
    holds blocks or runs after them (final norm, head); 0 for one that runs before them."""
    stack = stack_list[-1]
    for s_ in stack_list:
        for k, parts in enumerate(s_.blocks):
            if any(m is module for m in parts.block.modules()):
                return k + 1
            if any(m is parts.block for m in module.modules()):
                return s_.n_layers
    if stack.final_norm is not None and any(m is module for m in stack.final_norm.modules()):
        return stack.n_layers
    return stack.n_layers if "head" in path.rsplit(".", 1)[-1] else 0


def token_shape(args: tuple, kwargs: dict) -> tuple[int, int] | None:
    """``(B, N)`` of a model call's ``input_ids`` (or ``inputs_embeds``, or first argument)."""
    for x in (kwargs.get("input_ids"), kwargs.get("inputs_embeds"), args[0] if args else None):
        if isinstance(x, torch.Tensor) and x.ndim >= 2:
            return int(x.shape[0]), int(x.shape[1])
    return None


def as_tokens(X: torch.Tensor, shape: tuple[int, int] | None) -> torch.Tensor:
    """``X`` viewed as ``(B, N, width)`` where its module flattened the tokens to
    ``(B·N, width)`` (OPT's MLP); any other tensor as it is."""
    if shape is not None and X.ndim == 2 and X.shape[0] == shape[0] * shape[1]:
        return X.view(*shape, X.shape[-1])
    return X


def register_hook(module: nn.Module, io: str, hook: Any) -> Any:
    """A forward pre-hook with keyword arguments on ``module`` for ``io="input"``, else a forward hook; its handle."""
    if io == "input":
        return module.register_forward_pre_hook(hook, with_kwargs=True)
    return module.register_forward_hook(hook)


def _pick(value: Any, index: int) -> torch.Tensor:
    if isinstance(value, (tuple, list)):
        value = value[index]
    elif hasattr(value, "to_tuple"):  # a ModelOutput
        value = value.to_tuple()[index]
    return value


class _PointHooks(ABC):
    """Forward hooks at the taps of named points, installed inside a ``with`` block; a module that
    runs several times in a forward pass (ALBERT's shared layer) is told apart by counting its
    calls. What :meth:`_visit` returns (not None) replaces the tensor."""

    def __init__(self, model: nn.Module, taps: Iterable[tuple[str, Tap, int, Any]]):
        self.model = model
        # (module id, io) -> occurrence -> [(name, index, extra)]
        self._plan: dict[tuple[int, str], dict[int, list[tuple[str, int, Any]]]] = \
            defaultdict(lambda: defaultdict(list))
        self._modules: dict[tuple[int, str], nn.Module] = {}
        for name, tap, occ, extra in taps:
            key = (id(tap.module), tap.io)
            self._plan[key][occ].append((name, tap.index, extra))
            self._modules[key] = tap.module
        self._calls: dict[tuple[int, str], int] = defaultdict(int)
        self._tokens: tuple[int, int] | None = None  # (B, N) of the running forward pass
        self._handles: list[Any] = []

    @abstractmethod
    def _visit(self, key: tuple[int, str], value: Any) -> Any:
        """What the hook at ``key`` does with ``value`` (a tensor to replace it, or None)."""

    def _entries(self, key: tuple[int, str]) -> list[tuple[str, int, Any]]:
        occ = self._calls[key]
        self._calls[key] = occ + 1
        return self._plan[key].get(occ, [])

    def _reset(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self._tokens = token_shape(args, kwargs)
        self._calls.clear()

    def _install(self) -> None:
        self._handles.append(self.model.register_forward_pre_hook(self._reset, with_kwargs=True))
        for key, module in self._modules.items():
            hook = self._input_hook(key) if key[1] == "input" else self._output_hook(key)
            self._handles.append(register_hook(module, key[1], hook))

    def _input_hook(self, key: tuple[int, str]):
        def hook(module: nn.Module, args: tuple, kwargs: dict):
            new = self._visit(key, args[0] if args else kwargs["hidden_states"])
            if new is None:
                return None
            return ((new,) + args[1:], kwargs) if args else (args, dict(kwargs, hidden_states=new))

        return hook

    def _output_hook(self, key: tuple[int, str]):
        def hook(module: nn.Module, args: tuple, output: Any):
            return self._visit(key, output)

        return hook

    def _remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def __enter__(self) -> Any:
        self._install()
        return self

    def __exit__(self, *exc: Any) -> Any:
        self._remove()


class Recorder(_PointHooks):
    """Context manager capturing named points of a model during its forward passes.

    Parameters
    ----------
    loaded : LoadedModel (or any object with ``.model`` and ``.family``).
    points : point names, or ``module:PATH`` (:func:`module_tap`); None = the
        ``hidden_states`` points of every stack.
    stop : raise :class:`StopForward` once every point is captured, skipping the rest of
        the model.
    attentions : also record every block's self-attention probabilities: recomputed from
        the arguments of each SDPA call (:class:`SdpaRows`), or, for other models, with
        eager attention and ``output_attentions=True`` inside the block.

    Attributes
    ----------
    outputs : dict[str, torch.Tensor]
        Point name -> tensor ``(B, N, d)`` from the latest forward pass (detached).
    attention_maps : dict[str, torch.Tensor]
        With ``attentions=True``: ``{prefix}layer.k.attention`` -> ``(B, H, N, N)``.

    Raises
    ------
    ModelError
        A requested point does not exist in this model.

    See Also
    --------
    probe : metrics of the recorded points, summarised over windows.
    rankcollapse.models.families.point_names : the point names of a model.

    Examples
    --------
    >>> import torch, transformers
    >>> _ = torch.manual_seed(0)
    >>> config = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=50, bos_token_id=0, eos_token_id=0)
    >>> model = transformers.GPT2Model(config).eval()  # a tiny randomly initialised GPT-2
    >>> ids = torch.tensor([[1, 2, 3, 4]])
    >>> with Recorder(model, ["embeddings", "layer.0.output"]) as rec:
    ...     _ = model(ids)
    >>> {name: tuple(X.shape) for name, X in rec.outputs.items()}  # (B, N, d)
    {'embeddings': (1, 4, 16), 'layer.0.output': (1, 4, 16)}
    >>> torch.equal(rec.outputs["layer.0.output"], model(ids, output_hidden_states=True).hidden_states[1])
    True
    """

    def __init__(self, loaded: Any, points: Iterable[str] | None = None, *, stop: bool = False,
                 attentions: bool = False):
        loaded = as_loaded(loaded)
        self.stacks = families.stacks(loaded.model, loaded.family)
        table = resolve_points(self.stacks)
        if points is None:
            points = [n for s in self.stacks for n in families.point_names(s)]
        self.points = list(points)
        for p in self.points:
            if p.startswith(MODULE_PREFIX) and p not in table:
                table[p] = (module_tap(loaded.model, p), 0)
        unknown = [p for p in self.points if p not in table]
        if unknown:
            raise ModelError(f"unknown recording point(s) {unknown[:5]} for family {loaded.family!r}; "
                             f"available e.g. {list(table)[:6]}")
        super().__init__(loaded.model, [(name, *table[name], None) for name in self.points])
        self.stop = stop
        self.attentions = attentions
        self.attention_maps: dict[str, torch.Tensor] = {}
        self._previous_impl: str | None = None
        self._rows: SdpaRows | None = None
        self.outputs: dict[str, torch.Tensor] = {}

    def _visit(self, key: tuple[int, str], value: Any) -> None:
        for name, index, _ in self._entries(key):
            X = _pick(value, index).detach()
            self.outputs[name] = X if name.startswith(MODULE_PREFIX) else as_tokens(X, self._tokens)
        if self.stop and len(self.outputs) == len(self.points):
            raise StopForward()

    def _reset(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        super()._reset(module, args, kwargs)
        self.outputs = {}
        self.attention_maps.clear()  # the same dict SdpaRows fills

    def _store_attentions(self, module: nn.Module, args: tuple, output: Any) -> None:
        for stack in self.stacks:
            field = {"": "attentions", "encoder.": "encoder_attentions", "decoder.": "decoder_attentions"}[stack.prefix]
            maps = getattr(output, field, None)
            if not maps or any(m is None for m in maps):
                raise ModelError(f"{type(module).__name__} returned no attention probabilities in {field!r}")
            for k, a in enumerate(maps):
                self.attention_maps[f"{stack.prefix}layer.{k}.attention"] = a.detach()

    def __enter__(self) -> "Recorder":
        self._reset(self.model, (), {})
        if self.attentions and SdpaRows.applies(self.model, self.stacks):
            self._rows = SdpaRows(self.stacks, self.attention_maps)
            self._handles.extend(self._rows.hooks())
            self._handles.append(self.model.register_forward_hook(self._rows.check))
            self._rows.__enter__()
        elif self.attentions:
            self._previous_impl = switch_attention(self.model, "eager")
            self._handles.append(self.model.register_forward_pre_hook(_ask_attentions, with_kwargs=True))
            self._handles.append(self.model.register_forward_hook(self._store_attentions))
        self._install()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        if self._rows is not None:
            self._rows.__exit__(None, None, None)
            self._rows = None
        self._remove()
        if self._previous_impl is not None:
            switch_attention(self.model, self._previous_impl)
            self._previous_impl = None
        return exc_type is not None and issubclass(exc_type, StopForward)


class SdpaRows(TorchFunctionMode):
    """Attention probabilities of an SDPA model, recomputed from what each block's
    self-attention passes to ``scaled_dot_product_attention`` (queries and keys as the
    kernel uses them): ``softmax(q kᵀ · scale + mask)`` as eager attention forms it.
    Calls are named by forward hooks on each block's self-attention; cross-attention is not
    recorded.
    """

    def __init__(self, stack_list: list[Stack], maps: dict[str, torch.Tensor]):
        super().__init__()
        self.maps = maps
        self._current: str | None = None
        self._names: dict[int, list[str]] = defaultdict(list)
        for stack in stack_list:
            for k, parts in enumerate(stack.blocks):
                self._names[id(parts.self_attn)].append(f"{stack.prefix}layer.{k}.attention")
        self._modules = {id(p.self_attn): p.self_attn for s in stack_list for p in s.blocks}

    @staticmethod
    def applies(model: nn.Module, stack_list: list[Stack]) -> bool:
        """The model runs SDPA attention and every block names its self-attention."""
        return (getattr(model.config, "_attn_implementation", None) == "sdpa"
                and all(p.self_attn is not None for s in stack_list for p in s.blocks))

    def hooks(self) -> list[Any]:
        """Install the hooks that name the running block; returns their handles."""
        handles = []
        for key, module in self._modules.items():
            def enter(module: nn.Module, args: tuple, key: int = key) -> None:
                done = sum(1 for n in self._names[key] if n in self.maps)
                self._current = self._names[key][min(done, len(self._names[key]) - 1)]

            def leave(module: nn.Module, args: tuple, output: Any) -> None:
                self._current = None

            handles.append(module.register_forward_pre_hook(enter))
            handles.append(module.register_forward_hook(leave))
        return handles

    def check(self, module: nn.Module, args: tuple, output: Any) -> None:
        """:class:`ModelError` when a block's self-attention did not call SDPA."""
        missing = [n for names in self._names.values() for n in names if n not in self.maps]
        if missing:
            raise ModelError(f"{type(module).__name__}: {missing[0]} did not call scaled_dot_product_attention; "
                             "load the model with attn_implementation='eager' to record its attention")

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention and self._current is not None:
            self.maps[self._current] = sdpa_probabilities(*args, **kwargs).detach()
        return func(*args, **kwargs)


def sdpa_probabilities(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor | None = None,
                       attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False,
                       scale: float | None = None, enable_gqa: bool = False) -> torch.Tensor:
    """The probabilities ``(B, H, N, M)`` that ``scaled_dot_product_attention`` applies to
    the values (without dropout), formed as transformers' eager attention forms them."""
    from transformers.integrations.sdpa_attention import repeat_kv

    key = repeat_kv(key, query.shape[-3] // key.shape[-3])  # (B, H, M, d_head)
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.matmul(query, key.transpose(-2, -1)) * scale  # (B, H, N, M)
    if is_causal:
        attn_mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.where(attn_mask, torch.zeros((), dtype=scores.dtype, device=scores.device),
                                torch.finfo(scores.dtype).min)
    if attn_mask is not None:
        scores = scores + attn_mask
    return torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)


def _ask_attentions(module: nn.Module, args: tuple, kwargs: dict):
    return args, dict(kwargs, output_attentions=True)


def switch_attention(model: nn.Module, implementation: str) -> str:
    """Set the attention implementation with transformers' ``set_attn_implementation``;
    returns the previous one. :class:`ModelError` when the model cannot switch."""
    previous = getattr(model.config, "_attn_implementation", None) or "eager"
    if previous == implementation:
        return previous
    if not hasattr(model, "set_attn_implementation"):
        raise ModelError(f"{type(model).__name__} cannot switch to {implementation} attention")
    try:
        model.set_attn_implementation(implementation)
    except (ValueError, ImportError) as exc:
        raise ModelError(f"{type(model).__name__} cannot switch to {implementation} attention: {exc}") from None
    return previous
