"""Random-init controls: the same architecture, freshly initialised by its class's own
constructor from the trained model's config, torch seeded for the call.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import torch

from ..errors import ConfigError
from .loading import LoadedModel, as_loaded

CONTROLS = ("random-init",)


def random_init(loaded: Any, *, seed: int = 0) -> LoadedModel:
    """The architecture of ``loaded`` with fresh weights from ``seed`` (the caller's
    generator state restored): same class, config (a copy), dtype, device, family and
    tokenizer, eval mode, named ``NAME [random-init, seed S]``; the trained model is not touched.
    :class:`ConfigError` for a ``seed`` that is not an integer >= 0."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"the control's seed must be an integer >= 0, got {seed!r}")
    loaded = as_loaded(loaded)
    trained = loaded.model
    param = next(trained.parameters())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = type(trained)(copy.deepcopy(trained.config))
    model = model.to(dtype=param.dtype, device=param.device).eval()
    note = (f"random-init control: {type(trained).__name__} built from {loaded.name}'s config with the "
            f"architecture's own initialisation, torch seed {seed}; no trained weight")
    return replace(loaded, model=model, name=f"{loaded.name} [random-init, seed {seed}]", notes=[note])
