#!/usr/bin/env python3
"""A third-party MQTT client for qgate's interop tests, on paho-mqtt (PyPI `paho-mqtt`).

    paho_pub.py HOST PORT --version 5|311 [--ca CA] --client-id ID --topic T --records N

Connects (over TLS trusting CA when given), publishes N QoS 1 messages "ID record I" to T,
each waiting for its PUBACK, and prints one JSON line: {"acked": N}. Exits 1 when a message is
refused (a 5.0 PUBACK with a failure reason) or unacknowledged within 10 s, or the connection
fails, so the caller may try again. Everything here is this project's code; paho provides MQTT.
"""

import argparse
import json
import sys
import threading

import paho.mqtt.client as mqtt


def main():
    p = argparse.ArgumentParser()
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("--version", choices=["5", "311"], required=True)
    p.add_argument("--ca")
    p.add_argument("--client-id", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--records", type=int, default=10)
    a = p.parse_args()

    v5 = a.version == "5"
    c = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2,
        client_id=a.client_id,
        protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
    )
    if a.ca:
        c.tls_set(ca_certs=a.ca)
    connected = threading.Event()
    failures = []
    acked = set()
    done = threading.Condition()

    def on_connect(client, userdata, flags, reason, properties):
        if reason.is_failure:
            failures.append(f"CONNACK {reason}")
        connected.set()

    def on_publish(client, userdata, mid, reason, properties):
        with done:
            if reason.is_failure:
                failures.append(f"PUBACK {mid}: {reason}")
            acked.add(mid)
            done.notify_all()

    def on_disconnect(client, userdata, flags, reason, properties):
        failures.append(f"disconnected: {reason}")
        connected.set()
        with done:
            done.notify_all()

    c.on_connect = on_connect
    c.on_publish = on_publish
    c.on_disconnect = on_disconnect
    c.connect(a.host, a.port, keepalive=30)
    c.loop_start()
    if not connected.wait(10) or failures:
        print(json.dumps({"error": failures or ["no CONNACK"]}))
        sys.exit(1)
    for i in range(a.records):
        info = c.publish(a.topic, f"{a.client_id} record {i}".encode(), qos=1)
        with done:
            if not done.wait_for(lambda: info.mid in acked or failures, timeout=10):
                failures.append(f"no PUBACK for record {i}")
        if failures:
            print(json.dumps({"error": failures}))
            sys.exit(1)
    c.disconnect()
    c.loop_stop()
    print(json.dumps({"acked": len(acked)}))


if __name__ == "__main__":
    main()
