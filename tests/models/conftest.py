"""Fixtures: tiny random models of every family and padded token windows."""

import pytest
from models_tiny import build_tiny, tiny_windows

from rankcollapse.data import Windows
from rankcollapse.models import LoadedModel


@pytest.fixture(params=["bert", "albert", "gpt2", "t5", "llama"])
def tiny(request) -> LoadedModel:
    return build_tiny(request.param)


@pytest.fixture
def windows() -> Windows:
    return tiny_windows()
