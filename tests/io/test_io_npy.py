"""Reading a user's token array: a zip archive is named for what it is."""

import numpy as np
import pytest
import torch

from rankcollapse._io import load_npy
from rankcollapse.errors import DataError


def test_an_npz_and_a_torch_file_are_told_apart(tmp_path):
    np.savez(tmp_path / "x.npz", x=np.ones((3, 2)))
    torch.save(torch.ones(3, 2), tmp_path / "x.pt")  # a zip archive too: np.load opens it as an .npz
    with pytest.raises(DataError, match=r"is an \.npz archive; save one array with numpy\.save"):
        load_npy(tmp_path / "x.npz", "token array")
    with pytest.raises(DataError, match=r"is a zip archive, not \.npz \(torch\.save writes one\)"):
        load_npy(tmp_path / "x.pt", "token array")
    np.save(tmp_path / "x.npy", np.ones((3, 2)))
    assert load_npy(tmp_path / "x.npy", "token array").tolist() == [[1.0, 1.0]] * 3
