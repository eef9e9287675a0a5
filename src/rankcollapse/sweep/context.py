"""Shared inputs of one run (texts, token windows, loaded models, X(0) embeddings), loaded once
per process (each worker builds its own from the run's data spec and device)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch

from .. import assets, data
from ..dynamics.weights import random_layers
from ..errors import DataError

WEIGHT_CACHE = 2  # distinct weight draws RunContext.random_weights keeps


def data_spec(text: str | Path | None, n_tokens: int, seed: int) -> dict[str, Any]:
    """The input description that enters every unit hash: ``corpus``, ``n_tokens``, ``seed`` and,
    for a text file, ``path`` (recorded, left out of keys) and its content's ``sha256`` (for
    the packaged extracts only when they are not the pinned version's). Raises ``DataError``:
    ``n_tokens`` < 1, or the text file cannot be read (names the file)."""
    if int(n_tokens) < 1:
        raise DataError(f"tokens per window N must be >= 1, got {n_tokens}")
    if text is None:  # the packaged corpus: by name while it is the pinned version's (assets.wikipedia_key)
        return {"corpus": "wikipedia", **assets.wikipedia_key(), "n_tokens": int(n_tokens), "seed": int(seed)}
    docs = data.read_text_file(text)  # raises DataError with one clear line
    digest = hashlib.sha256("\n".join(docs).encode()).hexdigest()[:16]
    return {"corpus": "file", "path": str(Path(text).resolve()), "sha256": digest, "n_tokens": int(n_tokens),
            "seed": int(seed)}


class RunContext:
    """Lazily loaded inputs shared by the units of one run: ``data`` from :func:`data_spec`,
    ``device`` for simulations and loaded models."""

    def __init__(self, data: dict[str, Any], device: str | torch.device = "cpu") -> None:
        self.data = data
        self.device = torch.device(device)
        self._texts: list[str] | None = None
        self._models: dict[str, Any] = {}
        self._windows: dict[tuple, Any] = {}
        self._embeddings: dict[tuple, torch.Tensor] = {}
        self._weights: dict[tuple, list] = {}

    def random_weights(self, d_model: int, depth: int, *, seed: int, value: Any, query_key: Any, n_heads: int = 1,
                       out_proj: bool = False, mlp_ratio: int | None = None) -> list:
        """``dynamics.weights.random_layers``, drawn once for the units that share the
        arguments; the last :data:`WEIGHT_CACHE` draws are kept (units sharing weights run in a row)."""
        key = (int(d_model), int(depth), int(seed), str(value), str(query_key), int(n_heads), bool(out_proj), mlp_ratio)
        if key not in self._weights:
            while len(self._weights) >= WEIGHT_CACHE:
                self._weights.pop(next(iter(self._weights)))
            self._weights[key] = random_layers(d_model, depth, value=value, query_key=query_key, n_heads=n_heads,
                                               out_proj=out_proj, mlp_ratio=mlp_ratio, seed=seed)
        return self._weights[key]

    def texts(self) -> list[str]:
        if self._texts is None:
            wiki = self.data["corpus"] == "wikipedia"
            self._texts = data.wikipedia_texts() if wiki else data.read_text_file(self.data["path"])
        return self._texts

    def model(self, name: str) -> Any:
        """The loaded model ``name`` (``minilm``, ``smollm2`` or a path/hub id)."""
        if name not in self._models:
            from ..models._quiet import quiet_loading  # no progress bar of its own: the run draws one
            from ..models.loading import load_model  # offline by its default

            with quiet_loading():
                self._models[name] = load_model(name, device=self.device)
        return self._models[name]

    def windows(self, model: str, n_samples: int, *, n_tokens: int | None = None) -> Any:
        """``n_samples`` windows of ``n_tokens`` tokens (default: the run's) cut with ``model``'s
        tokenizer from the run's text and seed (``data.make_windows``)."""
        n_tokens = int(self.data["n_tokens"] if n_tokens is None else n_tokens)
        # the run's own length: the short key
        key = (model, int(n_samples)) if n_tokens == int(self.data["n_tokens"]) else (model, int(n_samples), n_tokens)
        if key not in self._windows:
            tok = self.model(model).require_tokenizer()
            self._windows[key] = data.make_windows(self.texts(), tok, n_tokens=n_tokens, n_samples=n_samples,
                                                   seed=self.data["seed"])
        return self._windows[key]

    def embeddings(self, model: str, n_samples: int, *, start: int = 0, stop: int | None = None,
                   n_tokens: int | None = None, positions: bool = True) -> torch.Tensor:
        """X(0): the embedding-layer output ``(B, N, d)`` of windows ``start:stop`` of
        :meth:`windows`; ``positions=False`` leaves the position embeddings out."""
        from ..models.probe import embed

        key = (model, int(n_samples), int(start), stop)
        if n_tokens is not None and int(n_tokens) != int(self.data["n_tokens"]) or not positions:
            key += (int(n_tokens or self.data["n_tokens"]), bool(positions))
        if key in self._embeddings:
            return self._embeddings[key]
        win = self.windows(model, n_samples, n_tokens=n_tokens)
        stop = win.n_samples if stop is None else stop
        part = type(win)(win.input_ids[start:stop], win.attention_mask[start:stop], win.special_tokens_mask[start:stop])
        with torch.no_grad():
            X = embed(self.model(model), part, positions=positions)
        if not torch.isfinite(X).all():
            raise DataError(f"embeddings of {model} contain NaN/Inf")
        self._embeddings[key] = X.detach()
        return self._embeddings[key]
