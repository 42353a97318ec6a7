//! Free text on its way into the ledger: error messages and reasons.
//!
//! A handler's error text comes from anywhere (a binary HTTP body shown
//! lossily, a C library's message) and may hold NUL characters, which
//! Postgres `text` and `jsonb` refuse. One such text must not fail the write
//! of an outcome (nor, batched, of every outcome it shares a statement with),
//! so NUL is escaped as the two characters `\0` before it is stored: the text
//! stays readable and nothing else about it changes. Both backends store the
//! same escaped text, so a run reads the same on either.

use std::borrow::Cow;

/// `text` with every NUL character written as `\0`.
pub fn storable(text: &str) -> Cow<'_, str> {
    if text.contains('\u{0}') {
        Cow::Owned(text.replace('\u{0}', "\\0"))
    } else {
        Cow::Borrowed(text)
    }
}

/// [`storable`] for an owned text: returned as it is (no copy) unless it
/// holds a NUL.
pub fn into_storable(text: String) -> String {
    match storable(&text) {
        Cow::Borrowed(_) => text,
        Cow::Owned(escaped) => escaped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nul_is_escaped_and_the_rest_kept() {
        assert_eq!(storable("a\u{0}b\u{0}"), "a\\0b\\0");
        assert!(matches!(storable("plain ✓"), Cow::Borrowed("plain ✓")));
        assert_eq!(into_storable("\u{0}".into()), "\\0");
        assert_eq!(into_storable("ok".into()), "ok");
    }
}
