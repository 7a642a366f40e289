"""all_gather of tensors in the client's memory with two operations in flight; a broadcast of
parameters that require grad; sync_params with a bool buffer."""
import ctypes
import time

import torch

import gradsync
import gradsync.torch
from gradsync import _lib

client = gradsync.connect()
rank = client.rank
mine = gradsync.torch.empty(client, 2)
mine.copy_(torch.tensor([1.0, 2.0]) + 10 * rank)
first = client.all_gather_coalesced([mine])
# Until the daemon finished the first (asked of the library directly: is_completed() would
# already copy its results out), then the input may change.
done = ctypes.c_int32(0)
while not done.value:
    assert _lib.lib().gs_work_is_completed(first._handle, ctypes.byref(done)) == 0
    time.sleep(0.001)
mine.copy_(torch.tensor([100.0, 101.0]) + 10 * rank)
second = client.all_gather_coalesced([mine])  # the same set: the same gather output
got2, got1 = second.wait(30), first.wait(30)
assert [row[0].tolist() for row in got1] == [[1.0, 2.0], [11.0, 12.0]], got1
assert [row[0].tolist() for row in got2] == [[100.0, 101.0], [110.0, 111.0]], got2
print("ok all_gather in flight", flush=True)


class WithMask(torch.nn.Module):
    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.linear = torch.nn.Linear(3, 3)
        self.register_buffer("mask", torch.rand(5) > 0.5)


net = WithMask(seed=rank)  # different on every rank until synced
gradsync.torch.sync_params(net, client)
reference = WithMask(seed=0)
assert torch.equal(net.linear.weight, reference.linear.weight) and torch.equal(net.mask, reference.mask)
assert net.linear.weight.requires_grad
print("ok sync_params", flush=True)
