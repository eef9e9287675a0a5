"""The command line's words for the API's arguments (docs/cli.md)."""

from __future__ import annotations

from ..errors import RankCollapseError

#: an API argument an error names (:attr:`RankCollapseError.argument`) -> its flag
FLAGS: dict[str, str] = {
    "n_tokens": "--n-tokens", "backend": "--backend", "qk_norm_scale": "--qk-norm-scale",
    "max_memory": "--max-memory", "text": "--text-file", "executor": "--executor", "workers": "--workers",
    "address": "--address", "overrides['masks']": "--mask",
    "overrides['depth']": "--depth", "overrides['n_samples']": "--n-samples", "overrides['extra_models']": "--model",
    "ablate_heads": "--ablate-heads", "head": "--patch-head", "shard": "--shard", "wait": "--wait",
    "allow_nonempty": "--allow-nonempty", "metrics": "--metrics", "d_qk": "--d-qk", "out": "--out",
}


def in_flags(exc: RankCollapseError) -> str:
    """``exc``'s message with the argument it concerns named by its flag (:data:`FLAGS`)."""
    if exc.argument is None:
        return str(exc)
    return f"{FLAGS.get(exc.argument, exc.argument)} {exc.detail}"
