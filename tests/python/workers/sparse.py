"""Sparse COO gradients: allreduce_coalesced of sparse tensors against torch's own sum of every
rank's tensors (each rank makes them all from seeds), every floating dtype, sum and avg,
coalesced and dense results, entries that grow from step to step and a rank with none; then an
nn.Embedding(sparse=True) model trained under DDP with the gradsync hook against DDP on gloo,
in the same process, from the same start and data. With the argument "cuda" (the device check;
ranks share GPU 0) every tensor and the model are on the GPU, the references still on the CPU.
"""
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gradsync
import gradsync.torch
from ops import exit_on_failures

failures = []
SHAPES = [((50, 4), 1), ((7, 3, 2), 2), ((30,), 1)]  # (shape, sparse dims)


def sparse_input(rank, case, shape, sparse_dims, dtype):
    g = torch.Generator().manual_seed(case * 1000 + rank * 10 + len(shape))
    nnz = 0 if rank == 1 and case % 3 == 0 else int(torch.randint(1, 12 + 4 * case, (1,), generator=g))
    indices = torch.stack([torch.randint(0, shape[d], (nnz,), generator=g) for d in range(sparse_dims)])
    values = (torch.randint(-8, 8, (nnz,) + shape[sparse_dims:], generator=g).to(torch.float64) / 4).to(dtype)
    return torch.sparse_coo_tensor(indices, values, shape)  # uncoalesced: duplicates included


def check_ops(client, rank, world, device):
    case = 0
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        for op in ("sum", "avg"):
            for result in ("coalesced", "dense"):
                case += 1
                everyone = [[sparse_input(r, case, s, d, dtype) for s, d in SHAPES] for r in range(world)]
                mine = [t.clone().to(device) for t in everyone[rank]]
                raw = client.allreduce_coalesced(mine, op=op, sparse_result=result).wait()
                if any(g.device != mine[0].device for g in raw):
                    failures.append(f"{dtype} {op} {result}: a result is not on {mine[0].device}")
                got = [g.cpu() for g in raw]
                for i in range(len(SHAPES)):
                    # Quarters, summed over a few ranks: exact in every dtype, so exact here.
                    want = everyone[0][i].to(torch.float64)
                    for e in everyone[1:]:
                        want = want + e[i].to(torch.float64)
                    want = want.coalesce()
                    if op == "avg":
                        want = want / world
                    want = want.to(dtype)
                    what = f"{dtype} {op} {result} tensor {i}"
                    # Coalesced results land in the inputs (in place); dense ones leave them.
                    if result == "coalesced" and raw[i] is not mine[i]:
                        failures.append(f"{what}: the result is not the input, reduced in place")
                    if result == "dense" and not torch.equal(mine[i].to_dense().cpu(), everyone[rank][i].to_dense()):
                        failures.append(f"{what}: a dense result changed the input")
                    if result == "dense":
                        if got[i].is_sparse or not torch.equal(got[i], want.to_dense()):
                            failures.append(f"{what}: differs from torch's dense sum")
                    elif not got[i].is_sparse or not got[i].is_coalesced():
                        failures.append(f"{what}: not a coalesced sparse tensor")
                    elif not (torch.equal(got[i]._indices(), want._indices()) and
                              torch.equal(got[i]._values(), want._values())):
                        failures.append(f"{what}: differs from torch's coalesced sum")
    refusals = [(dict(tensors=[torch.ones(3).to_sparse(), torch.ones(3)]), "all sparse or all dense"),
                (dict(tensors=[torch.ones(3).to_sparse()], group="dp2"), "over the whole job, not group 'dp2'"),
                (dict(tensors=[torch.ones(3, 0).to_sparse(1)]), "with no elements"),
                (dict(tensors=[torch.ones(3).to_sparse()], prescale=True), "sparse tensors take op, divisor")]
    if device != "cpu":
        refusals.append((dict(tensors=[torch.ones(3).to_sparse().to(device), torch.ones(3).to_sparse()]),
                         "one call's sparse tensors share a device"))
    for kwargs, needle in refusals:
        try:
            client.allreduce_coalesced(op="sum", **kwargs)
            failures.append(f"{kwargs} was accepted")
        except gradsync.InvalidArgumentError as e:
            if needle not in str(e):
                failures.append(f"{kwargs}: unexpected message {e}")
    try:
        client.allreduce_coalesced([torch.ones(3).to_sparse()], op="max")
        failures.append("a sparse max was accepted")
    except gradsync.InvalidArgumentError as e:
        if "op='sum' or 'avg'" not in str(e):
            failures.append(f"sparse max: unexpected message {e}")
    return case


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(100, 8, sparse=True)
        self.head = torch.nn.Linear(8, 1)

    def forward(self, tokens):
        return self.head(self.embedding(tokens).mean(dim=1))


def train(rank, client, device, steps=15):
    torch.manual_seed(3)
    reference, ours = Model().to(device), Model().to(device)
    ours.load_state_dict(reference.state_dict())
    nets = [DDP(reference), DDP(ours)]
    nets[1].register_comm_hook(client, gradsync.torch.allreduce_hook)
    optimizers = [torch.optim.SGD(n.parameters(), lr=0.5) for n in nets]
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * rank + step)
        tokens = torch.randint(0, 100, (4, 6), generator=g).to(device)
        target = torch.randn(4, 1, generator=g).to(device)
        for net, optimizer in zip(nets, optimizers):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(net(tokens), target).backward()
            if not net.module.embedding.weight.grad.is_sparse:
                failures.append(f"step {step}: the embedding's gradient is not sparse")
            optimizer.step()
    for name, value in reference.state_dict().items():
        try:
            torch.testing.assert_close(ours.state_dict()[name], value, rtol=1e-5, atol=1e-6)
        except AssertionError as e:
            failures.append(f"after {steps} steps, {name} differs from DDP on gloo: {str(e).splitlines()[0]}")
    if torch.equal(reference.embedding.weight.cpu(), Model().embedding.weight):
        failures.append("the embedding did not train")


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["TEST_PORT"], rank=rank,
                            world_size=world)
    client = gradsync.connect()
    device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    cases = check_ops(client, rank, world, device)
    train(rank, client, device)
    print(f"rank {rank}: {cases} cases on {device}")
    exit_on_failures(failures)


if __name__ == "__main__":
    main()
