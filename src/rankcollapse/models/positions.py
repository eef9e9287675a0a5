"""The window length against a model's position table: :func:`check_positions` on a loaded
model, :func:`check_source_positions` from the source's ``config.json`` before the model (or
the windows) are loaded, so a too-long ``--n-tokens`` is refused before any other work."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError


def position_limit(config: Any) -> int | None:
    """The number of positions ``config`` gives (``max_position_embeddings`` or ``n_positions``);
    None when it has none (relative positions: T5)."""
    return next((getattr(config, k) for k in ("max_position_embeddings", "n_positions")
                 if isinstance(getattr(config, k, None), int)), None)


def check_positions(loaded: Any, length: int) -> None:
    """:class:`ConfigError` for windows longer than the model's position table."""
    _check(position_limit(getattr(loaded.model, "config", None)), length, getattr(loaded, "name", "the model"))


def check_source_positions(name_or_path: str, length: int, *, gguf_file: str | None = None,
                           local_files_only: bool | None = None) -> None:
    """:func:`check_positions` of the model :func:`~rankcollapse.models.load_model` would load
    (arguments as there), from its configuration alone; a configuration that cannot be read is
    left to the load to report."""
    from transformers import AutoConfig

    from ._quiet import quiet_loading
    from .source import _local_only, _source

    source, gguf_file, _ = _source(name_or_path, gguf_file)
    extra = {"gguf_file": gguf_file} if gguf_file is not None else {}
    try:
        with quiet_loading():
            config = AutoConfig.from_pretrained(source, local_files_only=_local_only(local_files_only),
                                                trust_remote_code=False, **extra)
    except Exception:  # noqa: BLE001 - load_model names a source or configuration it cannot read
        return
    _check(position_limit(config), length, str(name_or_path))


def _check(limit: int | None, length: int, name: str) -> None:
    if limit is not None and length > limit:
        raise ConfigError(f"windows of {length} tokens exceed {name}'s {limit} positions; "
                          f"use windows of at most {limit} tokens")
