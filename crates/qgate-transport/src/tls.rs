//! TLS material: server identities (PEM files or a development PKI) and client trust roots.
//!
//! The development PKI is a CA plus a server certificate for `localhost`, loopback addresses
//! and any extra names, made with rcgen and kept in a directory so that a client on the same
//! machine can trust the server by that CA (`ca.pem`). It is for development and simulation
//! only: the CA key sits unencrypted next to it.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Something wrong with TLS material; the message names the file and the problem.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A file is not valid PEM of the expected kind.
    #[error("{path}: {problem}")]
    BadPem {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// Certificate generation failed.
    #[error("generating development certificates: {0}")]
    Generate(#[from] rcgen::Error),
    /// rustls refused the material.
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The crypto provider qgate uses everywhere: rustls on *ring*.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Where every TLS configuration of this process writes its secrets: the file
/// `$SSLKEYLOGFILE` names (NSS key log format, which Wireshark reads to decrypt QUIC and TLS),
/// or nowhere when it is unset. The first use with it set warns on the log (decision O6).
pub fn key_log() -> Arc<dyn rustls::KeyLog> {
    static SAID: std::sync::Once = std::sync::Once::new();
    let Some(path) = std::env::var_os("SSLKEYLOGFILE").filter(|p| !p.is_empty()) else {
        return Arc::new(rustls::NoKeyLog);
    };
    // rustls's KeyLogFile opens the file itself and drops the secrets silently when it cannot:
    // try first, so a path that cannot be written is reported instead of promised.
    let mut open = fs::OpenOptions::new();
    open.append(true).create(true);
    // Created as rustls would create it: readable by the owner only.
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut open, 0o600);
    let usable = open.open(&path);
    SAID.call_once(|| match &usable {
        Ok(_) => tracing::warn!(
            file = %path.to_string_lossy(),
            "SSLKEYLOGFILE is set: TLS secrets are written there; whoever reads it can \
             decrypt this process's traffic"
        ),
        Err(e) => tracing::error!(
            file = %path.to_string_lossy(),
            error = %e,
            "SSLKEYLOGFILE is set but cannot be written: no TLS secrets are logged"
        ),
    });
    match usable {
        Ok(_) => Arc::new(rustls::KeyLogFile::new()),
        Err(_) => Arc::new(rustls::NoKeyLog),
    }
}

/// How long a `.creating` lock may sit in a development PKI directory before another process
/// takes it as left by a dead one.
const STALE_LOCK: std::time::Duration = std::time::Duration::from_secs(10);

/// A server's certificate chain and private key.
#[derive(Debug)]
pub struct Identity {
    /// Leaf first.
    pub chain: Vec<CertificateDer<'static>>,
    /// The leaf's key.
    pub key: PrivateKeyDer<'static>,
}

impl Clone for Identity {
    fn clone(&self) -> Self {
        Identity {
            chain: self.chain.clone(),
            key: self.key.clone_key(),
        }
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> TlsError + '_ {
    move |source| TlsError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn bad_pem(path: &Path, problem: impl Into<String>) -> TlsError {
    TlsError::BadPem {
        path: path.to_path_buf(),
        problem: problem.into(),
    }
}

/// Read every certificate in a PEM file; an empty or malformed file is an error.
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = fs::read(path).map_err(io_err(path))?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| bad_pem(path, format!("not a valid PEM certificate file ({e})")))?;
    if certs.is_empty() {
        return Err(bad_pem(path, "contains no CERTIFICATE block"));
    }
    Ok(certs)
}

/// Read the first private key (PKCS#8, PKCS#1 or SEC1) in a PEM file.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = fs::read(path).map_err(io_err(path))?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| match e {
        rustls_pki_types::pem::Error::NoItemsFound => {
            bad_pem(path, "contains no PRIVATE KEY block")
        }
        e => bad_pem(path, format!("not a valid PEM private key ({e})")),
    })
}

impl Identity {
    /// Load a certificate chain and key from PEM files, checking that they belong together.
    pub fn from_pem_files(cert: &Path, key: &Path) -> Result<Identity, TlsError> {
        let id = Identity {
            chain: load_certs(cert)?,
            key: load_key(key)?,
        };
        // Fail here, naming both files, rather than at the first handshake.
        let signer = provider()
            .key_provider
            .load_private_key(id.key.clone_key())
            .map_err(|e| bad_pem(key, format!("unusable private key ({e})")))?;
        let certified = rustls::sign::CertifiedKey::new(id.chain.clone(), signer);
        certified.keys_match().map_err(|_| {
            bad_pem(
                key,
                format!("does not match the certificate in {}", cert.display()),
            )
        })?;
        Ok(id)
    }
}

/// A development PKI: a CA and a server certificate it signed.
#[derive(Debug, Clone)]
pub struct DevPki {
    /// The CA certificate clients trust.
    pub ca: CertificateDer<'static>,
    /// The server's identity (leaf signed by the CA).
    pub server: Identity,
}

/// Names every development server certificate covers.
const DEV_NAMES: &[&str] = &["localhost", "qgate.test", "127.0.0.1", "::1"];

impl DevPki {
    /// Make a fresh CA and a server certificate for `localhost`, `qgate.test`, the loopback
    /// addresses and `extra_names` (DNS names or IP addresses).
    pub fn generate(extra_names: &[String]) -> Result<DevPki, TlsError> {
        let (ca_pem, leaf_pem, leaf_key) = generate_pems(extra_names)?;
        Ok(DevPki {
            ca: CertificateDer::from_pem_slice(ca_pem.as_bytes()).expect("rcgen emits valid PEM"),
            server: Identity {
                chain: vec![CertificateDer::from_pem_slice(leaf_pem.as_bytes())
                    .expect("rcgen emits valid PEM")],
                key: PrivateKeyDer::from_pem_slice(leaf_key.as_bytes())
                    .expect("rcgen emits valid PEM"),
            },
        })
    }

    /// Load the development PKI kept in `dir` (`ca.pem`, `server.pem`, `server.key`), or make
    /// one there if `dir` has none.
    pub fn load_or_create(dir: &Path) -> Result<DevPki, TlsError> {
        let (ca, cert, key) = Self::paths(dir);
        if !ca.exists() {
            Self::create_once(dir)?;
        }
        Ok(DevPki {
            ca: load_certs(&ca)?.remove(0),
            server: Identity::from_pem_files(&cert, &key)?,
        })
    }

    /// Create the files in `dir` unless another process is doing so (two daemons sharing a
    /// fresh state directory start at once): the creator holds `dir/.creating` (made with
    /// `create_new`), writes the key and certificate, then `ca.pem` by a rename, so `ca.pem`
    /// existing means all three are complete. The others wait for it; a lock left by a process
    /// that died while creating is taken over after [`STALE_LOCK`].
    fn create_once(dir: &Path) -> Result<(), TlsError> {
        let (ca, cert, key) = Self::paths(dir);
        fs::create_dir_all(dir).map_err(io_err(dir))?;
        let lock = dir.join(".creating");
        // Waits in steps of POLL, for at most twice the stale age (then gives up).
        const POLL: std::time::Duration = std::time::Duration::from_millis(20);
        let mut waits = 2 * STALE_LOCK.as_millis() / POLL.as_millis();
        loop {
            if ca.exists() {
                return Ok(());
            }
            match fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&lock)
            {
                Ok(_) => break,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let age = fs::metadata(&lock)
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.elapsed().ok());
                    if age.is_some_and(|a| a > STALE_LOCK) {
                        let _ = fs::remove_file(&lock);
                    } else if waits == 0 {
                        return Err(TlsError::Io {
                            path: lock,
                            source: std::io::Error::other(
                                "another process has been creating the development CA for too long",
                            ),
                        });
                    }
                    waits = waits.saturating_sub(1);
                    std::thread::sleep(POLL);
                }
                Err(e) => return Err(io_err(&lock)(e)),
            }
        }
        let made = (|| {
            if ca.exists() {
                return Ok(()); // made between our check and our lock
            }
            let (ca_pem, leaf_pem, key_pem) = generate_pems(&[])?;
            write_private(&key, key_pem.as_bytes())?;
            fs::write(&cert, leaf_pem).map_err(io_err(&cert))?;
            let tmp = dir.join(".ca.pem.new");
            fs::write(&tmp, ca_pem).map_err(io_err(&tmp))?;
            fs::rename(&tmp, &ca).map_err(io_err(&ca))?;
            tracing::info!(dir = %dir.display(), "created a development CA and server certificate");
            Ok(())
        })();
        let _ = fs::remove_file(&lock);
        made
    }

    /// `ca.pem`, `server.pem`, `server.key` inside `dir`.
    pub fn paths(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
        (
            dir.join("ca.pem"),
            dir.join("server.pem"),
            dir.join("server.key"),
        )
    }

    /// Trust roots holding just this PKI's CA.
    pub fn trust(&self) -> TrustRoots {
        TrustRoots {
            roots: vec![self.ca.clone()],
        }
    }
}

fn write_private(path: &Path, data: &[u8]) -> Result<(), TlsError> {
    use std::io::Write;
    let mut opts = fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(path).map_err(io_err(path))?;
    f.write_all(data).map_err(io_err(path))
}

fn generate_pems(extra_names: &[String]) -> Result<(String, String, String), TlsError> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    };
    // Ed25519: fixed-size signatures, so handshake flights have the same size in every run and
    // simulations stay deterministic (ECDSA's DER signatures vary by a byte or two).
    let ca_key = KeyPair::generate_for(&rcgen::PKCS_ED25519)?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "qgate development CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca_params.serial_number = Some(serial(&ca_key));
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let mut names: Vec<String> = DEV_NAMES.iter().map(|s| s.to_string()).collect();
    names.extend(extra_names.iter().cloned());
    let leaf_key = KeyPair::generate_for(&rcgen::PKCS_ED25519)?;
    let mut leaf_params = CertificateParams::new(names)?;
    leaf_params
        .distinguished_name
        .push(DnType::CommonName, "qgate development server");
    leaf_params.serial_number = Some(serial(&leaf_key));
    let leaf = leaf_params.signed_by(&leaf_key, &issuer)?;
    Ok((ca_cert.pem(), leaf.pem(), pkcs8_v1_pem(&leaf_key)?))
}

/// An Ed25519 key as a PKCS#8 v1 document (RFC 5208, the private key alone), which
/// OpenSSL-based tools read: ring writes v2 (RFC 5958, with the public key), which OpenSSL 3
/// and Python's `cryptography` here reject ("extra data"). rustls reads both (decision T2).
pub(crate) fn pkcs8_v1_pem(key: &rcgen::KeyPair) -> Result<String, TlsError> {
    // SEQUENCE { INTEGER v, SEQUENCE { OID 1.3.101.112 }, OCTET STRING { OCTET STRING seed } …
    const ED25519_V2: [u8; 16] = [
        0x30, 0x51, 0x02, 0x01, 0x01, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04,
        0x20,
    ];
    const ED25519_V1: [u8; 16] = [
        0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04,
        0x20,
    ];
    let der = key.serialize_der();
    let Some(seed) = der.strip_prefix(&ED25519_V2[..]).and_then(|r| r.get(..32)) else {
        return Ok(key.serialize_pem()); // not ring's Ed25519 layout: as it is
    };
    let v1: Vec<u8> = ED25519_V1.iter().chain(seed).copied().collect();
    Ok(rcgen::KeyPair::try_from(v1.as_slice())?.serialize_pem())
}

/// A 20-byte serial number taken from the key (so unique per key) whose top bits are 01: its
/// DER encoding is always 20 bytes. rcgen's own drops a leading zero byte one time in 128, and
/// a certificate one byte shorter changes a simulated run's byte counts from run to run.
pub(crate) fn serial(key: &rcgen::KeyPair) -> rcgen::SerialNumber {
    let mut s = key.public_key_raw()[..20].to_vec();
    s[0] = (s[0] & 0x3f) | 0x40;
    rcgen::SerialNumber::from(s)
}

/// The CA certificates a client accepts servers by.
#[derive(Debug, Clone, Default)]
pub struct TrustRoots {
    /// DER certificates.
    pub roots: Vec<CertificateDer<'static>>,
}

impl TrustRoots {
    /// Every certificate in a PEM file.
    pub fn from_pem_file(path: &Path) -> Result<TrustRoots, TlsError> {
        Ok(TrustRoots {
            roots: load_certs(path)?,
        })
    }

    /// A rustls root store holding these certificates.
    pub fn store(&self) -> Result<rustls::RootCertStore, TlsError> {
        let mut store = rustls::RootCertStore::empty();
        for c in &self.roots {
            store.add(c.clone())?;
        }
        Ok(store)
    }
}

#[cfg(test)]
mod tests {
    /// The development server key is PKCS#8 v1 (48 bytes of DER for Ed25519), loads back into
    /// a working identity, and OpenSSL reads it where it is installed.
    #[test]
    fn the_development_key_is_one_openssl_reads() {
        let dir = std::env::temp_dir().join(format!("qgate-pki-v1-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let pki = super::DevPki::load_or_create(&dir).unwrap();
        let key = dir.join("server.key");
        use rustls_pki_types::pem::PemObject;
        let der = rustls_pki_types::PrivateKeyDer::from_pem_file(&key).unwrap();
        assert_eq!(
            der.secret_der().len(),
            48,
            "PKCS#8 v1: no public key inside"
        );
        assert_eq!(der.secret_der()[4], 0, "version 0 (v1)");
        let reloaded = super::DevPki::load_or_create(&dir).unwrap();
        crate::server_config(
            &reloaded.server,
            &[b"t"],
            &crate::TransportOptions::default(),
        )
        .unwrap();
        assert_eq!(pki.ca, reloaded.ca);
        if let Ok(o) = std::process::Command::new("openssl")
            .args(["pkey", "-noout", "-in"])
            .arg(&key)
            .output()
        {
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Daemons sharing a fresh state directory start at once: all of them trust one CA.
    #[test]
    fn processes_creating_the_dev_pki_at_once_agree_on_one_ca() {
        let dir = std::env::temp_dir().join(format!("qgate-pki-race-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for round in 0..5 {
            let d = dir.join(round.to_string());
            let cas: std::collections::BTreeSet<Vec<u8>> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..4)
                    .map(|_| s.spawn(|| super::DevPki::load_or_create(&d).unwrap().ca.to_vec()))
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert_eq!(cas.len(), 1, "round {round}: {} CAs", cas.len());
            assert!(!d.join(".creating").exists());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn every_generated_certificate_has_the_same_size() {
        // Simulations count handshake bytes: the certificates must not vary in length.
        let sizes: std::collections::BTreeSet<(usize, usize)> = (0..300)
            .map(|_| {
                let p = super::DevPki::generate(&[]).unwrap();
                (p.ca.len(), p.server.chain[0].len())
            })
            .collect();
        assert_eq!(sizes.len(), 1, "{sizes:?}");
    }

    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("qgate-tls-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn dev_pki_persists_and_reloads() {
        let dir = tmp("persist");
        let a = DevPki::load_or_create(&dir).unwrap();
        let b = DevPki::load_or_create(&dir).unwrap();
        assert_eq!(a.ca, b.ca);
        assert_eq!(a.server.chain, b.server.chain);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(dir.join("server.key"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o077, 0, "key must not be readable by others");
        }
    }

    #[test]
    fn bad_files_are_named_in_the_error() {
        let dir = tmp("bad");
        let missing = dir.join("nope.pem");
        let e = load_certs(&missing).unwrap_err().to_string();
        assert!(e.contains("nope.pem") && e.contains("No such file"), "{e}");

        let garbage = dir.join("garbage.pem");
        fs::write(&garbage, "hello, not a certificate\n").unwrap();
        let e = load_certs(&garbage).unwrap_err().to_string();
        assert!(
            e.contains("garbage.pem: contains no CERTIFICATE block"),
            "{e}"
        );
        let e = load_key(&garbage).unwrap_err().to_string();
        assert!(
            e.contains("garbage.pem: contains no PRIVATE KEY block"),
            "{e}"
        );

        let broken = dir.join("broken.pem");
        fs::write(
            &broken,
            "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let e = load_certs(&broken).unwrap_err().to_string();
        assert!(
            e.contains("broken.pem: not a valid PEM certificate file"),
            "{e}"
        );
    }

    #[test]
    fn mismatched_key_is_refused() {
        let d1 = tmp("mm1");
        let d2 = tmp("mm2");
        DevPki::load_or_create(&d1).unwrap();
        DevPki::load_or_create(&d2).unwrap();
        let e = Identity::from_pem_files(&d1.join("server.pem"), &d2.join("server.key"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not match the certificate"), "{e}");
    }
}
