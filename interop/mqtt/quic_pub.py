#!/usr/bin/env python3
"""An MQTT-over-QUIC client for qgate's interop tests, on aioquic (PyPI `aioquic`).

    quic_pub.py HOST PORT --ca CA --version 5|311 --client-id ID --topic T --records N

Speaks MQTT over QUIC as EMQX's single-stream mode expects: ALPN `mqtt`, one bidirectional
stream opened by the client for the whole MQTT connection. The MQTT packets (CONNECT, PUBLISH
at QoS 1, DISCONNECT) are encoded here by hand; the test is of the transport. Publishes N
messages "ID record I", each waiting for its PUBACK, and prints one JSON line: {"acked": N}.
Exits 1 on a refusal or an unexpected packet, so the caller may try again.
"""

import argparse
import asyncio
import json
import struct
import sys

from aioquic.asyncio.client import connect
from aioquic.quic.configuration import QuicConfiguration


def varint(n):
    out = bytearray()
    while True:
        b = n % 128
        n //= 128
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def string(s):
    b = s.encode()
    return struct.pack("!H", len(b)) + b


def packet(first, body):
    return bytes([first]) + varint(len(body)) + body


def connect_packet(v5, client_id):
    head = string("MQTT") + bytes([5 if v5 else 4, 0x02]) + struct.pack("!H", 30)
    if v5:
        head += varint(0)
    return packet(0x10, head + string(client_id))


def publish_packet(v5, topic, packet_id, payload):
    body = string(topic) + struct.pack("!H", packet_id)
    if v5:
        body += varint(0)
    return packet(0x32, body + payload)


async def read_packet(reader):
    first = (await reader.readexactly(1))[0]
    length, shift = 0, 0
    while True:
        b = (await reader.readexactly(1))[0]
        length += (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            break
    return first, await reader.readexactly(length)


def fail(why):
    print(json.dumps({"error": why}))
    sys.exit(1)


async def run(a):
    v5 = a.version == "5"
    cfg = QuicConfiguration(is_client=True, alpn_protocols=["mqtt"], server_name="localhost")
    cfg.load_verify_locations(a.ca)
    async with connect(a.host, a.port, configuration=cfg) as client:
        if client._quic.tls.alpn_negotiated != "mqtt":
            fail(f"ALPN {client._quic.tls.alpn_negotiated!r}")
        reader, writer = await client.create_stream()
        writer.write(connect_packet(v5, a.client_id))
        first, body = await asyncio.wait_for(read_packet(reader), 10)
        if first != 0x20 or body[1] != 0:
            fail(f"CONNACK {first:#x} {body.hex()}")
        acked = 0
        for i in range(a.records):
            pid = i + 1
            payload = f"{a.client_id} record {i}".encode()
            writer.write(publish_packet(v5, a.topic, pid, payload))
            first, body = await asyncio.wait_for(read_packet(reader), 10)
            if first != 0x40 or struct.unpack("!H", body[:2])[0] != pid:
                fail(f"expected PUBACK {pid}, got {first:#x} {body.hex()}")
            if len(body) > 2 and body[2] >= 0x80:
                fail(f"PUBACK {pid} reason {body[2]:#x}")
            acked += 1
        writer.write(packet(0xE0, b""))
        # The gateway ends the stream after DISCONNECT.
        rest = await asyncio.wait_for(reader.read(), 10)
        if rest:
            fail(f"bytes after DISCONNECT: {rest.hex()}")
        print(json.dumps({"acked": acked}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("--ca", required=True)
    p.add_argument("--version", choices=["5", "311"], required=True)
    p.add_argument("--client-id", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--records", type=int, default=10)
    try:
        asyncio.run(run(p.parse_args()))
    except (ConnectionError, asyncio.IncompleteReadError, asyncio.TimeoutError) as e:
        fail(repr(e))


if __name__ == "__main__":
    main()
