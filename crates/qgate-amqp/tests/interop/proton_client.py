"""python-qpid-proton against the qgate broker: one connection, a sender and a receiver on the
same address with proton's default link names, N messages through, in order."""
import sys

from proton import Message, SSLDomain
from proton.utils import BlockingConnection


def main():
    url, address, n, ca = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    domain = None
    if url.startswith("amqps://"):
        domain = SSLDomain(SSLDomain.MODE_CLIENT)
        domain.set_trusted_ca_db(ca)
        domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
    conn = BlockingConnection(url, ssl_domain=domain, allowed_mechs="ANONYMOUS", timeout=20)
    snd = conn.create_sender(address)
    rcv = conn.create_receiver(address, credit=50)
    print("link names:", snd.link.name, rcv.link.name, flush=True)
    for i in range(n):
        snd.send(Message(id=i, body="m%d" % i))
    got = []
    for _ in range(n):
        m = rcv.receive(timeout=20)
        got.append(m.body)
        rcv.accept()
    want = ["m%d" % i for i in range(n)]
    if got != want:
        print("mismatch:", got[:5], "…", file=sys.stderr)
        sys.exit(1)
    conn.close()
    print("OK", n, flush=True)


if __name__ == "__main__":
    main()
