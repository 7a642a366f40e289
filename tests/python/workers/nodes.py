"""One rank per node (daemon): connect() from torchrun's variables alone, the rendezvous from
$MASTER_ADDR (the library adds gradsyncd's default peer port). Across the nodes: a plain
allreduce, a masked one (only the kept elements reduced, the rest zero) and sparse gradients
(every rank's rows gathered and summed)."""
import torch

import gradsync
import gradsync.torch

client = gradsync.connect()
world = client.world_size
t = [torch.full((4,), float(client.rank + 1))]
client.allreduce_coalesced(t, op="sum").wait(30)
assert t[0].tolist() == [3.0] * 4, t
if world == 2:
    masked = [torch.full((6,), float(client.rank + 1))]
    client.allreduce_coalesced(masked, op="sum", mask=torch.tensor([1, 4])).wait(30)
    assert masked[0].tolist() == [0.0, 3.0, 0.0, 0.0, 3.0, 0.0], masked
    rows = torch.sparse_coo_tensor(torch.tensor([[client.rank, 2]]), torch.ones(2, 3), (4, 3))
    summed = client.allreduce_coalesced([rows], op="sum").wait(30)[0]
    assert summed._indices().tolist() == [[0, 1, 2]] and summed._values().tolist() == [[1.0] * 3, [1.0] * 3, [2.0] * 3], summed
print(f"ok rank {client.rank} job {client.job}", flush=True)
