#!/usr/bin/env python3
"""Paper 001's upload over Linux kernel sockets, for `qgate lab upload-kernel` (run inside the
namespaces `qgate linkem` makes; the buffers are the namespaces' tcp_rmem / tcp_wmem).

  recv PORT                      accept one upload (MPTCP or TCP), print {"bytes": N} when done
  send MODE SIZE CHUNK PEER PORT ADDR1 [ADDR2]
     MODE conventional: one MPTCP socket from ADDR1; the kernel stripes it over its subflows
     MODE two-ended-literal: one MPTCP socket per address, chunk 0,1,… on the first and
                        n-1,n-2,… on the second until they meet (paper 001 Alg. 1), each on
                        its dedicated subflow
     MODE two-ended:    the same, but a socket takes its next chunk only when less than one
                        chunk of it is unsent (TCP_NOTSENT_LOWAT = CHUNK; qgate's rule, U4)
     MODE tcp:          one plain TCP socket from ADDR1 (a single path)
  prints {"seconds": T, "goodput_mbps": G} (connect → the receiver's end-of-file byte)

Wire format: a 17-byte header (b"QUP1", u64 size, u8 sockets, u32 unused) per connection, then
for `conventional`/`tcp` the bytes in order, for `two-ended` frames (u64 offset, u32 length,
data). The receiver writes each frame at its offset (Alg. 2) and, once `size` bytes have arrived,
sends one byte on every connection.
"""
import json
import os
import socket
import struct
import sys
import threading
import time

IPPROTO_MPTCP = 262
TCP_NOTSENT_LOWAT = 25
HEADER = struct.Struct("!4sQBI")
FRAME = struct.Struct("!QI")


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


def send(mode, size, chunk, peer, port, addrs):
    payload = b"\x5a" * chunk
    t0 = time.monotonic()
    if mode in ("conventional", "tcp"):
        proto = IPPROTO_MPTCP if mode == "conventional" else socket.IPPROTO_TCP
        s = connect(proto, addrs[0], peer, port)
        s.sendall(HEADER.pack(b"QUP1", size, 1, 0))
        left = size
        while left > 0:
            n = min(left, chunk)
            s.sendall(payload[:n])
            left -= n
        recv_exact(s, 1)
    else:
        n = (size + chunk - 1) // chunk
        idx = {"lo": 0, "hi": n - 1}
        lock = threading.Lock()
        socks = [connect(IPPROTO_MPTCP, a, peer, port) for a in addrs[:2]]
        if mode == "two-ended":
            for s in socks:
                s.setsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT, chunk)
        for s in socks:
            s.sendall(HEADER.pack(b"QUP1", size, 2, 0))

        def lane(s, forward):
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

        ts = [threading.Thread(target=lane, args=(s, k == 0)) for k, s in enumerate(socks)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    secs = time.monotonic() - t0
    print(json.dumps({"seconds": secs, "goodput_mbps": size * 8e-6 / secs}), flush=True)


def main():
    a = sys.argv[1:]
    if a[0] == "recv":
        recv(int(a[1]))
    elif a[0] == "send":
        send(a[1], int(a[2]), int(a[3]), a[4], int(a[5]), a[6:])
    else:
        sys.exit(f"unknown command {a[0]}")


if __name__ == "__main__":
    main()
