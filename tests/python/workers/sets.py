"""The set cache: the same list reuses its set, a new list of the same layout reuses the staging
set, a changed layout registers a new one, and tensors in the client's memory are their own set."""
import torch

import gradsync
from gradsync.torch import GradBuffer

client = gradsync.connect()
a = [torch.ones(10), torch.ones(3)]
client.allreduce_coalesced(a).wait(30)
client.allreduce_coalesced(a).wait(30)
assert len(client._sets) == 1, client._sets
b = [torch.zeros(10), torch.zeros(3)]  # same layout, other tensors: the staging set again
client.allreduce_coalesced(b).wait(30)
assert len(client._sets) == 1, client._sets
client.allreduce_coalesced([torch.ones(11)]).wait(30)  # another layout
assert len(client._sets) == 2, client._sets
assert client.staging_copies == 3 * 4 + 2, client.staging_copies  # 3 lists of 2 and 1 of 1, in and out
# Two operations in flight on one layout share the staging area: the second waits for the first.
x, y = [torch.full((10,), 1.0 + client.rank), torch.ones(3)], [torch.full((10,), 10.0), torch.ones(3)]
w1 = client.allreduce_coalesced(x, op="sum")
w2 = client.allreduce_coalesced(y, op="sum")
w2.wait(30)
w1.wait(30)
assert x[0].tolist() == [3.0] * 10 and y[0].tolist() == [20.0] * 10, (x, y)
model = torch.nn.Linear(4, 4)
buffer = GradBuffer(model.parameters(), client)
copies = client.staging_copies
grads = [p.grad for p in model.parameters()]
client.allreduce_coalesced(grads).wait(30)
assert client.staging_copies == copies, "tensors in the client's memory were staged"
print("ok")
