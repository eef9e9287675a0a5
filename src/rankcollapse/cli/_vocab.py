"""The command line's words for the API's arguments.

The canonical vocabulary (docs/cli.md): ``--n-tokens``, ``--n-samples``, ``--d-model``,
``--model``, ``--metrics``, ``--seed``, ``--device``, ``--out`` (a folder) and
``--format json|csv|markdown|table``.
"""

from __future__ import annotations

import re


#: an API error's words for an argument -> the flag a command-line user typed (the API
#: names its arguments; the command line names its flags): (pattern, replacement)
API_TO_FLAGS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\bn_tokens=(\d+) was asked"), r"--n-tokens \1 was asked"),
    (re.compile(r"runs on path='dense' only"), "runs on --backend dense only"),
    (re.compile(r"use path='dense' or 'auto'"), "use --backend dense or auto"),
    (re.compile(r"^qk_norm_scale is a setting of qk_norm=True$"), "--qk-norm-scale is a setting of --qk-norm (give both)"),
    *((re.compile(rf"^{re.escape(arg)} does not apply to "), f"{flag} does not apply to ") for arg, flag in (
        ("text", "--text-file"), ("n_tokens", "--n-tokens"), ("overrides['masks']", "--mask"),
        ("overrides['depth']", "--depth"), ("overrides['n_samples']", "--n-samples"),
        ("overrides['extra_models']", "--model"))),
    (re.compile(r"^ablate_heads "), "--ablate-heads "),
    (re.compile(r"^patch: a head is patched at a point layer\.k\.heads, not "), "--patch-head applies at a "
     "--patch-point layer.k.heads, not "),
    (re.compile(r"^patch: head (\d+) outside"), r"--patch-head \1 outside"),
    (re.compile(r"raise the limit with max_memory \(--max-memory on the command line\)"),
     "raise the limit with --max-memory (e.g. --max-memory 32GiB)"),
)


def in_flags(message: str) -> str:
    """``message`` (an API error's) with the arguments it names as the command's flags
    (:data:`API_TO_FLAGS`); other text unchanged."""
    for pattern, flag in API_TO_FLAGS:
        message = pattern.sub(flag, message)
    return message
