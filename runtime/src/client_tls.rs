//! TLS material for belfry's client connections to Redis and RabbitMQ,
//! and the start-up check of the certificate files a Postgres URL names.
//!
//! Managed Redis and RabbitMQ services require TLS (`rediss://`,
//! `amqps://`), often with a private CA and sometimes with client
//! certificates. The server certificate is always verified: against the
//! system's trust store, or the CA given here (RabbitMQ trusts it beside
//! the system store, Redis instead of it). There is no setting that turns
//! verification off, and a `rediss://` or `amqps://` connection never falls
//! back to plaintext.
//!
//! Why the files are read here, once, at start: a path that is wrong must
//! stop the process with one line naming the variable and the file, not
//! surface later as a failed reconnect in the middle of the night. The PEM
//! bytes are kept in memory for every (re)connection; key material never
//! appears in `Debug` output or logs.

use std::path::{Path, PathBuf};

use crate::{SettingError, Settings};

/// TLS settings of one client connection: a CA to trust beside the system
/// trust store, and an optional client certificate.
#[derive(Clone, Default)]
pub struct ClientTls {
    /// The CA certificate(s) to trust, PEM, and the file they came from.
    pub ca: Option<PemFile>,
    /// The client certificate chain and its private key, PEM.
    pub identity: Option<ClientIdentity>,
}

/// The bytes of a PEM file and its path (for messages).
#[derive(Clone)]
pub struct PemFile {
    /// Where it was read from.
    pub path: PathBuf,
    /// Its content.
    pub pem: Vec<u8>,
    /// What it holds.
    pub kind: PemKind,
}

/// What a PEM file must hold: checked when it is read, so a wrong file is
/// a start-up error naming it, not a failed handshake later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PemKind {
    /// One or more `CERTIFICATE` blocks (a CA, or a chain leaf first).
    Certificates,
    /// One private key (PKCS#8, PKCS#1 or SEC1).
    PrivateKey,
}

/// A client certificate chain and its private key (PKCS#8 PEM, `BEGIN
/// PRIVATE KEY`), for servers that authenticate clients by certificate.
#[derive(Clone)]
pub struct ClientIdentity {
    /// The certificate chain, leaf first.
    pub cert: PemFile,
    /// The private key; never printed.
    pub key: PemFile,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field(
                "ca",
                &self.ca.as_ref().map(|c| c.path.display().to_string()),
            )
            .field(
                "client_cert",
                &self
                    .identity
                    .as_ref()
                    .map(|i| i.cert.path.display().to_string()),
            )
            .finish()
    }
}

impl ClientTls {
    /// Reads `{prefix}_CA`, `{prefix}_CERT` and `{prefix}_KEY` (e.g.
    /// `BELFRY_REDIS_TLS_CA`): each names a PEM file; all unset is plain
    /// system trust and no client certificate.
    ///
    /// # Errors
    ///
    /// [`SettingError::Invalid`] naming the variable and the file when a
    /// file cannot be read or holds no PEM block, or when only one of the
    /// certificate and the key is set.
    pub fn from_settings(settings: &Settings, prefix: &str) -> Result<Self, SettingError> {
        let file = |suffix: &str, kind| -> Result<Option<PemFile>, SettingError> {
            let var = format!("{prefix}_{suffix}");
            match settings.get(&var).map(str::trim).filter(|v| !v.is_empty()) {
                Some(path) => read_pem(&var, Path::new(path), kind).map(Some),
                None => Ok(None),
            }
        };
        let ca = file("CA", PemKind::Certificates)?;
        let cert = file("CERT", PemKind::Certificates)?;
        let key = file("KEY", PemKind::PrivateKey)?;
        let identity = match (cert, key) {
            (Some(cert), Some(key)) => Some(ClientIdentity { cert, key }),
            (None, None) => None,
            (Some(lone), None) | (None, Some(lone)) => {
                let (set, unset) = if lone.kind == PemKind::Certificates {
                    ("CERT", "KEY")
                } else {
                    ("KEY", "CERT")
                };
                return Err(SettingError::Invalid {
                    var: format!("{prefix}_{set}"),
                    value: lone.path.display().to_string(),
                    reason: format!(
                        "a client certificate needs both files: set {prefix}_{unset} too"
                    ),
                });
            }
        };
        Ok(Self { ca, identity })
    }

    /// Refuses TLS settings (read with `prefix`) beside a URL that does not
    /// use TLS: the credentials would go out in plaintext while the
    /// operator believes otherwise.
    ///
    /// # Errors
    ///
    /// [`SettingError::Invalid`] naming `url_var` and the scheme it needs.
    pub fn check_scheme(
        &self,
        prefix: &str,
        url_var: &str,
        url: &str,
        tls_scheme: &str,
    ) -> Result<(), SettingError> {
        let scheme = format!("{tls_scheme}://");
        // Its variants too: `rediss+sentinel://`, `rediss+cluster://`.
        let variant = format!("{tls_scheme}+");
        // A list of node URLs: every one of them.
        if !self.is_configured()
            || crate::endpoint::url_list(url)
                .iter()
                .all(|u| u.starts_with(&scheme) || u.starts_with(&variant))
        {
            return Ok(());
        }
        Err(SettingError::Invalid {
            var: url_var.to_owned(),
            value: crate::masked(url),
            reason: format!("{prefix}_* are set, so it must be a {tls_scheme}:// URL"),
        })
    }

    /// Whether anything beyond the system trust store is configured.
    pub fn is_configured(&self) -> bool {
        self.ca.is_some() || self.identity.is_some()
    }
}

/// Reads the PEM file `path` named by `var`, which must hold `kind`.
fn read_pem(var: &str, path: &Path, kind: PemKind) -> Result<PemFile, SettingError> {
    let invalid = |reason: String| SettingError::Invalid {
        var: var.to_owned(),
        value: path.display().to_string(),
        reason,
    };
    let pem = std::fs::read(path).map_err(|e| invalid(format!("cannot read the file: {e}")))?;
    match kind {
        PemKind::Certificates => {
            let certs = rustls_pemfile::certs(&mut pem.as_slice())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| invalid(format!("unreadable PEM: {e}")))?;
            if certs.is_empty() {
                return Err(invalid(
                    "the file holds no certificate (-----BEGIN CERTIFICATE-----)".into(),
                ));
            }
        }
        PemKind::PrivateKey => match rustls_pemfile::private_key(&mut pem.as_slice()) {
            Ok(Some(_)) => {}
            Ok(None) => {
                return Err(invalid(
                    "the file holds no private key (-----BEGIN PRIVATE KEY-----)".into(),
                ))
            }
            // The parser's error names a position, never the key's bytes.
            Err(e) => return Err(invalid(format!("unreadable PEM: {e}"))),
        },
    }
    Ok(PemFile {
        path: path.to_owned(),
        pem,
        kind,
    })
}

/// `BELFRY_DATABASE_DIRECT_URL`: the Postgres URL that bypasses a
/// transaction pooler, for `LISTEN` and the migrations; set only when
/// `database_url` (`DATABASE_URL`) leads through one (see the README's
/// "Production deployment"). Its TLS files are checked as
/// `DATABASE_URL`'s are.
///
/// # Errors
///
/// [`SettingError::Invalid`] when it is set beside a `sqlite:`
/// `DATABASE_URL`, is not a `postgres://`/`postgresql://` URL, or names a
/// TLS file that cannot be read.
pub fn database_direct_url(
    settings: &crate::setting::Settings,
    database_url: &str,
) -> Result<Option<String>, SettingError> {
    const VAR: &str = "BELFRY_DATABASE_DIRECT_URL";
    let Some(direct) = settings.get(VAR) else {
        return Ok(None);
    };
    let invalid = |reason: &str| SettingError::Invalid {
        var: VAR.to_owned(),
        value: crate::masked(direct),
        reason: reason.to_owned(),
    };
    if database_url.starts_with("sqlite:") {
        return Err(invalid(
            "it is for a Postgres ledger behind a transaction pooler; unset it with a sqlite: DATABASE_URL",
        ));
    }
    if !(direct.starts_with("postgres://") || direct.starts_with("postgresql://")) {
        return Err(invalid(
            "expected a postgres:// URL that reaches Postgres itself, not the pooler",
        ));
    }
    check_postgres_tls_files(VAR, direct)?;
    Ok(Some(direct.to_owned()))
}

/// Checks, at start, the TLS parameters of a Postgres URL (libpq's names,
/// which sqlx reads at every connect):
///
/// - `sslrootcert`, `sslcert` and `sslkey` must name readable files (a value
///   that is PEM text itself, which sqlx also accepts, is left alone);
/// - `sslrootcert` needs `sslmode=verify-ca` or `verify-full`: libpq then
///   verifies under `require` too, sqlx does not, so a URL written for
///   libpq would silently skip the verification it asks for;
/// - `sslpassword` is refused: sqlx cannot use encrypted keys, and it would
///   log the unknown parameter with its value.
///
/// Errors name the variable and the parameter, and the file, never a
/// value that could be key material.
///
/// # Errors
///
/// [`SettingError::Invalid`] as above.
pub fn check_postgres_tls_files(var: &str, url: &str) -> Result<(), SettingError> {
    // A URL that does not parse is left to sqlx, whose error names it; one
    // naming several hosts is checked through its first (the parameters
    // are the same for all).
    let one_host = crate::host_list::first_host_url(url);
    let Ok(parsed) = url::Url::parse(one_host.as_deref().unwrap_or(url)) else {
        return Ok(());
    };
    let invalid = |value: String, reason: String| SettingError::Invalid {
        var: var.to_owned(),
        value,
        reason,
    };
    let mut mode = None;
    let mut root_cert = false;
    for (name, value) in parsed.query_pairs() {
        let value = value.into_owned();
        match name.as_ref() {
            "sslmode" => mode = Some(value),
            "sslpassword" => {
                return Err(invalid(
                    "…sslpassword=…".into(),
                    "encrypted client keys are not supported; decrypt the key \
                     (openssl pkcs8 -topk8 -nocrypt) and drop sslpassword"
                        .into(),
                ))
            }
            "sslrootcert" | "sslcert" | "sslkey" if !value.is_empty() => {
                root_cert |= name == "sslrootcert";
                if value.trim_start().starts_with("-----BEGIN") {
                    continue;
                }
                if !Path::new(&value).is_file() {
                    let why = std::fs::File::open(&value)
                        .err()
                        .map_or_else(|| "not a file".to_owned(), |e| e.to_string());
                    return Err(invalid(
                        format!("…{name}={value}…"),
                        format!("cannot read the file {value}: {why}"),
                    ));
                }
            }
            _ => {}
        }
    }
    let verifies = matches!(mode.as_deref(), Some("verify-ca" | "verify-full"));
    if root_cert && !verifies {
        let mode = mode.unwrap_or_else(|| "prefer (the default)".into());
        return Err(invalid(
            format!("…sslmode={mode}…"),
            "sslrootcert is given but the server would not be verified under this sslmode; \
             use sslmode=verify-full (or verify-ca)"
                .into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> Settings {
        Settings::from_pairs(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        )
    }

    #[test]
    fn unset_is_system_trust_only() {
        let tls = ClientTls::from_settings(&settings(&[]), "BELFRY_REDIS_TLS").unwrap();
        assert!(!tls.is_configured());
    }

    #[test]
    fn a_missing_file_names_the_variable_and_the_file() {
        let e = ClientTls::from_settings(
            &settings(&[("BELFRY_AMQP_TLS_CA", "/nonexistent/ca.crt")]),
            "BELFRY_AMQP_TLS",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("BELFRY_AMQP_TLS_CA")
                && e.contains("/nonexistent/ca.crt")
                && e.contains("cannot read"),
            "{e}"
        );
    }

    #[test]
    fn a_file_without_pem_and_a_lone_key_are_refused() {
        let dir = std::env::temp_dir().join(format!("belfry-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let junk = dir.join("junk.pem");
        std::fs::write(&junk, "not a certificate").unwrap();
        let junk = junk.display().to_string();
        let e = ClientTls::from_settings(&settings(&[("X_CA", &junk)]), "X").unwrap_err();
        assert!(e.to_string().contains("no certificate"), "{e}");
        let e = ClientTls::from_settings(&settings(&[("X_KEY", &junk)]), "X").unwrap_err();
        assert!(e.to_string().contains("no private key"), "{e}");
        // A throwaway P-256 key made for this test: a real key, alone.
        let key = dir.join("key.pem");
        std::fs::write(
            &key,
            "-----BEGIN PRIVATE KEY-----\n\
             MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgt0EQebtxbcV4dxHJ\n\
             X+97t+MjwMr16kRRPcoHM1fGs2KhRANCAARS64kXMYbnrIfobcoAdiClo1nuNlXP\n\
             b7VLJh/p6CqW9j1SWUQEAblel1ENKE9hHULYtqNsfnMfpyBT36XJdvQX\n\
             -----END PRIVATE KEY-----\n",
        )
        .unwrap();
        let key = key.display().to_string();
        let e = ClientTls::from_settings(&settings(&[("X_KEY", &key)]), "X").unwrap_err();
        assert!(e.to_string().contains("set X_CERT too"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn postgres_url_files_are_checked_at_start() {
        assert!(check_postgres_tls_files("DATABASE_URL", "postgres://h/db").is_ok());
        let direct = |pairs: &[(&str, &str)], url: &str| {
            database_direct_url(&crate::setting::Settings::from_pairs(pairs.to_vec()), url)
        };
        assert_eq!(direct(&[], "postgres://pooler/db").unwrap(), None);
        let set = [("BELFRY_DATABASE_DIRECT_URL", "postgres://u:secret@db/x")];
        assert_eq!(
            direct(&set, "postgres://pooler/x").unwrap().as_deref(),
            Some("postgres://u:secret@db/x")
        );
        for (pairs, url, says) in [
            (&set[..], "sqlite:belfry.db", "sqlite"),
            (
                &[("BELFRY_DATABASE_DIRECT_URL", "db:5432")][..],
                "postgres://p/x",
                "postgres://",
            ),
        ] {
            let e = direct(pairs, url).unwrap_err().to_string();
            assert!(
                e.contains("BELFRY_DATABASE_DIRECT_URL") && e.contains(says),
                "{e}"
            );
            assert!(!e.contains("secret"), "{e}");
        }
        assert!(
            check_postgres_tls_files("DATABASE_URL", "postgres://h/db?sslmode=require").is_ok()
        );
        let e = check_postgres_tls_files(
            "DATABASE_URL",
            "postgres://h/db?sslmode=verify-full&sslrootcert=%2Fnonexistent%2Fca.crt",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("DATABASE_URL") && e.contains("/nonexistent/ca.crt"),
            "{e}"
        );
    }
}
