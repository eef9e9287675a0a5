"""``load_model`` never touches the network unless asked: an unknown name fails fast."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rankcollapse.errors import ModelError
from rankcollapse.models import loading, source

_SCRIPT = """
import json, time
from rankcollapse.errors import ModelError
from rankcollapse.models import load_model
import transformers  # imported before the clock starts
t = time.perf_counter()
try:
    load_model("some-org/no-such-model-xyz")
    out = {"error": None}
except ModelError as exc:
    out = {"error": str(exc)}
out["seconds"] = time.perf_counter() - t
print(json.dumps(out))
"""


def test_unknown_name_fails_fast_without_network_by_default():
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_HUB_OFFLINE")}
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["error"] is not None and out["seconds"] < 5.0, out
    assert "some-org/no-such-model-xyz" in out["error"] and "cache" in out["error"]
    assert "local_files_only=False" in out["error"]


@pytest.mark.parametrize(
    "env, expected",
    [(None, True), ("1", True), ("true", True), ("0", False), ("false", False), ("off", False)],
)
def test_default_is_local_only_unless_opted_in(monkeypatch, env, expected):
    if env is None:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    else:
        monkeypatch.setenv("HF_HUB_OFFLINE", env)
    assert source._local_only(None) is expected


def test_explicit_local_files_only_is_passed_through(monkeypatch):
    seen = {}

    def fake(source, gguf_file, dtype, attn, local_files_only, is_local):
        seen["local_files_only"] = local_files_only
        raise ModelError("stop")

    monkeypatch.setattr(loading, "_from_pretrained", fake)
    monkeypatch.setattr(loading, "_check_hub_reachable", lambda source: None)  # online: cache first, then the hub
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    for explicit, expected in ((None, True), (False, False), (True, True)):
        with pytest.raises(ModelError):
            loading.load_model("org/model", local_files_only=explicit)
        assert seen["local_files_only"] is expected
