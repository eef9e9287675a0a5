"""The synthetic executor of the experiments tests, for the sweep engine's tests that run
an experiment through it."""

from tests.experiments.conftest import fake  # noqa: F401
