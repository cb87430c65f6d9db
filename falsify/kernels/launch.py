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


def next_power_of_2_capped(n, cap):
    """min(next_power_of_2(n), cap) for 1 ≤ n ≤ 2^31 and cap a power of two, with no
    comparison, so z3 bit-vectors run it unchanged: next_power_of_2(n) − 1 has every bit below
    the top bit of n − 1 set, and masking it with cap − 1 saturates at cap − 1 exactly when
    n > cap."""
    return ((next_power_of_2(n) - 1) & (cap - 1)) + 1


def next_power_of_2_clamped(n, lo, hi):
    """next_power_of_2(n) clamped to [lo, hi], for 1 ≤ n ≤ 2^31 and lo ≤ hi powers of two,
    again without comparisons: or-ing lo − 1 into n − 1 raises every n ≤ lo to exactly lo (the
    smear then yields lo), and next_power_of_2_capped saturates at hi. Used for tl.dot tiles,
    which need every block dimension ≥ 16."""
    return next_power_of_2_capped(((n - 1) | (lo - 1)) + 1, hi)


# NF4 packing (bitsandbytes layout). Shifts and masks only, so the same functions index torch
# tensors at run time and z3 bit-vectors in falsify/proofs/nf4.py.


def nf4_byte_of(i):
    """Byte that holds element i: two 4-bit codes per byte."""
    return i >> 1


def nf4_shift_of(i):
    """Bit offset of element i inside its byte: even elements in the HIGH nibble (shift 4),
    odd elements in the low nibble (shift 0)."""
    return (1 - (i & 1)) << 2


def nf4_block_of(i, log2_blocksize):
    """absmax index of element i, for a power-of-two blocksize = 1 << log2_blocksize."""
    return i >> log2_blocksize


def log2_exact(n):
    """log2 of a power of two n ≥ 1 (Python ints only: used to turn a blocksize into a shift)."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"{n} is not a power of two")
    return n.bit_length() - 1
