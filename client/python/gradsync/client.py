"""gradsync.connect() and the Client."""
import ctypes
import os
import re
import weakref

from . import _lib
from .errors import InvalidArgumentError, error_for

DEFAULT_SOCKET = "/run/gradsync/gradsync.sock"
DEFAULT_PEER_PORT = 29590  # gradsyncd's --peer-listen default


def _check(status):
    if status != 0:
        raise error_for(status, _lib.last_error())


class _Core:
    """Owns the library's client handle. Everything that uses the handle or views the client's
    memory (tensors over it, sets, works) holds a reference to this object, so the handle is
    closed, and the memory unmapped, only when the Client was closed and the last of them is
    gone: a tensor that outlives Client.close() stays valid instead of faulting."""

    def __init__(self, handle):
        self.handle = handle
        self.closed = False
        # Held, not looked up at __del__: a client freed at interpreter exit (a process group
        # torch still holds) finds the modules' globals gone.
        self._close = _lib.lib().gs_client_close

    def __del__(self):
        handle, self.handle = getattr(self, "handle", None), None
        if handle and hasattr(self, "_close"):
            self._close(handle)


def _from_env(value, argument, variable, convert=int):
    if value is not None:
        return value
    raw = os.environ.get(variable)
    if raw is None or raw == "":
        raise InvalidArgumentError(f"gradsync.connect: {argument} was not given and ${variable} is not set "
                                   "(torchrun sets it; pass it when not running under torchrun)")
    try:
        return convert(raw)
    except ValueError:
        raise InvalidArgumentError(f"gradsync.connect: ${variable}={raw!r} (for {argument}) is not an integer") \
            from None


def connect(job=None, rank=None, world_size=None, local_rank=None, local_world_size=None, rendezvous=None,
            socket=None, timeout=None, groups=None, name="trainer"):
    """Connects to this node's gradsyncd and joins a job.

    Missing arguments come from torchrun's environment: RANK, WORLD_SIZE, LOCAL_RANK,
    LOCAL_WORLD_SIZE, TORCHELASTIC_RUN_ID (the job id) and, for a job on several nodes, MASTER_ADDR
    (rendezvous, HOST or HOST:PORT of node 0's gradsyncd peer service, or etcd://HOST:PORT[,...] for an
    etcd cluster; $GRADSYNC_RENDEZVOUS wins).
    socket: the daemon's control socket; default $GRADSYNC_SOCKET, else /run/gradsync/gradsync.sock.
    timeout: seconds, the bound on every wait of the job (default: the daemon's).
    groups: process groups beyond "dp" (every rank), as {name: [global ranks]}.
    """
    if job is None and os.environ.get("TORCHELASTIC_RUN_ID") == "none":
        # Plain torchrun (no --rdzv-id, no --standalone) calls every job "none": two jobs on one
        # node would collide. Its master address and port tell jobs apart.
        if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
            address = re.sub(r"[^A-Za-z0-9._-]", "_", os.environ["MASTER_ADDR"])
            job = f"torchrun-{address}-{re.sub(r'[^0-9]', '_', os.environ['MASTER_PORT'])}"
        else:
            raise InvalidArgumentError("gradsync.connect: $TORCHELASTIC_RUN_ID is 'none' (torchrun without --rdzv-id "
                                       "or --standalone) and $MASTER_ADDR/$MASTER_PORT are not set; pass job=")
    job = _from_env(job, "job", "TORCHELASTIC_RUN_ID", str)
    rank = _from_env(rank, "rank", "RANK")
    world_size = _from_env(world_size, "world_size", "WORLD_SIZE")
    local_rank = _from_env(local_rank, "local_rank", "LOCAL_RANK")
    local_world_size = _from_env(local_world_size, "local_world_size", "LOCAL_WORLD_SIZE")
    if local_world_size < 1 or world_size < local_world_size or world_size % local_world_size:
        raise InvalidArgumentError(
            f"gradsync.connect: world_size {world_size} is not a whole number of nodes of local_world_size "
            f"{local_world_size}: every node must run the same number of ranks (torchrun: --nproc-per-node), and "
            "world_size is their sum over the nodes")
    if timeout is not None and not timeout > 0:
        raise InvalidArgumentError(f"gradsync.connect: timeout must be a positive number of seconds, not {timeout!r}")
    if rendezvous is not None and ":" not in rendezvous:
        rendezvous = f"{rendezvous}:{DEFAULT_PEER_PORT}"
    if rendezvous is None:
        # The library resolves $GRADSYNC_RENDEZVOUS, else $MASTER_ADDR with the default peer port.
        if world_size > local_world_size and not (os.environ.get("GRADSYNC_RENDEZVOUS") or
                                                  os.environ.get("MASTER_ADDR")):
            raise InvalidArgumentError(
                f"gradsync.connect: the job spans {world_size // max(1, local_world_size)} nodes, so it needs "
                "rendezvous (node 0's gradsyncd, HOST[:PORT]); it was not given and neither $GRADSYNC_RENDEZVOUS "
                "nor $MASTER_ADDR is set")
    if socket is None:
        socket = os.environ.get("GRADSYNC_SOCKET") or DEFAULT_SOCKET
    lib = _lib.lib()
    handle = ctypes.c_void_p()
    status = lib.gs_connect(socket.encode(), name.encode(), 0, ctypes.byref(handle))
    if status != 0:
        raise error_for(status, f"{_lib.last_error()} [from Python: gradsync.connect(socket=...)]")
    core = _Core(handle)
    client = Client(core, job, rank, world_size, local_rank, local_world_size, groups or {})
    group_structs = []
    keep = []
    for group_name, ranks in (groups or {}).items():
        array = (ctypes.c_int32 * len(ranks))(*ranks)
        keep.append(array)
        group_structs.append(_lib.Group(group_name.encode(), array, len(ranks)))
    group_array = (_lib.Group * len(group_structs))(*group_structs) if group_structs else None
    timeout_ms = 0 if timeout is None else max(1, int(timeout * 1000))
    _check(lib.gs_join(core.handle, job.encode(), rank, world_size, local_rank, local_world_size, timeout_ms,
                       (rendezvous or "").encode(), group_array, len(group_structs)))
    return client


class Client:
    """A trainer's connection to its gradsyncd, joined to one job. Use it from one thread.

    The coalesced operations take lists of torch tensors (gradsync.torch does the work; torch is
    imported on their first use). The first call with a given list of tensors registers it as a
    set, and later calls with the same tensors (same addresses, sizes and dtypes) reuse it.
    Tensors in memory the daemon cannot reach are copied through a staging area registered once
    per layout; `staging_copies` counts the tensors copied that way.
    """

    def __init__(self, core, job, rank, world_size, local_rank, local_world_size, groups):
        self._core = core
        self._core_ref = weakref.ref(core)  # for abort() after close()
        self.job = job
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.local_world_size = local_world_size
        self.groups = {"dp": list(range(world_size))}
        self.groups.update({name: list(ranks) for name, ranks in groups.items()})
        self._allocations = []  # (address, bytes, device)
        self._sets = {}  # key -> registered set (gradsync.torch._coalesced)
        self._operations = 0  # the coalesced operations started: when a set was last used
        # Staging areas of released sets, for the next ones that fit: (area, device, the event
        # of its last copy out or None, the sweep it was pooled in) (_coalesced.release_unused).
        self._staging_pool = []
        self._sweeps = 0
        self._freed_staging = 0  # staging areas given back to the daemon, for tests
        self._released_sets = 0  # staging sets released (release_unused), for tests
        self.staging_copies = 0  # tensors copied into or out of a staging area
        self.staging_bytes = 0

    # -- lifetime
    def close(self):
        """Closes the client: later calls on it raise. The connection (and with it the job
        membership) and the client's memory are released once nothing uses them any more:
        tensors viewing the memory (GradBuffer's gradients, staging areas) and works keep them
        until they are garbage-collected, so they never dangle."""
        core, self._core = getattr(self, "_core", None), None
        self._sets = {}
        self._staging_pool = []
        if core is not None:
            core.closed = True
        hook_waiter = self.__dict__.pop("_ddp_waiter", None)  # gradsync.torch.allreduce_hook's
        if hook_waiter is not None:
            hook_waiter.stop()  # after the futures it was handed

    def abort(self, why=""):
        """Leaves the job at once, from any thread, also while another thread is in a call or
        waits for a work (a watchdog; a signal handler; the torch backend's
        ProcessGroup.abort()): the daemon ends the job, and its other ranks fail with
        gradsync.PeerLostError naming this rank. Works not yet completed raise
        gradsync.AbortedError naming `why` (the library polls every 100 ms), and so does every
        later call. It does not close the client (the thread in a call still uses it): close()
        it, or let it go, afterwards. Also after close(), while works still hold the connection.
        What the daemon wrote into the client's memory after the abort is undefined."""
        core = getattr(self, "_core", None)
        if core is None:  # closed: works in flight may still hold the connection
            ref = getattr(self, "_core_ref", None)
            core = ref() if ref is not None else None
        handle = core.handle if core is not None else None
        if handle:
            _check(_lib.lib().gs_client_abort(handle, str(why).encode()))

    # A client is this process's connection to its daemon: a copy is the same connection (so that
    # copy.deepcopy of a model whose DDP comm hook state holds it, as torch's AveragedModel
    # makes, works), and it cannot be pickled into another process.
    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        raise TypeError("a gradsync.Client cannot be pickled: it is this process's connection to its gradsyncd; "
                        "connect again in the other process (gradsync.connect())")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()

    def _h(self):
        if self._core is None:
            raise InvalidArgumentError("gradsync: this client was closed")
        return self._core.handle

    @property
    def job_timeout(self):
        """The job's timeout, in seconds, as the daemon applies it."""
        return _lib.lib().gs_job_timeout_ms(self._h()) / 1000.0

    # -- memory the daemon can reach
    def alloc(self, nbytes, device=-1):
        """Zero-filled memory the daemon can reach: host shared memory (device -1) or a CUDA VMM
        allocation on `device`. Returns its address; it lives as long as the client."""
        address = ctypes.c_void_p()
        if int(nbytes) <= 0 or int(nbytes) >= 1 << 64:  # ctypes would wrap it to a small size
            raise InvalidArgumentError(f"gradsync: alloc of {nbytes} bytes")
        _check(_lib.lib().gs_alloc(self._h(), int(nbytes), int(device), ctypes.byref(address)))
        self._allocations.append((address.value, int(nbytes), int(device)))
        return address.value

    def free(self, address):
        """Frees memory alloc() returned (`address` is what it returned): the daemon unmaps it
        and gives its charge back to the user's limits, then this client does. Nothing may use
        it afterwards: tensors viewing it must be gone. Refused (InvalidArgumentError, naming
        the set) while a registered set lies in it; the daemon drops a released set once every
        local client released it, and refuses the free until then."""
        _check(_lib.lib().gs_free(self._h(), ctypes.c_void_p(address)))
        self._allocations = [a for a in self._allocations if a[0] != address]

    def reachable(self, address, nbytes, device):
        """Whether [address, address + nbytes) lies in memory of this client's on `device`."""
        for base, size, dev in self._allocations:
            if dev == device and base <= address and address + nbytes <= base + size:
                return True
        return False

    # -- the coalesced operations (gradsync.torch._coalesced)
    def allreduce_coalesced(self, tensors, op="avg", divisor=None, prescale=False, fp32_accumulate=None,
                            bucket_bytes=None, group=None, health=False, wire_dtype=None, mask=None,
                            sparse_result="coalesced"):
        """Reduces the tensors in place across the group's ranks (default "dp": every rank).
        health=True (floating-point CPU or CUDA tensors): the daemon also computes, in the same pass,
        whether the result holds an inf or a NaN and its sum of squares: Work.found_inf() and
        Work.sq_norm() once it completed. wire_dtype=torch.bfloat16 or torch.float16 (float32,
        float16 or bfloat16 tensors): the nodes exchange their sums compressed to it (half a float32
        sum's bytes), with the error bounded in docs/how-it-works.md; half-precision tensors
        otherwise cross nodes as float32, each sum rounded once. mask (CPU tensors; a contiguous 1-D torch.int64 tensor of
        strictly increasing indices into the tensors flattened in order, the same on every rank):
        only those elements are reduced and cross nodes; every other element becomes zero (the
        seeds' pruned-model DDP). Keep the mask tensor unchanged between calls: a changed one
        registers a new set. Sparse COO tensors (nn.Embedding(sparse=True)'s gradients; a list is
        all sparse or all dense; CPU or CUDA, floating point; op "sum" or "avg"): every rank's entries
        are gathered through the daemon and summed, and wait() returns one result per tensor, a
        coalesced sparse tensor, or a dense one with sparse_result="dense"
        (gradsync.torch.sparse). The call finishes the reduction before it returns."""
        if any(getattr(t, "is_sparse", False) for t in tensors):
            from .torch import sparse
            if prescale or health or wire_dtype is not None or mask is not None or fp32_accumulate is not None:
                raise InvalidArgumentError("gradsync: sparse tensors take op, divisor, group and sparse_result only "
                                           "(not prescale, fp32_accumulate, health, wire_dtype or mask)")
            return sparse.allreduce(self, tensors, op, divisor, group, sparse_result)
        from .torch import _coalesced
        return _coalesced.allreduce(self, tensors, op, divisor, prescale, fp32_accumulate, bucket_bytes, group,
                                    health=health, wire_dtype=wire_dtype, mask=mask)

    def broadcast_coalesced(self, tensors, root=0, group=None):
        """Copies the root rank's tensors into every rank's, in place."""
        from .torch import _coalesced
        return _coalesced.broadcast(self, tensors, root, group)

    def all_gather_coalesced(self, tensors, group=None):
        """Gathers every rank's tensors; wait() returns one list of tensors per rank of the group."""
        from .torch import _coalesced
        return _coalesced.all_gather(self, tensors, group)

    def reduce_scatter_coalesced(self, tensors, op="avg", divisor=None, prescale=False, fp32_accumulate=None,
                                 bucket_bytes=None, group=None, wire_dtype=None):
        """Reduces the tensors across the group's ranks and gives this rank its shard: the tensors,
        flattened in order into one range of N elements, split over the group's W ranks (in rank
        order) into shards of ceil(N / W) elements, the last ones shorter (the ZeRO layout). The
        tensors must share one dtype and are left as they were; wait() returns this rank's shard
        as a new 1-D tensor, and Work.shard_first is where it starts in the flat range."""
        from .torch import _coalesced
        return _coalesced.reduce_scatter(self, tensors, op, divisor, prescale, fp32_accumulate, bucket_bytes, group,
                                         wire_dtype=wire_dtype)

    def reduce_coalesced(self, tensors, root=0, op="sum", group=None, mask=None):
        """Reduces into the root rank's tensors; the other ranks' tensors are unchanged. mask: as
        for allreduce_coalesced (the root's other elements become zero)."""
        from .torch import _coalesced
        return _coalesced.reduce(self, tensors, root, op, group, mask=mask)
