"""Buffers, known data and the correctness check of one collective benchmark point.

nccl-tests ``-c``: inputs filled with rank-dependent known values, the collective run once more,
and the elements of the result that differ from the expected one counted (its ``#wrong``). Used
by the rank targets of :mod:`perfkit.measuring.collectives.benchmark`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["point_buffers", "check"]

_ROOT = 0
_PATTERN_MOD = 17  # pattern values 1..17: sums over ranks stay exact integers in bf16 up to n=15


def _pattern(rank: int, numel: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Known data for the check: small positive integers depending on rank and index."""
    i = torch.arange(numel, dtype=torch.int64, device=device)
    return ((i * 7 + rank * 3) % _PATTERN_MOD + 1).to(dtype)


def point_buffers(op, inplace, count, n, rank, dtype, device):
    """(call, fills, expected, result) for one op/form: ``call()`` runs the collective once;
    ``fills`` are (buffer, value) copies that put the check's known inputs in place and a sentinel
    (0) in the outputs; ``expected()`` builds the expected result (only when checking: at large
    sizes it is as big as the buffers)."""
    zeros = lambda k: torch.zeros(k, dtype=dtype, device=device)  # noqa: E731
    pat = lambda r, k: _pattern(r, k, dtype, device)  # noqa: E731
    chunk = slice(rank * count, (rank + 1) * count)
    if op == "all_reduce":
        buf = zeros(count)
        expected = lambda: sum(pat(q, count).to(torch.float64) for q in range(n))  # noqa: E731
        return (lambda: dist.all_reduce(buf)), [(buf, lambda: pat(rank, count))], expected, buf
    if op == "broadcast":
        buf = zeros(count)
        return ((lambda: dist.broadcast(buf, src=_ROOT)), [(buf, lambda: pat(rank, count))],
                lambda: pat(_ROOT, count), buf)
    if op == "all_gather":
        out = zeros(n * count)
        inp = out[chunk] if inplace else zeros(count)
        fills = [(out, lambda: zeros(n * count)), (inp, lambda: pat(rank, count))]
        expected = lambda: torch.cat([pat(q, count) for q in range(n)])  # noqa: E731
        return (lambda: dist.all_gather_into_tensor(out, inp)), fills, expected, out
    if op == "reduce_scatter":
        inp = zeros(n * count)
        out = inp[chunk] if inplace else zeros(count)
        # input last: in place, it holds the output
        fills = [(out, lambda: zeros(count)), (inp, lambda: pat(rank, n * count))]
        expected = lambda: sum(pat(q, n * count)[chunk].to(torch.float64) for q in range(n))  # noqa: E731
        return (lambda: dist.reduce_scatter_tensor(out, inp)), fills, expected, out
    if op == "all_to_all":
        inp, out = zeros(n * count), zeros(n * count)
        # Rank q's input chunk r goes to rank r's output chunk q.
        expected = lambda: torch.cat([pat(q, n * count)[chunk] for q in range(n)])  # noqa: E731
        fills = [(out, lambda: zeros(n * count)), (inp, lambda: pat(rank, n * count))]
        return (lambda: dist.all_to_all_single(out, inp)), fills, expected, out
    # send_recv: a ring of pairs, rank r sends to r+1 and receives from r-1 (nccl-tests sendrecv).
    send, recv = zeros(count), zeros(count)
    ops = [dist.P2POp(dist.isend, send, (rank + 1) % n), dist.P2POp(dist.irecv, recv, (rank - 1) % n)]

    def call():
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    fills = [(recv, lambda: zeros(count)), (send, lambda: pat(rank, count))]
    return call, fills, lambda: pat((rank - 1) % n, count), recv


def check(call, fills, expected, result, corrupt: bool, device) -> int:
    """Wrong elements of one checked call on this rank (``corrupt``: spoil one element first,
    for tests)."""
    for buf, value in fills:
        buf.copy_(value())
    call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if corrupt:
        result.view(-1)[0] += 1
    return int((result.to(torch.float64) != expected().to(torch.float64)).sum().item())
