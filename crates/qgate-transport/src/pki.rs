//! Certificates for a fleet (issue 49): an operator's CA, and the device and gateway
//! certificates it issues. Small fleets and tests use it through `qgate pki`; a large fleet
//! brings its own CA (any X.509 CA whose certificates rustls's WebPKI verifier accepts).
//!
//! Keys are Ed25519 (small certificates, fast signatures on small devices) and written as
//! PKCS#8 v1, which OpenSSL-based device stacks read (decision T2).

use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use crate::tls::{pkcs8_v1_pem, serial, TlsError};

/// A certificate and its private key, as PEM.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The certificate.
    pub cert_pem: String,
    /// Its private key (PKCS#8).
    pub key_pem: String,
}

/// When a certificate is valid.
#[derive(Debug, Clone, Copy)]
pub struct Validity {
    /// From.
    pub from: SystemTime,
    /// Until.
    pub until: SystemTime,
}

impl Validity {
    /// From an hour ago (clocks on devices drift) for `days`.
    pub fn days(days: u32) -> Validity {
        let now = SystemTime::now();
        Validity {
            from: now - Duration::from_secs(3600),
            until: now + Duration::from_secs(u64::from(days) * 86_400),
        }
    }

    fn apply(&self, p: &mut CertificateParams) {
        p.not_before = self.from.into();
        p.not_after = self.until.into();
    }
}

/// What an issued certificate is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A TLS client: a device, or a gateway toward the server.
    Client,
    /// A TLS server (a gateway's device port, a server): `name` is also its DNS name.
    Server,
}

/// A new CA called `name`.
pub fn new_ca(name: &str, valid: Validity) -> Result<Issued, TlsError> {
    let key = KeyPair::generate_for(&rcgen::PKCS_ED25519)?;
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    p.distinguished_name.push(DnType::CommonName, name);
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    p.serial_number = Some(serial(&key));
    valid.apply(&mut p);
    let cert = p.self_signed(&key)?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem: pkcs8_v1_pem(&key)?,
    })
}

/// A certificate for `name`, signed by `ca`: its subject's common name is `name`, and so is
/// its DNS name when `name` is one, so the identity read from it ([`crate::peer_id`]) is
/// `name` either way.
pub fn issue(ca: &Issued, name: &str, role: Role, valid: Validity) -> Result<Issued, TlsError> {
    let ca_key = KeyPair::from_pem(&ca.key_pem)?;
    let issuer = Issuer::from_ca_cert_pem(&ca.cert_pem, ca_key)?;
    let key = KeyPair::generate_for(&rcgen::PKCS_ED25519)?;
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    p.distinguished_name.push(DnType::CommonName, name);
    if let Ok(dns) = name.try_into() {
        p.subject_alt_names = vec![SanType::DnsName(dns)];
    }
    p.extended_key_usages = vec![match role {
        Role::Client => ExtendedKeyUsagePurpose::ClientAuth,
        Role::Server => ExtendedKeyUsagePurpose::ServerAuth,
    }];
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.serial_number = Some(serial(&key));
    valid.apply(&mut p);
    let cert = p.signed_by(&key, &issuer)?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem: pkcs8_v1_pem(&key)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;

    #[test]
    fn an_issued_certificate_names_its_device_and_chains_to_its_ca() {
        let ca = new_ca("fleet CA", Validity::days(10)).unwrap();
        let dev = issue(&ca, "sensor-17", Role::Client, Validity::days(1)).unwrap();
        let der = CertificateDer::from_pem_slice(dev.cert_pem.as_bytes()).unwrap();
        assert_eq!(
            crate::peer_id::certificate_identity(&der).unwrap().name,
            "sensor-17"
        );
        // A name that is no DNS name is still the identity, through the common name.
        let odd = issue(&ca, "dev_17", Role::Client, Validity::days(1)).unwrap();
        let der = CertificateDer::from_pem_slice(odd.cert_pem.as_bytes()).unwrap();
        assert_eq!(
            crate::peer_id::certificate_identity(&der).unwrap().name,
            "dev_17"
        );
        // The verifier accepts it against the CA.
        let roots = crate::TrustRoots {
            roots: vec![CertificateDer::from_pem_slice(ca.cert_pem.as_bytes()).unwrap()],
        };
        let v = rustls::server::WebPkiClientVerifier::builder_with_provider(
            std::sync::Arc::new(roots.store().unwrap()),
            crate::tls::provider(),
        )
        .build()
        .unwrap();
        let leaf = CertificateDer::from_pem_slice(dev.cert_pem.as_bytes()).unwrap();
        v.verify_client_cert(&leaf, &[], rustls::pki_types::UnixTime::now())
            .unwrap();
    }
}
