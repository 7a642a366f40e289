"""allreduce_coalesced(..., health=True) on every floating dtype, staging and direct, against a
reference written from the definition in daemon/reduce/health.h (32 sequential float64 lanes), bit for
bit (masked sets too); an inf on one rank found on all; and MasterParams stepping, skipping and rescaling alike on
every rank."""
import math

import torch

import gradsync
import gradsync.torch
from ops import Direct, exit_on_failures, inputs

FLOATING = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
failures = []


def reference(tensors):
    """found_inf and the sum of squares of the results, as health.h defines them."""
    found, total = False, 0.0
    for t in tensors:
        values = t.reshape(-1).to(torch.float64).tolist()
        for begin in range(0, len(values), 4096):
            block = values[begin:begin + 4096]
            lanes = [0.0] * 32
            for i, x in enumerate(block):
                found = found or not math.isfinite(x)
                lanes[i % 32] = lanes[i % 32] + x * x
            block_sum = 0.0
            for lane in lanes:
                block_sum = block_sum + lane
            total = total + block_sum
    return found, total


def same(a, b):
    return (math.isnan(a) and math.isnan(b)) or a == b


def main():
    client = gradsync.connect()
    rank, world = client.rank, client.world_size
    direct = Direct(client)
    case = 0
    for path in ("staging", "direct"):
        place = (lambda ts: [t.clone() for t in ts]) if path == "staging" else direct.like
        for dtype in FLOATING:
            for poison in (False, True):
                case += 1
                mine = place(inputs(rank, dtype, case))
                if poison and rank == world - 1:
                    mine[2][3] = float("inf")
                work = client.allreduce_coalesced(mine, op="avg", health=True)
                work.wait(60)
                found, norm = reference(mine)
                what = f"{path} {dtype} poison={poison}"
                if work.found_inf() != found or found != poison:
                    failures.append(f"{what}: found_inf {work.found_inf()}, the results say {found}")
                if not poison and not same(work.sq_norm(), norm):
                    failures.append(f"{what}: sq_norm {work.sq_norm()!r}, the reference {norm!r}")
    # With a mask: the health of the results, which are zero outside it; an inf the mask drops
    # is not found (it is zeroed), one it keeps is.
    for path in ("staging", "direct"):
        place = (lambda ts: [t.clone() for t in ts]) if path == "staging" else direct.like
        for dtype in FLOATING:
            for poison in (None, "dropped", "kept"):
                case += 1
                mine = place(inputs(rank, dtype, case))
                total = sum(t.numel() for t in mine)
                mask = torch.arange(1, total, 3)
                if poison and rank == world - 1:
                    mine[2][0 if poison == "dropped" else 2] = float("inf")  # flat 8 is dropped, 10 kept
                work = client.allreduce_coalesced(mine, op="avg", health=True, mask=mask)
                work.wait(60)
                found, norm = reference(mine)
                what = f"masked {path} {dtype} poison={poison}"
                if work.found_inf() != found or found != (poison == "kept"):
                    failures.append(f"{what}: found_inf {work.found_inf()}, the results say {found}")
                if poison != "kept" and not same(work.sq_norm(), norm):
                    failures.append(f"{what}: sq_norm {work.sq_norm()!r}, the reference {norm!r}")
    # Not asked for: refused by name.
    work = client.allreduce_coalesced([torch.ones(4)], op="sum")
    work.wait(60)
    try:
        work.found_inf()
        failures.append("found_inf of an allreduce that did not ask for it")
    except gradsync.InvalidArgumentError as e:
        if "did not ask for it" not in str(e):
            failures.append(f"unexpected message: {e}")

    # MasterParams: bfloat16 parameters, gradients set by hand (rank-dependent), SGD on the
    # float32 master copy.
    params = [torch.nn.Parameter(torch.full((5,), 1.0, dtype=torch.bfloat16)),
              torch.nn.Parameter(torch.full((3, 2), -2.0, dtype=torch.bfloat16))]
    master = gradsync.torch.MasterParams(params, init_scale=4.0, growth_interval=2)
    optimizer = torch.optim.SGD([master.flat], lr=0.5)
    for step in range(4):
        for p in params:
            p.grad = torch.full(p.shape, (rank + 1) * master.loss_scale, dtype=torch.bfloat16)
        if step == 2 and rank == 0:
            params[1].grad[0, 1] = float("nan")
        before = [p.detach().clone() for p in params]
        scale = master.loss_scale
        work = client.allreduce_coalesced([p.grad for p in params], op="avg", health=True)
        work.wait(60)
        norm = master.grad_norm(work) if step != 2 else None
        stepped = master.step(optimizer, work)
        if stepped != (step != 2):
            failures.append(f"MasterParams step {step}: stepped {stepped}")
        # The averaged, unscaled gradient is (1 + ... + world) / world.
        mean = sum(range(1, world + 1)) / world
        for p, b in zip(params, before):
            want = b if step == 2 else (b.float() - 0.5 * mean).to(torch.bfloat16)
            if not torch.equal(p.detach(), want):
                failures.append(f"MasterParams step {step}: parameter {p.detach().tolist()}, want {want.tolist()}")
        want_scale = scale * (0.5 if step == 2 else (2.0 if master.clean_steps % 2 == 0 else 1.0))
        if master.loss_scale != want_scale:
            failures.append(f"MasterParams step {step}: loss scale {master.loss_scale}, want {want_scale}")
        if stepped and abs(norm - mean * math.sqrt(11)) > 1e-2:
            failures.append(f"MasterParams step {step}: grad_norm {norm}")
    # optimizer.zero_grad(set_to_none=True) drops flat.grad; the next step puts it back. And
    # max_norm clips: the gradient of norm mean * sqrt(11) is scaled to norm 1.
    optimizer.zero_grad(set_to_none=True)
    for p in params:
        p.grad = torch.full(p.shape, (rank + 1) * master.loss_scale, dtype=torch.bfloat16)
    before = master.flat.detach().clone()
    work = client.allreduce_coalesced([p.grad for p in params], op="avg", health=True)
    work.wait(60)
    if not master.step(optimizer, work, max_norm=1.0):
        failures.append("MasterParams: the clipped step was skipped")
    moved = (before - master.flat.detach()).norm().item()
    if abs(moved - 0.5) > 1e-3:  # lr 0.5 times a gradient of norm 1
        failures.append(f"MasterParams: a clipped step moved the parameters by {moved}, not 0.5")
    print(f"rank {rank}: {case} cases, loss scale {master.loss_scale}, skipped {master.skipped_steps}")
    exit_on_failures(failures)


if __name__ == "__main__":
    main()
