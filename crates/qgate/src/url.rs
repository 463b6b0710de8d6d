//! `https://host[:port]/path` → where to connect and what to ask for.

use std::net::SocketAddr;

/// A parsed request target.
#[derive(Debug, Clone)]
pub struct Target {
    /// The URL as given (for messages).
    pub url: String,
    /// Host name, used for TLS server-name checks.
    pub host: String,
    /// UDP port (443 if none is given).
    pub port: u16,
    /// The parsed URI (for the request line).
    pub uri: http::Uri,
}

/// Parse an `https://` URL; the error names the URL and the problem.
pub fn parse(url: &str) -> Result<Target, String> {
    let bad = |why: &str| format!("invalid URL '{url}': {why}");
    let uri: http::Uri = url.parse().map_err(|e| bad(&format!("{e}")))?;
    match uri.scheme_str() {
        Some("https") => {}
        Some(other) => {
            return Err(bad(&format!(
                "scheme '{other}' is not supported; HTTP/3 needs https://"
            )))
        }
        None => return Err(bad("missing scheme; write it as https://host:port/path")),
    }
    let host = uri
        .host()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| bad("missing host"))?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    // `http` reads a port it cannot parse as none, which would quietly mean 443.
    let authority = uri.authority().map_or("", |a| a.as_str());
    if authority.contains('@') {
        return Err(bad("user info (user@) is not supported"));
    }
    let port = match authority.rsplit_once(':').filter(|(_, p)| !p.contains(']')) {
        Some((_, p)) => p
            .parse::<u16>()
            .map_err(|_| bad(&format!("port '{p}' is not a number from 1 to 65535")))?,
        None => 443,
    };
    if port == 0 {
        return Err(bad("port 0 is not a valid destination"));
    }
    Ok(Target {
        url: url.to_string(),
        host,
        port,
        uri,
    })
}

impl Target {
    /// Resolve the host to a socket address (the first one the resolver returns).
    pub async fn resolve(&self) -> Result<SocketAddr, String> {
        let mut addrs = tokio::net::lookup_host((self.host.as_str(), self.port))
            .await
            .map_err(|e| format!("cannot resolve host '{}': {e}", self.host))?;
        addrs
            .next()
            .ok_or_else(|| format!("host '{}' has no address", self.host))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        let t = parse("https://localhost:4433/ingest/a").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.uri.path()),
            ("localhost", 4433, "/ingest/a")
        );
        assert_eq!(parse("https://[::1]/").unwrap().host, "::1");
        assert_eq!(parse("https://example.org").unwrap().port, 443);
        assert!(parse("http://x/")
            .unwrap_err()
            .contains("scheme 'http' is not supported"));
        assert!(parse("localhost:4433")
            .unwrap_err()
            .starts_with("invalid URL 'localhost:4433'"));
        assert!(parse("https://exa mple/")
            .unwrap_err()
            .starts_with("invalid URL"));
        for (url, port) in [
            ("https://127.0.0.1:99999/", "99999"),
            ("https://h:65536", "65536"),
            ("https://h:4433x/", "4433x"),
            ("https://[::1]:99999/", "99999"),
            ("https://h:/", ""),
        ] {
            let e = parse(url).unwrap_err();
            assert!(e.contains(&format!("port '{port}' is not a number")), "{e}");
        }
        assert_eq!(parse("https://[::1]:4433/").unwrap().port, 4433);
        assert!(parse("https://user@h/").unwrap_err().contains("user info"));
        assert!(parse("not a url")
            .unwrap_err()
            .starts_with("invalid URL 'not a url'"));
    }
}
