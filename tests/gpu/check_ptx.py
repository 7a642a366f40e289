#!/usr/bin/env python3
"""Reads the PTX of the CUDA backend's kernels (daemon/backend/cuda/kernels.cu, compiled for
sm_90) and fails if the vector path of a gather or scatter kernel moves its data with scalar
accesses: every gather must store the accumulator, and every scatter load it, with 16-byte
vector accesses (st/ld.global.cg.v4.u32), as many per storage vector as the accumulator's
stretch needs (two for the half types, which accumulate in float32), and each must move the
clients' side 16 bytes at a time too. A kernel that falls back to scalar accesses still works,
but at a fraction of the copy bandwidth (issue 23's 80%-of-D2D target).

    check_ptx.py KERNELS.ptx
"""
import re
import sys

# Accumulator vectors per 16-byte storage vector, by the codec in the kernel's mangled name.
ACC_VECTORS = {
    "SameCodecIfE": ("float32", 1),
    "SameCodecIdE": ("float64", 1),
    "SameCodecIiE": ("int32", 1),
    "SameCodecIlE": ("int64", 1),
    "SameCodecIhE": ("uint8", 1),
    "Float16Codec": ("float16", 2),
    "BFloat16Codec": ("bfloat16", 2),
}


def kernels(ptx):
    """(name, body) of every .entry."""
    starts = [m for m in re.finditer(r"^\.(?:visible )?\.?entry\s+(\S+)\(", ptx, re.M)]
    for i, m in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(ptx)
        yield m.group(1), ptx[m.end():end]


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    ptx = open(sys.argv[1]).read()
    checked, failures = 0, []
    for name, body in kernels(ptx):
        side = "gather" if "GatherItem" in name else "scatter" if "ScatterItem" in name else None
        codec = next((v for k, v in ACC_VECTORS.items() if k in name), None)
        if side is None or codec is None:
            continue
        checked += 1
        loads = len(re.findall(r"\bld\.global\.cg\.v4\.u32\b", body))
        stores = len(re.findall(r"\bst\.global\.cg\.v4\.u32\b", body))
        dtype, acc = codec
        # gather: clients' vectors in (>= 1 load), the accumulator out (acc stores);
        # scatter: the accumulator in (acc loads), clients' vectors out (>= 1 store).
        need_loads, need_stores = (1, acc) if side == "gather" else (acc, 1)
        if loads < need_loads or stores < need_stores:
            failures.append(f"{side} {dtype}: {loads} vector loads and {stores} vector stores, needs at least "
                            f"{need_loads} and {need_stores} ({name[:90]}...)")
    if checked == 0:
        sys.exit("check_ptx.py: no gather or scatter kernel found in " + sys.argv[1])
    for f in failures:
        print("scalar fallback: " + f)
    print(f"check_ptx.py: {checked} gather/scatter kernels checked, {len(failures)} fall back to scalar accesses")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
