//! The admin token (decision O2).

use std::fmt;

/// Shortest token accepted: 16 characters leave guessing out of reach of an online attacker.
pub const MIN_TOKEN_LEN: usize = 16;

/// A bearer token; its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(…)")
    }
}

impl Token {
    /// A token of at least [`MIN_TOKEN_LEN`] visible ASCII characters (it travels in a header).
    pub fn new(token: &str) -> Result<Token, String> {
        let t = token.trim();
        if t.len() < MIN_TOKEN_LEN {
            return Err(format!(
                "the admin token must have at least {MIN_TOKEN_LEN} characters (it has {})",
                t.len()
            ));
        }
        if !t.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("the admin token must be visible ASCII characters, no spaces".into());
        }
        Ok(Token(t.to_string()))
    }

    /// The token in the file at `path` (surrounding whitespace ignored).
    pub fn from_file(path: &std::path::Path) -> Result<Token, String> {
        let s = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the admin token file {}: {e}", path.display()))?;
        Token::new(&s).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The token, to send.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether an `Authorization` header value carries this token; the comparison takes the
    /// same time wherever the first difference is.
    pub fn admits(&self, authorization: Option<&[u8]>) -> bool {
        // The scheme is case-insensitive (RFC 9110 §11.1).
        let Some(given) = authorization
            .filter(|h| h.len() > 7 && h[..7].eq_ignore_ascii_case(b"bearer "))
            .map(|h| &h[7..])
        else {
            return false;
        };
        let want = self.0.as_bytes();
        given.len() == want.len()
            && given
                .iter()
                .zip(want)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_bearer_token_is_admitted() {
        let t = Token::new(" 0123456789abcdef\n").unwrap();
        assert!(t.admits(Some(b"Bearer 0123456789abcdef")));
        assert!(t.admits(Some(b"bearer 0123456789abcdef")));
        for bad in [
            &b"Bearer 0123456789abcdeF"[..],
            b"Bearer 0123456789abcde",
            b"Bearer 0123456789abcdef0",
            b"0123456789abcdef",
            b"",
        ] {
            assert!(!t.admits(Some(bad)), "{bad:?}");
        }
        assert!(!t.admits(None));
        assert!(Token::new("short").is_err());
        assert!(Token::new("0123456789 abcdef").is_err());
        assert_eq!(format!("{t:?}"), "Token(…)");
    }
}
