"""A model whose gradients are exact on any device, for the hook tests (ddp_hook_test.py, ddp_hook_cuda_test.py):
forward(cs) = sum(p * c) over its parameters, so backward writes grad = c with no arithmetic, and every difference a
test sees is the hook's -- never the model's own math (cuBLAS against terse's fixed-order GEMM, say)."""

import torch
import torch.nn as nn


class Exact(nn.Module):
    """Parameters of the given shapes only (seeded: the same on every rank and device)."""

    def __init__(self, shapes):
        super().__init__()
        g = torch.Generator().manual_seed(7)
        self.ps = nn.ParameterList([nn.Parameter(torch.randn(s, generator=g)) for s in shapes])

    def forward(self, cs):
        return sum((p * c).sum() for p, c in zip(self.ps, cs))


def exact_gradients(shapes, step, rank, spread, rank_scale=0.0):
    """The gradients `cs` of one step on one rank: normal values scaled by 1 + rank_scale * rank + spread * U(0, 1)
    per element -- mixed magnitudes, so that top-k, threshold and the quantizers' scales all see something to choose,
    and with rank_scale, ranks whose magnitudes differ."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return [torch.randn(s, generator=g) * ((1.0 + rank_scale * rank) + spread * torch.rand(s, generator=g))
            for s in shapes]
