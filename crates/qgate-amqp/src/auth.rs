//! SASL for the broker: PLAIN against a credentials file and/or ANONYMOUS (AMQP 1.0 §5.3).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use fe2o3_amqp::acceptor::sasl_acceptor::{SaslAcceptor, SaslServerFrame};
use fe2o3_amqp::types::primitives::{Array, Symbol};
use fe2o3_amqp::types::sasl::{SaslCode, SaslInit, SaslOutcome, SaslResponse};

/// SASL mechanism names (RFC 4616, RFC 4505).
const PLAIN: &str = "PLAIN";
const ANONYMOUS: &str = "ANONYMOUS";

/// Who may connect.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    users: Arc<BTreeMap<String, String>>,
    anonymous: bool,
}

/// A credentials file that cannot be used; the message names the file and the problem.
#[derive(Debug, thiserror::Error)]
#[error("credentials file {path}: {msg}")]
pub struct CredentialsError {
    path: String,
    msg: String,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    users: BTreeMap<String, String>,
}

impl Credentials {
    /// Anyone (SASL ANONYMOUS only).
    pub fn anonymous() -> Self {
        Credentials {
            users: Arc::default(),
            anonymous: true,
        }
    }

    /// PLAIN with these users (name → password); `anonymous` also admits ANONYMOUS.
    pub fn plain(users: BTreeMap<String, String>, anonymous: bool) -> Self {
        Credentials {
            users: Arc::new(users),
            anonymous,
        }
    }

    /// Whether SASL ANONYMOUS is admitted.
    pub fn admits_anonymous(&self) -> bool {
        self.anonymous
    }

    /// Read a TOML credentials file: a `[users]` table of `name = "password"`.
    pub fn load(path: &Path, anonymous: bool) -> Result<Self, CredentialsError> {
        let err = |msg: String| CredentialsError {
            path: path.display().to_string(),
            msg,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        let f: File = toml::from_str(&text).map_err(|e| err(e.message().to_string()))?;
        if f.users.is_empty() {
            return Err(err("[users] is empty".into()));
        }
        if let Some((u, _)) = f.users.iter().find(|(u, p)| u.is_empty() || p.is_empty()) {
            return Err(err(format!("user '{u}' has an empty name or password")));
        }
        Ok(Credentials::plain(f.users, anonymous))
    }

    /// Whether `user` / `password` may connect (PLAIN).
    pub fn check(&self, user: &[u8], password: &[u8]) -> bool {
        let Ok(user) = std::str::from_utf8(user) else {
            return false;
        };
        match self.users.get(user) {
            // Compare every byte whatever the first mismatch, so timing does not leak a prefix.
            Some(p) => {
                p.len() == password.len()
                    && p.bytes()
                        .zip(password)
                        .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                        == 0
            }
            None => false,
        }
    }

    fn outcome(&self, init: &SaslInit) -> SaslCode {
        match init.mechanism.as_str() {
            m if m == ANONYMOUS && self.anonymous => SaslCode::Ok,
            m if m == PLAIN && !self.users.is_empty() => {
                // RFC 4616: [authzid] NUL authcid NUL passwd
                let Some(resp) = init.initial_response.as_ref() else {
                    return SaslCode::Auth;
                };
                let mut parts = resp.as_ref().split(|b| *b == 0);
                match (parts.next(), parts.next(), parts.next(), parts.next()) {
                    (Some(_), Some(user), Some(pass), None) if self.check(user, pass) => {
                        SaslCode::Ok
                    }
                    _ => SaslCode::Auth,
                }
            }
            _ => SaslCode::Auth,
        }
    }
}

impl SaslAcceptor for Credentials {
    fn mechanisms(&self) -> Array<Symbol> {
        let mut m = Vec::new();
        if !self.users.is_empty() {
            m.push(Symbol::from(PLAIN));
        }
        if self.anonymous {
            m.push(Symbol::from(ANONYMOUS));
        }
        Array::from(m)
    }

    fn on_init(&mut self, init: SaslInit) -> SaslServerFrame {
        let code = self.outcome(&init);
        if code != SaslCode::Ok {
            tracing::warn!(mechanism = %init.mechanism.as_str(), "SASL authentication failed");
        }
        SaslServerFrame::Outcome(SaslOutcome {
            code,
            additional_data: None,
        })
    }

    fn on_response(&mut self, _response: SaslResponse) -> SaslServerFrame {
        // Neither PLAIN nor ANONYMOUS has a challenge round.
        SaslServerFrame::Outcome(SaslOutcome {
            code: SaslCode::Auth,
            additional_data: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fe2o3_amqp::types::primitives::Binary;

    fn init(mech: &str, resp: Option<&[u8]>) -> SaslInit {
        SaslInit {
            mechanism: Symbol::from(mech),
            initial_response: resp.map(|r| Binary::from(r.to_vec())),
            hostname: None,
        }
    }

    #[test]
    fn plain_and_anonymous() {
        let users = BTreeMap::from([("alice".to_string(), "s3cret".to_string())]);
        let c = Credentials::plain(users.clone(), false);
        assert_eq!(
            c.outcome(&init("PLAIN", Some(b"\0alice\0s3cret"))),
            SaslCode::Ok
        );
        assert_eq!(
            c.outcome(&init("PLAIN", Some(b"\0alice\0wrong"))),
            SaslCode::Auth
        );
        assert_eq!(
            c.outcome(&init("PLAIN", Some(b"\0alice\0s3cret\0x"))),
            SaslCode::Auth
        );
        assert_eq!(
            c.outcome(&init("PLAIN", Some(b"\0bob\0s3cret"))),
            SaslCode::Auth
        );
        assert_eq!(c.outcome(&init("PLAIN", None)), SaslCode::Auth);
        assert_eq!(c.outcome(&init("ANONYMOUS", None)), SaslCode::Auth);
        assert_eq!(c.mechanisms().0, vec![Symbol::from("PLAIN")]);
        let both = Credentials::plain(users, true);
        assert_eq!(both.outcome(&init("ANONYMOUS", None)), SaslCode::Ok);
        assert_eq!(both.mechanisms().0.len(), 2);
        let anon = Credentials::anonymous();
        assert_eq!(
            anon.outcome(&init("PLAIN", Some(b"\0a\0b"))),
            SaslCode::Auth
        );
    }

    #[test]
    fn credentials_file_errors_name_the_problem() {
        let dir = std::env::temp_dir().join(format!("qgate-creds-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("users.toml");
        std::fs::write(&p, "[users]\nalice = \"pw\"\n").unwrap();
        assert!(Credentials::load(&p, false).unwrap().check(b"alice", b"pw"));
        std::fs::write(&p, "[users]\n").unwrap();
        assert!(Credentials::load(&p, false)
            .unwrap_err()
            .to_string()
            .contains("empty"));
        std::fs::write(&p, "users = 3\n").unwrap();
        let e = Credentials::load(&p, false).unwrap_err().to_string();
        assert!(e.contains("users.toml"), "{e}");
        let e = Credentials::load(&dir.join("missing.toml"), false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing.toml"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
