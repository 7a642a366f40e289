#!/usr/bin/env python3
"""Clang's thread-safety analysis over the daemon, the client library and shared/.

Compiles every translation unit of those folders again, syntax only, with clang++-16 and
-Wthread-safety -Werror=thread-safety, using the flags CMake recorded for it in
compile_commands.json (with unity builds, the batches that include the sources). A read of a
GS_GUARDED_BY member without its mutex, a call to a GS_REQUIRES function without the lock, or a
lock taken twice fails the check and is printed with its file and line (shared/mutex.h,
shared/thread_annotations.h).

Usage: thread_safety.py BUILD_DIR [SOURCE_DIR]
Exit 0 when clean, 1 on a finding or a compile error, 2 on bad use or a missing clang++-16.
"""
import concurrent.futures
import json
import os
import shlex
import shutil
import subprocess
import sys

CLANG = "clang++-16"
FOLDERS = ("daemon", "client", "shared")
# GCC options clang does not know; dropped from the recorded commands.
GCC_ONLY = ("-fno-semantic-interposition",)


def units(build_dir, source_dir):
    with open(os.path.join(build_dir, "compile_commands.json")) as f:
        commands = json.load(f)
    roots = [os.path.join(source_dir, d) + os.sep for d in FOLDERS] + \
            [os.path.join(build_dir, d) + os.sep for d in FOLDERS]
    for entry in commands:
        path = entry["file"]
        if path.endswith(".cu") or not any(path.startswith(r) for r in roots):
            continue
        yield entry


def clang_command(entry):
    words = shlex.split(entry["command"])
    out = [CLANG]
    skip = False
    for i, word in enumerate(words[1:], 1):
        if skip:
            skip = False
            continue
        if word in ("-o", "-c"):
            skip = True  # the object and the source: given again below
            continue
        if word in GCC_ONLY or word.startswith("-O"):
            continue
        out.append(word)
    # Boost 1.74 enables Asio's coroutines for GCC and for libc++, not for clang on libstdc++,
    # which has them in C++20.
    return out + ["-DBOOST_ASIO_HAS_CO_AWAIT=1", "-DBOOST_ASIO_HAS_STD_COROUTINE=1", "-fsyntax-only",
                  "-ferror-limit=0", "-Wno-everything", "-Wthread-safety", "-Werror=thread-safety", entry["file"]]


def check(entry):
    command = clang_command(entry)
    result = subprocess.run(command, cwd=entry["directory"], capture_output=True, text=True)
    return entry["file"], result.returncode, result.stderr


# Proves, on every run, that the check can fail: a read of a guarded member without its mutex
# must be refused, and the same read with the lock held must pass.
SELF_TEST = r"""
#include "shared/mutex.h"
struct Counter {
  gradsync::Mutex mutex;
  int value GS_GUARDED_BY(mutex) = 0;
  int read() { %s return value; }
};
int main() { Counter c; return c.read(); }
"""


def self_test(source_dir):
    flags = ["-std=c++20", "-I" + source_dir, "-fsyntax-only", "-Wno-everything", "-Wthread-safety",
             "-Werror=thread-safety", "-x", "c++", "-"]
    bad = subprocess.run([CLANG] + flags, input=SELF_TEST % "", capture_output=True, text=True)
    good = subprocess.run([CLANG] + flags, input=SELF_TEST % "gradsync::MutexLock lock(mutex);",
                          capture_output=True, text=True)
    if bad.returncode == 0 or "requires holding mutex 'mutex'" not in bad.stderr:
        print("thread_safety: self-test: an unlocked read of a guarded member was not refused:\n" + bad.stderr)
        return False
    if good.returncode != 0:
        print("thread_safety: self-test: correct locking was refused:\n" + good.stderr)
        return False
    return True


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    build_dir = os.path.abspath(sys.argv[1])
    source_dir = os.path.abspath(sys.argv[2] if len(sys.argv) > 2 else
                                 os.path.join(os.path.dirname(__file__), "..", ".."))
    if not shutil.which(CLANG):
        print(f"thread_safety: {CLANG} is not installed (.ci/install-deps installs it)", file=sys.stderr)
        return 2
    if not os.path.exists(os.path.join(build_dir, "compile_commands.json")):
        print(f"thread_safety: {build_dir}/compile_commands.json is missing: configure with CMake first",
              file=sys.stderr)
        return 2
    if not self_test(source_dir):
        return 1
    todo = list(units(build_dir, source_dir))
    if not todo:
        print("thread_safety: no daemon, client or shared sources in compile_commands.json", file=sys.stderr)
        return 1
    failed = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for path, code, stderr in pool.map(check, todo):
            if code != 0:
                failed += 1
                print(f"--- {os.path.relpath(path, build_dir)}\n{stderr}", end="")
    print(f"thread_safety: {len(todo)} translation units, {failed} with findings")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
