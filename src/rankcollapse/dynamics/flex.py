"""FlexAttention backend (``backend="flex"``): ``torch.compile``-d ``flex_attention`` on a
``BlockMask`` built from the mask's CSR form (:func:`rankcollapse.masks.to_block_mask`).

Device-agnostic: the block mask lives on the tokens' device and the same code runs on
CPU or GPU wherever ``torch.compile`` works. FlexAttention computes the softmax of
spec.md §1 over the allowed keys in the tokens' dtype, so scores that may overflow are
not given to it: :class:`~rankcollapse.dynamics.layers.Attention` sends such a layer
to the windowed kernel (:mod:`.sparse`), which forms them in float64.
"""

from __future__ import annotations

import torch

from ..errors import ConfigError


def flex_available() -> bool:
    """Whether this torch has FlexAttention (``torch.nn.attention.flex_attention``)."""
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


class FlexBackend:
    """Compiled FlexAttention on one mask.

    Parameters
    ----------
    mask : :class:`rankcollapse.masks.Mask` on ``N`` tokens.
    device : device of the tokens (the block mask is built there).
    block_size : FlexAttention tile size (default 128).

    Raises
    ------
    ConfigError
        FlexAttention missing from this torch.
    """

    def __init__(self, mask, device, *, block_size: int = 128):
        if not flex_available():
            raise ConfigError(f"backend='flex' needs torch.nn.attention.flex_attention (torch {torch.__version__})")
        from torch.nn.attention.flex_attention import flex_attention

        from ..masks.convert import to_block_mask

        self.block_mask = to_block_mask(mask, block_size=block_size, device=device)
        self._fn = torch.compile(flex_attention, dynamic=False)

    def __call__(self, Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, *, scale: float) -> torch.Tensor:
        """``(B, H, N, d_v)`` masked softmax attention of ``Q, K (B, H, N, d_k)``, ``V``."""
        try:
            return self._fn(Q.contiguous(), K.contiguous(), V.contiguous(), block_mask=self.block_mask, scale=scale)
        except torch._dynamo.exc.TorchDynamoException as exc:  # no compiler for this device
            raise ConfigError(f"backend='flex': torch.compile of flex_attention failed on {Q.device} "
                              f"({type(exc).__name__}: {str(exc).splitlines()[0]}); use backend='blocked'") from None
