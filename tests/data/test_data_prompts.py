"""``prompt_windows``: one window per prompt, special tokens around it, right-padded to
the longest, with the padding and special tokens marked."""

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from rankcollapse.data import prompt_windows
from rankcollapse.errors import DataError

VOCAB = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "cat", "sat", "on", "mat"])}


def _tokenizer(special: bool):
    core = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if special:
        core.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                            special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]")


def test_prompts_of_different_lengths_are_right_padded():
    w = prompt_windows(["the cat sat", "the mat", "the cat sat on the mat"], _tokenizer(special=True))
    assert w.input_ids.tolist() == [[2, 4, 5, 6, 3, 0, 0, 0], [2, 4, 8, 3, 0, 0, 0, 0], [2, 4, 5, 6, 7, 4, 8, 3]]
    assert w.attention_mask.sum(1).tolist() == [5, 4, 8]
    assert torch.equal(w.special_tokens_mask[1], torch.tensor([1, 0, 0, 1, 0, 0, 0, 0], dtype=torch.bool))


def test_without_special_tokens_and_refusals():
    w = prompt_windows(["cat", "the cat"], _tokenizer(special=False))
    assert w.input_ids.tolist() == [[5, 0], [4, 5]] and w.attention_mask.tolist() == [[1, 0], [1, 1]]
    assert not w.special_tokens_mask.any()
    with pytest.raises(DataError, match="no prompts"):
        prompt_windows([], _tokenizer(special=False))
