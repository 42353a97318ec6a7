//! Bearer tokens: who may read and who may change.
//!
//! Tokens come from `BELFRY_API_ADMIN_TOKENS` and `BELFRY_API_READ_TOKENS`,
//! each a comma-separated list of `name:secret` (the name is what the audit
//! log records; a bare `secret` is named `admin-1`, `read-1`, ...). Secrets
//! are kept only as SHA-256 digests and compared in constant time against
//! every configured token, so neither a secret's content nor which entry
//! matched leaks through timing. With no token configured the API is open,
//! which [`super::serve`] allows on loopback addresses only.

use axum::extract::{Request, State};
use axum::http::{header::AUTHORIZATION, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::error::ApiError;
use super::ApiState;

/// Shortest accepted secret.
pub const MIN_SECRET_LEN: usize = 16;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `GET` everything, change nothing.
    Read,
    /// Everything.
    Admin,
}

/// The authenticated caller of a request (a request extension).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The token's name (`anonymous` when the API is open).
    pub name: String,
    /// What it may do.
    pub role: Role,
}

#[derive(Clone)]
struct Entry {
    name: String,
    role: Role,
    digest: [u8; 32],
}

/// The configured tokens. `Debug` shows names and roles, never secrets.
#[derive(Default, Clone)]
pub struct Tokens {
    entries: Vec<Entry>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(
                self.entries
                    .iter()
                    .map(|e| format!("{}:{:?}:***", e.name, e.role)),
            )
            .finish()
    }
}

/// A token list that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{variable}: {message}")]
pub struct TokenError {
    /// The variable holding the list.
    pub variable: &'static str,
    /// What is wrong (never the secret itself).
    pub message: String,
}

impl Tokens {
    /// Parses the admin and read-only lists.
    ///
    /// # Errors
    ///
    /// [`TokenError`] naming the variable when an entry has an empty or bad
    /// name, a secret shorter than [`MIN_SECRET_LEN`], or a repeated name.
    pub fn parse(admin: Option<&str>, read: Option<&str>) -> Result<Self, TokenError> {
        let mut tokens = Self::default();
        tokens.add("BELFRY_API_ADMIN_TOKENS", admin, Role::Admin, "admin")?;
        tokens.add("BELFRY_API_READ_TOKENS", read, Role::Read, "read")?;
        Ok(tokens)
    }

    fn add(
        &mut self,
        variable: &'static str,
        list: Option<&str>,
        role: Role,
        prefix: &str,
    ) -> Result<(), TokenError> {
        let err = |message: String| TokenError { variable, message };
        for (i, item) in list
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .enumerate()
        {
            let (name, secret) = match item.split_once(':') {
                Some((name, secret)) => (name.trim().to_owned(), secret.trim()),
                None => (format!("{prefix}-{}", i + 1), item),
            };
            belfry_protocol::validate_name("token name", &name)
                .map_err(|e| err(format!("entry {}: {e}", i + 1)))?;
            if secret.len() < MIN_SECRET_LEN {
                return Err(err(format!(
                    "the secret of token {name:?} is shorter than {MIN_SECRET_LEN} characters; \
                     use a long random value (e.g. `openssl rand -hex 32`)"
                )));
            }
            if self.entries.iter().any(|e| e.name == name) {
                return Err(err(format!("token name {name:?} is used twice")));
            }
            let digest: [u8; 32] = Sha256::digest(secret.as_bytes()).into();
            if let Some(other) = self.entries.iter().find(|e| e.digest == digest) {
                return Err(err(format!(
                    "token {name:?} has the same secret as token {:?}; every token needs its own",
                    other.name
                )));
            }
            self.entries.push(Entry { name, role, digest });
        }
        Ok(())
    }

    /// Whether no token is configured (the API is open).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The caller `secret` belongs to, if any.
    pub fn check(&self, secret: &str) -> Option<Caller> {
        let presented: [u8; 32] = Sha256::digest(secret.as_bytes()).into();
        let mut found: Option<&Entry> = None;
        // Every entry is compared, match or not: the time taken does not
        // depend on which entry (if any) matched.
        for entry in &self.entries {
            if bool::from(entry.digest.ct_eq(&presented)) {
                found = Some(entry);
            }
        }
        found.map(|e| Caller {
            name: e.name.clone(),
            role: e.role,
        })
    }
}

/// Paths anyone may read: probes and the API description.
const PUBLIC: [&str; 3] = ["/healthz", "/readyz", "/openapi.json"];

/// Web view paths that need no token (still refused cross-site).
const UI_PUBLIC: [&str; 4] = [
    "/ui/login",
    "/ui/logout",
    "/ui/assets/ui.css",
    "/ui/assets/ui.js",
];

/// Middleware: authenticates the request and checks its method against the
/// caller's role; the [`Caller`] is left in the request's extensions.
pub async fn authorize(
    State(state): State<ApiState>,
    mut request: Request,
    next: Next,
) -> Response {
    if PUBLIC.contains(&request.uri().path()) {
        return next.run(request).await;
    }
    if let Err(e) = same_site(&state, &request) {
        return e.into_response();
    }
    if UI_PUBLIC.contains(&request.uri().path()) {
        return next.run(request).await;
    }
    let caller = match caller_of(&state, &request) {
        Ok(caller) => caller,
        // A browser without a (valid) token is sent to sign in.
        Err(_) if request.uri().path().starts_with("/ui") => {
            return (
                axum::http::StatusCode::SEE_OTHER,
                [(axum::http::header::LOCATION, "/ui/login")],
            )
                .into_response();
        }
        Err(e) => return e.into_response(),
    };
    let reading = matches!(*request.method(), Method::GET | Method::HEAD);
    if !reading && caller.role != Role::Admin {
        return ApiError::forbidden(format!(
            "token {:?} is read-only; changes need a token from BELFRY_API_ADMIN_TOKENS",
            caller.name
        ))
        .into_response();
    }
    request.extensions_mut().insert(caller);
    next.run(request).await
}

/// Refuses what a web page in the operator's browser could send: a request
/// from another origin (browsers send `Origin` on cross-site `POST`s, which
/// need no preflight), and, while the API is open (no token), a `Host` that
/// is not a loopback name, which is how DNS rebinding reaches a loopback
/// service. Scripts and the CLI send no `Origin` and a loopback `Host`.
fn same_site(state: &ApiState, request: &Request) -> Result<(), ApiError> {
    let header = |name: &str| {
        request
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let host = header("host").unwrap_or_default();
    // Following a link to the web view from elsewhere (a chat, Grafana) is
    // a top-level GET navigation: it changes nothing and is let through.
    let navigation = request.method() == Method::GET
        && request.uri().path().starts_with("/ui")
        && header("sec-fetch-mode").is_some_and(|m| m == "navigate");
    if header("sec-fetch-site").is_some_and(|s| s == "cross-site") && !navigation {
        return Err(ApiError::forbidden("cross-site requests are refused"));
    }
    if let Some(origin) = header("origin") {
        let authority = origin
            .split_once("://")
            .map_or(origin.as_str(), |(_, rest)| rest);
        if !authority.eq_ignore_ascii_case(&host) {
            return Err(ApiError::forbidden(format!(
                "requests from origin {origin:?} are refused; the API only answers its own origin"
            )));
        }
    }
    if state.tokens().is_empty() && !loopback_host(&host) {
        return Err(ApiError::forbidden(
            "the API has no token configured and only answers requests addressed to a loopback \
             host (127.0.0.1, [::1] or localhost); configure BELFRY_API_ADMIN_TOKENS to serve others",
        ));
    }
    Ok(())
}

/// Whether `host` (a `Host` header: name or address, optional port) names
/// this machine's loopback.
fn loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        host.rsplit_once(':').map_or(host, |(name, _)| name)
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The value of cookie `name`, percent-decoded.
fn cookie(request: &Request, name: &str) -> Option<String> {
    request
        .headers()
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| {
            form_urlencoded::parse(format!("v={v}").as_bytes())
                .next()
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default()
        })
}

fn caller_of(state: &ApiState, request: &Request) -> Result<Caller, ApiError> {
    let tokens = state.tokens();
    if tokens.is_empty() {
        return Ok(Caller {
            name: "anonymous".into(),
            role: Role::Admin,
        });
    }
    // A browser of the web view presents the token as a cookie; the API
    // under /v1 takes bearer headers only, so no cookie can act on it.
    if request.headers().get(AUTHORIZATION).is_none() && request.uri().path().starts_with("/ui") {
        if let Some(secret) = cookie(request, crate::ui::TOKEN_COOKIE) {
            return tokens
                .check(&secret)
                .ok_or_else(|| ApiError::unauthorized("the token is not valid"));
        }
    }
    let header = request
        .headers()
        .get(AUTHORIZATION)
        .ok_or_else(|| ApiError::unauthorized("send `Authorization: Bearer <token>`"))?;
    let secret = header
        .to_str()
        .ok()
        .and_then(|h| h.split_once(' '))
        // The scheme is case-insensitive (RFC 9110 section 11.1).
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, secret)| secret.trim())
        .ok_or_else(|| {
            ApiError::unauthorized("the Authorization header must be `Bearer <token>`")
        })?;
    tokens
        .check(secret)
        .ok_or_else(|| ApiError::unauthorized("the token is not valid"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_checks_and_hides_secrets() {
        let t = Tokens::parse(
            Some("ops:0123456789abcdef-admin, 0123456789abcdef-bare"),
            Some("grafana:0123456789abcdef-read"),
        )
        .unwrap();
        assert_eq!(
            t.check("0123456789abcdef-admin"),
            Some(Caller {
                name: "ops".into(),
                role: Role::Admin
            })
        );
        assert_eq!(
            t.check("0123456789abcdef-bare").map(|c| c.name),
            Some("admin-2".into())
        );
        assert_eq!(
            t.check("0123456789abcdef-read").map(|c| c.role),
            Some(Role::Read)
        );
        assert_eq!(t.check("0123456789abcdef-nope"), None);
        assert_eq!(t.check(""), None);
        let shown = format!("{t:?}");
        assert!(!shown.contains("0123456789abcdef"), "{shown}");
    }

    #[test]
    fn loopback_hosts() {
        for ok in [
            "127.0.0.1:8080",
            "localhost",
            "LOCALHOST:1",
            "[::1]:8080",
            "127.1.2.3",
        ] {
            assert!(loopback_host(ok), "{ok}");
        }
        for bad in [
            "evil.example:8080",
            "",
            "10.0.0.1:80",
            "[2001:db8::1]:80",
            "localhost.evil.example",
        ] {
            assert!(!loopback_host(bad), "{bad}");
        }
    }

    #[test]
    fn refuses_short_secrets_bad_names_and_repeats() {
        let e = Tokens::parse(Some("ops:short"), None).unwrap_err();
        assert_eq!(e.variable, "BELFRY_API_ADMIN_TOKENS");
        assert!(e.message.contains("shorter than 16"), "{e}");
        assert!(!e.to_string().contains("short\""), "{e}");
        let e = Tokens::parse(None, Some("a b:0123456789abcdef")).unwrap_err();
        assert_eq!(e.variable, "BELFRY_API_READ_TOKENS");
        let e =
            Tokens::parse(Some("x:0123456789abcdef1"), Some("x:0123456789abcdef2")).unwrap_err();
        assert!(e.message.contains("twice"), "{e}");
        let e =
            Tokens::parse(Some("a:0123456789abcdef1"), Some("b:0123456789abcdef1")).unwrap_err();
        assert!(
            e.message.contains("same secret") && !e.message.contains("0123"),
            "{e}"
        );
        assert!(Tokens::parse(None, None).unwrap().is_empty());
    }
}
