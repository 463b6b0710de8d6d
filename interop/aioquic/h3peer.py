#!/usr/bin/env python3
"""A third-party HTTP/3 peer for qgate's interop tests, on aioquic (PyPI `aioquic`).

    h3peer.py device HOST PORT --ca CA [--records N] ...   an IoT device: register with a qgate
        gateway (POST /register), then POST each record to /ingest/STREAM with the Hash ID,
        retrying a record the gateway answers 502/503 for; prints one JSON line.
    h3peer.py server PORT --pki DIR                        a plain HTTP/3 server for qgate's own
        clients: GET → 200 "hello from aioquic", POST → 201 {"bytes": N, "sha256": ...}; its
        certificate (ECDSA P-256, for localhost and 127.0.0.1) is issued by a CA it makes and
        writes to DIR/ca.pem; prints "listening" once it is.

Everything here is this project's code; aioquic provides the QUIC and HTTP/3 layers.
"""

import argparse
import asyncio
import datetime
import hashlib
import ipaddress
import json
import os
import sys

from aioquic.asyncio import serve
from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import ConnectionTerminated


class Exchange:
    """One request's response as it arrives."""

    def __init__(self, future):
        self.future = future
        self.status = None
        self.headers = {}
        self.body = bytearray()


class Client(QuicConnectionProtocol):
    """HTTP/3 requests over one QUIC connection, each on its own stream."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.open = {}

    async def request(self, authority, method, path, headers=(), body=b""):
        stream = self._quic.get_next_available_stream_id()
        fields = [
            (b":method", method.encode()),
            (b":scheme", b"https"),
            (b":authority", authority.encode()),
            (b":path", path.encode()),
            (b"content-length", str(len(body)).encode()),
        ]
        fields += [(k.encode(), v.encode()) for k, v in headers]
        self.h3.send_headers(stream, fields, end_stream=not body)
        if body:
            self.h3.send_data(stream, body, end_stream=True)
        exchange = Exchange(self._loop.create_future())
        self.open[stream] = exchange
        self.transmit()
        return await exchange.future

    def quic_event_received(self, event):
        if isinstance(event, ConnectionTerminated):
            for exchange in self.open.values():
                if not exchange.future.done():
                    exchange.future.set_exception(
                        ConnectionError(f"connection closed: {event.reason_phrase}")
                    )
            self.open.clear()
        for ev in self.h3.handle_event(event):
            exchange = self.open.get(getattr(ev, "stream_id", None))
            if exchange is None:
                continue
            if isinstance(ev, HeadersReceived):
                for name, value in ev.headers:
                    if name == b":status":
                        exchange.status = int(value)
                    else:
                        exchange.headers[name.decode()] = value.decode()
            elif isinstance(ev, DataReceived):
                exchange.body += ev.data
            if getattr(ev, "stream_ended", False):
                del self.open[ev.stream_id]
                if not exchange.future.done():  # not given up on (a timeout cancels it)
                    exchange.future.set_result(exchange)


async def device(a):
    cfg = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, server_name=a.server_name)
    cfg.load_verify_locations(a.ca)
    if a.cert:
        # The device's own certificate, for a gateway that authenticates devices.
        cfg.load_cert_chain(a.cert, a.key)
    cfg.idle_timeout = 30.0
    authority = f"{a.server_name}:{a.port}"
    report = {"stack": "aioquic", "records": a.records, "created": 0, "statuses": {}, "retries": 0}
    async with connect(a.host, a.port, configuration=cfg, create_protocol=Client) as client:

        async def ask(method, path, headers=(), body=b""):
            return await asyncio.wait_for(
                client.request(authority, method, path, headers, body), a.timeout
            )

        r = await ask("POST", "/register", [("qgate-priority", "1" if a.priority else "0")])
        if r.status != 201:
            raise SystemExit(f"registration refused: {r.status} {bytes(r.body)!r}")
        hash_id = json.loads(bytes(r.body))["hash_id"]
        report["hash_id_hex_digits"] = len(hash_id)
        for i in range(a.records):
            record = f"{a.tag} record {i} ".encode().ljust(a.body_bytes, b".")
            for attempt in range(a.attempts):
                r = await ask("POST", f"/ingest/{a.stream}", [("qgate-hash-id", hash_id)], record)
                if r.status not in (502, 503) or attempt + 1 == a.attempts:
                    break
                report["retries"] += 1
                await asyncio.sleep(0.2)
            report["statuses"][str(r.status)] = report["statuses"].get(str(r.status), 0) + 1
            if r.status == 201:
                report["created"] += 1
        # A request without the Hash ID is refused, not forwarded.
        r = await ask("POST", f"/ingest/{a.stream}", body=b"no hash id")
        report["without_hash_id"] = r.status
    print(json.dumps(report), flush=True)


class Server(QuicConnectionProtocol):
    """Answers each request stream once its request has ended."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h3 = None
        self.requests = {}

    def quic_event_received(self, event):
        if self.h3 is None:
            self.h3 = H3Connection(self._quic)
        for ev in self.h3.handle_event(event):
            if isinstance(ev, HeadersReceived):
                fields = dict(ev.headers)
                self.requests[ev.stream_id] = [fields.get(b":method", b"").decode(), bytearray()]
            elif isinstance(ev, DataReceived) and ev.stream_id in self.requests:
                self.requests[ev.stream_id][1] += ev.data
            if getattr(ev, "stream_ended", False) and ev.stream_id in self.requests:
                method, body = self.requests.pop(ev.stream_id)
                if method == "POST":
                    status = b"201"
                    answer = json.dumps(
                        {"bytes": len(body), "sha256": hashlib.sha256(body).hexdigest()}
                    ).encode()
                else:
                    status, answer = b"200", b"hello from aioquic\n"
                self.h3.send_headers(
                    ev.stream_id,
                    [(b":status", status), (b"content-length", str(len(answer)).encode())],
                )
                self.h3.send_data(ev.stream_id, answer, end_stream=True)
        self.transmit()


def issue(pki):
    """A CA and a server certificate it signs, for localhost; the CA goes to pki/ca.pem."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "h3peer interop CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(ca_key, hashes.SHA256())
    )
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), False)
        .sign(ca_key, hashes.SHA256())
    )
    os.makedirs(pki, exist_ok=True)
    pem = serialization.Encoding.PEM
    with open(os.path.join(pki, "ca.pem"), "wb") as f:
        f.write(ca.public_bytes(pem))
    with open(os.path.join(pki, "server.pem"), "wb") as f:
        f.write(leaf.public_bytes(pem))
    with open(os.path.join(pki, "server.key"), "wb") as f:
        f.write(
            key.private_bytes(
                pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )


async def server(a):
    issue(a.pki)
    cfg = QuicConfiguration(is_client=False, alpn_protocols=H3_ALPN)
    # Small windows, so a client's large body needs MAX_STREAM_DATA / MAX_DATA updates.
    cfg.max_stream_data = 64 * 1024
    cfg.max_data = 128 * 1024
    cfg.load_cert_chain(os.path.join(a.pki, "server.pem"), os.path.join(a.pki, "server.key"))
    await serve(a.listen, a.port, configuration=cfg, create_protocol=Server)
    print("listening", flush=True)
    await asyncio.Future()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="role", required=True)
    d = sub.add_parser("device", help="register with a qgate gateway and post records")
    d.add_argument("host")
    d.add_argument("port", type=int)
    d.add_argument("--ca", required=True, help="CA certificate the gateway's is checked against")
    d.add_argument("--server-name", default="qgate.test")
    d.add_argument("--cert", help="this device's certificate (PEM), for a gateway with a device CA")
    d.add_argument("--key", help="the private key of --cert (PEM)")
    d.add_argument("--records", type=int, default=20)
    d.add_argument("--body-bytes", type=int, default=200)
    d.add_argument("--stream", default="aioquic")
    d.add_argument("--tag", default="aioquic")
    d.add_argument("--priority", action="store_true")
    d.add_argument("--attempts", type=int, default=50, help="tries per record (502/503 retried)")
    d.add_argument("--timeout", type=float, default=20.0, help="seconds per request")
    s = sub.add_parser("server", help="a plain HTTP/3 server for qgate's clients")
    s.add_argument("port", type=int)
    s.add_argument("--listen", default="127.0.0.1")
    s.add_argument("--pki", required=True, help="directory for its CA and certificate")
    a = p.parse_args()
    try:
        asyncio.run(device(a) if a.role == "device" else server(a))
    except (ConnectionError, asyncio.TimeoutError) as e:
        print(f"h3peer: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
