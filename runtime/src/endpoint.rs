//! Service URLs, safe to print.
//!
//! Connection errors name the URL they tried so an operator can see which
//! service and address is wrong, but a URL may carry a password
//! (`postgres://app:s3cret@db/belfry`). [`masked`] replaces the password
//! with `***` before a URL reaches a log line or an error message.
//!
//! A setting may also hold a list of node URLs of one cluster
//! (`AMQP_URL=amqp://u:p@mq1/%2f,amqp://u:p@mq2/%2f`): [`url_list`] splits
//! it, and [`masked`] masks every URL of it.

/// The URLs of a comma-separated list of node URLs, trimmed; a single URL
/// is a list of one. A comma splits only where a new `scheme://` follows
/// it (or nothing does), so a comma inside a URL (a password, a libpq host
/// list such as `postgres://h1,h2/db`) stays in that URL.
pub fn url_list(list: &str) -> Vec<&str> {
    let mut urls = Vec::new();
    let mut start = 0;
    for (i, _) in list.match_indices(',') {
        let rest = list[i + 1..].trim_start();
        if rest.is_empty() || starts_with_scheme(rest) {
            urls.push(list[start..i].trim());
            start = i + 1;
        }
    }
    urls.push(list[start..].trim());
    urls.retain(|u| !u.is_empty());
    urls
}

/// Whether `s` starts with `scheme://` (RFC 3986: a letter, then letters,
/// digits, `+`, `-` or `.`).
fn starts_with_scheme(s: &str) -> bool {
    let Some(end) = s.find("://") else {
        return false;
    };
    let scheme = &s[..end];
    scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// Returns `url` with any password in its userinfo replaced by `***`; a
/// list of URLs ([`url_list`]) has each of its URLs masked.
///
/// Works on any `scheme://user:password@host...` URL without parsing the
/// rest, so it never fails and never drops information other than the
/// secret.
pub fn masked(url: &str) -> String {
    let urls = url_list(url);
    if urls.len() > 1 {
        return urls
            .into_iter()
            .map(masked_one)
            .collect::<Vec<_>>()
            .join(",");
    }
    masked_one(url)
}

fn masked_one(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest_start = scheme_end + 3;
    let rest = &url[rest_start..];
    // The authority ends at the first '/', '?' or '#'; userinfo is before
    // its last '@'.
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let Some(at) = authority.rfind('@') else {
        return url.to_owned();
    };
    let userinfo = &authority[..at];
    let Some(colon) = userinfo.find(':') else {
        return url.to_owned();
    };
    format!(
        "{}{}:***{}",
        &url[..rest_start],
        &userinfo[..colon],
        &rest[at..]
    )
}

#[cfg(test)]
mod tests {
    use super::{masked, url_list};

    #[test]
    fn lists_split_only_before_a_scheme() {
        assert_eq!(
            url_list("amqp://a:p,w@mq1/%2f, amqps://mq2/%2f ,amqp://mq3"),
            ["amqp://a:p,w@mq1/%2f", "amqps://mq2/%2f", "amqp://mq3"]
        );
        assert_eq!(url_list("postgres://h1,h2/db"), ["postgres://h1,h2/db"]);
        assert_eq!(url_list("amqp://mq1/, "), ["amqp://mq1/"]);
        assert!(url_list(" ").is_empty());
        assert_eq!(
            masked("amqp://u:one@mq1/%2f,amqp://u:two@mq2/%2f"),
            "amqp://u:***@mq1/%2f,amqp://u:***@mq2/%2f"
        );
    }

    #[test]
    fn masks_passwords_only() {
        assert_eq!(
            masked("postgres://app:s3cret@db:5432/belfry?sslmode=require"),
            "postgres://app:***@db:5432/belfry?sslmode=require"
        );
        assert_eq!(
            masked("amqp://guest:gu@st@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
        assert_eq!(masked("redis://127.0.0.1:6379/"), "redis://127.0.0.1:6379/");
        assert_eq!(masked("redis://user@host/"), "redis://user@host/");
        assert_eq!(masked("not a url"), "not a url");
    }
}
