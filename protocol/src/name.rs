//! Names that end up in run keys, routing keys, queue names and Redis keys.
//!
//! Job names, job types, worker groups and namespaces all travel through
//! AMQP routing keys and Redis keys, where characters such as `*`, `#`, `@`,
//! spaces or `:` have meaning. One rule for all of them keeps every derived
//! key unambiguous: 1 to 100 characters from `A-Z a-z 0-9 . _ -`.

use thiserror::Error;

/// Longest accepted name, in bytes (all accepted characters are ASCII).
pub const MAX_NAME_LEN: usize = 100;

/// Why a name was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NameError {
    /// The name was empty.
    #[error("{what} is empty; use 1 to {MAX_NAME_LEN} characters from A-Z a-z 0-9 . _ -")]
    Empty {
        /// What kind of name it was (`job name`, `job type`, ...).
        what: &'static str,
    },
    /// The name was longer than [`MAX_NAME_LEN`].
    #[error("{what} {name:?} is {len} characters long; the limit is {MAX_NAME_LEN}")]
    TooLong {
        /// What kind of name it was.
        what: &'static str,
        /// The offending name.
        name: String,
        /// Its length.
        len: usize,
    },
    /// The name held a character outside the allowed set.
    #[error("{what} {name:?} contains {bad:?}; allowed characters are A-Z a-z 0-9 . _ -")]
    BadCharacter {
        /// What kind of name it was.
        what: &'static str,
        /// The offending name.
        name: String,
        /// The first character that is not allowed.
        bad: char,
    },
}

/// Checks `name` against the shared naming rule.
///
/// `what` names the kind of name in the error message (`"job name"`,
/// `"job type"`, `"namespace"`, `"worker group"`).
///
/// # Errors
///
/// [`NameError`] when the name is empty, too long, or holds a character
/// outside `A-Z a-z 0-9 . _ -`.
pub fn validate_name(what: &'static str, name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty { what });
    }
    if name.len() > MAX_NAME_LEN {
        return Err(NameError::TooLong {
            what,
            name: name.to_owned(),
            len: name.len(),
        });
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(NameError::BadCharacter {
            what,
            name: name.to_owned(),
            bad,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_documented_set() {
        assert!(validate_name("job name", "nightly-report_v2.eu").is_ok());
    }

    #[test]
    fn refuses_empty_long_and_special() {
        assert!(matches!(
            validate_name("job name", ""),
            Err(NameError::Empty { .. })
        ));
        assert!(matches!(
            validate_name("job name", &"a".repeat(101)),
            Err(NameError::TooLong { len: 101, .. })
        ));
        for bad in ["a b", "a@b", "a*b", "a#b", "a:b", "ü"] {
            assert!(
                matches!(
                    validate_name("job type", bad),
                    Err(NameError::BadCharacter { .. })
                ),
                "{bad} accepted"
            );
        }
    }
}
