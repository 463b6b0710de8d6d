//! Who a peer is, from the certificate it authenticated with (issue 49, decision G30).
//!
//! A device's identity is its certificate's first URI subject alternative name, else its first
//! DNS name, else its subject's common name: SANs are what a CA vouches for in current
//! practice (RFC 6125), the CN is what older device fleets carry. The identity travels as the
//! `qgate-device` header, so it must be 1 to 64 visible ASCII characters; a certificate whose
//! chosen name is not is refused, never cut or escaped into someone else's name.

use std::any::Any;

use rustls::pki_types::CertificateDer;
use x509_parser::extensions::GeneralName;

/// Longest identity taken: what the `qgate-device` header carries.
pub const MAX_IDENTITY: usize = 64;

/// Why a certificate gives no identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// The certificate could not be parsed (the TLS stack verified it, so this is rare).
    #[error("the client certificate could not be read")]
    Unreadable,
    /// It names nobody: no URI or DNS name, no common name.
    #[error("the client certificate names no URI, DNS name or common name")]
    Nameless,
    /// Its name is too long or not visible ASCII.
    #[error("the client certificate's name must be 1 to {MAX_IDENTITY} visible ASCII characters")]
    Unusable,
}

/// A peer's identity and until when the credential that gave it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identified {
    /// Its name (see the module's rule).
    pub name: String,
    /// Seconds since the Unix epoch after which it is no longer valid (a certificate's
    /// notAfter, a token's exp). A resumed TLS session carries the certificate of the session
    /// it resumes and TLS does not check it again, so whoever keeps the identity checks this.
    pub until: u64,
}

/// The identity `cert` names (see the module's rule). Alternative names that cannot be read
/// refuse the certificate rather than fall back to its common name.
pub fn certificate_identity(cert: &CertificateDer<'_>) -> Result<Identified, IdentityError> {
    let (_, c) = x509_parser::parse_x509_certificate(cert.as_ref())
        .map_err(|_| IdentityError::Unreadable)?;
    let until = u64::try_from(c.validity().not_after.timestamp()).unwrap_or(0);
    let sans = c
        .subject_alternative_name()
        .map_err(|_| IdentityError::Unreadable)?;
    let (mut uri, mut dns) = (None, None);
    for n in sans.iter().flat_map(|s| &s.value.general_names) {
        match n {
            GeneralName::URI(u) if uri.is_none() => uri = Some(*u),
            GeneralName::DNSName(d) if dns.is_none() => dns = Some(*d),
            // A URI (tag 6) or DNS name (tag 2) that is not text is not read as no name.
            GeneralName::Invalid(tag, _) if matches!(tag.0, 2 | 6) => {
                return Err(IdentityError::Unreadable)
            }
            _ => {}
        }
    }
    let cn = || {
        c.subject()
            .iter_common_name()
            .next()
            .and_then(|a| a.as_str().ok())
    };
    let name = uri.or(dns).or_else(cn).ok_or(IdentityError::Nameless)?;
    if name.is_empty() || name.len() > MAX_IDENTITY || !name.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(IdentityError::Unusable);
    }
    Ok(Identified {
        name: name.to_owned(),
        until,
    })
}

/// The identity of a connection's peer, from what its TLS session says of it
/// (`quinn::Connection::peer_identity` or the shared driver's): `None` while the peer has shown
/// no certificate (none asked for, or the handshake is not done; a resumed session has the
/// certificate of the one it resumes).
pub fn peer_identity(peer: Option<Box<dyn Any>>) -> Option<Result<Identified, IdentityError>> {
    let chain = peer?.downcast::<Vec<CertificateDer<'static>>>().ok()?;
    chain.first().map(certificate_identity)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, SanType};

    fn cert(sans: Vec<SanType>, cn: Option<&str>) -> CertificateDer<'static> {
        let mut p = CertificateParams::default();
        p.subject_alt_names = sans;
        let mut dn = DistinguishedName::new();
        if let Some(cn) = cn {
            dn.push(DnType::CommonName, cn);
        }
        p.distinguished_name = dn;
        let key = KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        p.self_signed(&key).unwrap().der().clone()
    }

    #[test]
    fn a_uri_first_then_a_dns_name_then_the_common_name() {
        let uri = SanType::URI("urn:dev:sensor-1".try_into().unwrap());
        let dns = SanType::DnsName("sensor-1.fleet".try_into().unwrap());
        assert_eq!(
            certificate_identity(&cert(vec![dns.clone(), uri], Some("cn-1")))
                .unwrap()
                .name,
            "urn:dev:sensor-1"
        );
        assert_eq!(
            certificate_identity(&cert(vec![dns], Some("cn-1")))
                .unwrap()
                .name,
            "sensor-1.fleet"
        );
        assert_eq!(
            certificate_identity(&cert(vec![], Some("cn-1")))
                .unwrap()
                .name,
            "cn-1"
        );
        assert_eq!(
            certificate_identity(&cert(vec![], None)),
            Err(IdentityError::Nameless)
        );
    }

    #[test]
    fn a_name_the_device_header_cannot_carry_is_refused_not_cut() {
        let long = "d".repeat(MAX_IDENTITY + 1);
        assert_eq!(
            certificate_identity(&cert(vec![], Some(&long))),
            Err(IdentityError::Unusable)
        );
        assert_eq!(
            certificate_identity(&cert(vec![], Some("two words"))),
            Err(IdentityError::Unusable)
        );
        assert_eq!(
            certificate_identity(&CertificateDer::from(vec![0x30, 0x03, 1, 2, 3])),
            Err(IdentityError::Unreadable)
        );
    }
}
