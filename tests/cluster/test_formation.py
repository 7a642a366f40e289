"""Formation at scale (formation.py): jobs of 16 and 64 nodes on loopback form and verify, and the
calls at the rendezvous grow linearly with the node count (was 3.5 N²: every node read every
node's record, and Gloo's mesh every rank's keys one at a time), and the bytes each node reads
there grow with N, not N² (every node read every rank's list of N pair addresses: N³ in all).
The times are printed, not asserted: they are the bench's (docs/performance.md#formation-at-scale)."""
import formation


def test_store_calls_per_node_stay_constant_from_16_to_64_nodes():
    per_node, read_per_node = {}, {}
    for nodes in (16, 64):
        times, calls = formation.measure(nodes, runs=1)
        read = calls.pop(formation.BYTES_READ)
        total = sum(calls.values())
        per_node[nodes] = total / nodes
        read_per_node[nodes] = read / nodes
        print(f"{nodes} nodes: formed and verified in {times[0]:.2f} s; {total} calls at node 0 "
              f"({per_node[nodes]:.1f} per node): {calls}; Gets answered {read} bytes "
              f"({read_per_node[nodes]:.0f} per node)")
        assert calls.get("Get", 0) < 10 * nodes, calls  # N² would be 14,000 at 64
    assert per_node[64] < 1.25 * per_node[16], per_node
    # 4x the nodes: about 4x the bytes per node (N each); whole address lists made it 16x.
    assert read_per_node[64] < 6 * read_per_node[16], read_per_node
