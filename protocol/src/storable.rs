//! What a received value must be for the ledger to store it.
//!
//! A message can be perfectly good JSON and still be impossible to store:
//! Postgres `text` and `jsonb` cannot hold the NUL character (`\u0000` in
//! JSON), and a value of unbounded size does not belong in a trace header.
//! Such a message can never succeed, so a worker that only found out from the
//! database's refusal would treat it as an outage and hand it back forever.
//! These checks run when a message is decoded, so it is dead-lettered once
//! with a reason instead, on either backend (the embedded SQLite one could
//! store a NUL, but a message must not be good on one backend and poison on
//! the other).

use thiserror::Error;

/// Longest trace header value (`traceparent`, `tracestate`) accepted, in
/// bytes. W3C allows `tracestate` up to 512 characters.
pub const MAX_TRACE_HEADER_BYTES: usize = 512;

/// A received value the ledger cannot store.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{field} {reason}")]
pub struct Unstorable {
    /// Where the value is (`payload.items[3].name`, `trace.traceparent`).
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

/// Checks a text value: no NUL, no other control character, at most
/// `max_bytes`.
///
/// # Errors
///
/// [`Unstorable`] naming `field` and the broken rule.
pub fn check_storable_text(field: &str, value: &str, max_bytes: usize) -> Result<(), Unstorable> {
    let bad = |reason: String| Unstorable {
        field: field.to_owned(),
        reason,
    };
    if value.contains('\u{0}') {
        return Err(bad(
            "contains a NUL character (\\u0000), which the ledger cannot store".into(),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(bad("contains a control character".into()));
    }
    if value.len() > max_bytes {
        return Err(bad(format!(
            "is {} bytes long; at most {max_bytes} are accepted",
            value.len()
        )));
    }
    Ok(())
}

/// Checks that no string or object key anywhere inside `value` holds a NUL
/// character (`jsonb` refuses `\u0000`). Other control characters are fine
/// in JSON strings.
///
/// # Errors
///
/// [`Unstorable`] naming the path of the first offending string.
pub fn check_storable_json(field: &str, value: &serde_json::Value) -> Result<(), Unstorable> {
    // An explicit stack rather than recursion: a hostile payload nested
    // thousands deep cannot overflow it (serde_json already refuses depth
    // past 128 when parsing, but a value may come from elsewhere).
    let mut stack: Vec<(String, &serde_json::Value)> = vec![(field.to_owned(), value)];
    let nul = |path: String, what: &str| Unstorable {
        field: path,
        reason: format!("{what} a NUL character (\\u0000), which the ledger cannot store"),
    };
    while let Some((path, v)) = stack.pop() {
        match v {
            serde_json::Value::String(s) if s.contains('\u{0}') => {
                return Err(nul(path, "contains"));
            }
            serde_json::Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    stack.push((format!("{path}[{i}]"), item));
                }
            }
            serde_json::Value::Object(map) => {
                for (key, item) in map {
                    if key.contains('\u{0}') {
                        return Err(nul(path, "has a key with"));
                    }
                    stack.push((format!("{path}.{key}"), item));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nul_anywhere_in_json_is_found_with_its_path() {
        assert!(check_storable_json("payload", &json!({"a": [1, "x", {"b": null}]})).is_ok());
        let e = check_storable_json("payload", &json!({"a": [1, "x\u{0}"]})).unwrap_err();
        assert_eq!(e.field, "payload.a[1]");
        let e = check_storable_json("payload", &json!({"k\u{0}": 1})).unwrap_err();
        assert_eq!(e.field, "payload");
        assert!(e.to_string().contains("key with a NUL"), "{e}");
        // Other control characters are valid in jsonb strings.
        assert!(check_storable_json("payload", &json!("tab\there\u{7}")).is_ok());
    }

    #[test]
    fn text_rules() {
        assert!(check_storable_text("t", "00-abc", 10).is_ok());
        assert!(check_storable_text("t", "a\u{0}", 10).is_err());
        assert!(check_storable_text("t", "a\nb", 10).is_err());
        let e = check_storable_text("t", &"x".repeat(11), 10).unwrap_err();
        assert!(e.to_string().contains("11 bytes"), "{e}");
    }
}
