"""The documented mask spellings (docs/masks.md) read to the constructor call they name:
values typed by key (int, bool, '+'-lists), defaults filled in, spaces stripped."""

import numpy as np
import pytest

from rankcollapse.masks import constructors as c
from rankcollapse.masks import parse_mask


@pytest.mark.parametrize("spec, built", [
    ("dilated:w=3,dilation=2,causal=true", lambda n: c.dilated(n, w=3, dilation=2, causal=True)),
    ("dilated:w=3,dilation=2", lambda n: c.dilated(n, w=3, dilation=2, causal=False)),
    ("documents:lengths=3+5+4", lambda n: c.documents(n, lengths=[3, 5, 4])),
    ("block:size=4,causal=yes", lambda n: c.block(n, size=4, causal=True)),
    (" block : size = 4 , causal = off ", lambda n: c.block(n, size=4, causal=False)),
    ("bigbird:w=3,globals=0+7,random=2,seed=1", lambda n: c.bigbird(n, w=3, globals=(0, 7), random=2, seed=1)),
    ("longformer:w=5", lambda n: c.longformer(n, w=5, globals=())),
    ("fixed:stride=4", lambda n: c.fixed(n, stride=4, c=1)),
    ("random:p=0.25,seed=3", lambda n: c.random(n, p=0.25, seed=3)),
])
def test_documented_spellings_build_the_constructors_mask(spec, built):
    np.testing.assert_array_equal(parse_mask(spec, 12).to_numpy(), built(12).to_numpy())
