"""A backward that autograd cannot differentiate again must refuse where the second
derivative is asked for, not answer it.

torch's own `once_differentiable` wraps the gradients in an error node whose inputs are fresh
detached aliases: `torch.autograd.grad(s, inputs=[x, dy])` never reaches that node (it is on
no path to x or dy) and returns None, which `allow_unused=True` or `materialize_grads=True`
turn into a silent zero second derivative. `once_differentiable(name)` below puts the refusal
on the path instead: the gradients come back as outputs of a node whose inputs are the
backward's own inputs (the saved tensors and the upstream gradients that require grad), and
whose backward raises, so any second derivative with respect to any of them raises.
"""

from __future__ import annotations

import functools

import torch

MESSAGE = ("{name}: the backward runs Triton kernels, which autograd cannot differentiate "
           "(double backward is once_differentiable here); take second derivatives through "
           "the torch backend")


class _Refuse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, n_sources, *tensors):
        ctx.name = name
        return tuple(t.detach() for t in tensors[n_sources:])

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(MESSAGE.format(name=ctx.name))


def once_differentiable(name: str):
    """Decorator for an autograd.Function's backward computed outside autograd."""

    def wrap(backward):
        @functools.wraps(backward)
        def run(ctx, *grads):
            with torch.no_grad():
                out = backward(ctx, *grads)
            if not torch.is_grad_enabled():  # create_graph=False: nothing will differentiate it
                return out
            sources = [t for t in (*ctx.saved_tensors, *grads)
                       if isinstance(t, torch.Tensor) and t.requires_grad]
            single = not isinstance(out, tuple)
            outs = (out,) if single else out
            present = [i for i, t in enumerate(outs) if isinstance(t, torch.Tensor)]
            if not sources or not present:
                return out
            wrapped = _Refuse.apply(name, len(sources), *sources, *(outs[i] for i in present))
            result = list(outs)
            for i, t in zip(present, wrapped):
                result[i] = t
            return result[0] if single else tuple(result)

        return run

    return wrap
