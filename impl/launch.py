"""Launch arithmetic shared by the Triton kernels: pure integer functions, no triton import.

Written with only `+ - | >> //`-style operations so the *same code* runs on Python ints (at
launch) and on z3 bit-vectors / CrossHair symbolic ints (in the proofs under falsify/proofs):
the symbolic checks prove facts about the function the kernels actually call.
"""


def next_power_of_2(n):
    """Smallest power of two ≥ n, for 1 ≤ n ≤ 2^31 (bit smearing)."""
    v = n - 1
    v = v | (v >> 1)
    v = v | (v >> 2)
    v = v | (v >> 4)
    v = v | (v >> 8)
    v = v | (v >> 16)
    return v + 1


def cdiv(a, b):
    """Ceiling division for a ≥ 0, b > 0: the number of tiles of size b covering a."""
    return (a + b - 1) // b
