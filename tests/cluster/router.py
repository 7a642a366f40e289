"""The simulated cluster's impairment router: forwards every Ethernet frame between two
interfaces of the hub namespace (a node's link end and the veth that leads to the bridge),
dropping a fraction of them and delaying the rest, both directions alike. It stands in for
netem, which this kernel lacks (SimCluster.impair starts it; SIGKILL ends it).

    router.py IFACE_A IFACE_B [--loss P] [--delay-ms D] [--seed S] [--ready-fd FD]
"""
import argparse
import heapq
import os
import random
import select
import socket
import time

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4  # a frame this socket's interface sent, not one it received
SO_RCVBUFFORCE = 33  # <asm-generic/socket.h>


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--loss", type=float, default=0.0, help="fraction of frames dropped, 0 to 1")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="added to every frame, each direction")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--ready-fd", type=int, default=-1, help="written '1' once forwarding")
    args = parser.parse_args()
    if not 0.0 <= args.loss <= 1.0 or args.delay_ms < 0:
        parser.error("--loss is a fraction from 0 to 1 and --delay-ms is not negative")
    rng = random.Random(args.seed)
    ends = {}
    for name in (args.a, args.b):
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        # SO_RCVBUFFORCE (root): beyond rmem_max, so the router itself drops no frame it was not
        # told to (Python names no constant for it).
        s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 8 << 20)
        s.bind((name, 0))
        s.setblocking(False)
        ends[name] = s
    other = {ends[args.a]: ends[args.b], ends[args.b]: ends[args.a]}
    if args.ready_fd >= 0:
        os.write(args.ready_fd, b"1")
        os.close(args.ready_fd)
    delay = args.delay_ms / 1000.0
    queued = []  # (due, order, socket, frame)
    order = 0
    while True:
        timeout = max(0.0, queued[0][0] - time.monotonic()) if queued else None
        readable, _, _ = select.select(list(other), [], [], timeout)
        for s in readable:
            while True:
                try:
                    frame, address = s.recvfrom(65536)
                except BlockingIOError:
                    break
                if address[2] == PACKET_OUTGOING:
                    continue
                if args.loss and rng.random() < args.loss:
                    continue
                if delay:
                    order += 1
                    heapq.heappush(queued, (time.monotonic() + delay, order, other[s], frame))
                else:
                    send(other[s], frame)
        now = time.monotonic()
        while queued and queued[0][0] <= now:
            _, _, out, frame = heapq.heappop(queued)
            send(out, frame)


def send(s, frame):
    try:
        s.send(frame)
    except (BlockingIOError, OSError):
        pass  # a full queue or a link down drops the frame, as a switch would


if __name__ == "__main__":
    main()
