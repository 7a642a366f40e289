"""fp32 master copies of fp16/bf16 parameters with dynamic loss scaling, driven by the fused health
of the gradients' allreduce (the seeds' S10 S14 S15 S21 S25-S27, without their second pass over the
gradients to find an overflow: the daemon reports it with the reduction).

    master = gradsync.torch.MasterParams(model.parameters())
    optimizer = torch.optim.SGD([master.flat], lr=0.1)           # steps the fp32 copy
    for batch in data:
        master.scale(loss_fn(model(batch))).backward()           # fp16/bf16 gradients, scaled
        grads = [p.grad for p in master.model_params]             # every parameter needs one
        work = client.allreduce_coalesced(grads, op="avg", health=True)
        work.wait()
        norm = master.grad_norm(work)                             # before step(), which rescales
        master.step(optimizer, work, max_norm=1.0)                # False: skipped (inf or NaN)

The daemon computes the fused health for CPU and, since 2026-12-04, CUDA gradients; this helper
is tested with CPU tensors only (tests/python/workers/health.py); on CUDA tensors it has not run.
"""
import math

import torch

from ..errors import InvalidArgumentError


class MasterParams:
    """One flat float32 master copy (`flat`, an nn.Parameter for the optimizer) of the parameters
    that require grad, and the dynamic loss scale.

    step(optimizer, work) reads work.found_inf(): with an inf or a NaN in the reduced gradients
    it skips the step, zeroes the gradients and multiplies the scale by `backoff_factor`;
    otherwise it unscales the gradients into flat.grad (in float32), steps the optimizer, copies
    the master values back into the parameters (rounded to their dtype), and after
    `growth_interval` clean steps in a row multiplies the scale by `growth_factor`. Every rank
    sees the same found_inf, so every rank makes the same choice."""

    def __init__(self, params, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
                 min_scale=1.0):
        self.model_params = [p for p in params if p.requires_grad]
        if not self.model_params:
            raise InvalidArgumentError("gradsync: MasterParams needs at least one parameter that requires grad")
        for i, p in enumerate(self.model_params):
            if not p.dtype.is_floating_point:
                raise InvalidArgumentError(f"gradsync: MasterParams: parameter {i} is {p.dtype}, not floating point")
        if (not init_scale > 0 or not growth_factor >= 1 or not 0 < backoff_factor <= 1 or growth_interval < 1
                or not 0 < min_scale <= init_scale):
            raise InvalidArgumentError("gradsync: MasterParams: init_scale > 0, growth_factor >= 1, "
                                       "0 < backoff_factor <= 1, growth_interval >= 1 and "
                                       "0 < min_scale <= init_scale are required")
        device = self.model_params[0].device
        with torch.no_grad():
            flat = torch.cat([p.detach().reshape(-1).to(torch.float32) for p in self.model_params]).to(device)
        self.flat = torch.nn.Parameter(flat)
        # Kept here too: optimizer.zero_grad() sets flat.grad to None, and step() puts it back.
        self._grad = torch.zeros_like(flat)
        self.flat.grad = self._grad
        self._views, self._grad_views, at = [], [], 0
        for p in self.model_params:
            self._views.append(self.flat.data[at:at + p.numel()].view(p.shape))
            self._grad_views.append(self._grad[at:at + p.numel()].view(p.shape))
            at += p.numel()
        self.loss_scale = float(init_scale)
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.min_scale = float(min_scale)
        self.clean_steps = 0
        self.skipped_steps = 0

    def scale(self, loss):
        """The loss multiplied by the current scale, to backpropagate."""
        return loss * self.loss_scale

    def grad_norm(self, work):
        """The global norm of the unscaled gradients, from the allreduce's fused sum of squares.
        Call it before step(), which may change the scale the gradients were made with."""
        return math.sqrt(work.sq_norm()) / self.loss_scale

    def step(self, optimizer, work, max_norm=None):
        """Steps `optimizer` (over [self.flat]) unless the reduced gradients hold an inf or a NaN;
        returns whether it stepped. `max_norm`: the gradients are first scaled down so that their
        global norm (from the fused sum of squares) is at most max_norm, as
        torch.nn.utils.clip_grad_norm_ does."""
        if work.found_inf():
            self.loss_scale = max(self.min_scale, self.loss_scale * self.backoff_factor)
            self.clean_steps = 0
            self.skipped_steps += 1
            self.zero_grad()
            return False
        unscale = 1.0 / self.loss_scale
        if max_norm is not None:
            norm = self.grad_norm(work)
            if norm > max_norm:
                unscale *= max_norm / (norm + 1e-6)
        self.flat.grad = self._grad
        with torch.no_grad():
            for grad_view, p in zip(self._grad_views, self.model_params):
                if p.grad is None:
                    grad_view.zero_()
                else:
                    grad_view.copy_(p.grad.to(torch.float32)).mul_(unscale)
            optimizer.step()
            for view, p in zip(self._views, self.model_params):
                p.copy_(view)
        self.zero_grad()
        self.clean_steps += 1
        if self.clean_steps % self.growth_interval == 0:
            self.loss_scale *= self.growth_factor
        return True

    def zero_grad(self):
        """Zeroes the parameters' gradients (in place, so that views into a GradBuffer stay) and
        the master gradient."""
        with torch.no_grad():
            for p in self.model_params:
                if p.grad is not None:
                    p.grad.zero_()
            self._grad.zero_()
