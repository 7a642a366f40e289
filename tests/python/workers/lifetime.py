"""Tensors and works that outlive Client.close() stay valid (they keep the memory mapped), and
the closed client refuses new calls."""
import torch

import gradsync
from gradsync.torch import GradBuffer

client = gradsync.connect()
model = torch.nn.Linear(4, 2)
buffer = GradBuffer(model.parameters(), client)
model(torch.ones(1, 4)).sum().backward()
buffer.wait(30)
staged = [torch.ones(3)]
work = client.allreduce_coalesced(staged)
client.close()
work.wait(30)                                  # the staging area is still mapped
assert staged[0].tolist() == [1.0, 1.0, 1.0], staged
model.zero_grad(set_to_none=False)             # writes the buffer: still mapped
assert model.weight.grad.abs().sum().item() == 0
try:
    client.allreduce_coalesced(staged)
    raise SystemExit("a closed client took an operation")
except gradsync.InvalidArgumentError as e:
    assert "closed" in str(e), e
print("ok lifetime", flush=True)
