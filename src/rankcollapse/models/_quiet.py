"""Silence transformers while a model loads: its progress bars, logging and warnings
would stand before the one error line a failure prints, and the notes already say what
qualifies the numbers. Every setting is restored afterwards.
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
        # stderr buffered: bars ignoring these switches (GGUF de-quantisation) write there
        with warnings.catch_warnings(), redirect_stderr(io.StringIO()):
            warnings.filterwarnings("ignore", module=r"(transformers|huggingface_hub)(\.|$)")
            yield
    finally:
        hf_logging.set_verbosity(level)
        if bars_on:
            hf_logging.enable_progress_bar()
        if not hub_bars_off:
            hub_utils.enable_progress_bars()
