//! How a name goes into a URL of the API: a schedule name, run id or query
//! value percent-encoded as one path segment or query value. The CLI builds
//! its request paths and the web view its links with this one function, so
//! both put a name in a URL the way the server's router reads it back.

use std::fmt::Write as _;

/// `text` percent-encoded for a URL path segment or query value: every
/// byte outside the unreserved set of RFC 3986 (`A-Z a-z 0-9 - _ . ~`) as
/// `%XX`.
pub fn encode_url_component(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            // Writing to a String cannot fail.
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_bytes_are_escaped() {
        assert_eq!(encode_url_component("a b/<c>"), "a%20b%2F%3Cc%3E");
        assert_eq!(
            encode_url_component("nightly-report_2.x~"),
            "nightly-report_2.x~"
        );
        assert_eq!(encode_url_component("日"), "%E6%97%A5");
    }
}
