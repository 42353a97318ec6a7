//! The instant a run key names: the partition key of the ledger's runs.
//!
//! The ledger partitions `job_runs` by `key_instant`, computed by the SQL
//! function `belfry_key_instant(job_name, run_key)` on every insert (and
//! enforced by a CHECK). This is the same function in Rust, so a statement
//! that finds runs by key or id can name the instants it touches as plain
//! values: Postgres then prunes every other partition while planning,
//! instead of planning (and probing) all of them. The database never takes
//! this value on trust: statements keep their own per-row check, and a
//! statement that finds fewer rows with the hint than it should is run again
//! without it, so a disagreement costs speed, never a result. A test
//! compares both functions over every kind of key.
//!
//! The rules: a key `{job_name}@{identity}` whose identity is an instant in
//! the exact form of fire keys (`2026-07-26T03:00:00Z`, a day that exists)
//! names that instant; one whose identity is a lower-case UUIDv7 (a keyless
//! ad-hoc run) names its clock, to the second; every other key (idempotency
//! keys, keys of another name) names 1970-01-01T00:00:00Z.

use chrono::{DateTime, NaiveDate, Utc};

/// The instant `run_key` of `job_name` names (see the module notes).
pub fn key_instant(job_name: &str, run_key: &str) -> DateTime<Utc> {
    run_key
        .strip_prefix(job_name)
        .and_then(|rest| rest.strip_prefix('@'))
        .and_then(|identity| fire_instant(identity).or_else(|| uuid_v7_instant(identity)))
        .unwrap_or(DateTime::UNIX_EPOCH)
}

/// `YYYY-MM-DDTHH:MM:SSZ`, year 1000 to 9999, a real day; nothing else.
fn fire_instant(identity: &str) -> Option<DateTime<Utc>> {
    let b = identity.as_bytes();
    if b.len() != 20
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
        || b[19] != b'Z'
    {
        return None;
    }
    let num = |from: usize, to: usize| -> Option<u32> {
        let digits = &b[from..to];
        if !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(digits).ok()?.parse().ok()
    };
    let (year, month, day) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (hour, minute, second) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    if year < 1000 || hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    let date = NaiveDate::from_ymd_opt(i32::try_from(year).ok()?, month, day)?;
    Some(date.and_hms_opt(hour, minute, second)?.and_utc())
}

/// A lower-case hyphenated UUID of version 7 (variant 10xx): its clock, in
/// whole seconds.
fn uuid_v7_instant(identity: &str) -> Option<DateTime<Utc>> {
    let b = identity.as_bytes();
    if b.len() != 36 {
        return None;
    }
    for (i, c) in b.iter().enumerate() {
        let ok = match i {
            8 | 13 | 18 | 23 => *c == b'-',
            14 => *c == b'7',
            19 => matches!(c, b'8' | b'9' | b'a' | b'b'),
            _ => c.is_ascii_digit() || (b'a'..=b'f').contains(c),
        };
        if !ok {
            return None;
        }
    }
    let hex = format!("{}{}", identity.get(0..8)?, identity.get(9..13)?);
    let millis = i64::from_str_radix(&hex, 16).ok()?;
    DateTime::from_timestamp(millis / 1000, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().to_utc()
    }

    #[test]
    fn fire_keys_name_their_instant() {
        assert_eq!(
            key_instant("nightly", "nightly@2026-07-26T03:00:00Z"),
            at("2026-07-26T03:00:00Z")
        );
        assert_eq!(
            key_instant("n", "n@2024-02-29T23:59:59Z"),
            at("2024-02-29T23:59:59Z")
        );
    }

    #[test]
    fn uuid_v7_keys_name_their_clock_to_the_second() {
        // 0x01938f2a1c3e ms = 1733273721918 ms (what Postgres computes).
        assert_eq!(
            key_instant("j", "j@01938f2a-1c3e-7abc-8def-0123456789ab"),
            DateTime::from_timestamp(1_733_273_721, 0).unwrap()
        );
    }

    #[test]
    fn every_other_key_names_the_epoch() {
        for (name, key) in [
            ("n", "n@2026-02-30T00:00:00Z"),
            ("n", "n@2025-02-29T00:00:00Z"),
            ("n", "n@0999-01-01T00:00:00Z"),
            ("n", "n@2026-01-01T24:00:00Z"),
            ("n", "n@2026-01-01T00:00:60Z"),
            ("n", "n@2026-01-01 00:00:00Z"),
            ("n", "n@2026-01-01T00:00:00z"),
            ("n", "n@2026-01-01T00:00:00+00:00"),
            ("n", "n@+026-01-01T00:00:00Z"),
            ("n", "n@01938F2A-1C3E-7ABC-8DEF-0123456789AB"),
            ("n", "n@01938f2a-1c3e-4abc-8def-0123456789ab"),
            ("n", "n@01938f2a-1c3e-7abc-cdef-0123456789ab"),
            ("n", "other@2026-07-26T03:00:00Z"),
            ("n", "n2026-07-26T03:00:00Z"),
            ("n", "n@invoice-42"),
            ("n", "n@"),
        ] {
            assert_eq!(key_instant(name, key), DateTime::UNIX_EPOCH, "{key}");
        }
    }
}
