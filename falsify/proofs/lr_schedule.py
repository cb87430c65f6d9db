"""Symbolic facts behind the LR-schedule contract: CrossHair proofs of the integer step logic.

CrossHair explores every path of these pure integer functions symbolically (no float code:
CrossHair models floats as reals, so a proof over float code would not be about IEEE
rounding), and the harness counts a check as passed only when every PEP 316 condition is
CONFIRMED, i.e. all paths were exhausted.
"""

from __future__ import annotations

from falsify.kernels.torch.lr_schedule import DECAY, FLOOR, WARMUP, schedule_phase


def consecutive_steps(step: int, warmup: int, total: int) -> bool:
    """Step s → s + 1 never goes back a phase; within warmup or decay the elapsed fraction
    num/den strictly increases (compared by cross-multiplication, exact in integers); the
    warmup hands over to the decay exactly at s + 1 = warmup, at fraction 0 (the peak), and
    the decay hands over to the floor exactly at s + 1 = total.

    pre: 0 <= warmup < total
    pre: step >= 0
    post: __return__
    """
    p1, n1, d1 = schedule_phase(step, warmup, total)
    p2, n2, d2 = schedule_phase(step + 1, warmup, total)
    if p2 < p1:
        return False
    if p1 == p2:
        return p1 == FLOOR or n1 * d2 < n2 * d1
    if p1 == WARMUP:
        return p2 == DECAY and step + 1 == warmup and n2 == 0
    return p1 == DECAY and p2 == FLOOR and step + 1 == total
