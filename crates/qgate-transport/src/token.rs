//! Device tokens (issue 49, decision G33): for devices that cannot hold a certificate, a JSON Web
//! Token (RFC 7519) signed with the operator's Ed25519 key (`EdDSA`, RFC 8037), sent as
//! `authorization: Bearer …` over the device's TLS connection. The gateway holds only the public
//! key, so a stolen gateway cannot mint tokens, and any JWT library can make them.
//!
//! A token names its device (`sub`, the same 1–64 visible ASCII characters as a certificate's
//! name) and must expire (`exp`, seconds since the Unix epoch); `nbf` is honoured if present.
//! Nothing else is read. Sans-IO: the caller gives the time.

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use ring::signature::{self, Ed25519KeyPair, KeyPair, UnparsedPublicKey};

use crate::peer_id::{Identified, MAX_IDENTITY};

/// The header every token carries.
const HEADER: &str = r#"{"alg":"EdDSA","typ":"JWT"}"#;
/// A token longer than this is refused unread.
pub const MAX_TOKEN: usize = 1024;
/// DER before the 32 key bytes of an Ed25519 SubjectPublicKeyInfo (RFC 8410).
const SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

/// Why a token was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Not three base64url parts, not JSON, not EdDSA, or too long.
    #[error("the token is not an EdDSA JSON Web Token of at most {MAX_TOKEN} bytes")]
    Malformed,
    /// The signature does not verify with the gateway's key.
    #[error("the token's signature does not verify with this gateway's key")]
    Signature,
    /// Past its `exp`, or before its `nbf`.
    #[error("the token has expired or is not valid yet")]
    Expired,
    /// No `exp`, or a `sub` that cannot be a device name.
    #[error("the token must name its device (sub: 1 to {MAX_IDENTITY} visible ASCII characters) and expire (exp)")]
    Claims,
}

#[derive(serde::Deserialize)]
struct Claims {
    sub: Option<String>,
    exp: Option<u64>,
    nbf: Option<u64>,
}

#[derive(serde::Serialize)]
struct NewClaims<'a> {
    sub: &'a str,
    iat: u64,
    exp: u64,
}

/// The public key tokens are checked with.
#[derive(Debug, Clone)]
pub struct TokenKey {
    public: [u8; 32],
}

impl TokenKey {
    /// From a PEM `PUBLIC KEY` (an Ed25519 SubjectPublicKeyInfo, as `qgate pki token-key` and
    /// `openssl pkey -pubout` write it).
    pub fn from_pem(pem: &str) -> Result<TokenKey, String> {
        let der = pem_block(pem, "PUBLIC KEY")?;
        let key = der
            .strip_prefix(&SPKI_PREFIX[..])
            .filter(|k| k.len() == 32)
            .ok_or("not an Ed25519 public key")?;
        Ok(TokenKey {
            public: key.try_into().expect("32 bytes"),
        })
    }

    /// The device `token` names, if it verifies and is valid at `now` (seconds since the
    /// Unix epoch).
    pub fn verify(&self, token: &str, now: u64) -> Result<Identified, TokenError> {
        if token.len() > MAX_TOKEN {
            return Err(TokenError::Malformed);
        }
        let mut parts = token.split('.');
        let (Some(h), Some(p), Some(s), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(TokenError::Malformed);
        };
        let header = B64.decode(h).map_err(|_| TokenError::Malformed)?;
        let alg = serde_json::from_slice::<serde_json::Value>(&header)
            .ok()
            .and_then(|v| v.get("alg").and_then(|a| a.as_str()).map(str::to_owned));
        if alg.as_deref() != Some("EdDSA") {
            return Err(TokenError::Malformed);
        }
        let sig = B64.decode(s).map_err(|_| TokenError::Malformed)?;
        UnparsedPublicKey::new(&signature::ED25519, &self.public)
            .verify(&token.as_bytes()[..h.len() + 1 + p.len()], &sig)
            .map_err(|_| TokenError::Signature)?;
        let claims: Claims = B64
            .decode(p)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or(TokenError::Malformed)?;
        let (Some(sub), Some(exp)) = (claims.sub, claims.exp) else {
            return Err(TokenError::Claims);
        };
        if sub.is_empty() || sub.len() > MAX_IDENTITY || !sub.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(TokenError::Claims);
        }
        if now >= exp || claims.nbf.is_some_and(|n| now < n) {
            return Err(TokenError::Expired);
        }
        Ok(Identified {
            name: sub,
            until: exp,
        })
    }
}

/// The operator's signing key (kept off the gateway).
pub struct TokenSigner {
    pair: Ed25519KeyPair,
}

impl TokenSigner {
    /// A new key: its PKCS#8 document as PEM (to keep secret) and the signer.
    pub fn generate() -> Result<(String, TokenSigner), String> {
        let rng = ring::rand::SystemRandom::new();
        let doc = Ed25519KeyPair::generate_pkcs8(&rng).map_err(|e| e.to_string())?;
        let s = TokenSigner::from_pkcs8(doc.as_ref())?;
        Ok((pem("PRIVATE KEY", doc.as_ref()), s))
    }

    /// From a PEM `PRIVATE KEY` (as [`generate`](Self::generate) made it).
    pub fn from_pem(text: &str) -> Result<TokenSigner, String> {
        TokenSigner::from_pkcs8(&pem_block(text, "PRIVATE KEY")?)
    }

    fn from_pkcs8(der: &[u8]) -> Result<TokenSigner, String> {
        Ed25519KeyPair::from_pkcs8_maybe_unchecked(der)
            .map(|pair| TokenSigner { pair })
            .map_err(|e| format!("not an Ed25519 PKCS#8 key: {e}"))
    }

    /// Its public key as PEM, for the gateway's `device_token_key`.
    pub fn public_pem(&self) -> String {
        let der: Vec<u8> = SPKI_PREFIX
            .iter()
            .chain(self.pair.public_key().as_ref())
            .copied()
            .collect();
        pem("PUBLIC KEY", &der)
    }

    /// A token for `device`, issued at `now` and valid for `secs` seconds.
    pub fn token(&self, device: &str, now: u64, secs: u64) -> String {
        let claims = serde_json::to_vec(&NewClaims {
            sub: device,
            iat: now,
            exp: now.saturating_add(secs),
        })
        .expect("serializable");
        let signed = format!("{}.{}", B64.encode(HEADER), B64.encode(claims));
        let sig = self.pair.sign(signed.as_bytes());
        format!("{signed}.{}", B64.encode(sig.as_ref()))
    }
}

/// `der` as a PEM block labelled `label`.
fn pem(label: &str, der: &[u8]) -> String {
    let b = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<&str> = b
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).expect("base64 is ASCII"))
        .collect();
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        lines.join("\n")
    )
}

/// The DER in `text`'s first PEM block labelled `label`.
fn pem_block(text: &str, label: &str) -> Result<Vec<u8>, String> {
    let begin = format!("-----BEGIN {label}-----");
    let body: String = text
        .lines()
        .skip_while(|l| l.trim() != begin)
        .skip(1)
        .take_while(|l| !l.starts_with("-----END"))
        .collect();
    base64::engine::general_purpose::STANDARD
        .decode(body.trim())
        .ok()
        .filter(|d| !d.is_empty())
        .ok_or_else(|| format!("no PEM {label} block"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000;

    #[test]
    fn a_token_names_its_device_until_it_expires() {
        let (private, s) = TokenSigner::generate().unwrap();
        let key = TokenKey::from_pem(&s.public_pem()).unwrap();
        // The key as written reads back as the same signer.
        let again = TokenSigner::from_pem(&private).unwrap();
        assert_eq!(again.public_pem(), s.public_pem());
        let t = s.token("meter-9", NOW, 3600);
        let id = key.verify(&t, NOW + 10).unwrap();
        assert_eq!((id.name.as_str(), id.until), ("meter-9", NOW + 3600));
        assert_eq!(key.verify(&t, NOW + 3600), Err(TokenError::Expired));
        // Another operator's key, a changed claim, garbage.
        let (_, other) = TokenSigner::generate().unwrap();
        assert_eq!(
            key.verify(&other.token("meter-9", NOW, 3600), NOW),
            Err(TokenError::Signature)
        );
        let mut parts: Vec<&str> = t.split('.').collect();
        let forged = B64.encode(br#"{"sub":"admin","exp":9999999999}"#);
        parts[1] = &forged;
        assert_eq!(
            key.verify(&parts.join("."), NOW),
            Err(TokenError::Signature)
        );
        for bad in ["", "a.b", "a.b.c.d", "x.y.z", &"a".repeat(MAX_TOKEN + 1)] {
            assert_eq!(key.verify(bad, NOW), Err(TokenError::Malformed), "{bad}");
        }
        assert_eq!(
            key.verify(&s.token("two words", NOW, 60), NOW),
            Err(TokenError::Claims)
        );
    }
}
