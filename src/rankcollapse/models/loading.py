"""Load pretrained Hugging Face models and name their family (docs/models.md, "Loading").

``"minilm"`` and ``"smollm2"`` are the packaged offline models (``rankcollapse.assets``);
any other name goes to ``AutoModel.from_pretrained``. ``trust_remote_code`` is never
enabled. Dequantised GGUF weights are cached (:func:`gguf_cache_dir`).
"""

from __future__ import annotations

import json
import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import assets
from .._validate import check_device
from ..errors import ModelError, TokenizerError
from . import families
from ._checkpoint import check_finite_weights, check_loaded_weights
from ._quiet import quiet_loading
# the checks made before loading, torch-free (a dry run makes them too)
from .source import PACKAGED, _check_source, _local_only, _looks_like_hub_name, _source


FAMILIES = (*families.REGISTRY, families.GENERIC.name)


@dataclass
class LoadedModel:
    """A pretrained model in eval mode with its tokenizer.

    Attributes
    ----------
    model : the base model (no task head), weights untouched.
    tokenizer : or None when the source has none usable (``tokenizer_error`` says why).
    family : ``bert, roberta, albert, gpt2, t5, llama`` or ``generic``.
    name : what the caller asked for (``minilm``, a hub name or a path).
    notes : facts that qualify the numbers (e.g. SmolLM2's 4-bit quantisation).
    """

    model: Any
    tokenizer: Any
    family: str
    name: str
    notes: list[str] = field(default_factory=list)
    tokenizer_error: str | None = None

    def require_tokenizer(self) -> Any:
        """The tokenizer, checked to represent text; :class:`TokenizerError` when there is none
        (with ``tokenizer_error`` and the remedies) or it has no ordinary vocabulary."""
        from ..data import TOKENIZER_REMEDY, check_tokenizer

        if self.tokenizer is None:
            why = self.tokenizer_error or f"model {self.name!r} was given without a tokenizer"
            raise TokenizerError(f"{why}; {TOKENIZER_REMEDY}")
        check_tokenizer(self.tokenizer)
        return self.tokenizer

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype


def detect_family(model: Any) -> str:
    """Family of a Hugging Face model from ``config.model_type`` (``generic`` if unknown);
    :class:`ModelError` for an object without a ``config``."""
    config = getattr(model, "config", None)
    if config is None:
        raise ModelError(f"expected a Hugging Face model (with a config), got {type(model).__name__}")
    return families.family_of(getattr(config, "model_type", ""))


def as_loaded(model: Any, tokenizer: Any = None, *, name: str | None = None) -> "LoadedModel":
    """``model`` as a :class:`LoadedModel`: returned as is if it is one (or has ``.model``
    and ``.family``); a ``PreTrainedModel`` is wrapped (its ``base_model``, unmodified).
    :class:`ModelError` for anything else."""
    if isinstance(model, LoadedModel) or (hasattr(model, "model") and hasattr(model, "family")):
        return model
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel):
        raise ModelError("expected a LoadedModel (rankcollapse.models.load_model) or a transformers PreTrainedModel, "
                         f"got {type(model).__name__}")
    base = model.base_model
    label = name or getattr(model.config, "_name_or_path", "") or type(model).__name__
    return LoadedModel(model=base, tokenizer=tokenizer, family=detect_family(base), name=str(label))


def _hub_cache() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def load_model(name_or_path: str, *, gguf_file: str | None = None, dtype: torch.dtype = torch.float32,
               device: str | torch.device = "cpu", attn_implementation: str | None = None,
               local_files_only: bool | None = None, tokenizer: Any = None) -> LoadedModel:
    """Load a pretrained model and its tokenizer for measurement.

    Parameters
    ----------
    name_or_path : ``"minilm"`` (all-MiniLM-L6-v2), ``"smollm2"`` (SmolLM2-135M-Instruct,
        Q4_1 GGUF), a Hugging Face hub name, or a local folder.
    gguf_file : GGUF file inside ``name_or_path`` (dequantised to ``dtype``, cached).
    dtype : parameter dtype after loading.
    device : where the model is placed (default CPU).
    attn_implementation : ``"eager"``, ``"sdpa"``, or None for the transformers default.
    local_files_only : None means True unless ``HF_HUB_OFFLINE=0``.
    tokenizer : None: the source's own (a folder without one gives ``tokenizer=None`` and
        ``tokenizer_error``); a string: ``"minilm"``, ``"smollm2"``, a folder or hub name;
        any other object: used as the tokenizer.

    Raises
    ------
    AssetMissingError
        ``minilm``/``smollm2`` requested but its package is not installed.
    ModelError
        Not a model folder nor available offline, ``gguf_file`` with a packaged model,
        loading failed, or the weights are not all the checkpoint's own finite weights
        (:mod:`rankcollapse.models._checkpoint`).
    TokenizerError
        ``tokenizer`` cannot be loaded, has no ordinary vocabulary, or more tokens than the
        model has embeddings.
    ConfigError
        ``device`` is not a torch device present here.
    MemoryLimitError
        A local ``config.json`` describing more parameters than half the physical memory.

    See Also
    --------
    as_loaded : wrap a model already in memory.
    probe : per-layer metrics of the loaded model.
    Recorder : record its hidden states by name.

    Examples
    --------
    A local folder (here a tiny GPT-2 saved without a tokenizer; ``"minilm"`` and
    ``"smollm2"`` load the packaged models the same way):

    >>> import torch, transformers
    >>> _ = torch.manual_seed(0)
    >>> config = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=50, bos_token_id=0, eos_token_id=0)
    >>> model = transformers.GPT2Model(config).eval()  # a tiny randomly initialised GPT-2
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     model.save_pretrained(folder)
    ...     loaded = load_model(folder)
    >>> loaded.family, loaded.tokenizer is None
    ('gpt2', True)
    >>> next(loaded.model.parameters()).dtype
    torch.float32
    """
    device = check_device(device)
    source, gguf_file, notes = _source(name_or_path, gguf_file)
    local_files_only = _local_only(local_files_only)
    is_local = _check_source(source, gguf_file, local_files_only)
    if is_local and gguf_file is None:
        _check_size(source, dtype)
    cache = _gguf_cache_entry(Path(source) / gguf_file, dtype) if is_local and gguf_file is not None else None
    cached = _read_gguf_cache(*cache) if cache is not None else None
    with quiet_loading():  # no progress bar or warning before the result or the one error line
        if cached is not None:
            model, info = _from_state_dict(source, *cached, dtype, attn_implementation)
        else:
            model, info = _load_online_or_cached(source, gguf_file, dtype, attn_implementation, local_files_only,
                                                 is_local)
    notes += check_loaded_weights(model, info, source)
    check_finite_weights(model, source)
    if cache is not None and cached is None and not info.get("missing_keys"):  # never a model with random weights
        _write_gguf_cache(*cache, model)
    model.to(device)
    model.eval()
    if tokenizer is None:
        tokenizer, why = _own_tokenizer(source, gguf_file, local_files_only)
    else:
        tokenizer, why = _given_tokenizer(tokenizer, getattr(model.config, "vocab_size", None), local_files_only), None
    return LoadedModel(model=model, tokenizer=tokenizer, family=detect_family(model), name=str(name_or_path), notes=notes,
                       tokenizer_error=why)


def model_digest(name_or_path: str, *, gguf_file: str | None = None, local_files_only: bool | None = None) -> str | None:
    """SHA-256 (16 hex digits) of what :func:`load_model` reads for ``name_or_path``, the
    cache key of a model's numbers: a GGUF file; a folder's top-level regular files except
    dot files and ``*.md``; a hub name's cached snapshot, else (online only) ``hub:<commit>``,
    else None. Raises as :func:`load_model` for a packaged model not installed, and
    :class:`ModelError` for files that cannot be read."""
    from .._io import config_hash, file_sha256

    source, gguf_file, _ = _source(name_or_path, gguf_file)
    folder = Path(source)
    if not folder.exists():
        folder = _cached_snapshot(source)
        if folder is None:
            return None if _local_only(local_files_only) or not _looks_like_hub_name(source) else _hub_commit(source)
    try:
        if gguf_file is not None:
            files = {gguf_file: file_sha256(folder / gguf_file)}
        elif folder.is_dir():
            files = {f.name: file_sha256(f) for f in sorted(folder.iterdir())
                     if f.is_file() and not f.name.startswith(".") and f.suffix != ".md"}
        else:
            files = {folder.name: file_sha256(folder)}
    except OSError as exc:
        raise ModelError(f"cannot read model {source!r}: {exc}") from None
    return config_hash(files, 16)


def model_key(name: str) -> dict[str, Any]:
    """``{"model_sha256": digest}`` (:func:`model_digest`) for a cached unit's key, or
    ``{}`` for a packaged model whose files are its pinned version's
    (:data:`rankcollapse.assets.PINNED_DIGESTS`)."""
    digest = model_digest(name)
    return {} if digest == assets.PINNED_DIGESTS.get(str(name).strip().lower()) else {"model_sha256": digest}


def _cached_snapshot(source: str) -> Path | None:
    if not _looks_like_hub_name(source):
        return None
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(source, "config.json")
    except Exception:  # a malformed repo id: nothing cached under it
        return None
    return Path(found).parent if isinstance(found, str) else None


def _hub_commit(source: str) -> str:
    """``hub:<commit>`` of hub model ``source``; ModelError when the hub does not answer or has no such model."""
    _check_hub_reachable(source)
    try:
        from huggingface_hub import HfApi

        return f"hub:{HfApi().model_info(source).sha}"
    except Exception as exc:  # huggingface_hub's own errors (RepositoryNotFoundError, HTTPError)
        raise ModelError(f"cannot find model {source!r} on the hub: {str(exc).splitlines()[0][:200]}") from None


def _check_size(source: str, dtype: torch.dtype) -> None:
    """:class:`MemoryLimitError` for a local model whose ``config.json`` needs over half the physical memory."""
    from transformers import AutoConfig, AutoModel

    from .._memory import default_limit, human
    from ..errors import MemoryLimitError

    try:
        with quiet_loading():
            config = AutoConfig.from_pretrained(source, local_files_only=True, trust_remote_code=False)
            with torch.device("meta"):
                shell = AutoModel.from_config(config, trust_remote_code=False)
    except Exception:  # noqa: BLE001 - transformers' own load reports a config it cannot read
        return
    n = sum(p.numel() for p in shell.parameters())
    need, limit = n * torch.empty((), dtype=dtype).element_size(), default_limit()
    if need > limit:
        raise MemoryLimitError(f"model {source!r}: its config.json describes {n:.3g} parameters, {human(need)} in "
                               f"{str(dtype).replace('torch.', '')}, more than half this machine's memory "
                               f"({human(limit)}); check the sizes in config.json (vocab_size, hidden_size, layers)")


def load_tokenizer(name_or_path: str, *, gguf_file: str | None = None, tokenizer: Any = None,
                   local_files_only: bool | None = None) -> Any:
    """The tokenizer :func:`load_model` would give (arguments as there), checked to represent
    text, without loading the model; :class:`TokenizerError` when there is none usable,
    :class:`ModelError` as :func:`load_model` for a source that is not a model."""
    from ..data import TOKENIZER_REMEDY

    source, gguf_file, _ = _source(name_or_path, gguf_file)
    local_files_only = _local_only(local_files_only)
    is_local = _check_source(source, gguf_file, local_files_only)
    if not is_local and local_files_only:  # a hub name not in the cache is a missing model, not a tokenizer problem
        from transformers import AutoConfig

        extra = {"gguf_file": gguf_file} if gguf_file is not None else {}
        try:
            with quiet_loading():
                AutoConfig.from_pretrained(source, local_files_only=True, trust_remote_code=False, **extra)
        except OSError as exc:
            raise _not_found(source, False, True, exc) from None
        except (ValueError, KeyError):
            pass  # a config transformers cannot read: load_model names it
    if tokenizer is None:
        tokenizer, why = _own_tokenizer(source, gguf_file, local_files_only)
        if tokenizer is None:
            raise TokenizerError(f"{why}; {TOKENIZER_REMEDY}")
    return _given_tokenizer(tokenizer, None, local_files_only)


#: Files (glob patterns) that hold a tokenizer in a Hugging Face folder.
TOKENIZER_FILES = ("tokenizer*.json", "vocab.*", "merges.txt", "*.model")


def _own_tokenizer(source: str, gguf_file: str | None, local_files_only: bool) -> tuple[Any, str | None]:
    """``(tokenizer, None)``, or ``(None, why)`` when the source has no usable tokenizer."""
    from ..data import tokenizer_problem

    folder = Path(source)
    if gguf_file is None and folder.is_dir() and not any(next(folder.glob(p), None) for p in TOKENIZER_FILES):
        return None, (f"model folder {source!r} holds no tokenizer files ({', '.join(TOKENIZER_FILES)}); it was "
                      "saved without its tokenizer")
    try:
        tokenizer = _tokenizer_from(source, gguf_file, local_files_only)
    except ModelError as exc:
        return None, f"model {source!r} has no usable tokenizer: {exc}"
    problem = tokenizer_problem(tokenizer)
    if problem is not None:
        return None, f"model {source!r} has no usable tokenizer: {problem}"
    return tokenizer, None


def _given_tokenizer(tokenizer: Any, vocab: int | None, local_files_only: bool) -> Any:
    """``tokenizer`` (a name loaded), checked to represent text and to fit ``vocab`` embeddings."""
    from ..data import check_tokenizer

    if isinstance(tokenizer, (str, os.PathLike)):  # a packaged model's tokenizer is always local
        if not str(tokenizer).strip():  # else named as an empty model
            raise TokenizerError(f"tokenizer {str(tokenizer)!r} is empty; give 'minilm', 'smollm2', a tokenizer "
                                 "folder or a hub name")
        source, gguf_file, _ = _source(str(tokenizer), None)
        tokenizer = _tokenizer_from(source, gguf_file, local_files_only or str(tokenizer).strip().lower() in PACKAGED)
    check_tokenizer(tokenizer)
    if isinstance(vocab, int) and len(tokenizer) > vocab:
        raise TokenizerError(f"the tokenizer has {len(tokenizer)} tokens but the model only {vocab} embeddings: "
                             "it belongs to another model")
    return tokenizer


def _tokenizer_from(source: str, gguf_file: str | None, local_files_only: bool) -> Any:
    """``AutoTokenizer.from_pretrained``, any failure as one :class:`ModelError` line."""
    from transformers import AutoTokenizer

    kwargs: dict[str, Any] = {"local_files_only": local_files_only, "trust_remote_code": False}
    if gguf_file is not None:
        kwargs["gguf_file"] = gguf_file
    try:
        with quiet_loading():  # it reads config.json too, whose checks log warnings
            return AutoTokenizer.from_pretrained(source, **kwargs)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        reason = " ".join(str(exc).split())  # transformers' reasons span lines ("... one of: (1) ...")
        raise ModelError(f"cannot load a tokenizer from {source!r} ({type(exc).__name__}: {reason[:400]})") from None


def _load_online_or_cached(source, gguf_file, dtype, attn_implementation, local_files_only, is_local):
    """The model and its loading info; online, the cache first, then the hub checked once (no network: one line)."""
    if is_local or local_files_only:
        return _from_pretrained(source, gguf_file, dtype, attn_implementation, local_files_only, is_local)
    try:
        return _from_pretrained(source, gguf_file, dtype, attn_implementation, True, is_local)
    except ModelError:
        _check_hub_reachable(source)
    return _from_pretrained(source, gguf_file, dtype, attn_implementation, False, is_local)


#: Seconds to wait for the hub before declaring it unreachable.
HUB_CONNECT_TIMEOUT = 5.0


def _check_hub_reachable(source: str) -> None:
    import socket
    from urllib.parse import urlparse

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    url = urlparse(endpoint)
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=HUB_CONNECT_TIMEOUT).close()
    except OSError as exc:
        raise ModelError(f"cannot download model {source!r}: {host}:{port} is unreachable ({exc}) and the model "
                         f"is not in the cache {_hub_cache()!r}; use a local folder, 'minilm' or 'smollm2'") from None


def _from_pretrained(source: str, gguf_file: str | None, dtype: torch.dtype, attn_implementation: str | None,
                     local_files_only: bool, is_local: bool) -> tuple[Any, dict[str, list]]:
    from transformers import AutoModel

    if is_local:
        _refuse_custom_code(source)
    given = {k: v for k, v in (("gguf_file", gguf_file), ("attn_implementation", attn_implementation)) if v is not None}
    try:
        # with ignore_mismatched_sizes a wrong shape is listed in the loading info (checked by
        # check_loaded_weights) instead of raised with its details in a silenced log
        model, info = AutoModel.from_pretrained(source, local_files_only=local_files_only, trust_remote_code=False,
                                                dtype=dtype, output_loading_info=True, ignore_mismatched_sizes=True,
                                                **given)
    except OSError as exc:
        raise _not_found(source, is_local, local_files_only, exc) from None
    except (ValueError, KeyError) as exc:
        raise ModelError(f"cannot load model {source!r}: {str(exc).splitlines()[0][:300]}") from None
    except Exception as exc:
        if isinstance(exc, pickle.UnpicklingError) or "weights_only" in str(exc):
            raise ModelError(f"model {source!r}: its PyTorch pickle weights (pytorch_model.bin) hold objects other "
                             "than plain tensors, and unpickling those can run arbitrary code, so the file is refused; "
                             "use a copy of the model saved in the safetensors format") from None
        raise
    return model, info


def _not_found(source: str, is_local: bool, local_files_only: bool, exc: OSError) -> ModelError:
    if is_local:
        looked = f"in the local folder {source!r}"
    else:
        looked = f"as a local folder (none at {str(Path(source).resolve())!r}) or in the cache {_hub_cache()!r}"
    how = ("offline (HF_HUB_OFFLINE=1 / local_files_only=True; pass local_files_only=False or set "
           "HF_HUB_OFFLINE=0 to download)") if local_files_only else "online"
    return ModelError(f"cannot load model {source!r}: looked {looked}, {how}; use 'minilm', 'smollm2' or a local "
                      f"folder with config.json and weights ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})")


def _refuse_custom_code(folder: str) -> None:
    """Refuse a local folder whose config or tokenizer config asks for custom code (``auto_map``)."""
    for name in ("config.json", "tokenizer_config.json"):
        path = Path(folder) / name
        if not path.is_file():
            continue
        try:
            cfg = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            continue  # transformers' own reading names a malformed file
        if isinstance(cfg, dict) and cfg.get("auto_map"):
            raise ModelError(f"model {folder!r}: {name} asks for custom code (auto_map); custom model code is never "
                             "run here, so the folder is refused. Use a model whose architecture transformers ships")


#: Environment variable: the folder of the GGUF weights cache, or ``off`` to disable it.
GGUF_CACHE_ENV = "RANKCOLLAPSE_GGUF_CACHE"
#: Version of the cache entry layout (part of every key).
_GGUF_CACHE_FORMAT = 1


def gguf_cache_dir() -> Path | None:
    """Folder of the dequantised GGUF weights cache, or None (disabled).

    ``$RANKCOLLAPSE_GGUF_CACHE`` (``off``, ``0``, ``false``, ``no`` disable it), else
    ``$XDG_CACHE_HOME/rankcollapse/gguf`` (``~/.cache`` when unset or not absolute). Entries
    ``KEY.safetensors`` and ``KEY.json``, keyed by the GGUF file's SHA-256, the dtype and the
    library versions; an entry that does not match its record is written again.
    """
    value = os.environ.get(GGUF_CACHE_ENV, "").strip()
    if value.lower() in ("off", "0", "false", "no"):
        return None
    if value:
        return Path(value).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "rankcollapse" / "gguf"


def _gguf_cache_entry(gguf: Path, dtype: torch.dtype) -> tuple[Path, str, dict[str, Any]] | None:
    """``(folder, name, key)`` of the cache entry, or None when the cache is disabled."""
    from importlib.metadata import version

    from .._io import config_hash, file_sha256

    folder = gguf_cache_dir()
    if folder is None:
        return None
    try:
        digest = file_sha256(gguf)
    except OSError:  # transformers' own load names an unreadable file
        return None
    key = {"format": _GGUF_CACHE_FORMAT, "gguf_sha256": digest, "dtype": str(dtype).removeprefix("torch."),
           "torch": torch.__version__, "transformers": version("transformers"), "gguf": version("gguf")}
    return folder, config_hash(key, 32), key


def _read_gguf_cache(folder: Path, name: str, key: dict[str, Any]) -> tuple[dict, dict] | None:
    """``(config dict, state dict)`` of a matching, intact entry; None otherwise."""
    from safetensors.torch import load_file

    from .._io import file_sha256

    weights = folder / f"{name}.safetensors"
    try:
        entry = json.loads((folder / f"{name}.json").read_text(encoding="utf-8"))
        if (not isinstance(entry, dict) or entry.get("key") != key or not isinstance(entry.get("config"), dict)
                or weights.stat().st_size != entry.get("bytes") or file_sha256(weights) != entry.get("sha256")):
            return None
        return entry["config"], load_file(weights)
    except Exception:  # noqa: BLE001 - OSError, JSON or safetensors errors: an unusable entry is a miss
        return None


def _from_state_dict(source: str, config: dict, state_dict: dict, dtype: torch.dtype,
                     attn_implementation: str | None) -> tuple[Any, dict[str, list]]:
    """The base model of ``config`` with ``state_dict``, loaded as :func:`_from_pretrained` does."""
    from transformers import MODEL_MAPPING, AutoConfig

    config = AutoConfig.for_model(**config)
    kwargs: dict[str, Any] = {"attn_implementation": attn_implementation} if attn_implementation is not None else {}
    model, info = MODEL_MAPPING[type(config)].from_pretrained(
        None, config=config, state_dict=state_dict, dtype=dtype, output_loading_info=True,
        ignore_mismatched_sizes=True, **kwargs)
    model.config.name_or_path = source
    return model, info


def _write_gguf_cache(folder: Path, name: str, key: dict[str, Any], model: Any) -> None:
    """Write the cache entry (weights, then the record); a failure is a warning."""
    import warnings

    from safetensors.torch import save_file

    from .._io import atomic_path, file_sha256, write_json_atomic

    tensors, seen = {}, set()
    for k, t in model.state_dict().items():
        t = t.detach().contiguous()
        if t.data_ptr() in seen:  # tied weights: safetensors stores each tensor once
            t = t.clone()
        seen.add(t.data_ptr())
        tensors[k] = t
    config = {k: v for k, v in model.config.to_dict().items() if k != "_name_or_path"}
    try:
        weights = folder / f"{name}.safetensors"
        with atomic_path(weights) as tmp:
            save_file(tensors, str(tmp))
            record = {"key": key, "bytes": tmp.stat().st_size, "sha256": file_sha256(tmp), "config": config}
        write_json_atomic(folder / f"{name}.json", record)
    except Exception as exc:  # noqa: BLE001 - OSError or safetensors' own error (a full disk): the load goes on
        warnings.warn(f"cannot write the GGUF weights cache {str(folder)!r} ({exc}); set {GGUF_CACHE_ENV} to "
                      "another folder, or to off", stacklevel=3)
