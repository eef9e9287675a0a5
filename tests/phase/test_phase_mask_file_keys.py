"""A phase cell whose mask is a file is keyed by the file's content."""

from rankcollapse.phase.grid import expand_grid
from rankcollapse.phase.sweep import cell_units


def _keys(path):
    cells = expand_grid({"mask": [f"file:{path}", "causal"]}, {"n_tokens": 4, "d_model": 2, "depth": 2})
    units, _ = cell_units(cells, 2, 1, 0)
    return [u.hash for u in units]


def test_a_mask_file_rewritten_in_place_gives_new_keys(tmp_path):
    edges = tmp_path / "mask.txt"
    edges.write_text("0 0\n1 0\n1 1\n2 2\n3 3\n")
    first = _keys(edges)
    assert _keys(edges) == first and len(first) == 2
    edges.write_text("0 0\n1 1\n2 1\n2 2\n3 3\n")  # another graph under the same name
    again = _keys(edges)
    assert again[0] != first[0] and again[1] == first[1]  # the causal cell keeps its key


def test_packaged_inputs_are_keyed_by_name_only_while_they_are_the_pinned_versions(monkeypatch):
    from rankcollapse import assets

    cells = expand_grid({"input": ["wikipedia", "gaussian"]}, {"n_tokens": 4, "d_model": 2, "depth": 2})
    pinned = [u.hash for u in cell_units(cells, 2, 1, 0)[0]]
    monkeypatch.setitem(assets.PINNED_DIGESTS, "minilm", "0" * 16)  # another MiniLM installed
    other = [u.hash for u in cell_units(cells, 2, 1, 0)[0]]
    assert other[0] != pinned[0] and other[1] == pinned[1]  # the gaussian input reads no package
