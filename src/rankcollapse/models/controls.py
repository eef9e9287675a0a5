"""Random-init controls: the same architecture, freshly initialised, on the same windows.

A trained model's geometry (massive tokens, sinks, a spectrum's entropy) is a finding
only where a network of the same architecture that never saw data differs. The control
is built from the trained model's own config by its class's constructor, which runs the
architecture's own initialisation (transformers' ``_init_weights``: e.g. normal(0,
``initializer_range``) linear and embedding weights, unit norm gains), with torch's
generator seeded for the call (and restored after it).
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import torch

from ..errors import ConfigError
from .loading import LoadedModel, as_loaded

CONTROLS = ("random-init",)


def control_name(name: str, control: str, seed: int) -> str:
    """The label of a control run in tables and figures, e.g. ``smollm2 [random-init, seed 0]``."""
    return f"{name} [{control}, seed {seed}]"


def random_init(loaded: Any, *, seed: int = 0) -> LoadedModel:
    """The architecture of ``loaded`` with fresh weights, ``seed``-determined.

    Parameters
    ----------
    loaded : LoadedModel or a transformers model (:func:`~rankcollapse.models.as_loaded`).
    seed : seeds torch's global generator for the construction only (the caller's
        generator state is restored); the same seed gives the same weights.

    Returns
    -------
    LoadedModel
        Same class, config (a copy), dtype, device, family and tokenizer; eval mode;
        ``name`` from :func:`control_name`; ``notes`` say the weights are random.
        The trained model is not touched.

    Raises
    ------
    ConfigError
        ``seed`` not an integer >= 0.
    """
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
    return replace(loaded, model=model, name=control_name(loaded.name, "random-init", seed), notes=[note])
