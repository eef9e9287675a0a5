"""Experiments of the paper as declarative configs, a cached runner, claims and plots
(:func:`run_experiment`; docs/reproduce.md). Layering (tests/test_layering.py): may import
``theory``, ``dynamics``, ``models``, ``metrics``, ``masks`` and below; never ``phase`` or ``cli``.
"""

from ..sweep.executors import ExecutionConfig
from .claims import evaluate_claim, verdict_from
from .config import EXPERIMENTS, load_config
from .runner import RunResult, StorageConfig, run_experiment

__all__ = ["EXPERIMENTS", "ExecutionConfig", "RunResult", "StorageConfig", "evaluate_claim", "load_config", "run_experiment",
           "verdict_from"]
