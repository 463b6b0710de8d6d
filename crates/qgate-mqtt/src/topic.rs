//! Topic names and topic filters (spec §4.7): a name is what a PUBLISH goes to and holds no
//! wildcard; a filter is what a SUBSCRIBE asks for, where `+` fills one level and `#` the rest.

/// Whether `name` may be a PUBLISH's topic: no `+` or `#` (§4.7.1.1). Emptiness is the caller's
/// to judge (an empty name is how MQTT 5.0 uses a topic alias).
pub fn is_valid_name(name: &str) -> bool {
    !name.contains(['+', '#'])
}

/// Whether `filter` is a well-formed topic filter (§4.7.1): not empty, `#` only as the whole last
/// level, `+` only as a whole level.
pub fn is_valid_filter(filter: &str) -> bool {
    if filter.is_empty() {
        return false;
    }
    let mut levels = filter.split('/').peekable();
    while let Some(level) = levels.next() {
        let last = levels.peek().is_none();
        let ok = match level {
            "#" => last,
            "+" => true,
            _ => !level.contains(['+', '#']),
        };
        if !ok {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_filter_examples() {
        // §4.7.1.2 and §4.7.1.3.
        for ok in [
            "sport/tennis/player1/#",
            "sport/#",
            "#",
            "+",
            "+/tennis/#",
            "sport/+/player1",
            "/+",
            "sport/+",
        ] {
            assert!(is_valid_filter(ok), "{ok}");
        }
        for bad in [
            "sport/tennis#",
            "sport/tennis/#/ranking",
            "sport+",
            "",
            "a/b#/c",
        ] {
            assert!(!is_valid_filter(bad), "{bad}");
        }
    }

    #[test]
    fn names_hold_no_wildcards() {
        assert!(is_valid_name("sport/tennis/player1"));
        assert!(is_valid_name("/"));
        assert!(!is_valid_name("sport/+"));
        assert!(!is_valid_name("#"));
    }
}
