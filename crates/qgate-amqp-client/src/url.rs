//! `amqp://`, `amqps://` and `amqp+quic://` URLs: where an AMQP client connects, how, as whom and
//! to which address (queue).
//!
//! `amqp` is plain TCP (port 5672), `amqps` TCP with TLS 1.3 (5671), `amqp+quic` AMQP over QUIC
//! (UDP 5671, one bidirectional stream per AMQP connection, as `qgate broker` serves it). User
//! and password go in the user-info part, percent-encoded; the path is the address (queue name).

use std::net::SocketAddr;

use qgate_transport::{TransportOptions, TrustRoots};

use crate::client::{bounded, Client, Connector, StreamInfo};
use crate::transport::{Scheme, TlsVersion};

/// A parsed AMQP URL.
#[derive(Clone, PartialEq, Eq)]
pub struct AmqpUrl {
    /// How AMQP is carried.
    pub scheme: Scheme,
    /// Host name or address (the name the broker's certificate is checked against).
    pub host: String,
    /// Port.
    pub port: u16,
    /// SASL PLAIN credentials (None: ANONYMOUS).
    pub credentials: Option<(String, String)>,
    /// The address (queue) the path names.
    pub address: String,
}

/// Credentials never show in logs or errors.
impl std::fmt::Debug for AmqpUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AmqpUrl({self})")
    }
}

impl std::fmt::Display for AmqpUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = match self.scheme {
            Scheme::Tcp => "amqp",
            Scheme::TcpTls(_) => "amqps",
            Scheme::Quic | Scheme::QuicMux => "amqp+quic",
        };
        let user = match &self.credentials {
            Some((u, _)) => format!("{u}:***@"),
            None => String::new(),
        };
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        write!(f, "{scheme}://{user}{host}:{}/{}", self.port, self.address)
    }
}

impl std::str::FromStr for AmqpUrl {
    type Err = String;
    fn from_str(url: &str) -> Result<AmqpUrl, String> {
        parse(url)
    }
}

/// Parse `url`; the error names the URL (without its password) and the problem.
pub fn parse(url: &str) -> Result<AmqpUrl, String> {
    let shown = redact(url);
    let bad = |why: &str| format!("invalid AMQP URL '{shown}': {why}");
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| bad("missing scheme; write it as amqp://host:port/queue"))?;
    let (scheme, port) = match scheme.to_ascii_lowercase().as_str() {
        "amqp" => (Scheme::Tcp, 5672),
        "amqps" => (Scheme::TcpTls(TlsVersion::V13), 5671),
        "amqp+quic" => (Scheme::Quic, 5671),
        other => {
            return Err(bad(&format!(
                "scheme '{other}' is not supported (amqp, amqps or amqp+quic)"
            )))
        }
    };
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    if path.contains(['?', '#']) {
        return Err(bad("query and fragment are not supported"));
    }
    // Most likely a password with a '/' in it, which would end the host part there.
    if path.contains('@') {
        return Err(bad(
            "an '@' after the host: percent-encode a '/' in the password as %2F (and an '@' in a queue name as %40)",
        ));
    }
    let address = decode(path).map_err(|e| bad(&e))?;
    if address.is_empty() {
        return Err(bad("missing queue: write it as the path, e.g. /telemetry"));
    }
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let credentials = match userinfo {
        None => None,
        Some(u) => {
            // A user without a password takes it from the environment (not the command line,
            // where `ps` shows it): see AmqpUrl::password_from.
            let (user, pass) = u.split_once(':').unwrap_or((u, ""));
            let user = decode(user).map_err(|e| bad(&e))?;
            if user.is_empty() {
                return Err(bad("empty user name"));
            }
            Some((user, decode(pass).map_err(|e| bad(&e))?))
        }
    };
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        let (h, tail) = v6
            .split_once(']')
            .ok_or_else(|| bad("unclosed '[' in the host"))?;
        let port = match tail.strip_prefix(':') {
            Some(p) => p.parse::<u16>().map_err(|_| bad("invalid port"))?,
            None if tail.is_empty() => port,
            None => return Err(bad("unexpected text after the host")),
        };
        (h.to_string(), port)
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (
                h.to_string(),
                p.parse::<u16>().map_err(|_| bad("invalid port"))?,
            ),
            None => (hostport.to_string(), port),
        }
    };
    if host.is_empty() {
        return Err(bad("missing host"));
    }
    if port == 0 {
        return Err(bad("port 0 is not a valid destination"));
    }
    Ok(AmqpUrl {
        scheme,
        host,
        port,
        credentials,
        address,
    })
}

impl AmqpUrl {
    /// A user given without a password gets `password` (e.g. from `QGATE_AMQP_PASSWORD`); an
    /// error if there is none.
    pub fn password_from(mut self, password: Option<String>) -> Result<AmqpUrl, String> {
        if let Some((user, pass)) = &mut self.credentials {
            if pass.is_empty() {
                *pass = password.filter(|p| !p.is_empty()).ok_or_else(|| {
                    format!(
                        "the AMQP user '{user}' needs a password: user:password@host in the URL, or QGATE_AMQP_PASSWORD"
                    )
                })?;
            }
        }
        Ok(self)
    }

    /// Resolve the host (the first address the resolver returns).
    pub async fn resolve(&self) -> Result<SocketAddr, String> {
        let mut addrs = tokio::net::lookup_host((self.host.as_str(), self.port))
            .await
            .map_err(|e| format!("cannot resolve host '{}': {e}", self.host))?;
        addrs
            .next()
            .ok_or_else(|| format!("host '{}' has no address", self.host))
    }
}

/// Where a client (the server's queue sink, a bridge) connects, again at every attempt.
#[derive(Clone)]
pub enum Upstream {
    /// Always through this connector (tests, the simulated network).
    Connector(Connector),
    /// A URL resolved again at every attempt; each address it has is tried in turn.
    Url {
        /// The broker and queue.
        url: AmqpUrl,
        /// CAs its certificate is checked against (amqps, amqp+quic).
        trust: TrustRoots,
        /// Transport options (idle timeout, keep-alive).
        opts: TransportOptions,
    },
}

impl Upstream {
    /// Connectors to try, in order.
    /// Open a connection and attach a sender on `link` to `address`: each address in turn,
    /// each given `within` (a silent first address must not use up the second's time), the
    /// host resolved within it too.
    pub async fn open_sender(
        &self,
        link: &str,
        address: &str,
        within: std::time::Duration,
    ) -> Result<(Client, StreamInfo, fe2o3_amqp::Sender), String> {
        let mut last = String::from("no address to try");
        let connectors = tokio::time::timeout(within, self.connectors())
            .await
            .map_err(|_| "timed out resolving the host".to_string())??;
        for c in connectors {
            let attempt = async {
                let (mut client, info) = c.open().await.map_err(|e| e.to_string())?;
                match client.sender(link, address, false).await {
                    Ok(s) => Ok((client, info, s)),
                    Err(e) => {
                        bounded(client.close()).await;
                        Err(e.to_string())
                    }
                }
            };
            match tokio::time::timeout(within, attempt).await {
                Ok(Ok(x)) => return Ok(x),
                Ok(Err(e)) => last = e,
                Err(_) => last = "timed out connecting".into(),
            }
        }
        Err(last)
    }

    pub async fn connectors(&self) -> Result<Vec<Connector>, String> {
        match self {
            Upstream::Connector(c) => Ok(vec![c.clone()]),
            Upstream::Url { url, trust, opts } => {
                let addrs: Vec<_> = tokio::net::lookup_host((url.host.as_str(), url.port))
                    .await
                    .map_err(|e| format!("cannot resolve host '{}': {e}", url.host))?
                    .collect();
                if addrs.is_empty() {
                    return Err(format!("host '{}' has no address", url.host));
                }
                addrs
                    .into_iter()
                    .map(|a| {
                        Connector::new(
                            url.scheme,
                            a,
                            &url.host,
                            trust,
                            url.credentials.clone(),
                            None,
                            opts,
                        )
                        .map_err(|e| e.to_string())
                    })
                    .collect()
            }
        }
    }
}

/// `url` with everything between `://` and its last `@` (user and password, even a password
/// with a `/` in it) replaced by `***`.
fn redact(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    match rest.rsplit_once('@') {
        Some((_, host)) if scheme.is_empty() => format!("***@{host}"),
        Some((_, host)) => format!("{scheme}://***@{host}"),
        None => url.to_string(),
    }
}

/// Percent-decoding (RFC 3986 §2.1) into UTF-8.
fn decode(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or("a '%' must be followed by two hex digits")?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "percent-encoding is not UTF-8".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_scheme_with_defaults() {
        let u = parse("amqp://localhost/q").unwrap();
        assert_eq!(
            (u.scheme, u.host.as_str(), u.port, u.address.as_str()),
            (Scheme::Tcp, "localhost", 5672, "q")
        );
        let u = parse("amqps://broker.example:6000/a/b").unwrap();
        assert_eq!(
            (u.scheme, u.port, u.address.as_str()),
            (Scheme::TcpTls(TlsVersion::V13), 6000, "a/b")
        );
        let u = parse("amqp+quic://[::1]/telemetry").unwrap();
        assert_eq!(
            (u.scheme, u.host.as_str(), u.port),
            (Scheme::Quic, "::1", 5671)
        );
        // RabbitMQ 4's v2 addresses start with a '/': a second slash keeps it.
        assert_eq!(
            parse("amqp://h//queues/telemetry").unwrap().address,
            "/queues/telemetry"
        );
        assert_eq!(parse("amqp://h/%2Fq%40x").unwrap().address, "/q@x");
        let u = parse("AMQP://u%40x:p%3Aw@h:1/q%20x").unwrap();
        assert_eq!(u.credentials, Some(("u@x".to_string(), "p:w".to_string())));
        assert_eq!(u.address, "q x");
        assert_eq!(u.to_string(), "amqp://u@x:***@h:1/q x");
        assert!(!format!("{u:?}").contains("p:w"));
    }

    #[test]
    fn a_password_can_come_from_elsewhere() {
        let u = parse("amqp://bob@h/q").unwrap();
        assert!(u
            .clone()
            .password_from(None)
            .unwrap_err()
            .contains("QGATE_AMQP_PASSWORD"));
        let u = u.password_from(Some("pw".into())).unwrap();
        assert_eq!(u.credentials, Some(("bob".into(), "pw".into())));
        // One in the URL wins.
        let u = parse("amqp://bob:url@h/q").unwrap();
        let u = u.password_from(Some("env".into())).unwrap();
        assert_eq!(u.credentials, Some(("bob".into(), "url".into())));
    }

    #[test]
    fn errors_name_the_problem_and_hide_the_password() {
        for (url, why) in [
            ("localhost:5672/q", "missing scheme"),
            ("http://h/q", "scheme 'http' is not supported"),
            ("amqp://h", "missing queue"),
            ("amqp://h/", "missing queue"),
            ("amqp://h:x/q", "invalid port"),
            ("amqp://h:0/q", "port 0"),
            ("amqp://:5672/q", "missing host"),
            ("amqp://[::1/q", "unclosed"),
            ("amqp://h/q?x=1", "query"),
            ("amqp://h/%zz", "two hex digits"),
            ("amqp://u:secret@h:99999/q", "invalid port"),
            ("amqp://bob:se/cret@h/q", "percent-encode a '/'"),
            ("amqp://bob:12/secret@h/q", "percent-encode a '/'"),
            ("amqp:/bob:secret@h/q", "missing scheme"),
        ] {
            let e = parse(url).unwrap_err();
            assert!(e.contains(why), "{url}: {e}");
            assert!(!e.contains("cret"), "{e}");
        }
    }
}
