"""GradBuffer's edge cases on 2 ranks; prints "ok CASE" for each, exits 1 on the first failure.
Rank r's inputs are r + 1, so an average over the ranks is 1.5 times a rank-1-less one."""
import sys
import time

import torch

import gradsync
from gradsync.torch import GradBuffer

client = gradsync.connect()
rank = client.rank


def linear(dtype=torch.float32):
    torch.manual_seed(0)
    return torch.nn.Linear(4, 1, bias=False).to(dtype)


def expect(what, got, want):
    if not torch.allclose(got.float(), torch.as_tensor(want, dtype=torch.float32), rtol=1e-3):
        print(f"FAIL {what}: got {got.tolist()} want {want}")
        sys.exit(1)


def backward(model, scale):
    # d/dw sum(w . x) = x, with x = scale * ones
    model(torch.full((1, 4), float(scale), dtype=model.weight.dtype)).sum().backward()


# A second backward before wait() is refused, naming the parameter (not silently mis-reduced).
model = linear()
buffer = GradBuffer(model.parameters(), client)
backward(model, rank + 1)
try:
    backward(model, rank + 1)
    print("FAIL twice: no error")
    sys.exit(1)
except gradsync.InvalidArgumentError as e:
    assert "produced twice before wait()" in str(e) and "no_sync()" in str(e), e
print("ok twice", flush=True)

# no_sync(): micro-batches accumulate locally; the last one reduces the sum.
model = linear()
buffer = GradBuffer(model.parameters(), client)
buffer.zero_grad()
with buffer.no_sync():
    backward(model, rank + 1)
backward(model, rank + 1)
buffer.wait(30)
expect("no_sync", model.weight.grad, [3.0] * 4)  # ranks hold 2 and 4: the average is 3
print("ok no_sync", flush=True)

# fp32 main_grad of bf16 parameters: accumulated in fp32 even inside no_sync().
model = linear(torch.bfloat16)
buffer = GradBuffer(model.parameters(), client, dtype=torch.float32)
buffer.zero_grad()
with buffer.no_sync():
    for _ in range(3):
        backward(model, (rank + 1) * 1.001)
backward(model, (rank + 1) * 1.001)
buffer.wait(30)
assert model.weight.main_grad.dtype == torch.float32 and model.weight.grad is None
expect("main_grad", model.weight.main_grad, [4 * 1.5 * 1.001] * 4)
print("ok main_grad", flush=True)

# A parameter backward did not reach is reduced with its buffer value (zero after zero_grad()).
torch.manual_seed(0)
used, unused = torch.nn.Linear(4, 1, bias=False), torch.nn.Linear(4, 1, bias=False)
buffer = GradBuffer(list(used.parameters()) + list(unused.parameters()), client)
buffer.zero_grad()
backward(used, rank + 1)
buffer.wait(30)
expect("unused", unused.weight.grad, [0.0] * 4)
expect("used", used.weight.grad, [1.5] * 4)
print("ok unused", flush=True)

# set_to_none=True detaches param.grad: the hook copies it back in and counts it.
model = linear()
buffer = GradBuffer(model.parameters(), client)
model.zero_grad(set_to_none=True)
backward(model, rank + 1)
buffer.wait(30)
expect("set_to_none", model.weight.grad, [1.5] * 4)
assert buffer.staging_copies == 1 and model.weight.grad.data_ptr() == buffer.grads[0].data_ptr()
print("ok set_to_none", flush=True)

# A wait() that times out keeps the step open: waiting again gets that step's reduction.
model = linear()
buffer = GradBuffer(model.parameters(), client)
for step in range(2):
    buffer.zero_grad()
    if rank == 1 and step == 0:
        time.sleep(1.5)
    backward(model, rank + 1 + step)
    try:
        buffer.wait(0.5)
    except gradsync.TimeoutError:
        buffer.wait(30)
    expect(f"timeout step {step}", model.weight.grad, [1.5 + step] * 4)
print("ok timeout", flush=True)

# Built under no_grad (torch < 2.1 needs autograd for its accumulator hooks).
model = linear()
with torch.no_grad():
    buffer = GradBuffer(model.parameters(), client)
buffer.zero_grad()
backward(model, rank + 1)
buffer.wait(30)
expect("no_grad", model.weight.grad, [1.5] * 4)
print("ok no_grad", flush=True)

# Which hook marks parameters ready: the test checks it against the torch version.
model = linear()
buffer = GradBuffer(model.parameters(), client)
if getattr(model.weight, "_post_accumulate_grad_hooks", None):
    path = "post-accumulate-grad"
elif buffer._accumulators:
    path = "grad-accumulator"
else:
    path = "none"
print(f"hook path {path}", flush=True)

# A dropped GradBuffer's hooks go with it (a post-accumulate-grad hook lives on the parameter,
# PyTorch 2.1+): a new GradBuffer over the same parameters is the only one marking them, so
# no gradient is taken back into the old buffer, and no step sees it "produced twice".
model = linear()
old = GradBuffer(model.parameters(), client)
old.zero_grad()
backward(model, rank + 1)
old.wait(30)
del old  # no remove_hooks(), no gc.collect(): dropped the way a training script drops it
buffer = GradBuffer(model.parameters(), client)
for step in range(3):
    buffer.zero_grad()
    backward(model, rank + 1 + step)
    buffer.wait(30)
    expect(f"rebuilt step {step}", model.weight.grad, [1.5 + step] * 4)
assert buffer.staging_copies == 0 and model.weight.grad.data_ptr() == buffer.grads[0].data_ptr(), buffer.staging_copies
print("ok rebuilt", flush=True)
