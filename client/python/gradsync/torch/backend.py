"""gradsync as a torch.distributed backend: `dist.init_process_group("gradsync")`.

`import gradsync.torch` registers the backend. Its process group is a Python subclass of
torch.distributed.ProcessGroup: torch 1.13 calls a Python subclass's collectives through its
trampoline, and torch 2.x's `_new_process_group_helper` uses a ProcessGroup that a custom
backend's creator returns as it is, so one mechanism serves both, with no C++ extension to
build against each installed torch. Each collective goes through this rank's gradsync client
(the tensors staged through daemon-shared memory where they are not in it already, one
registered set per layout, as the coalesced calls do) and returns at once a Work of the
operation in flight (_pg_work): its wait() waits for the daemon on the caller's thread, its
get_future() is completed by a waiter thread, so DDP's backward overlaps its buckets.

CPU tensors go through host staging, CUDA tensors through VMM staging buffers on their GPU,
ordered on the caller's current stream (_pg_work says how). The default group, and groups that
dist.new_group makes with this backend: each such group is a gradsync job of its own, joined by
a client of its own. Operations the daemon does not offer raise NotImplementedError naming them;
gradsync's errors are raised as torch raises its own (_pg_errors).
"""
import datetime
import functools
import hashlib
import os
import re
import socket
import threading
import uuid
import warnings

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (AllreduceCoalescedOptions, AllreduceOptions,
                                       BroadcastOptions, ReduceOptions, ReduceScatterOptions)
from torch.distributed.constants import default_pg_timeout

from .. import client as _client
from ..errors import AbortedError, Error, InvalidArgumentError
from ._pg_errors import as_torch
from ._pg_fallback import Options, fallback_group, options_of
from . import _coalesced, _wire
from ._pg_work import ForeignWork, GradsyncWork, Slots, Tracker

NAME = "gradsync"


# torch's reduce op types (ReduceOp.RedOpType, hashable on every torch) by gradsync's name: a
# lookup per call, where comparing ReduceOp objects one by one cost a few microseconds.
_OP_NAMES = {getattr(dist.ReduceOp.RedOpType, torch_op): name
             for name, torch_op in (("sum", "SUM"), ("avg", "AVG"), ("min", "MIN"), ("max", "MAX"))
             if hasattr(dist.ReduceOp.RedOpType, torch_op)}


def _op_name(op):
    """torch's ReduceOp as gradsync's name; NotImplementedError for the ones it does not offer."""
    kind = getattr(op, "op", op)
    name = _OP_NAMES.get(kind)
    if name is None:
        raise NotImplementedError(f"gradsync backend: reduce op {kind} is not offered (sum, avg, min and max are)")
    return name


def _device_of(what, tensors):
    """The one device of a collective's tensors (-1: the CPU, else the GPU's index); refuses
    tensors on several devices, and devices other than the CPU and CUDA GPUs, naming them."""
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise InvalidArgumentError(f"gradsync backend: {what} takes tensors of one device, not of "
                                   f"{', '.join(sorted(str(d) for d in devices))}")
    device = devices.pop()
    if device.type not in ("cpu", "cuda"):
        raise NotImplementedError(f"gradsync backend: {what} of a tensor on {device}: CPU and CUDA tensors only")
    return -1 if device.type == "cpu" else (device.index if device.index is not None else torch.cuda.current_device())


def _scoped(key, global_ranks):
    """A key of a group in torch's store. torch gives each group a store prefix of its own, named
    after the group; but ranks can disagree on group names (torch 2.x's
    use_local_synchronization=True counts groups on members only), so two groups may share a
    prefix: a group's keys carry its global ranks too. The default group's are as they were."""
    if not global_ranks:
        return key
    return f"{key}/{hashlib.sha256(','.join(map(str, global_ranks)).encode()).hexdigest()[:16]}"


# Dtypes the daemon does not reduce, but whose bytes a broadcast or an all_gather can move as
# uint8: what torch puts in a model's buffers (a bool mask) and DDP broadcasts at construction.
_MOVED_AS_BYTES = (torch.bool, torch.int8, torch.int16)


def _as_bytes(t):
    """A uint8 view of `t` (sharing its memory) where the daemon does not take its dtype and
    only its bytes move; `t` itself otherwise."""
    if t.dtype in _MOVED_AS_BYTES and t.is_contiguous():
        # Flat first: a contiguous tensor may still have a last stride other than 1 (a size-1
        # last dimension), which a view as a smaller dtype refuses; 0-dim ones become 1 element.
        return t.reshape(-1).view(torch.uint8)
    return t


def _nonempty(tensors):
    """The tensors with elements: a collective over none has nothing to do (every rank passes
    the same shapes), and the daemon refuses an empty tensor."""
    return [t for t in tensors if t.numel() > 0]


def _connect_within_maximum(args, seconds, chosen):
    """Connects with `seconds` as the job's timeout, or the daemon's maximum where that is less
    (its refusal names it): with a warning when the user chose the longer one."""
    try:
        return _client.connect(timeout=seconds, **args)
    except InvalidArgumentError as e:
        most = re.search(r"exceeds the daemon's maximum of (\d+) ms", str(e))
        if seconds is None or not most:
            raise
    if chosen:
        warnings.warn(f"gradsync backend: the timeout of {seconds:g} s is more than this gradsyncd allows; "
                      f"operations are bounded by its maximum, {int(most.group(1)) / 1000:g} s "
                      f"(gradsyncd --max-timeout-ms)", stacklevel=4)
    return _client.connect(timeout=int(most.group(1)) / 1000, **args)


def _named_in_store(store, rank, key, make):
    """A name every rank of a group agrees on: rank 0 makes it and sets it in the group's store,
    the others read it there (torch's store waits for the key)."""
    if rank == 0:
        store.set(key, make())
    return store.get(key).decode()


def _subgroup_job(store, rank, global_ranks):
    """The job of a group made by dist.new_group: the default group's job (when it is gradsync's)
    or the torchrun run, with a suffix of its own, so that two groups of the same ranks are two
    jobs, and the daemon's log names the job they came from."""
    default = dist.distributed_c10d._get_default_group()
    base = getattr(default, "job", None) or os.environ.get("TORCHELASTIC_RUN_ID") or "torch"
    if base == "none":
        base = "torch"
    return _named_in_store(store, rank, _scoped("gradsync/job", global_ranks),
                           lambda: f"{base[:100]}.g{uuid.uuid4().hex[:12]}")


def _node_of_this_rank():
    """What tells this rank's node from another: the host, and the daemon it reaches (its
    control socket), since one host may run several daemons (a test's "nodes" on loopback)."""
    sock = os.environ.get("GRADSYNC_SOCKET") or _client.DEFAULT_SOCKET
    return f"host {socket.gethostname()} (daemon {os.path.realpath(sock)})"


def _published_nodes(store, rank, size, global_ranks):
    """Every rank's node, by group rank, as each published it in the group's store (one get for
    all of them where the store has multi_get)."""
    key = _scoped("gradsync/host", global_ranks)
    store.set(f"{key}/{rank}", _node_of_this_rank())
    keys = [f"{key}/{r}" for r in range(size)]
    values = store.multi_get(keys) if hasattr(store, "multi_get") else [store.get(k) for k in keys]
    return [bytes(v).decode() for v in values]


def _default_nodes(global_ranks):
    """Every member's node, by group rank, from the default group when it is gradsync's: its
    job is node-major (rank = node x local world + local rank), so a global rank's node is known
    without asking anyone, and two machines of one host name are not taken for one."""
    if not global_ranks or not dist.is_initialized():
        return None
    default = dist.distributed_c10d._get_default_group()
    client = getattr(default, "_client", None)
    if not isinstance(default, ProcessGroupGradsync) or client is None:
        return None
    return [f"node {g // client.local_world_size}" for g in global_ranks]


def _node_layout(nodes, rank, global_ranks, grouped):
    """This rank's local rank and local world, from every rank's node (by group rank): the ranks
    on this node, in group rank order, are its local ranks. A gradsync job is node-major with as
    many ranks on every node (rank = node x local world + local rank): a group laid out
    otherwise is refused (NotImplementedError), alike on every member, naming its global ranks
    by node. `grouped`: the group is dist.new_group's, for the error's words."""
    size = len(nodes)
    order = list(dict.fromkeys(nodes))  # nodes in order of their first rank
    counts = [nodes.count(n) for n in order]
    node_major = len(set(counts)) == 1 and all(nodes[r] == order[r // counts[0]] for r in range(size))
    if not node_major:
        what = "this group's ranks" if grouped else "the ranks"
        named = global_ranks or list(range(size))
        raise NotImplementedError(
            f"gradsync backend: {what} are not laid out as a gradsync job is, node by node with the same number on "
            "every node (rank = node x local world + local rank); by node: "
            + "; ".join(f"{n}: ranks {[named[r] for r in range(size) if nodes[r] == n]}" for n in order)
            + ("; make this group with backend='gloo'" if grouped else ""))
    return nodes[:rank].count(nodes[rank]), counts[0]


def _locked(method):
    """A collective's start: under the group's lock (the client is used from one thread at a
    time), gradsync's errors raised as torch raises its own."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        if self._unusable is not None:
            raise self._unusable
        with self._lock:
            try:
                return method(self, *args, **kwargs)
            except Error as e:
                raise as_torch(e) from None
    return call


class ProcessGroupGradsync(dist.ProcessGroup):
    """The process group of `init_process_group("gradsync")`: one gradsync client of this rank,
    joined to the job every rank of the group agreed on through torch's store."""

    def __init__(self, store, rank, size, timeout, global_ranks=(), options=None):
        super().__init__(rank, size)
        # Set when the group cannot be used: every collective raises it (a refused layout, a
        # destroyed group).
        self._unusable = None
        self._aborted = None  # abort()'s error: also ends the waits for the gloo fallback's works
        self._client = None
        self._fallback = None
        self.options = options or Options()
        global_ranks = list(global_ranks)
        if global_ranks or dist.is_initialized():
            # dist.new_group(ranks, backend="gradsync"), called on its members only: a job of
            # its own, which rank 0 of the group names in the group's store (torch's prefix
            # store of the group), its nodes from the default group's layout when that is
            # gradsync's, else from what each member publishes.
            job = _subgroup_job(store, rank, global_ranks)
            nodes = _default_nodes(global_ranks) or _published_nodes(store, rank, size, global_ranks)
            try:
                local_rank, local_world = _node_layout(nodes, rank, global_ranks, grouped=True)
            except NotImplementedError as e:
                # Refused on every member alike, but not here: raising would leave the ranks
                # outside the group waiting in torch's barrier after new_group (torch 1.13)
                # for the whole timeout. The group is made, and each collective on it raises.
                self._unusable = e
                warnings.warn(str(e), stacklevel=3)
                self.job = job
                return
        else:
            job = os.environ.get("TORCHELASTIC_RUN_ID")
            if not job or job == "none":
                # Not under torchrun (or under one without a run id): rank 0 names the job in the store.
                job = _named_in_store(store, rank, "gradsync/job", lambda: f"torch-{uuid.uuid4().hex[:12]}")
            if os.environ.get("LOCAL_RANK") and os.environ.get("LOCAL_WORLD_SIZE"):
                local_rank, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
            else:
                local_rank, local_world = _node_layout(_published_nodes(store, rank, size, ()), rank, (),
                                                       grouped=False)
        self.job = job
        # The timeout bounds every operation of the job. torch's default (30 minutes, what gloo
        # waits) asks for as long as the daemon allows: torch code expects minutes (rank 0
        # downloads a dataset while the others wait in a barrier), not the daemon's 30 s default.
        # A longer one the user gave is cut to the daemon's maximum, with a warning; every rank
        # does the same, so the job's ranks agree.
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else None
        try:
            self._client = _connect_within_maximum(
                dict(job=job, rank=rank, world_size=size, local_rank=local_rank, local_world_size=local_world,
                     name="torch.distributed"),
                seconds, chosen=seconds is not None and timeout != default_pg_timeout)
        except Error as e:
            raise as_torch(e) from None
        try:
            # Ranks that asked agree within the job's timeout, the daemon's bound on a rank that
            # does not arrive.
            self._fallback = fallback_group(self.options, store, _scoped("gradsync/fallback", global_ranks), rank,
                                            size, timeout, agree_within=self._client.job_timeout)
        except Exception as e:
            self._client.close()  # this rank leaves the job it joined; the error says what gloo met
            raise as_torch(e) from None
        self._barrier = torch.zeros(1)
        # The client is used from one thread at a time (gradsync.Client); torch may call a
        # process group from several (DDP's reducer, a user's async_op).
        self._lock = threading.Lock()
        self._tracker = Tracker()
        self._slots = Slots()
        self._started = 0
        # A staging set no collective used in this many is released (every 64 collectives, the
        # same on every rank: counts, not time).
        self.release_after = 1024

    def _start(self, kind, tensors, submit, result, finish=None, after=()):
        """Starts `submit(tag)` on the staging set that Slots picks for this layout and returns
        its Work, whose wait() yields `result` after `finish(value)` copied the daemon's value
        into the caller's tensors."""
        self._started += 1
        layout = (kind, tuple((t.numel(), t.dtype) for t in tensors), str(tensors[0].device))
        slot = self._slots.slot(layout)
        # The kind is part of the tag: a barrier never waits in its staging set for an
        # all_reduce of one float, nor a broadcast for an all_reduce of its layout.
        try:
            if self._started % 64 == 0:
                # Staging sets of layouts no longer used (all_gather_object's ever-new sizes, an
                # evaluation's shapes) go back to the daemon, their memory to the next ones.
                _coalesced.release_unused(self._client, "pg", self.release_after)
            started = submit(("pg", kind, slot))
        except Error as e:
            if isinstance(e, InvalidArgumentError):
                raise  # the caller's mistake, refused at the call as torch's backends do
            # The job failed (a lost rank, the daemon gone): the Work carries the error, so that
            # DDP's reducer, which calls this from backward, gets it at the end of backward as
            # gradsync's class rather than as a RuntimeError through its C++.
            return GradsyncWork.failed(self._tracker, as_torch(e), result)
        work = GradsyncWork(self._tracker, started, finish, result, after)
        self._slots.note(layout, slot, work)
        return work

    def getBackendName(self):  # noqa: N802 (torch's name)
        return NAME

    # torch 2.x names a group through its C++ backends (ProcessGroup::getGroupName), and a
    # Python group has none: destroy_process_group(group) then failed with "ProcessGroup name
    # not set". The name torch gives is kept here instead.
    def _set_group_name(self, name):
        self._group_name = name

    @property
    def group_name(self):
        return getattr(self, "_group_name", "")

    def _set_group_desc(self, desc):
        self._group_desc = desc

    @property
    def group_desc(self):
        return getattr(self, "_group_desc", "")

    def shutdown(self):
        """torch 2.x's destroy_process_group(): this rank leaves the group's job. Its client
        closes; Works and tensors still holding its memory keep the connection until they go
        (gradsync.Client.close), the futures already handed out complete, and later
        collectives on the group raise. torch 1.13's destroy_process_group(group) does not call
        it: call group.shutdown() there to leave at once rather than when the group is freed."""
        if self._unusable is None:
            self._unusable = InvalidArgumentError(f"gradsync backend: the group of job {self.job} was destroyed "
                                                  "(destroy_process_group or shutdown)")
        self._fallback = None  # gloo's Works in flight hold it
        if self._client is None:
            return
        with self._lock:
            self._client.close()
        self._tracker.close()

    def abort(self):
        """torch 2.x's abort of a group (torch.distributed's _abort_process_group; a watchdog, a
        signal handler), from any thread: this rank leaves the job at once
        (gradsync.Client.abort), so the collectives in flight fail with gradsync's AbortedError
        (as torch's type), here within about 100 ms, and on the other ranks with PeerLostError
        naming this rank; later collectives raise the AbortedError. Takes no lock and waits for
        nothing: a thread inside a collective call may hold the group's lock (a signal handler
        runs on it), and the abort is what gets it out. The client is closed when the group is
        destroyed (shutdown()) or freed."""
        why = f"the process group of job {self.job} was aborted (ProcessGroup.abort) on rank {self.rank()}"
        if self._aborted is None:
            self._aborted = as_torch(AbortedError("gradsync backend: " + why))
        if self._unusable is None:
            self._unusable = self._aborted
        client = self._client
        if client is not None:
            try:
                client.abort(why)
            except Error:  # the daemon is gone already: nothing left to leave
                pass
        # The gloo fallback's operations in flight end too where torch's gloo can abort (2.x).
        # Its reference is kept: dropping the last one here would wait, in the caller's
        # thread, for gloo's queued work (its destructor joins it).
        fallback = self._fallback
        if fallback is not None and hasattr(fallback, "abort"):
            try:
                fallback.abort()
            except Exception:  # noqa: BLE001 (best effort: the gradsync side has left already)
                pass

    # --- reductions ---------------------------------------------------------------------------

    @_locked
    def allreduce(self, tensors, opts=None):
        opts = opts or AllreduceOptions()
        _device_of("all_reduce", tensors)
        op = _op_name(opts.reduceOp)
        if any(t.is_sparse for t in tensors):
            # Sparse COO (nn.Embedding(sparse=True)'s gradients): gathered and summed in the call
            # (gradsync.torch.sparse); the results replace the tensors' contents, as gloo's do.
            try:
                sums = self._client.allreduce_coalesced(tensors, op=op).wait()
            except Error as e:
                if isinstance(e, InvalidArgumentError):
                    raise
                return GradsyncWork.failed(self._tracker, as_torch(e), tensors)  # as in _start
            with torch.no_grad():
                for t, total in zip(tensors, sums):
                    t.copy_(total)
            return GradsyncWork(self._tracker, None, None, tensors)
        moved = _nonempty(tensors)
        if not moved:
            return GradsyncWork(self._tracker, None, None, tensors)
        wire = _wire.wire_for(self.options.wire_dtype, moved)
        return self._start("allreduce", moved, lambda tag: _coalesced.allreduce(
            self._client, moved, op, None, _wire.avg_prescaled(op, wire), None, None, None, tag=tag, wire_dtype=wire),
            tensors)

    @_locked
    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts or AllreduceCoalescedOptions()
        _device_of("all_reduce_coalesced", tensors)
        op = _op_name(opts.reduceOp)
        moved = _nonempty(tensors)
        if not moved:
            return GradsyncWork(self._tracker, None, None, tensors)
        wire = _wire.wire_for(self.options.wire_dtype, moved)
        return self._start("allreduce", moved, lambda tag: _coalesced.allreduce(
            self._client, moved, op, None, _wire.avg_prescaled(op, wire), None, None, None, tag=tag, wire_dtype=wire),
            tensors)

    @_locked
    def reduce(self, tensors, opts=None):
        opts = opts or ReduceOptions()
        _device_of("reduce", tensors)
        op = _op_name(opts.reduceOp)
        moved = _nonempty(tensors)
        if not moved:
            return GradsyncWork(self._tracker, None, None, tensors)
        wire = _wire.wire_for(self.options.wire_dtype, moved)
        return self._start("reduce", moved, lambda tag: _coalesced.reduce(
            self._client, moved, opts.rootRank, op, None, tag=tag, prescale=_wire.avg_prescaled(op, wire),
            wire_dtype=wire), tensors)

    @_locked
    def reduce_scatter(self, outputs, input_lists, opts=None):
        opts = opts or ReduceScatterOptions()
        # One output and its list of world_size inputs, each shaped like the output: rank r gets
        # the reduction of every rank's input r, which is the r-th shard of their concatenation.
        _device_of("reduce_scatter", list(outputs) + [t for inputs in input_lists for t in inputs])
        if len(outputs) != 1 or len(input_lists) != 1:
            raise InvalidArgumentError(f"gradsync backend: reduce_scatter takes one output and one list of inputs, "
                                       f"not {len(outputs)} and {len(input_lists)}")
        output, inputs = outputs[0], input_lists[0]
        if len(inputs) != self.size() or any(t.shape != output.shape or t.dtype != output.dtype for t in inputs):
            raise InvalidArgumentError("gradsync backend: reduce_scatter takes world_size inputs shaped and typed "
                                       "like the output")
        return self._reduce_scatter_flat(torch.cat([t.reshape(-1) for t in inputs]), opts, outputs,
                                         lambda shard: output.copy_(shard.reshape(output.shape)))

    def _scattered_from(self, what, outputs, inputs):
        """Checks that each input holds world_size x its output's elements, of its dtype."""
        for i, (output, input) in enumerate(zip(outputs, inputs)):  # noqa: A001 (torch's word)
            if input.numel() != output.numel() * self.size() or input.dtype != output.dtype:
                which = f" {i}" if len(inputs) > 1 else ""
                raise InvalidArgumentError(f"gradsync backend: {what}'s input{which} ({input.numel()} {input.dtype}) "
                                           f"must be world_size ({self.size()}) x its output's {output.numel()} "
                                           f"elements, of its dtype {output.dtype}")

    @_locked
    def _reduce_scatter_base(self, output, input, opts=None):  # noqa: A002 (torch's name)
        opts = opts or ReduceScatterOptions()
        _device_of("reduce_scatter_tensor", [output, input])
        self._scattered_from("reduce_scatter_tensor", [output], [input])
        return self._reduce_scatter_flat(input.reshape(-1), opts, [output],
                                         lambda shard: output.copy_(shard.reshape(output.shape)))

    @_locked
    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        """torch 2.x's coalescing manager: the reduce_scatter_tensor calls made inside
        `with dist._coalescing_manager()` as one reduce-scatter of one set. The daemon gives rank
        r the r-th even shard of the set's flat range, so the inputs are laid out rank by rank:
        rank r's shard is the r-th chunk of every input, in order."""
        opts = opts or ReduceScatterOptions()
        outputs, inputs = list(outputs), list(inputs)
        _device_of("reduce_scatter_tensor_coalesced", outputs + inputs)
        if len(outputs) != len(inputs):
            raise InvalidArgumentError(f"gradsync backend: reduce_scatter_tensor_coalesced takes one output per "
                                       f"input, not {len(outputs)} for {len(inputs)}")
        self._scattered_from("reduce_scatter_tensor_coalesced", outputs, inputs)
        dtypes = sorted({str(t.dtype) for t in inputs})
        if len(dtypes) > 1:
            raise InvalidArgumentError(f"gradsync backend: reduce_scatter_tensor_coalesced of several dtypes "
                                       f"({', '.join(dtypes)}): one coalesced reduce-scatter takes one dtype")
        pairs = [(o, i) for o, i in zip(outputs, inputs) if o.numel() > 0]
        if not pairs:
            return GradsyncWork(self._tracker, None, None, outputs)
        flat = torch.cat([i.reshape(self.size(), -1) for _, i in pairs], dim=1).reshape(-1)

        def finish(shard):
            for (output, _), part in zip(pairs, shard.split([o.numel() for o, _ in pairs])):
                output.copy_(part.reshape(output.shape))

        return self._reduce_scatter_flat(flat, opts, outputs, finish)

    def _reduce_scatter_flat(self, flat, opts, result, finish):
        """Reduce-scatters `flat`, world_size even shards; `finish` gets this rank's."""
        flat, op = flat.contiguous(), _op_name(opts.reduceOp)
        # A CUDA reduce-scatter is not compressed yet (docs/limitations.md): it crosses as is.
        wire = None if flat.is_cuda else _wire.wire_for(self.options.wire_dtype, [flat])
        return self._start("reduce_scatter", [flat], lambda tag: _coalesced.reduce_scatter(
            self._client, [flat], op, None, _wire.avg_prescaled(op, wire), None, None, None, wire_dtype=wire, tag=tag),
            result, finish)

    # --- moves --------------------------------------------------------------------------------

    @_locked
    def broadcast(self, tensors, opts=None):
        opts = opts or BroadcastOptions()
        _device_of("broadcast", tensors)
        moved = [_as_bytes(t) for t in _nonempty(tensors)]  # views: the bytes land in `tensors`
        if not moved:
            return GradsyncWork(self._tracker, None, None, tensors)
        return self._start("broadcast", moved, lambda tag: _coalesced.broadcast(
            self._client, moved, opts.rootRank, None, tag=tag), tensors)

    def _gathered_into(self, what, output_lists, inputs):
        """Checks torch's [rank][input] outputs against the inputs, before anything is sent."""
        if len(output_lists) != self.size() or any(len(outputs) != len(inputs) for outputs in output_lists):
            raise InvalidArgumentError(f"gradsync backend: {what} takes world_size ({self.size()}) lists of "
                                       f"{len(inputs)} outputs")
        for outputs in output_lists:
            for i, output in enumerate(outputs):
                if output.numel() != inputs[i].numel():
                    raise InvalidArgumentError(f"gradsync backend: {what}: an output of input {i} holds "
                                               f"{output.numel()} elements, the input {inputs[i].numel()}")

    def _gather(self, inputs, result, finish):
        """All-gathers `inputs`; `finish` gets [rank][input] parts of the inputs' dtypes (those
        the daemon does not take travel as their bytes). Empty inputs gather empty parts."""
        inputs = [t.contiguous() for t in inputs]
        moved = [_as_bytes(t) for t in inputs if t.numel() > 0]
        if not moved:
            finish([[t.new_empty(t.shape) for t in inputs] for _ in range(self.size())])
            return GradsyncWork(self._tracker, None, None, result)

        def typed(gathered):  # [rank][moved] -> [rank][input], in the inputs' dtypes
            rows = []
            for row in gathered:
                parts = iter(row)
                rows.append([next(parts).view(t.dtype) if t.numel() > 0 else t.new_empty(t.shape) for t in inputs])
            return finish(rows)

        return self._start("allgather", moved, lambda tag: _coalesced.all_gather(self._client, moved, None, tag=tag),
                           result, typed)

    def _gather_into(self, inputs, by_rank, result):
        """All-gathers `inputs` into by_rank[rank][i] (checked by _gathered_into)."""
        def finish(gathered):  # [rank][input]
            for outputs, row in zip(by_rank, gathered):
                for output, part in zip(outputs, row):
                    output.copy_(part.reshape(output.shape))

        return self._gather(inputs, result, finish)

    @_locked
    def allgather(self, output_lists, inputs, opts=None):
        # torch's layout here: output_lists[i][rank] receives rank's inputs[i].
        _device_of("all_gather", list(inputs) + [t for outputs in output_lists for t in outputs])
        if len(output_lists) != len(inputs):
            raise InvalidArgumentError(f"gradsync backend: all_gather takes one list of outputs per input, "
                                       f"not {len(output_lists)} for {len(inputs)}")
        by_rank = [list(row) for row in zip(*output_lists)] if output_lists else []
        self._gathered_into("all_gather", by_rank, inputs)
        return self._gather_into(inputs, by_rank, output_lists)

    @_locked
    def _allgather_base(self, output, input, opts=None):  # noqa: A002 (torch's name)
        _device_of("all_gather_into_tensor", [output, input])
        if output.numel() != input.numel() * self.size() or output.dtype != input.dtype:
            raise InvalidArgumentError(f"gradsync backend: all_gather_into_tensor's output ({output.numel()} "
                                       f"{output.dtype}) must be world_size ({self.size()}) x the input's "
                                       f"{input.numel()} elements, of its dtype {input.dtype}")
        return self._gather_flat([output], [input])

    @_locked
    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        """torch 2.x's coalescing manager: the all_gather_into_tensor calls made inside
        `with dist._coalescing_manager()` as one all-gather of one set."""
        outputs, inputs = list(outputs), list(inputs)
        _device_of("all_gather_into_tensor_coalesced", outputs + inputs)
        if len(outputs) != len(inputs):
            raise InvalidArgumentError(f"gradsync backend: all_gather_into_tensor_coalesced takes one output per "
                                       f"input, not {len(outputs)} for {len(inputs)}")
        for i, (output, input) in enumerate(zip(outputs, inputs)):  # noqa: A001 (torch's word)
            if output.numel() != input.numel() * self.size() or output.dtype != input.dtype:
                raise InvalidArgumentError(f"gradsync backend: all_gather_into_tensor_coalesced's output {i} "
                                           f"({output.numel()} {output.dtype}) must be world_size ({self.size()}) x "
                                           f"its input's {input.numel()} elements, of its dtype {input.dtype}")
        return self._gather_flat(outputs, inputs)

    def _gather_flat(self, outputs, inputs):
        """All-gathers inputs[i] into outputs[i], rank after rank (all_gather_into_tensor)."""
        def finish(gathered):  # [rank][input]
            for i, output in enumerate(outputs):
                output.copy_(torch.cat([row[i].reshape(-1) for row in gathered]).reshape(output.shape))

        return self._gather(inputs, outputs, finish)

    @_locked
    def allgather_coalesced(self, output_lists, inputs, opts=None):
        # torch's layout: output_lists[rank][i] receives rank's inputs[i].
        _device_of("all_gather_coalesced", list(inputs) + [t for outputs in output_lists for t in outputs])
        self._gathered_into("all_gather_coalesced", output_lists, inputs)
        return self._gather_into(inputs, output_lists, output_lists)

    @_locked
    def barrier(self, opts=None):
        # As gloo's: done only once every collective started before it is, in place (its
        # results copied back), the first of their errors raised here; the gloo fallback's too
        # (its own barrier waits for the work queued on it before).
        earlier = self._tracker.in_flight()
        if self._fallback is not None:
            earlier.append(ForeignWork(self._fallback.barrier(), aborted=lambda: self._aborted))
        return self._start("barrier", [self._barrier], lambda tag: _coalesced.allreduce(
            self._client, [self._barrier], "sum", None, False, None, None, None, tag=tag), [], after=earlier)

    # --- what the daemon does not offer: gloo's, when asked for at init (_pg_fallback) --------

    def _fallback_for(self, what):
        if self._unusable is not None:
            raise self._unusable
        if self._fallback is None:
            raise NotImplementedError(f"gradsync backend: {what} is not offered (the daemon reduces and moves whole "
                                      "sets: all_reduce, broadcast, all_gather, reduce_scatter, reduce, barrier); "
                                      "ask for a gloo group beside it at init, init_process_group('gradsync', "
                                      "pg_options=gradsync.torch.Options(fallback='gloo')), or use a gloo group "
                                      "of your own (dist.new_group(backend='gloo'))")
        return self._fallback

    def _point_to_point(self, what, tensors):
        """The gloo fallback for send and recv, of CPU tensors only: gloo's send and recv hand a
        tensor's address to its TCP transport as it is, with no copy off a GPU and no wait for
        the stream that writes it."""
        fallback = self._fallback_for(what)
        if any(t.device.type != "cpu" for t in tensors):
            raise NotImplementedError(f"gradsync backend: {what} of a tensor on "
                                      f"{next(t.device for t in tensors if t.device.type != 'cpu')} through the "
                                      "gloo fallback: gloo's send and recv take CPU tensors only (copy it to the CPU)")
        return fallback

    def send(self, tensors, dst, tag):
        return self._point_to_point("send", tensors).send(tensors, dst, tag)

    def recv(self, tensors, src, tag):
        return self._point_to_point("recv", tensors).recv(tensors, src, tag)

    def recv_anysource(self, tensors, tag):
        return self._point_to_point("recv", tensors).recv_anysource(tensors, tag)

    def alltoall(self, outputs, inputs, opts=None):
        raise NotImplementedError("gradsync backend: all_to_all of tensor lists is not offered, nor by gloo, which "
                                  "the fallback would use: use all_to_all_single (with the gloo fallback, "
                                  "pg_options=gradsync.torch.Options(fallback='gloo'))")

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):  # noqa: A002
        return self._fallback_for("all_to_all_single").alltoall_base(output, input, output_split_sizes,
                                                                     input_split_sizes, *_given(opts))

    def scatter(self, outputs, input_lists, opts=None):
        return self._fallback_for("scatter").scatter(outputs, input_lists, *_given(opts))

    def gather(self, output_lists, inputs, opts=None):
        return self._fallback_for("gather").gather(output_lists, inputs, *_given(opts))


def _given(opts):
    """The options argument to pass on: none where torch gave none (gloo's default then)."""
    return () if opts is None else (opts,)


# Newer torch dispatches the tensor forms of a Python group by these names, and refuses a
# subclass that defines a name and its deprecated alias in its body (its __init_subclass__):
# set after the class is made, where that check does not run.
ProcessGroupGradsync.all_gather_single = ProcessGroupGradsync._allgather_base
ProcessGroupGradsync.reduce_scatter_single = ProcessGroupGradsync._reduce_scatter_base


def _usable(group):
    """The gradsync process group `group` names (None: the default group), usable; raises
    otherwise, saying why."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(pg, ProcessGroupGradsync):
        raise InvalidArgumentError(f"gradsync: {type(pg).__name__} is not a gradsync process group; "
                                   "dist.init_process_group('gradsync') makes one")
    if pg._unusable is not None:
        raise pg._unusable
    return pg


def client_of(group=None):
    """The gradsync client behind a gradsync process group (None: the default group), for
    tensors in the daemon's reach: `gradsync.torch.empty(client_of(), n)`, which the group's
    collectives then use in place, copying nothing."""
    return _usable(group)._client


def inline_futures(group=None, enabled=True):
    """Makes a gradsync process group (None: the default group) complete each Work's future on
    the thread that asks for it, blocking that thread until the daemon is done, so that the
    future's callbacks run there at once, in program order, as NCCL's do.

    For DDP comm hooks that start collectives inside future callbacks (torch's PowerSGD and
    batched PowerSGD hooks): otherwise a callback's collective starts whenever the group's
    waiter thread gets to it, in an order that differs by rank, and the job fails as a layout
    mismatch. The cost: backward waits for each bucket's reduction where DDP asks for its
    future, so reduction no longer overlaps backward (PowerSGD's own decompression synchronizes
    once per bucket anyway). Call it on every rank, before the first collective."""
    _usable(group)._tracker.inline_futures = bool(enabled)


def _create(options, backend_options=None):
    """torch's extended creator API (1.13 and 2.x alike): it also names the group's global ranks
    ([] for the default group), which a group's layout and its store keys are made from, and
    passes on init_process_group's and new_group's `pg_options` (gradsync.torch.Options)."""
    default = dist.distributed_c10d._get_default_group() if dist.is_initialized() else None
    return ProcessGroupGradsync(options.store, options.group_rank, options.group_size, options.timeout,
                                global_ranks=list(options.global_ranks_in_group),
                                options=options_of(backend_options, default))


def register():
    """Registers the backend with torch.distributed (once; `import gradsync.torch` does it)."""
    if getattr(dist.Backend, NAME.upper(), None) is not None:
        return
    try:  # torch 2.x: say which devices it serves; 1.13 has no `devices`
        dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu", "cuda"])
    except TypeError:
        dist.Backend.register_backend(NAME, _create, extended_api=True)
