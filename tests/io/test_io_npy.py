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
    with pytest.raises(DataError, match=r"is a zip archive, not \.npz \(a torch\.save file\? name it \.pt\)"):
        load_npy(tmp_path / "x.pt", "token array")
    np.save(tmp_path / "x.npy", np.ones((3, 2)))
    assert load_npy(tmp_path / "x.npy", "token array").tolist() == [[1.0, 1.0]] * 3


class _Payload:  # a pickled object other than a tensor
    pass


def test_a_pt_file_gives_its_one_tensor_and_refuses_other_pickles(tmp_path):
    from rankcollapse._io import load_array

    X = torch.arange(6.0).reshape(3, 2).to(torch.bfloat16)
    torch.save(X, tmp_path / "x.pt")
    assert torch.equal(load_array(tmp_path / "x.pt", "token array"), X)
    torch.save({"x": X}, tmp_path / "dict.pt")
    with pytest.raises(DataError, match=r"'.*dict\.pt' holds a dict, not one tensor"):
        load_array(tmp_path / "dict.pt", "token array")
    torch.save({"x": _Payload()}, tmp_path / "obj.pt")
    with pytest.raises(DataError, match=r"holds pickled Python objects other than tensors, which are refused") as exc:
        load_array(tmp_path / "obj.pt", "token array")
    assert "weights_only" not in str(exc.value)  # never a suggestion to unpickle it
    (tmp_path / "cut.pt").write_bytes((tmp_path / "x.pt").read_bytes()[:100])
    with pytest.raises(DataError, match=r"is not a readable \.pt tensor: ") as exc:
        load_array(tmp_path / "cut.pt", "token array")
    assert "\n" not in str(exc.value)
    np.save(tmp_path / "x.npy", np.ones((3, 2)))
    assert load_array(tmp_path / "x.npy", "token array").tolist() == [[1.0, 1.0]] * 3


def test_metrics_reads_a_pt_tensor_as_its_npy_twin(tmp_path):
    import json

    from tests.cli._harness import check_run

    X = np.random.default_rng(0).standard_normal((2, 6, 3))
    np.save(tmp_path / "X.npy", X)
    torch.save(torch.from_numpy(X), tmp_path / "X.pt")
    runs = [check_run(["metrics", name, "--metrics", "mu,stable_rank", "--format", "json"], tmp_path)
            for name in ("X.npy", "X.pt")]
    assert [code for code, _, _ in runs] == [0, 0]
    assert json.loads(runs[0][1]) == json.loads(runs[1][1])
