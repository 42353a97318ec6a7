//! Service URLs, safe to print.
//!
//! Connection errors name the URL they tried so an operator can see which
//! service and address is wrong, but a URL may carry a password
//! (`postgres://app:s3cret@db/belfry`). [`masked`] replaces the password
//! with `***` before a URL reaches a log line or an error message.

/// Returns `url` with any password in its userinfo replaced by `***`.
///
/// Works on any `scheme://user:password@host...` URL without parsing the
/// rest, so it never fails and never drops information other than the
/// secret.
pub fn masked(url: &str) -> String {
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
    use super::masked;

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
