//! What a device credential costs the gateway per registration (issue 49, evidence for decisions
//! G30 and G33): checking a token, and reading a certificate's name. Run it in release:
//! `cargo run --release -p qgate-transport --example credential_cost`.

use std::time::Instant;

use qgate_transport::peer_id::certificate_identity;
use qgate_transport::pki::{self, Role, Validity};
use qgate_transport::token::{TokenKey, TokenSigner};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

const N: u32 = 20_000;

fn main() {
    let (_, signer) = TokenSigner::generate().expect("a key");
    let key = TokenKey::from_pem(&signer.public_pem()).expect("its public half");
    let now = 1_800_000_000;
    let token = signer.token("sensor-17", now, 86_400);
    let t0 = Instant::now();
    for _ in 0..N {
        key.verify(&token, now + 100).expect("valid");
    }
    let per_token = t0.elapsed().as_secs_f64() / f64::from(N) * 1e6;

    let ca = pki::new_ca("fleet CA", Validity::days(1)).expect("a CA");
    let dev = pki::issue(&ca, "sensor-17", Role::Client, Validity::days(1)).expect("a cert");
    let der = CertificateDer::from_pem_slice(dev.cert_pem.as_bytes()).expect("PEM");
    let t0 = Instant::now();
    for _ in 0..N {
        certificate_identity(&der).expect("named");
    }
    let per_name = t0.elapsed().as_secs_f64() / f64::from(N) * 1e6;
    println!(
        "token: {} B, {per_token:.1} µs to check; certificate: {} B of DER, {per_name:.1} µs to read its name ({N} each)",
        token.len(),
        der.len()
    );
}
