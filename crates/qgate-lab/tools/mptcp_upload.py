#!/usr/bin/env python3
"""Paper 001's upload over Linux kernel sockets, for `qgate-lab upload-kernel` (run inside the
namespaces `qgate-lab linkem` makes; the buffers are the namespaces' tcp_rmem / tcp_wmem).

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
  prints {"seconds": T, "goodput_mbps": G, "backup_subflows": K, "backup_bytes": B,
           "sender_peak_bytes": S, "receiver_peak_bytes": R}:
  connect → the first end-of-file answer from the receiver, and how many subflows left from the
  addresses in $QUP_BACKUP (comma-separated) and the bytes they sent, read with `ss` before the
  sockets close; the most memory the kernel held for the sender's sockets (S) and for the
  receiver's (R), sampled every SAMPLE_S (see Held)

Wire format: a 17-byte header (b"QUP1", u64 size, u8 sockets, u32 unused) per connection, then
for `conventional`/`tcp` the bytes in order, for `two-ended` frames (u64 offset, u32 length,
data). The receiver writes each frame at its offset (Alg. 2) and, once `size` bytes have arrived,
answers on every connection: b"!" and its peak R as a u64.
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
ANSWER = struct.Struct("!cQ")
# How often Held samples (a sample costs about 0.2 ms of CPU: 4 % of a core).
SAMPLE_S = 0.005
SO_MEMINFO = 55
# sock_diag (linux/inet_diag.h, linux/sock_diag.h): dump the namespace's TCP sockets (MPTCP
# subflows among them) with their memory.
NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST_DUMP = 0x301
NLMSG_ERROR, NLMSG_DONE = 2, 3
INET_DIAG_SKMEMINFO = 7
NLMSG = struct.Struct("=IHHII")
DIAG_REQ = struct.Struct("=BBBBI48x")
# inet_diag_msg: family, state, timer, retrans, then the socket id (ports first, big-endian).
DIAG_MSG_PORTS = 4
DIAG_MSG_SIZE = 72
MEMINFO = struct.Struct("=9I")  # rmem_alloc, rcvbuf, wmem_alloc, sndbuf, fwd_alloc, wmem_queued, …
# Bytes sent and acknowledged at the connection level: struct mptcp_info's mptcpi_bytes_sent
# (new data only) and mptcpi_bytes_acked (Linux ≥ 6.5), struct tcp_info's tcpi_bytes_acked,
# tcpi_bytes_sent (retransmissions included) and tcpi_bytes_retrans.
SOL_MPTCP, MPTCP_INFO = 284, 1
MPTCP_INFO_SENT_ACKED = ((56, 72), 80)
TCP_INFO_ACKED_SENT_RETRANS = ((120, 200, 208), 216)
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


# Decision U13.
class Held:
    """The most memory the kernel held for some sockets, sampled every SAMPLE_S in a thread.

    Each sample sums, over the sockets `socks()` returns (the application's own: MPTCP's
    connection-level socket, or a plain TCP socket), `SO_MEMINFO`'s rmem_alloc (`recv`) or
    wmem_queued (send), and for `recv` also rmem_alloc of the namespace's TCP sockets with
    `port` at either end: MPTCP subflows hold data there until the connection-level socket takes
    it. Memory is what the kernel charged (buffers' true size, headers and slack included), not
    payload. The connection-level socket holds what arrived out of order across subflows until
    the gap fills, and what the application has not read yet; on the send side, what was
    written and not yet acknowledged at the connection level (unsent bytes included).
    (The subflows' send queues point at the same data, so they are not added again.) On the
    send side it also keeps the most bytes sent and not yet acknowledged (`unacked`).
    """

    def __init__(self, socks, recv, port):
        self.socks, self.recv, self.port = socks, recv, port
        self.peak = 0
        self.unacked = 0
        self.error = None
        self.stop = threading.Event()
        self.diag = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG)
        self.diag.settimeout(1.0)
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def subflows_rmem(self):
        req = DIAG_REQ.pack(socket.AF_INET, socket.IPPROTO_TCP, 1 << (INET_DIAG_SKMEMINFO - 1), 0, 0xFFFFFFFF)
        self.diag.send(
            NLMSG.pack(NLMSG.size + len(req), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST_DUMP, 1, 0) + req
        )
        total = 0
        while True:
            data = self.diag.recv(1 << 16)
            off = 0
            while off + NLMSG.size <= len(data):
                ln, typ = NLMSG.unpack_from(data, off)[:2]
                if typ == NLMSG_DONE:
                    return total
                if typ == NLMSG_ERROR:
                    err = struct.unpack_from("=i", data, off + NLMSG.size)[0]
                    raise OSError(-err, "sock_diag dump")
                msg = off + NLMSG.size
                if self.port in struct.unpack_from("!HH", data, msg + DIAG_MSG_PORTS):
                    a = msg + DIAG_MSG_SIZE
                    while a + 4 <= off + ln:
                        alen, atyp = struct.unpack_from("=HH", data, a)
                        if alen < 4:
                            break
                        if atyp == INET_DIAG_SKMEMINFO:
                            total += MEMINFO.unpack_from(data, a + 4)[0]
                        a += (alen + 3) & ~3
                off += (ln + 3) & ~3

    @staticmethod
    def in_flight(s):
        """Bytes `s` sent and has not had acknowledged, at the connection level."""
        if s.proto == IPPROTO_MPTCP:
            (sent, acked), size = MPTCP_INFO_SENT_ACKED
            info = s.getsockopt(SOL_MPTCP, MPTCP_INFO, size)
            if len(info) < size:
                raise OSError("this kernel's mptcp_info has no byte counters (Linux < 6.5)")
            return struct.unpack_from("=Q", info, sent)[0] - struct.unpack_from("=Q", info, acked)[0]
        (acked, sent, retrans), size = TCP_INFO_ACKED_SENT_RETRANS
        info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, size)
        at = lambda off: struct.unpack_from("=Q", info, off)[0]
        return at(sent) - at(retrans) - at(acked)

    def run(self):
        try:
            while not self.stop.wait(SAMPLE_S):
                held = unacked = 0
                for s in self.socks():
                    try:
                        mem = MEMINFO.unpack(
                            s.getsockopt(socket.SOL_SOCKET, SO_MEMINFO, MEMINFO.size)
                        )
                        if not self.recv:
                            unacked += self.in_flight(s)
                    except OSError as e:
                        # A socket closed under the sampler (errno set) is skipped; anything
                        # else is a failure of the measurement.
                        if e.errno is None:
                            raise
                        continue
                    held += mem[0] if self.recv else mem[5]
                if self.recv:
                    held += self.subflows_rmem()
                self.peak = max(self.peak, held)
                self.unacked = max(self.unacked, unacked)
        except Exception as e:  # noqa: BLE001 — reported by finish(), not lost with the thread
            self.error = e

    def finish(self):
        """Stop sampling; the peak, or the error that stopped the sampler."""
        self.stop.set()
        self.thread.join()
        self.diag.close()
        if self.error is not None:
            raise RuntimeError(f"memory sampling failed: {self.error!r}")
        return self.peak


def recv(port):
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM, IPPROTO_MPTCP)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("0.0.0.0", port))
    ls.listen(16)
    out = open(os.devnull, "wb")
    state = {"got": 0, "size": None, "conns": []}
    lock = threading.Lock()
    done = threading.Event()
    held = Held(lambda: list(state["conns"]), True, port)

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
                    # b"?": the file arrived but the measurement failed; the sender fails the run.
                    try:
                        answer = ANSWER.pack(b"!", held.finish())
                    except RuntimeError as e:
                        print(e, file=sys.stderr, flush=True)
                        answer = ANSWER.pack(b"?", 0)
                    for cc in state["conns"]:
                        try:
                            cc.sendall(answer)
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
    print(json.dumps({"bytes": state["got"], "peak_bytes": held.peak}), flush=True)
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
        # A transfer that stops making progress ends the run with an error, not a hang.
        s.settimeout(GIVE_UP_S)
        held = Held(lambda: [s], False, port)
        s.sendall(HEADER.pack(b"QUP1", size, 1, 0))
        left = size
        while left > 0:
            n = min(left, chunk)
            s.sendall(payload[:n])
            left -= n
        mark, receiver_peak = ANSWER.unpack(recv_exact(s, ANSWER.size))
        secs = time.monotonic() - t0
        if mark != b"!":
            sys.exit("the receiver's memory sampling failed (its stderr says why)")
    else:
        n = (size + chunk - 1) // chunk
        idx = {"lo": 0, "hi": n - 1}
        lock = threading.Lock()
        socks = [connect(IPPROTO_MPTCP, a, peer_of(k), port) for k, a in enumerate(addrs[:2])]
        if mode == "two-ended":
            for s in socks:
                s.setsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT, chunk)
        held = Held(lambda: socks, False, port)
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
                mark, peak = ANSWER.unpack(recv_exact(s, ANSWER.size))
                if mark != b"!":
                    raise OSError("the receiver's memory sampling failed (its stderr says why)")
                ends.append((time.monotonic(), peak))
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
        secs, receiver_peak = ends[0][0] - t0, ends[0][1]
    sender_peak = held.finish()
    subflows, sent = subflows_from(backup)
    print(
        json.dumps(
            {
                "seconds": secs,
                "goodput_mbps": size * 8e-6 / secs,
                "backup_subflows": subflows,
                "backup_bytes": sent,
                "sender_peak_bytes": sender_peak,
                "sender_unacked_peak_bytes": held.unacked,
                "receiver_peak_bytes": receiver_peak,
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
