//! What the relay reads of an IP packet: its flow (for flow-aware queues such as FQ-CoDel) and
//! its ECN field (an AQM that marks instead of dropping writes CE back). Anything else passes
//! untouched; a packet too short to parse is one flow of its own and not ECN-capable.

use qgate_aqm::Ecn;

/// A view of an IPv4 or IPv6 packet in a byte buffer.
pub struct IpView<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> IpView<T> {
    /// A view; no check is done until a field is read.
    pub fn new(buf: T) -> Self {
        IpView { buf }
    }

    fn version(&self) -> Option<u8> {
        self.buf.as_ref().first().map(|b| b >> 4)
    }

    /// The IPv4 header length, when the packet is a well-formed IPv4 packet.
    fn v4_header_len(&self) -> Option<usize> {
        let b = self.buf.as_ref();
        let ihl = usize::from(b.first()? & 0x0f) * 4;
        (self.version() == Some(4) && ihl >= 20 && b.len() >= ihl).then_some(ihl)
    }

    /// The ECN codepoint.
    pub fn ecn(&self) -> Ecn {
        let b = self.buf.as_ref();
        let bits = match self.version() {
            Some(4) if self.v4_header_len().is_some() => b[1] & 0b11,
            Some(6) if b.len() >= 40 => (b[1] >> 4) & 0b11,
            _ => return Ecn::NotEct,
        };
        match bits {
            0b01 => Ecn::Ect1,
            0b10 => Ecn::Ect0,
            0b11 => Ecn::Ce,
            _ => Ecn::NotEct,
        }
    }

    /// A hash of (source, destination, protocol, ports): FNV-1a, the same on every run.
    pub fn flow(&self) -> u64 {
        let b = self.buf.as_ref();
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |bytes: &[u8]| {
            for x in bytes {
                h ^= *x as u64;
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        };
        let (addrs, proto, l4) = match self.version() {
            Some(4) => match self.v4_header_len() {
                // Later fragments carry no ports: hash them without.
                Some(ihl) if b.len() >= 20 => {
                    let first_fragment = u16::from_be_bytes([b[6], b[7]]) & 0x1fff == 0;
                    (&b[12..20], b[9], first_fragment.then(|| &b[ihl..]))
                }
                _ => return 0,
            },
            Some(6) if b.len() >= 40 => (&b[8..40], b[6], Some(&b[40..])),
            _ => return 0,
        };
        eat(addrs);
        eat(&[proto]);
        if let Some(l4) = l4.filter(|_| matches!(proto, 6 | 17 | 132)) {
            if l4.len() >= 4 {
                eat(&l4[..4]);
            }
        }
        h
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> IpView<T> {
    /// Set CE (only on an ECN-capable packet), fixing the IPv4 header checksum.
    pub fn set_ce(&mut self) {
        if !self.ecn().is_capable() {
            return;
        }
        match self.version() {
            Some(4) => {
                let ihl = self.v4_header_len().expect("ecn() checked it");
                let b = self.buf.as_mut();
                b[1] |= 0b11;
                b[10] = 0;
                b[11] = 0;
                let sum = checksum(&b[..ihl]);
                b[10..12].copy_from_slice(&sum.to_be_bytes());
            }
            Some(6) => self.buf.as_mut()[1] |= 0b11 << 4,
            _ => {}
        }
    }
}

/// The Internet checksum (RFC 1071) of a header whose checksum field is zero.
fn checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 20-byte IPv4 header + 8-byte UDP header with a valid checksum.
    fn udp4(src_port: u16, tos: u8) -> Vec<u8> {
        let mut p = vec![
            0x45, tos, 0, 28, 0, 1, 0x40, 0, 64, 17, 0, 0, 10, 77, 1, 1, 10, 77, 1, 2,
        ];
        let sum = checksum(&p);
        p[10..12].copy_from_slice(&sum.to_be_bytes());
        p.extend_from_slice(&src_port.to_be_bytes());
        p.extend_from_slice(&[0x1f, 0x90, 0, 8, 0, 0]);
        p
    }

    #[test]
    fn flows_differ_by_port_and_are_stable() {
        let a = IpView::new(udp4(1000, 0)).flow();
        assert_eq!(a, IpView::new(udp4(1000, 0)).flow());
        assert_ne!(a, IpView::new(udp4(1001, 0)).flow());
        assert_eq!(IpView::new(&[0x45u8][..]).flow(), 0, "truncated: one flow");
    }

    #[test]
    fn ce_is_set_only_on_capable_packets_with_a_valid_checksum() {
        let mut p = IpView::new(udp4(1, 0b10));
        assert_eq!(p.ecn(), Ecn::Ect0);
        p.set_ce();
        assert_eq!(p.ecn(), Ecn::Ce);
        let b = p.buf;
        assert_eq!(checksum(&b[..20]), 0, "a valid header sums to zero");
        let mut q = IpView::new(udp4(1, 0));
        q.set_ce();
        assert_eq!(q.ecn(), Ecn::NotEct);
        let mut v6 = vec![0x60u8, 0x20, 0, 0, 0, 8, 17, 64];
        v6.extend_from_slice(&[0; 32]);
        let mut v = IpView::new(v6);
        assert_eq!(v.ecn(), Ecn::Ect0);
        v.set_ce();
        assert_eq!(v.ecn(), Ecn::Ce);
    }

    #[test]
    fn garbage_never_panics() {
        for len in 0..64 {
            for first in [0x00u8, 0x45, 0x4f, 0x41, 0x60, 0xff] {
                let mut b = vec![0xa5u8; len];
                if len > 0 {
                    b[0] = first;
                }
                let mut v = IpView::new(b);
                let _ = (v.ecn(), v.flow());
                v.set_ce();
            }
        }
    }
}
