"""Silence transformers while a model loads.

transformers prints a "Loading weights" progress bar, logging warnings (unused or newly
initialised weights, deprecated options) and Python warnings while it loads; on the
command line they would stand before the one error line a failure prints, and on
success they repeat what the notes already say. The project reports what qualifies
the numbers itself (:attr:`LoadedModel.notes`), so loading runs with transformers'
and huggingface_hub's progress bars off, transformers' logging at ``ERROR``,
transformers' Python warnings ignored, and ``sys.stderr`` held in a buffer (bars that
ignore those switches, such as the GGUF de-quantisation bar, write there); every
setting is restored afterwards. Errors are exceptions, raised after the block.
"""

from __future__ import annotations

import io
import warnings
from contextlib import contextmanager, redirect_stderr
from typing import Iterator


@contextmanager
def quiet_loading() -> Iterator[None]:
    """Inside the block transformers prints no progress bar, warning or info line."""
    from huggingface_hub import utils as hub_utils
    from transformers.utils import logging as hf_logging

    bars_on = hf_logging.is_progress_bar_enabled()
    hub_bars_off = hub_utils.are_progress_bars_disabled()
    level = hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hub_utils.disable_progress_bars()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings(), redirect_stderr(io.StringIO()):
            warnings.filterwarnings("ignore", module=r"(transformers|huggingface_hub)(\.|$)")
            yield
    finally:
        hf_logging.set_verbosity(level)
        if bars_on:
            hf_logging.enable_progress_bar()
        if not hub_bars_off:
            hub_utils.enable_progress_bars()
