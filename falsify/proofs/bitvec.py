"""Unsigned z3 bit-vectors that run the launch arithmetic of falsify/kernels/launch.py unchanged.

z3's BitVecRef has no `//` and its `>>` is arithmetic; launch functions are written with
`+ - * // | & >>` on Python ints. Wrapping the symbolic inputs in `U` maps `//` to UDiv and `>>`
to a logical shift, so the proof runs the kernel's own `launch_config` on symbolic shapes.
Read results back with `.e`.
"""

import z3


class U:
    """An unsigned z3 bit-vector that supports the operators falsify/kernels/launch.py uses (`//` is
    UDiv,
    `>>` is a logical shift), so the launch functions run unchanged on symbolic input."""

    __slots__ = ("e",)

    def __init__(self, e):
        self.e = e

    @staticmethod
    def _v(o):
        return o.e if isinstance(o, U) else o

    def __add__(self, o):
        return U(self.e + self._v(o))

    __radd__ = __add__

    def __sub__(self, o):
        return U(self.e - self._v(o))

    def __rsub__(self, o):
        return U(self._v(o) - self.e)

    def __mul__(self, o):
        return U(self.e * self._v(o))

    __rmul__ = __mul__

    def __floordiv__(self, o):
        return U(z3.UDiv(self.e, self._v(o)))

    def __rfloordiv__(self, o):
        return U(z3.UDiv(self._v(o), self.e))

    def __or__(self, o):
        return U(self.e | self._v(o))

    def __and__(self, o):
        return U(self.e & self._v(o))

    def __rshift__(self, o):
        return U(z3.LShR(self.e, self._v(o)))
