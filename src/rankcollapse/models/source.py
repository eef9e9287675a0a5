"""What a model name or path stands for, and the checks :func:`~.loading.load_model` makes on
it before loading anything: torch-free, so a dry run (``reproduce --dry-run --model DIR``)
refuses a missing or unreadable model folder with the run's own message, and quickly."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from .. import assets
from ..errors import ModelError

#: The packaged offline models (``rankcollapse.assets``).
PACKAGED = ("minilm", "smollm2")

SMOLLM2_NOTE = ("SmolLM2-135M-Instruct weights are Q4_1 (4-bit) quantised then dequantised to float32: "
                "real pretrained weights with quantisation noise")


def check_model_source(name_or_path: str, *, gguf_file: str | None = None, local_files_only: bool | None = None
                       ) -> bool:
    """Whether ``name_or_path`` is a local model folder, after the checks :func:`~.loading.load_model`
    makes before loading (same messages): a packaged model installed, a local path a folder with
    ``config.json`` (or ``gguf_file``) and readable safetensors headers, offline a name neither a
    folder nor a hub name refused. A hub name is not looked up. Imports no torch.

    Raises
    ------
    AssetMissingError
        ``minilm``/``smollm2`` whose package is not installed.
    ModelError
        Any of the refusals above, or ``gguf_file`` with a packaged model.
    """
    source, gguf_file, _ = _source(name_or_path, gguf_file)
    return _check_source(source, gguf_file, _local_only(local_files_only))


def _local_only(given: bool | None) -> bool:
    """``given``, else offline unless ``HF_HUB_OFFLINE`` is 0/false/no/off."""
    if given is not None:
        return given
    return os.environ.get("HF_HUB_OFFLINE", "1").strip().lower() not in ("0", "false", "no", "off")


def _source(name_or_path: str, gguf_file: str | None) -> tuple[str, str | None, list[str]]:
    """``(source, gguf_file, notes)`` that :func:`~.loading.load_model` loads for ``name_or_path``."""
    key = str(name_or_path).strip().lower()
    if not key:  # "" would read as the working directory, " " as a hub name
        raise ModelError(f"model {str(name_or_path)!r} is empty; give 'minilm', 'smollm2', a model folder or a hub name")
    if key in PACKAGED and gguf_file is not None:
        raise ModelError(f"gguf_file {gguf_file!r} does not apply to {key!r}: its weights file is fixed by its package")
    if key == "minilm":
        return str(assets.minilm_dir()), None, ["all-MiniLM-L6-v2 (sentence-transformers), fp32 weights, post-LN BERT encoder"]
    if key == "smollm2":
        folder, gguf = assets.smollm2_gguf()
        return str(folder), gguf, [SMOLLM2_NOTE]
    return str(name_or_path), gguf_file, [f"weights dequantised from GGUF file {gguf_file}"] if gguf_file else []


def _check_source(source: str, gguf_file: str | None, local_files_only: bool) -> bool:
    """Whether ``source`` is local (then checked); offline, a name neither a folder nor a hub name is refused."""
    is_local = Path(source).exists()
    if is_local:
        _check_local(Path(source), gguf_file)
    if not is_local and local_files_only and not _looks_like_hub_name(source):
        raise ModelError(f"model {source!r} is neither 'minilm', 'smollm2', a local folder nor a hub name")
    return is_local


def _check_local(path: Path, gguf_file: str | None) -> None:
    """A local source must be a folder with ``config.json`` (or the GGUF file) and readable safetensors headers."""
    if not path.is_dir():
        raise ModelError(f"model path {str(path)!r} is not a folder; give a folder with config.json and weights")
    need = gguf_file if gguf_file is not None else "config.json"
    if not (path / need).is_file():
        raise ModelError(f"model folder {str(path)!r} has no {need}; it is not a Hugging Face model folder")
    if gguf_file is None:
        _check_config(path / need)
    from safetensors import safe_open

    for weights in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(str(weights), framework="numpy") as f:  # the header only; numpy: no torch import
                f.keys()
        except Exception as exc:  # safetensors raises its own SafetensorError (and OSError)
            raise ModelError(f"weights file {str(weights)!r} is corrupt or truncated: "
                             f"{str(exc).splitlines()[0][:200]}") from None


def _check_config(path: Path) -> None:
    """:class:`ModelError` unless ``path`` (a model's ``config.json``) holds a JSON object."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise ModelError(f"model config {str(path)!r} is not readable JSON ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0][:120] if str(exc) else ''})") from None
    if not isinstance(config, dict):
        raise ModelError(f"model config {str(path)!r} holds a JSON {type(config).__name__}, not an object of settings")


def _looks_like_hub_name(source: str) -> bool:
    """``NAME`` or ``OWNER/NAME`` of letters, digits, ``-``, ``_`` and ``.`` (not first)."""
    parts = source.split("/")
    return 1 <= len(parts) <= 2 and all(_HUB_PART.fullmatch(p) for p in parts)


#: One part of a hub repository id (the hub's own rule: no spaces, no leading dot).
_HUB_PART = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")
