"""FlexAttention backend (``backend="flex"``): ``torch.compile``-d ``flex_attention`` on a
``BlockMask`` of the mask (:func:`rankcollapse.masks.to_block_mask`), on the tokens' device.
It computes in the tokens' dtype, so layers whose scores may overflow go to :mod:`.sparse`.
"""

from __future__ import annotations

import torch

from ..errors import ConfigError
from ..masks.convert import to_block_mask


class FlexBackend:
    """Compiled FlexAttention on one :class:`~rankcollapse.masks.Mask`, the block mask built
    on ``device`` with tiles of ``block_size``. Raises ``ConfigError``: FlexAttention missing from
    this torch."""

    def __init__(self, mask, device, *, block_size: int = 128):
        try:
            from torch.nn.attention.flex_attention import flex_attention
        except ImportError:
            raise ConfigError(f"backend='flex' needs torch.nn.attention.flex_attention "
                              f"(torch {torch.__version__})") from None
        self.block_mask = to_block_mask(mask, block_size=block_size, device=device)
        self._fn = torch.compile(flex_attention, dynamic=False)

    def __call__(self, Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, *, scale: float) -> torch.Tensor:
        """``(B, H, N, d_v)`` masked softmax attention of ``Q, K (B, H, N, d_k)``, ``V``."""
        try:
            return self._fn(Q.contiguous(), K.contiguous(), V.contiguous(), block_mask=self.block_mask, scale=scale)
        except torch._dynamo.exc.TorchDynamoException as exc:  # no compiler for this device
            raise ConfigError(f"backend='flex': torch.compile of flex_attention failed on {Q.device} "
                              f"({type(exc).__name__}: {str(exc).splitlines()[0]}); use backend='blocked'") from None
