"""Traffic tools for the linkem accuracy tests: each prints one JSON line of what it measured.

    echo PORT                       UDP echo server
    ping HOST PORT COUNT GAP_MS [BIND]  UDP round trips through an echo server
    source PORT                     TCP server that sends bytes to whoever connects
    recv HOST PORT SECONDS SKIP     TCP client: goodput over [SKIP, SECONDS] s
    cbr HOST PORT MBIT SECONDS      UDP constant bit rate, 1200-byte datagrams
    drain PORT                      UDP sink
    sink PORT                       TCP sink: accepts connections and discards what they send
    flows HOST PORT N SECONDS CC    N bulk TCP flows with congestion control CC (cubic, bbr,
                                    reno), started 10 ms apart, for SECONDS
"""
import threading
import json
import socket
import statistics
import sys
import time


def echo(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", int(port)))
    while True:
        data, addr = s.recvfrom(65536)
        s.sendto(data, addr)


def ping(host, port, count, gap_ms, bind=None):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    if bind:
        s.bind((bind, 0))
    s.settimeout(0.001)
    count, gap = int(count), float(gap_ms) / 1000
    sent = {}
    rtts = []
    deadline = time.monotonic() + count * gap + 2.0
    i = 0
    next_send = time.monotonic()
    while time.monotonic() < deadline:
        now = time.monotonic()
        if i < count and now >= next_send:
            sent[i] = now
            s.sendto(i.to_bytes(4, "big") + b"x" * 60, (host, int(port)))
            i += 1
            next_send += gap
        try:
            data, _ = s.recvfrom(2048)
            k = int.from_bytes(data[:4], "big")
            if k in sent:
                rtts.append((time.monotonic() - sent.pop(k)) * 1000)
        except socket.timeout:
            pass
        if i == count and not sent:
            break
    print(json.dumps({
        "sent": count, "received": len(rtts),
        "median_ms": statistics.median(rtts) if rtts else None,
        "min_ms": min(rtts) if rtts else None, "max_ms": max(rtts) if rtts else None,
    }), flush=True)


def source(port):
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", int(port)))
    srv.listen(4)
    chunk = b"q" * 65536
    while True:
        c, _ = srv.accept()
        try:
            while True:
                c.sendall(chunk)
        except OSError:
            c.close()


def recv(host, port, seconds, skip):
    seconds, skip = float(seconds), float(skip)
    for _ in range(50):
        try:
            c = socket.create_connection((host, int(port)), timeout=2)
            break
        except OSError:
            time.sleep(0.1)
    start = time.monotonic()
    counted = 0
    while True:
        data = c.recv(1 << 20)
        now = time.monotonic() - start
        if not data or now >= seconds:
            break
        if now >= skip:
            counted += len(data)
    c.close()
    print(json.dumps({"goodput_mbps": counted * 8 / (seconds - skip) / 1e6}), flush=True)


def cbr(host, port, mbit, seconds):
    """Paced in 2 ms steps: each step sends what is due (a step's burst is what a real sender's
    pacing would smooth; it is far below any queue limit used)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    size = 1200
    rate = float(mbit) * 1e6 / (size * 8)
    start = time.monotonic()
    n = 0
    while True:
        elapsed = time.monotonic() - start
        if elapsed >= float(seconds):
            break
        while n < int(elapsed * rate):
            s.sendto(b"c" * size, (host, int(port)))
            n += 1
        time.sleep(0.002)
    print(json.dumps({"sent": n}), flush=True)


def drain(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", int(port)))
    while True:
        s.recvfrom(65536)


def sink(port):
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", int(port)))
    srv.listen(64)

    def discard(c):
        with c:
            while c.recv(1 << 20):
                pass

    while True:
        c, _ = srv.accept()
        threading.Thread(target=discard, args=(c,), daemon=True).start()


def flows(host, port, n, seconds, cc):
    n, seconds = int(n), float(seconds)
    end = time.monotonic() + seconds
    chunk = b"f" * 65536
    sent = [0] * n

    def run(i):
        time.sleep(0.01 * i)
        c = None
        for _ in range(50):
            try:
                c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                c.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())
                c.connect((host, int(port)))
                break
            except OSError:
                c.close()
                c = None
                time.sleep(0.1)
        if c is None:
            return
        c.settimeout(0.5)
        while time.monotonic() < end:
            try:
                sent[i] += c.send(chunk)
            except socket.timeout:
                pass
            except OSError:
                break
        c.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps({"flows": n, "cc": cc, "sent_bytes": sum(sent)}), flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) >= 2 else 2)
    {"echo": echo, "ping": ping, "source": source, "recv": recv, "cbr": cbr,
     "drain": drain, "sink": sink, "flows": flows}[sys.argv[1]](*sys.argv[2:])
