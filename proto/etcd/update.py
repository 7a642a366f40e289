#!/usr/bin/env python3
"""Copies etcd's published v3 API protos into proto/etcd/, ready for protoc without Go.

gradsyncd talks to etcd through etcd's own gRPC API (KV, Watch, Lease, Auth). Its definitions
are etcd's: this script takes them from Debian's golang-etcd-server-dev (the sources of the
etcd-server that the tests run, v3.4) and changes only what a C++ build cannot use or need:

- the gogoproto imports and options (Go code generation only);
- the grpc-gateway imports and `option (google.api.http)` blocks (etcd's HTTP/JSON gateway);
- the import paths, to where the copies live here;
- `optimize_for = CODE_SIZE`, since the daemon makes a few calls per job formation.

Messages, fields, numbers and services are untouched, so the wire format is etcd's. Run it
again (as root: `apt-get install golang-etcd-server-dev`) to follow a newer etcd.
"""
import pathlib
import re
import sys

SOURCE = pathlib.Path("/usr/share/gocode/src/go.etcd.io/etcd")
FILES = {
    "rpc.proto": "etcdserver/etcdserverpb/rpc.proto",
    "kv.proto": "mvcc/mvccpb/kv.proto",
    "auth.proto": "auth/authpb/auth.proto",
}
IMPORTS = {
    "etcd/mvcc/mvccpb/kv.proto": "etcd/kv.proto",
    "etcd/auth/authpb/auth.proto": "etcd/auth.proto",
}
HEADER = """// Copied from etcd v3.4 ({path}, Apache License 2.0, (c) The etcd Authors) by
// proto/etcd/update.py, which removed the Go and HTTP-gateway annotations only. Do not edit:
// run the script.
"""


def convert(text, path):
    text = re.sub(r'import "(gogoproto/gogo|google/api/annotations)\.proto";\n', "", text)
    text = re.sub(r"// for grpc-gateway\n", "", text)
    text = re.sub(r"option \(gogoproto\.[a-z_]+\) = [a-z]+;\n", "", text)
    # `option (google.api.http) = { ... };` inside an rpc's braces, over several lines, with at
    # most one level of nested braces (additional_bindings).
    text = re.sub(r"\s*option \(google\.api\.http\) = \{(?:[^{}]|\{[^{}]*\})*\};", "", text)
    for old, new in IMPORTS.items():
        text = text.replace(f'import "{old}";', f'import "{new}";')
    if "gogoproto" in text or "google.api" in text:
        sys.exit(f"{path}: annotations this script does not know how to remove are left")
    text = re.sub(r"(package [a-z]+;\n)", r"\1\noption optimize_for = CODE_SIZE;\n", text, count=1)
    return HEADER.format(path=path) + text


def main():
    here = pathlib.Path(__file__).resolve().parent
    for name, path in FILES.items():
        source = SOURCE / path
        if not source.exists():
            sys.exit(f"{source} is missing: apt-get install golang-etcd-server-dev")
        (here / name).write_text(convert(source.read_text(), path))
        print(f"proto/etcd/{name} <- {source}")


if __name__ == "__main__":
    main()
