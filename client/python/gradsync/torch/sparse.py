"""Sparse (COO) gradients: allreduce_coalesced of torch sparse tensors, as nn.Embedding(sparse=True)
makes them (the seeds' S16 S35 S36).

A sparse tensor's entries differ in number from rank to rank and from step to step, and a sum
of sparse tensors is their union. Each rank first coalesces its own tensors (repeated rows
summed, so a tensor never has more entries than rows), then allgathers through the daemon, in
two operations on sets of the client's memory:
1. every rank's entry count per tensor (one int64 each);
2. every rank's entries, each tensor's indices (int64, its sparse dimensions flattened to one
   row-major index) and values (its dense dimensions flattened) in separate tensors of one set,
   each padded to the tensor's capacity: the smallest set registered so far that holds this
   call's largest counts, else those counts rounded up to a power of two (at most the rows).
   Every rank saw the same counts in (1) and registered the same sets, so every rank picks the
   same one.
Each rank then sums what it gathered, in rank order, in float32 for the half types (float64
for float64), into the coalesced sum (indices sorted, duplicates summed) or, when asked, the
dense result. Every rank gathers the same bytes and sums them alike, so every rank gets the same
bits. CUDA tensors (all on one device) stay there: the entries are gathered through a set of
device memory and summed on the GPU, one rank at a time, so that no element takes two additions
in one kernel (index_add_ adds with atomics on a GPU, whose order would differ between ranks);
the counts go through host memory, since the capacities are chosen on the host. Sum and avg only: a missing entry is a zero, for which min and max mean little. Over the
whole job only: a named group's non-members would see no counts and pick other sets. C++'s
gradsync::SparseReducer (client/include/gradsync/sparse.h) speaks the same two operations.
"""
import torch

from ..errors import InvalidArgumentError
from . import _coalesced

RESULTS = ("coalesced", "dense")


class DoneWork:
    """The Work of an operation that already finished: sparse reductions finish in the call."""

    def __init__(self, result):
        self._result = result

    def wait(self, timeout=None):
        return self._result

    def is_completed(self):
        return True

    def wait_stream(self, stream=None):
        return None


def _check(tensors, op, result, group):
    if group not in (None, "dp"):
        raise InvalidArgumentError(f"gradsync: sparse tensors are reduced over the whole job, not group {group!r} "
                                   "(docs/limitations.md)")
    if op not in ("sum", "avg"):
        raise InvalidArgumentError(f"gradsync: sparse tensors are reduced with op='sum' or 'avg', not {op!r}")
    if result not in RESULTS:
        raise InvalidArgumentError(f"gradsync: sparse_result must be one of {RESULTS}, not {result!r}")
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor) or not t.is_sparse:
            got = t.layout if isinstance(t, torch.Tensor) else type(t).__name__
            raise InvalidArgumentError(f"gradsync: item {i} is {got}, not a sparse COO tensor; a list is either all "
                                       "sparse or all dense (reduce the two kinds in two calls)")
        if t.device.type not in ("cpu", "cuda"):
            raise InvalidArgumentError(f"gradsync: sparse tensor {i} is on {t.device}; sparse gradients are reduced "
                                       "from CPU or CUDA memory")
        if t.device != tensors[0].device:
            raise InvalidArgumentError(f"gradsync: sparse tensor {i} is on {t.device} and tensor 0 on "
                                       f"{tensors[0].device}; one call's sparse tensors share a device")
        if t.dtype not in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
            raise InvalidArgumentError(f"gradsync: sparse tensor {i} is {t.dtype}; sparse reduction takes "
                                       "floating-point values")
        if any(size == 0 for size in t.shape):
            raise InvalidArgumentError(f"gradsync: sparse tensor {i} has shape {tuple(t.shape)}, with no elements")


def _flat_parts(t):
    """A sparse tensor, coalesced (the half types summed in float32, then rounded), as (row-major
    linear indices [nnz] int64, values [nnz, width])."""
    if t.dtype in (torch.float16, torch.bfloat16):
        t = t.to(torch.float32).coalesce().to(t.dtype)
    else:
        t = t.coalesce()
    sparse_dims = t.sparse_dim()
    indices = t._indices()
    linear = torch.zeros(indices.shape[1], dtype=torch.int64, device=t.device)
    for d in range(sparse_dims):
        linear = linear * t.shape[d] + indices[d]
    width = 1
    for size in t.shape[sparse_dims:]:
        width *= size
    values = t._values().reshape(indices.shape[1], width)
    return linear, values


def _unflatten_indices(linear, shape, sparse_dims):
    rows = []
    rest = linear.clone()
    for d in reversed(range(sparse_dims)):
        rows.append(rest % shape[d])
        rest = rest // shape[d]
    return torch.stack(list(reversed(rows))) if rows else linear.new_zeros((0, linear.numel()))


def _capacity(client, key, maxima, rows, widths):
    """The data set's capacity per tensor: the smallest registered for these shapes that holds
    the largest counts, else the counts rounded up to powers of two (at most the rows). Every
    rank saw the same counts and registered the same sets, so every rank picks the same."""
    known = getattr(client, "_sparse_capacities", None)
    if known is None:
        known = client._sparse_capacities = {}
    made = known.setdefault(key, [])
    fitting = [c for c in made if all(have >= need for have, need in zip(c, maxima))]
    if fitting:
        return min(fitting, key=lambda c: sum(cap * (1 + w) for cap, w in zip(c, widths)))
    grown = []
    for need, limit in zip(maxima, rows):
        size = 1
        while size < need:
            size *= 2
        grown.append(min(size, limit))
    made.append(grown)
    return grown


def allreduce(client, tensors, op="avg", divisor=None, group=None, result="coalesced"):
    """Sums (or averages, after summing) sparse COO tensors across the job's ranks; returns a
    finished Work whose wait() gives one result per tensor: the input itself, which now holds
    the coalesced result (as the dense operations reduce in place), or, with result="dense", a
    new dense tensor (the input is left as it was)."""
    tensors = list(tensors)
    if not tensors:
        raise InvalidArgumentError("gradsync: an operation needs at least one tensor")
    _check(tensors, op, result, group)
    if divisor is not None and op != "avg":
        raise InvalidArgumentError("gradsync: divisor applies to op='avg' only")
    if divisor is not None and not divisor > 0:
        raise InvalidArgumentError(f"gradsync: divisor must be positive, not {divisor!r}")
    parts = [_flat_parts(t) for t in tensors]
    counts = torch.tensor([linear.numel() for linear, _ in parts], dtype=torch.int64)
    gathered_counts = _coalesced.all_gather(client, [counts], group).wait()
    per_rank = [row[0].tolist() for row in gathered_counts]
    maxima = [max(rank_counts[i] for rank_counts in per_rank) for i in range(len(tensors))]
    shapes = tuple((tuple(t.shape), t.sparse_dim(), t.dtype) for t in tensors)
    rows = []
    for t in tensors:
        count = 1
        for size in t.shape[:t.sparse_dim()]:
            count *= size
        rows.append(count)
    caps = _capacity(client, shapes, maxima, rows, [values.shape[1] for _, values in parts])
    padded = []
    device = tensors[0].device
    for (linear, values), cap in zip(parts, caps):
        index = torch.zeros(cap, dtype=torch.int64, device=device)
        index[:linear.numel()] = linear
        padded.append(index)
    for (linear, values), cap in zip(parts, caps):
        width = values.shape[1]
        flat = torch.zeros(max(cap * width, 1), dtype=values.dtype, device=device)
        flat[:values.numel()] = values.reshape(-1)
        padded.append(flat)
    everyone = _coalesced.all_gather(client, padded, group).wait()
    n = len(tensors)
    divide = (divisor or len(everyone)) if op == "avg" else None
    out = []
    for i, t in enumerate(tensors):
        width = parts[i][1].shape[1]
        wide = torch.float64 if t.dtype == torch.float64 else torch.float32
        # Each rank's entries are coalesced (its indices distinct and sorted): adding one rank's
        # at a time, in rank order, makes every sum ((0 + v0) + v1) + ..., on any device.
        indices = [row[i][:per_rank[r][i]] for r, row in enumerate(everyone)]
        unique = torch.unique(torch.cat(indices))
        summed = torch.zeros((unique.numel(), width), dtype=wide, device=device)
        for r, row in enumerate(everyone):
            values = row[n + i][:per_rank[r][i] * width].reshape(per_rank[r][i], width).to(wide)
            summed.index_add_(0, torch.searchsorted(unique, indices[r]), values)
        if divide is not None:
            summed = summed / divide
        dense_shape = t.shape[t.sparse_dim():]
        reduced = torch.sparse_coo_tensor(_unflatten_indices(unique, t.shape, t.sparse_dim()),
                                          summed.to(t.dtype).reshape((unique.numel(),) + tuple(dense_shape)),
                                          t.shape, dtype=t.dtype)._coalesced_(True)
        if result == "dense":
            out.append(reduced.to_dense())
        else:
            # In place, as the dense operations: the input becomes the coalesced result.
            with torch.no_grad():
                t.copy_(reduced)
            out.append(t)
    return DoneWork(out)
