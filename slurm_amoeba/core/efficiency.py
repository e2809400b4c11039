"""Statistical efficiency of a larger batch (Pollux, OSDI 2021), shared by the runtime and the policies.

With ``phi`` the gradient noise scale (in samples), a step at global batch ``B`` makes the progress of
``B/B0 x (phi + B0) / (phi + B)`` steps at the initial batch ``B0``: per sample, ``(phi + B0) / (phi + B)``. The
runtime uses it for its own batch choice and the learning-rate rules (``runtime/gns.py``, ``runtime/adaptive.py``),
the goodput policy to weigh sizes and batches (``policy/goodput.py``), and the simulator through the policy.
"""

from __future__ import annotations

import math


def efficiency(noise_scale: float | None, batch: int, base: int) -> float:
    """Statistical efficiency of ``batch`` over ``base``: ``(phi + base) / (phi + batch)``.

    Without an estimate (``None``) no gain is assumed (``base / batch``); an infinite noise scale (the runtime
    measured no gradient noise) gives 1.
    """
    if noise_scale is None:
        return base / batch
    if math.isinf(noise_scale):
        return 1.0
    return (noise_scale + base) / (noise_scale + batch)


__all__ = ["efficiency"]
