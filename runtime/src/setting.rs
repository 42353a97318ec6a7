//! Typed settings read from environment variables.
//!
//! Each binary's configuration struct reads its fields through [`Settings`],
//! so every variable has one documented default and a bad value produces an
//! error naming the variable, the value and what is accepted, instead of a
//! panic or a silent fallback.

use std::collections::HashMap;
use std::str::FromStr;
use std::time::Duration;

use thiserror::Error;

/// A setting with a value that cannot be used.
#[derive(Debug, Error)]
pub enum SettingError {
    /// The value could not be parsed or is out of range.
    #[error("{var}={value:?} is invalid: {reason}")]
    Invalid {
        /// The environment variable.
        var: String,
        /// The value found (never a secret: secrets are not parsed here).
        value: String,
        /// What is accepted.
        reason: String,
    },
}

/// A snapshot of environment variables to read settings from.
///
/// Built from the process environment in binaries and from a plain map in
/// tests, so configuration parsing is testable without touching global
/// state.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    vars: HashMap<String, String>,
}

impl Settings {
    /// The current process environment.
    pub fn from_env() -> Self {
        Self {
            vars: std::env::vars().collect(),
        }
    }

    /// An explicit set of variables.
    pub fn from_pairs<I, K, V>(pairs: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        Self {
            vars: pairs
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        }
    }

    /// The raw value, when set and not blank.
    pub fn get(&self, var: &str) -> Option<&str> {
        self.vars
            .get(var)
            .map(String::as_str)
            .filter(|v| !v.trim().is_empty())
    }

    /// A string, or `default`.
    pub fn string(&self, var: &str, default: &str) -> String {
        self.get(var).unwrap_or(default).to_owned()
    }

    /// A value parsed with [`FromStr`], or `default`.
    ///
    /// # Errors
    ///
    /// [`SettingError::Invalid`] when the value does not parse; `expected`
    /// describes what is accepted.
    pub fn parsed<T: FromStr>(
        &self,
        var: &str,
        default: T,
        expected: &str,
    ) -> Result<T, SettingError> {
        match self.get(var) {
            None => Ok(default),
            Some(raw) => raw.trim().parse().map_err(|_| SettingError::Invalid {
                var: var.into(),
                value: raw.into(),
                reason: format!("expected {expected}"),
            }),
        }
    }

    /// A whole number in `min..=max`, or `default`.
    ///
    /// # Errors
    ///
    /// [`SettingError::Invalid`] when the value is not a number in range.
    pub fn number(&self, var: &str, default: u64, min: u64, max: u64) -> Result<u64, SettingError> {
        let expected = format!("a whole number from {min} to {max}");
        let n = self.parsed(var, default, &expected)?;
        if (min..=max).contains(&n) {
            Ok(n)
        } else {
            Err(SettingError::Invalid {
                var: var.into(),
                value: n.to_string(),
                reason: format!("expected {expected}"),
            })
        }
    }

    /// A duration such as `30s`, `500ms` or `2m`, at least `min`, or
    /// `default`.
    ///
    /// # Errors
    ///
    /// [`SettingError::Invalid`] when the value is not a duration or is
    /// shorter than `min`.
    pub fn duration(
        &self,
        var: &str,
        default: Duration,
        min: Duration,
    ) -> Result<Duration, SettingError> {
        let Some(raw) = self.get(var) else {
            return Ok(default);
        };
        let invalid = |reason: String| SettingError::Invalid {
            var: var.into(),
            value: raw.into(),
            reason,
        };
        let d = humantime::parse_duration(raw.trim())
            .map_err(|e| invalid(format!("{e}; expected a duration such as 500ms, 30s or 5m")))?;
        if d < min {
            return Err(invalid(format!(
                "must be at least {}",
                humantime::format_duration(min)
            )));
        }
        Ok(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_overrides() {
        let s = Settings::from_pairs([("A", "7"), ("D", "250ms"), ("BLANK", " ")]);
        assert_eq!(s.number("A", 1, 1, 10).unwrap(), 7);
        assert_eq!(s.number("MISSING", 3, 1, 10).unwrap(), 3);
        assert_eq!(s.string("BLANK", "x"), "x");
        assert_eq!(
            s.duration("D", Duration::from_secs(1), Duration::ZERO)
                .unwrap(),
            Duration::from_millis(250)
        );
    }

    #[test]
    fn errors_name_the_variable_and_the_rule() {
        let s = Settings::from_pairs([("A", "70"), ("B", "x"), ("D", "soon"), ("E", "1ms")]);
        let e = s.number("A", 1, 1, 10).unwrap_err().to_string();
        assert!(e.contains("A=\"70\"") && e.contains("from 1 to 10"), "{e}");
        assert!(s
            .number("B", 1, 1, 10)
            .unwrap_err()
            .to_string()
            .contains("B=\"x\""));
        let e = s
            .duration("D", Duration::ZERO, Duration::ZERO)
            .unwrap_err()
            .to_string();
        assert!(e.contains("30s"), "{e}");
        let e = s
            .duration("E", Duration::ZERO, Duration::from_millis(10))
            .unwrap_err()
            .to_string();
        assert!(e.contains("at least 10ms"), "{e}");
    }
}
