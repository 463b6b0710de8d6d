#!/usr/bin/env python3
"""Paper 001's upload over Linux kernel sockets, for `qgate lab upload-kernel` (run inside the
namespaces `qgate linkem` makes; the buffers are the namespaces' tcp_rmem / tcp_wmem).

  recv PORT                      accept one upload (MPTCP or TCP), print {"bytes": N} when done
  send MODE SIZE CHUNK PEERS PORT ADDR1 [ADDR2]
     PEERS: the receiver's addresses, comma-separated; the socket from ADDRk connects to the
            k-th (or the last)
     MODE conventional: one MPTCP socket from ADDR1; the kernel stripes it over its subflows
     MODE two-ended-literal: one MPTCP socket per address, chunk 0,1,… on the first and
                        n-1,n-2,… on the second until they meet (paper 001 Alg. 1), each on
                        its dedicated subflow (and whatever backup subflows the path manager
                        adds)
     MODE two-ended:    the same, but a socket takes its next chunk only when less than one
                        chunk of it is unsent (TCP_NOTSENT_LOWAT = CHUNK; qgate's rule, U4)
     MODE tcp:          one plain TCP socket from ADDR1 (a single path)
  prints {"seconds": T, "goodput_mbps": G, "backup_subflows": K, "backup_bytes": B}:
  connect → the first end-of-file byte from the receiver, and how many subflows left from the
  addresses in $QUP_BACKUP (comma-separated) and the bytes they sent, read with `ss` before the
  sockets close

Wire format: a 17-byte header (b"QUP1", u64 size, u8 sockets, u32 unused) per connection, then
for `conventional`/`tcp` the bytes in order, for `two-ended` frames (u64 offset, u32 length,
data). The receiver writes each frame at its offset (Alg. 2) and, once `size` bytes have arrived,
sends one byte on every connection.
"""
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time

IPPROTO_MPTCP = 262
TCP_NOTSENT_LOWAT = 25
HEADER = struct.Struct("!4sQBI")
FRAME = struct.Struct("!QI")
# The longest an upload may take before the sender gives up (a 10 MB file on cellular alone
# takes about 20 s).
GIVE_UP_S = 300


def recv_exact(s, n):
    buf = bytearray()
    while len(buf) < n:
        b = s.recv(n - len(buf))
        if not b:
            raise ConnectionError("peer closed")
        buf += b
    return bytes(buf)


def recv(port):
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM, IPPROTO_MPTCP)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("0.0.0.0", port))
    ls.listen(16)
    out = open(os.devnull, "wb")
    state = {"got": 0, "size": None, "conns": []}
    lock = threading.Lock()
    done = threading.Event()

    def serve(c):
        magic, size, socks, _ = HEADER.unpack(recv_exact(c, HEADER.size))
        assert magic == b"QUP1"
        with lock:
            state["size"] = size
            state["conns"].append(c)
        framed = socks > 1
        while not done.is_set():
            if framed:
                try:
                    off, n = FRAME.unpack(recv_exact(c, FRAME.size))
                except ConnectionError:
                    return
                data = recv_exact(c, n)
                os.pwrite(out.fileno(), data, off)
            else:
                data = c.recv(1 << 16)
                if not data:
                    return
                n = len(data)
            with lock:
                state["got"] += n
                if state["got"] >= size:
                    for cc in state["conns"]:
                        try:
                            cc.sendall(b"!")
                        except OSError:
                            pass
                    done.set()

    while not done.is_set():
        ls.settimeout(0.2)
        try:
            c, _ = ls.accept()
        except socket.timeout:
            continue
        threading.Thread(target=serve, args=(c,), daemon=True).start()
    print(json.dumps({"bytes": state["got"]}), flush=True)
    time.sleep(0.5)


def connect(proto, addr, peer, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, proto)
    # CUBIC, as the paper (an MPTCP socket passes it to its subflows).
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, b"cubic")
    s.bind((addr, 0))
    s.connect((peer, port))
    return s


def subflows_from(addrs):
    """How many TCP sockets (MPTCP subflows among them) have their local address in `addrs`,
    and the bytes they sent, as `ss -tin` reports them (no bytes_sent field: none sent)."""
    if not addrs:
        return 0, 0
    out = subprocess.run(
        ["ss", "-tinH", "state", "established"], capture_output=True, text=True, check=True
    ).stdout
    count, total, counting = 0, 0, False
    for line in out.splitlines():
        if line and not line[0].isspace():
            # With a state filter ss leaves the state column out: local address first.
            fields = line.split()
            local = fields[2].rsplit(":", 1)[0].split("%")[0] if len(fields) > 2 else ""
            counting = local in addrs
            count += counting
        elif counting:
            for f in line.split():
                if f.startswith("bytes_sent:"):
                    total += int(f.split(":", 1)[1])
    return count, total


def send(mode, size, chunk, peers, port, addrs):
    payload = b"\x5a" * chunk
    backup = [a for a in os.environ.get("QUP_BACKUP", "").split(",") if a]
    peer_of = lambda k: peers[min(k, len(peers) - 1)]
    t0 = time.monotonic()
    done = threading.Event()
    if mode in ("conventional", "tcp"):
        proto = IPPROTO_MPTCP if mode == "conventional" else socket.IPPROTO_TCP
        s = connect(proto, addrs[0], peer_of(0), port)
        s.sendall(HEADER.pack(b"QUP1", size, 1, 0))
        left = size
        while left > 0:
            n = min(left, chunk)
            s.sendall(payload[:n])
            left -= n
        recv_exact(s, 1)
        secs = time.monotonic() - t0
    else:
        n = (size + chunk - 1) // chunk
        idx = {"lo": 0, "hi": n - 1}
        lock = threading.Lock()
        socks = [connect(IPPROTO_MPTCP, a, peer_of(k), port) for k, a in enumerate(addrs[:2])]
        if mode == "two-ended":
            for s in socks:
                s.setsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT, chunk)
        for s in socks:
            s.sendall(HEADER.pack(b"QUP1", size, 2, 0))

        def lane(s, forward):
            try:
                while True:
                    with lock:
                        if idx["lo"] > idx["hi"]:
                            break
                        if forward:
                            i = idx["lo"]
                            idx["lo"] += 1
                        else:
                            i = idx["hi"]
                            idx["hi"] -= 1
                    off = i * chunk
                    ln = min(chunk, size - off)
                    s.sendall(FRAME.pack(off, ln) + payload[:ln])
                recv_exact(s, 1)
                ends.append(time.monotonic())
            except OSError as e:
                errors.append(e)
            finally:
                if ends or len(errors) == len(socks):
                    done.set()

        # The receiver answers on every connection once it holds the whole file; the first
        # answer ends the clock (a connection whose own path died answers later, or never).
        ends, errors = [], []
        ts = [
            threading.Thread(target=lane, args=(s, k == 0), daemon=True)
            for k, s in enumerate(socks)
        ]
        for t in ts:
            t.start()
        # A lane that lost its path without a backup never answers: give up, loudly.
        if not done.wait(timeout=GIVE_UP_S) or not ends:
            sys.exit(f"no end-of-file answer within {GIVE_UP_S} s: {errors}")
        secs = ends[0] - t0
    subflows, sent = subflows_from(backup)
    print(
        json.dumps(
            {
                "seconds": secs,
                "goodput_mbps": size * 8e-6 / secs,
                "backup_subflows": subflows,
                "backup_bytes": sent,
            }
        ),
        flush=True,
    )
    # Daemon lanes still waiting on a dead path's answer end with the process.
    os._exit(0)


def main():
    a = sys.argv[1:]
    if a[0] == "recv":
        recv(int(a[1]))
    elif a[0] == "send":
        send(a[1], int(a[2]), int(a[3]), a[4].split(","), int(a[5]), a[6:])
    else:
        sys.exit(f"unknown command {a[0]}")


if __name__ == "__main__":
    main()
