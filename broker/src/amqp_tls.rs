//! TLS for an `amqps://` RabbitMQ: belfry's PEM settings
//! ([`belfry_runtime::ClientTls`]) as lapin's TLS configuration.
//!
//! lapin (through `tcp-stream`, rustls) verifies the server against the
//! system trust store plus the CA given here, and takes a client
//! certificate only as a PKCS#12 bundle. Operators hold PEM files (what
//! Redis, Postgres and RabbitMQ's own docs hand out), so the certificate
//! chain and its PKCS#8 key are packed into a PKCS#12 bundle in memory,
//! once, at start. No setting turns verification off, and an `amqps://`
//! connection never falls back to plaintext.

use belfry_runtime::ClientTls;
use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};

/// The password of the in-memory PKCS#12 bundle: it never leaves the
/// process, so it protects nothing and need not be secret.
const BUNDLE_PASSWORD: &str = "belfry";

/// Why the TLS material cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{what} ({path}): {reason}")]
pub struct TlsMaterialError {
    /// Which setting: `BELFRY_AMQP_TLS_CA`, `_CERT`, `_KEY`, or `AMQP_URL`.
    pub what: &'static str,
    /// The file it came from (for `AMQP_URL`: the URL, password masked).
    pub path: String,
    /// What is wrong and how to fix it.
    pub reason: String,
}

/// `tls` as lapin's configuration: the CA chain as PEM text, the client
/// certificate and key as a PKCS#12 bundle.
///
/// # Errors
///
/// [`TlsMaterialError`] naming the file when the CA is not UTF-8 PEM, a
/// certificate does not parse, or the key is not a PKCS#8 private key.
pub fn lapin_tls(tls: &ClientTls) -> Result<OwnedTLSConfig, TlsMaterialError> {
    let cert_chain = match &tls.ca {
        Some(ca) => Some(
            String::from_utf8(ca.pem.clone()).map_err(|_| TlsMaterialError {
                what: "BELFRY_AMQP_TLS_CA",
                path: ca.path.display().to_string(),
                reason: "not a text PEM file".into(),
            })?,
        ),
        None => None,
    };
    let identity = match &tls.identity {
        Some(id) => {
            let cert_err = |reason: String| TlsMaterialError {
                what: "BELFRY_AMQP_TLS_CERT",
                path: id.cert.path.display().to_string(),
                reason,
            };
            let key_err = |reason: String| TlsMaterialError {
                what: "BELFRY_AMQP_TLS_KEY",
                path: id.key.path.display().to_string(),
                reason,
            };
            let chain = rustls_pemfile::certs(&mut id.cert.pem.as_slice())
                .map(|der| {
                    let der = der.map_err(|e| cert_err(format!("unreadable PEM: {e}")))?;
                    p12_keystore::Certificate::from_der(der.as_ref())
                        .map_err(|e| cert_err(format!("not an X.509 certificate: {e}")))
                })
                .collect::<Result<Vec<_>, _>>()?;
            if chain.is_empty() {
                return Err(cert_err("no CERTIFICATE block".into()));
            }
            let key = match rustls_pemfile::private_key(&mut id.key.pem.as_slice()) {
                Ok(Some(rustls_pki_types::PrivateKeyDer::Pkcs8(key))) => {
                    key.secret_pkcs8_der().to_vec()
                }
                Ok(Some(_)) => {
                    return Err(key_err(
                        "the key is not PKCS#8 (BEGIN PRIVATE KEY); convert it with \
                         `openssl pkcs8 -topk8 -nocrypt -in KEY -out KEY.pk8`"
                            .into(),
                    ))
                }
                Ok(None) => return Err(key_err("no PRIVATE KEY block".into())),
                Err(e) => return Err(key_err(format!("unreadable PEM: {e}"))),
            };
            let mut store = p12_keystore::KeyStore::new();
            store.add_entry(
                "belfry",
                p12_keystore::KeyStoreEntry::PrivateKeyChain(p12_keystore::PrivateKeyChain::new(
                    key, b"belfry", chain,
                )),
            );
            let der = store
                .writer(BUNDLE_PASSWORD)
                .write()
                .map_err(|e| key_err(format!("cannot bundle the key with its certificate: {e}")))?;
            Some(OwnedIdentity {
                der,
                password: BUNDLE_PASSWORD.into(),
            })
        }
        None => None,
    };
    Ok(OwnedTLSConfig {
        identity,
        cert_chain,
    })
}

/// A copy of `tls` for one more connection attempt (lapin takes the
/// configuration by value and `OwnedTLSConfig` is not `Clone`).
pub(crate) fn copy(tls: &OwnedTLSConfig) -> OwnedTLSConfig {
    OwnedTLSConfig {
        identity: tls.identity.as_ref().map(|id| OwnedIdentity {
            der: id.der.clone(),
            password: id.password.clone(),
        }),
        cert_chain: tls.cert_chain.clone(),
    }
}
