"""The CSR graph analysis is sized before the CSR is built; interval masks need none."""

import pytest

from rankcollapse import masks
from rankcollapse.errors import MemoryLimitError


def test_csr_path_refused_by_size_before_building():
    m = masks.parse_mask("complete", 50)
    with pytest.raises(MemoryLimitError, match=r"^max_memory "):
        masks.analyze(m, method="csr", max_memory=100)
    assert not m.is_built  # refused before the CSR existed
    a = masks.analyze(m, method="csr", max_memory="1GiB")
    assert a.radius == 1 and a.n_edges == 2500


def test_huge_complete_mask_analysed_from_intervals():
    a = masks.analyze(masks.parse_mask("complete", 65536), max_memory=100)
    assert a.method == "intervals" and a.n_edges == 65536**2 and a.radius == 1


def test_a_number_of_tokens_beyond_memory_is_refused_before_any_array():
    """N = 10^12: the rows' first and last keys alone are 16 TB; a MemoryLimitError (not
    numpy's MemoryError) before anything is allocated."""
    with pytest.raises(MemoryLimitError, match="N = 1000000000000 tokens"):
        masks.parse_mask("causal", 10**12)
