"""What a gradsync process group may be asked at init, and the gloo group beside it that serves
the operations the daemon does not offer, when the user asks for that:

    dist.init_process_group("gradsync", pg_options=gradsync.torch.Options(fallback="gloo"))

The daemon reduces and moves whole registered sets; point-to-point and personalised operations
(send, recv, all_to_all, scatter, gather) are not among them. Without the option they raise
NotImplementedError naming the operation; with it they go, unchanged, to a gloo process group
of the same ranks that the gradsync group makes at init (gloo's Works, errors and timeout).
Never silently: the choice is the user's, made once at init, and a group made by
dist.new_group without options of its own inherits the default gradsync group's (DeviceMesh
makes its groups so).
"""
import torch.distributed as dist

from ..errors import InvalidArgumentError

_FALLBACKS = (None, "gloo")


class Options:
    """`pg_options` of a gradsync process group (init_process_group, new_group).

    fallback: None (the default): send, recv, all_to_all, scatter and gather raise
    NotImplementedError; "gloo": they go through a gloo group of the same ranks, made at init
    (one more TCP connection per pair of ranks; CPU tensors, and CUDA tensors where gloo takes
    them)."""

    def __init__(self, fallback=None):
        if fallback not in _FALLBACKS:
            raise InvalidArgumentError(f"gradsync.torch.Options: fallback must be None or 'gloo', not {fallback!r}")
        self.fallback = fallback

    def __repr__(self):
        return f"gradsync.torch.Options(fallback={self.fallback!r})"


def options_of(pg_options, default_group):
    """The options of a group being made: its own `pg_options`, else the default group's when
    that is a gradsync group (new_group and DeviceMesh pass none), else the defaults."""
    if pg_options is None:
        return getattr(default_group, "options", None) or Options()
    if not isinstance(pg_options, Options):
        raise InvalidArgumentError(f"gradsync backend: pg_options must be a gradsync.torch.Options, not a "
                                   f"{type(pg_options).__module__}.{type(pg_options).__qualname__}")
    return pg_options


def fallback_group(options, store, prefix, rank, size, timeout):
    """The gloo group beside a gradsync group of these ranks (None when not asked for): made by
    every rank of the group at init, its keys under `prefix` in the group's store."""
    if options.fallback is None:
        return None
    return dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, size, timeout)
