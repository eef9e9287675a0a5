"""Experiments of the paper as declarative configs, a cached runner, claims and plots.

``run_experiment(name, scale, out, seed)`` runs ``main``, ``fig2``, ``fig3``, ``fig4``,
``theory`` or ``all`` (see ``docs/reproduce.md``); ``execution=ExecutionConfig(...)``
says where its units run (and which shard of them), ``storage=StorageConfig(...)``
where its numbers are kept.

Layering (pyproject.toml ``[tool.importlinter]``, tests/test_layering.py): ``experiments`` may
import ``theory``, ``dynamics``, ``models``, ``metrics``, ``masks`` and everything below
them; never ``phase`` or ``cli``.
"""

from ..sweep.executors import ExecutionConfig
from .claims import evaluate_claim, verdict_from
from .config import EXPERIMENTS, load_config
from .runner import RunResult, StorageConfig, run_experiment

__all__ = ["EXPERIMENTS", "ExecutionConfig", "RunResult", "StorageConfig", "evaluate_claim", "load_config", "run_experiment",
           "verdict_from"]
