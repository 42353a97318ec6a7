//! A cluster-wide rate limit on the starts of runs (issue 22): at most
//! `starts` attempts start in any window of `per_ms` milliseconds, across
//! every worker of every host. Written `"50/s"`, `"10/1m"` or `"3/10s"` in
//! schedule files and API requests; carried typed in a run's options.
//!
//! The bounds keep the ledger's check cheap and meaningful: the window is
//! counted from a log of the key's recent starts (at most `starts` rows),
//! and the outbox republishes waiting runs about once a second, so windows
//! shorter than a second would not be honoured any better than one second.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The most starts one window may allow.
pub const MAX_RATE_STARTS: u32 = 10_000;
/// The shortest window.
pub const MIN_RATE_WINDOW: Duration = Duration::from_secs(1);
/// The longest window.
pub const MAX_RATE_WINDOW: Duration = Duration::from_secs(86_400);

/// Why a rate limit was refused: what is wrong, and what is allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidRateLimit(pub String);

/// At most `starts` starts per `per_ms` milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RateLimit {
    /// Starts allowed in one window (1 to 10000).
    pub starts: u32,
    /// The window, in milliseconds (1 second to 1 day).
    pub per_ms: u64,
}

impl RateLimit {
    /// The limit of `starts` per `per`.
    ///
    /// # Errors
    ///
    /// What is out of range, and what is allowed.
    pub fn new(starts: u32, per: Duration) -> Result<Self, InvalidRateLimit> {
        let limit = Self {
            starts,
            per_ms: u64::try_from(per.as_millis()).unwrap_or(u64::MAX),
        };
        limit.check()?;
        Ok(limit)
    }

    /// The window.
    pub fn per(&self) -> Duration {
        Duration::from_millis(self.per_ms)
    }

    /// Whether the limit is within bounds (a message published by hand may
    /// carry any numbers).
    ///
    /// # Errors
    ///
    /// What is out of range, and what is allowed.
    pub fn check(&self) -> Result<(), InvalidRateLimit> {
        if !(1..=MAX_RATE_STARTS).contains(&self.starts) {
            return Err(InvalidRateLimit(format!(
                "{} starts per window is out of range; allowed 1 to {MAX_RATE_STARTS}",
                self.starts
            )));
        }
        let per = self.per();
        if !(MIN_RATE_WINDOW..=MAX_RATE_WINDOW).contains(&per) {
            return Err(InvalidRateLimit(format!(
                "a window of {} ms is out of range; allowed 1s to 1 day",
                self.per_ms
            )));
        }
        Ok(())
    }
}

impl FromStr for RateLimit {
    type Err = InvalidRateLimit;

    /// `"<starts>/<window>"`: the window a unit alone (`s`, `m`, `h`, `d`:
    /// one of it) or a duration (`10s`, `1m`, `1h 30m`).
    fn from_str(raw: &str) -> Result<Self, InvalidRateLimit> {
        let hint = "write it as <starts>/<window>, e.g. \"50/s\", \"10/1m\" or \"3/10s\"";
        let Some((starts, window)) = raw.split_once('/') else {
            return Err(InvalidRateLimit(format!("{raw:?} has no \"/\"; {hint}")));
        };
        let starts: u32 = starts.trim().parse().map_err(|_| {
            InvalidRateLimit(format!(
                "{:?} is not a whole number of starts; {hint}",
                starts.trim()
            ))
        })?;
        let per = parse_window(window.trim()).ok_or_else(|| {
            InvalidRateLimit(format!("{:?} is not a window; {hint}", window.trim()))
        })?;
        Self::new(starts, per)
    }
}

impl fmt::Display for RateLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let per = self.per_ms;
        match per {
            p if p % 86_400_000 == 0 => write!(f, "{}/{}d", self.starts, p / 86_400_000),
            p if p % 3_600_000 == 0 => write!(f, "{}/{}h", self.starts, p / 3_600_000),
            p if p % 60_000 == 0 => write!(f, "{}/{}m", self.starts, p / 60_000),
            p if p % 1000 == 0 => write!(f, "{}/{}s", self.starts, p / 1000),
            p => write!(f, "{}/{}ms", self.starts, p),
        }
    }
}

/// A window: `s`/`m`/`h`/`d` alone, or a sum of `<number><unit>` parts
/// (`ms`, `s`, `m`, `h`, `d`) separated by optional spaces.
fn parse_window(raw: &str) -> Option<Duration> {
    let unit_ms = |u: &str| -> Option<u64> {
        match u {
            "ms" => Some(1),
            "s" | "sec" | "second" => Some(1000),
            "m" | "min" | "minute" => Some(60_000),
            "h" | "hour" => Some(3_600_000),
            "d" | "day" => Some(86_400_000),
            _ => None,
        }
    };
    if let Some(ms) = unit_ms(raw) {
        return Some(Duration::from_millis(ms));
    }
    let mut total: u64 = 0;
    let mut rest = raw;
    let mut parts = 0;
    while !rest.is_empty() {
        rest = rest.trim_start();
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let letters = rest[digits..]
            .bytes()
            .take_while(u8::is_ascii_alphabetic)
            .count();
        if digits == 0 || letters == 0 {
            return None;
        }
        let n: u64 = rest[..digits].parse().ok()?;
        let ms = unit_ms(&rest[digits..digits + letters])?;
        total = total.checked_add(n.checked_mul(ms)?)?;
        rest = rest[digits + letters..].trim_start();
        parts += 1;
    }
    (parts > 0).then(|| Duration::from_millis(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_written_forms_and_prints_them_back() {
        for (raw, starts, ms, shown) in [
            ("50/s", 50, 1000, "50/1s"),
            ("10/1m", 10, 60_000, "10/1m"),
            (" 3 / 10s ", 3, 10_000, "3/10s"),
            ("1000/1h 30m", 1000, 5_400_000, "1000/90m"),
            ("1/d", 1, 86_400_000, "1/1d"),
            ("7/1500ms", 7, 1500, "7/1500ms"),
        ] {
            let r: RateLimit = raw.parse().unwrap();
            assert_eq!((r.starts, r.per_ms), (starts, ms), "{raw}");
            assert_eq!(r.to_string(), shown);
            assert_eq!(r.to_string().parse::<RateLimit>().unwrap(), r);
        }
    }

    #[test]
    fn refuses_bad_forms_and_out_of_range_values_saying_what_is_allowed() {
        for (raw, says) in [
            ("50", "has no \"/\""),
            ("x/s", "not a whole number"),
            ("-1/s", "not a whole number"),
            ("5/fortnight", "not a window"),
            ("5/10", "not a window"),
            ("5/", "not a window"),
            ("0/s", "allowed 1 to 10000"),
            ("10001/s", "allowed 1 to 10000"),
            ("5/500ms", "allowed 1s to 1 day"),
            ("5/2d", "allowed 1s to 1 day"),
            ("5/99999999999999999999d", "not a window"),
        ] {
            let e = raw.parse::<RateLimit>().unwrap_err().to_string();
            assert!(e.contains(says), "{raw}: {e}");
        }
        let hand_written = RateLimit {
            starts: 5,
            per_ms: 0,
        };
        assert!(hand_written
            .check()
            .unwrap_err()
            .to_string()
            .contains("1s to 1 day"));
    }
}
