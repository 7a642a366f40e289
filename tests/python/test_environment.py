"""connect() from torchrun's environment: the rendezvous from MASTER_ADDR across two daemons
("nodes"), and plain torchrun's job id "none" told apart by the master address and port."""
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading

import pytest

from harness import HERE, Daemon, assert_all_ok, cluster_token


def ranks_on_nodes(daemons, env_extra, local_world_size=1):
    processes = []
    world = len(daemons) * local_world_size
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank % local_world_size),
                   LOCAL_WORLD_SIZE=str(local_world_size), GRADSYNC_SOCKET=daemons[rank // local_world_size].socket,
                   OMP_NUM_THREADS="1", **env_extra)
        env.pop("GRADSYNC_RENDEZVOUS", None)
        processes.append(subprocess.Popen([sys.executable, os.path.join(HERE, "workers", "nodes.py")], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return [(p.wait(120), p.stdout.read()) for p in processes]


def port_free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


@pytest.mark.skipif(not port_free(29590), reason="gradsyncd's default peer port 29590 is taken here")
def test_rendezvous_from_master_addr_alone():
    token_dir = tempfile.mkdtemp(prefix="gradsync-token-")
    token = cluster_token(token_dir)
    node0 = Daemon("--peer-token-file", token, peer_listen="127.0.0.1:29590")  # the port MASTER_ADDR implies
    node1 = Daemon("--peer-token-file", token)
    try:
        results = ranks_on_nodes([node0, node1], {"MASTER_ADDR": "127.0.0.1", "TORCHELASTIC_RUN_ID": "mn-env"})
        assert_all_ok(results, node0)
        assert all("ok rank" in out for _, out in results), results
    finally:
        node0.close()
        node1.close()
        shutil.rmtree(token_dir, ignore_errors=True)


def test_plain_torchrun_job_ids_are_told_apart_by_master_port(daemon):
    # Two jobs of plain torchrun (TORCHELASTIC_RUN_ID=none) on one node at once.
    jobs = []
    for port in ("29511", "29512"):
        env = {"TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        jobs.append(env)
    results = {}

    def run(env):
        results[env["MASTER_PORT"]] = ranks_on_nodes([daemon], env, local_world_size=2)

    threads = [threading.Thread(target=run, args=(env,)) for env in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for port, res in results.items():
        assert_all_ok(res, daemon)
        assert all(f"job torchrun-127.0.0.1-{port}" in out for _, out in res), res
