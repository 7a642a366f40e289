"""One rank per node (daemon): connect() from torchrun's variables alone, the rendezvous from
$MASTER_ADDR (the library adds gradsyncd's default peer port)."""
import torch

import gradsync

client = gradsync.connect()
t = [torch.full((4,), float(client.rank + 1))]
client.allreduce_coalesced(t, op="sum").wait(30)
assert t[0].tolist() == [3.0] * 4, t
print(f"ok rank {client.rank} job {client.job}", flush=True)
