"""One rank per node (daemon): connect() from torchrun's variables alone, the rendezvous from
$MASTER_ADDR (the library adds gradsyncd's default peer port). Across the nodes: a plain
allreduce, a masked one (only the kept elements reduced, the rest zero), sparse gradients
(every rank's rows gathered and summed) and wire compression (float32 and bfloat16 tensors
crossing as bfloat16, float16 ones as float16: with two nodes, one rounding of each node's sum and one of their
sum, so the result is known exactly)."""
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
    generator = torch.Generator().manual_seed(7)
    inputs = [[torch.randn(1000, generator=generator) * 100 for _ in range(3)] for _ in range(world)]
    across = client.local_world_size == 1  # two nodes; else both ranks on one, where nothing crosses
    # float32 and bfloat16 as bfloat16; float16 as float16 (never bfloat16: refused below). With
    # one rank per node a half tensor's node sum is already in its type, so only float32 shows
    # that the wire took effect here; the C++ byte counter and backend_wire.py show it for halves.
    for dtypes, wire in (((torch.float32, torch.bfloat16), torch.bfloat16), ((torch.float16,), torch.float16)):
        mine = [x.to(dtype).clone() for x, dtype in zip(inputs[client.rank], dtypes)]
        client.allreduce_coalesced(mine, op="sum", wire_dtype=wire).wait(30)
        for k, dtype in enumerate(dtypes):
            given = [inputs[r][k].to(dtype).float() for r in range(world)]
            if across:
                want = (given[0].to(wire).float() + given[1].to(wire).float()).to(wire).float().to(dtype)
            else:
                want = (given[0] + given[1]).to(dtype)
            assert torch.equal(mine[k], want), (dtype, wire, across, (mine[k].float() - want.float()).abs().max())
        if dtypes[0] == torch.float32:
            exact = inputs[0][0] + inputs[1][0]
            assert ((mine[0] != exact).sum() > 500) == across, (across, (mine[0] != exact).sum())
    try:
        client.allreduce_coalesced([torch.ones(4, dtype=torch.float16)], op="sum", wire_dtype=torch.bfloat16)
        raise AssertionError("a float16 tensor crossing as bfloat16 was accepted")
    except gradsync.InvalidArgumentError as e:
        assert "cannot cross nodes as bfloat16" in str(e), e
    try:
        client.allreduce_coalesced([torch.ones(4, dtype=torch.float64)], op="sum", wire_dtype=torch.bfloat16)
        raise AssertionError("wire compression of float64 was accepted")
    except gradsync.InvalidArgumentError as e:
        assert "applies to float32, float16 and bfloat16" in str(e), e
print(f"ok rank {client.rank} job {client.job}", flush=True)
