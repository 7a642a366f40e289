"""The C API (client/include/gradsync/c_api.h) through ctypes.

The library is found, in order: $GRADSYNC_LIBRARY; libgradsync_client.so beside this file (the
build tree's package and an installed one); the dynamic loader's search path. ctypes releases
the GIL around every call, so a wait blocks only the calling thread.
"""
import ctypes
import os
import threading

C_API_VERSION = 5

c_void_p = ctypes.c_void_p
c_int32 = ctypes.c_int32
c_int64 = ctypes.c_int64
c_uint32 = ctypes.c_uint32
c_uint64 = ctypes.c_uint64
c_size_t = ctypes.c_size_t
c_char_p = ctypes.c_char_p
c_double = ctypes.c_double


class Tensor(ctypes.Structure):
    _fields_ = [("data", c_void_p), ("numel", c_uint64), ("dtype", c_int32), ("device", c_int32),
                ("group", c_char_p)]


class ReduceOptions(ctypes.Structure):
    _fields_ = [("op", c_int32), ("prescale", c_int32), ("divisor", c_double), ("fp32_accumulate", c_int32)]


class OpOptions(ctypes.Structure):
    _fields_ = [("size", c_uint32), ("health", c_int32), ("wire_dtype", c_int32)]


class RegisterOptions(ctypes.Structure):
    _fields_ = [("size", c_uint32), ("bucket_cap_bytes", c_int64), ("allgather", c_int32),
                ("reduce_scatter", c_int32), ("label", c_char_p), ("mask", ctypes.c_void_p),
                ("mask_count", ctypes.c_uint64)]


class Group(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("ranks", ctypes.POINTER(c_int32)), ("count", c_size_t)]


_P = ctypes.POINTER
_SIGNATURES = {
    "gs_c_api_version": (ctypes.c_int, []),
    "gs_last_error": (c_char_p, []),
    "gs_connect": (c_int32, [c_char_p, c_char_p, c_int64, _P(c_void_p)]),
    "gs_client_close": (None, [c_void_p]),
    "gs_client_abort": (c_int32, [c_void_p, c_char_p]),
    "gs_join": (c_int32, [c_void_p, c_char_p, c_int32, c_int32, c_int32, c_int32, c_int64, c_char_p, _P(Group),
                          c_size_t]),
    "gs_job_timeout_ms": (c_int64, [c_void_p]),
    "gs_alloc": (c_int32, [c_void_p, c_uint64, c_int32, _P(c_void_p)]),
    "gs_free": (c_int32, [c_void_p, c_void_p]),
    "gs_register": (c_int32, [c_void_p, _P(Tensor), c_size_t, c_int64, c_int32, _P(c_void_p)]),
    "gs_register_labeled": (c_int32, [c_void_p, _P(Tensor), c_size_t, c_int64, c_int32, c_char_p, _P(c_void_p)]),
    "gs_register_ex": (c_int32, [c_void_p, _P(Tensor), c_size_t, _P(RegisterOptions), _P(c_void_p)]),
    "gs_set_free": (None, [c_void_p]),
    "gs_set_release": (c_int32, [c_void_p, c_void_p]),
    "gs_set_id": (c_uint32, [c_void_p]),
    "gs_set_buckets": (c_size_t, [c_void_p]),
    "gs_set_gathered": (c_int32, [c_void_p, c_int32, c_size_t, _P(c_void_p)]),
    "gs_set_shard": (c_int32, [c_void_p, _P(c_void_p), _P(c_uint64), _P(c_uint64)]),
    "gs_set_stream": (c_int32, [c_void_p, c_void_p]),
    "gs_allreduce": (c_int32, [c_void_p, c_void_p, _P(ReduceOptions), _P(c_void_p)]),
    "gs_allreduce_ex": (c_int32, [c_void_p, c_void_p, _P(ReduceOptions), _P(OpOptions), _P(c_void_p)]),
    "gs_allreduce_deferred": (c_int32, [c_void_p, c_void_p, _P(ReduceOptions), _P(c_void_p)]),
    "gs_mark_ready": (c_int32, [c_void_p, c_void_p, c_uint32, c_int32, c_void_p]),
    "gs_broadcast": (c_int32, [c_void_p, c_void_p, c_int32, _P(c_void_p)]),
    "gs_reduce": (c_int32, [c_void_p, c_void_p, c_int32, _P(ReduceOptions), _P(c_void_p)]),
    "gs_allgather": (c_int32, [c_void_p, c_void_p, _P(c_void_p)]),
    "gs_reduce_ex": (c_int32, [c_void_p, c_void_p, c_int32, _P(ReduceOptions), _P(OpOptions), _P(c_void_p)]),
    "gs_reduce_scatter": (c_int32, [c_void_p, c_void_p, _P(ReduceOptions), _P(OpOptions), _P(c_void_p)]),
    "gs_work_wait": (c_int32, [c_void_p, c_int64, _P(c_int32)]),
    "gs_work_wait_stream": (c_int32, [c_void_p, c_void_p, c_int64, _P(c_int32)]),
    "gs_work_is_completed": (c_int32, [c_void_p, _P(c_int32)]),
    "gs_work_health": (c_int32, [c_void_p, _P(c_int32), _P(c_double)]),
    "gs_work_free": (None, [c_void_p]),
}

_loaded = None
_lock = threading.Lock()


def _candidates():
    explicit = os.environ.get("GRADSYNC_LIBRARY")
    if explicit:
        return [explicit]
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libgradsync_client.so")
    return [here, "libgradsync_client.so"]


def lib():
    """The loaded library, with every function's signature set. Raises OSError naming where it looked."""
    global _loaded
    if _loaded is not None:
        return _loaded
    with _lock:
        if _loaded is None:
            tried = []
            found = None
            for path in _candidates():
                try:
                    found = ctypes.CDLL(path)
                    break
                except OSError as e:
                    tried.append(f"{path}: {e}")
            if found is None:
                raise OSError("gradsync: cannot load libgradsync_client.so (build gradsync, or set GRADSYNC_LIBRARY); "
                              "tried " + "; ".join(tried))
            for name, (restype, argtypes) in _SIGNATURES.items():
                fn = getattr(found, name)
                fn.restype = restype
                fn.argtypes = argtypes
            version = found.gs_c_api_version()
            if version != C_API_VERSION:
                raise OSError(f"gradsync: libgradsync_client.so has C API version {version}, "
                              f"this package needs {C_API_VERSION}")
            _loaded = found
    return _loaded


def last_error():
    message = lib().gs_last_error()
    return message.decode("utf-8", "replace") if message else ""
