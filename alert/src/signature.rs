//! Webhook signatures, as the Standard Webhooks specification (1.0)
//! writes them, so receivers can verify with its libraries (Svix, ...) or
//! a few lines of their own.
//!
//! The signed content is `{webhook-id}.{webhook-timestamp}.{body}`; the
//! signature is HMAC-SHA256 with the shared secret, base64, sent as
//! `webhook-signature: v1,<base64>`. The timestamp (Unix seconds) is part
//! of what is signed, so a receiver can refuse replays older than a few
//! minutes; each attempt is signed again with its own timestamp. A secret
//! written `whsec_<base64>` (the standard's form) signs with the decoded
//! bytes; any other secret signs with its UTF-8 bytes.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The prefix of a Standard Webhooks secret.
const SECRET_PREFIX: &str = "whsec_";

/// The key bytes of `secret`.
pub fn key_of(secret: &str) -> Vec<u8> {
    secret
        .strip_prefix(SECRET_PREFIX)
        .and_then(|b64| STANDARD.decode(b64).ok())
        .unwrap_or_else(|| secret.as_bytes().to_vec())
}

/// The `webhook-signature` value (`v1,<base64>`) of `body` sent as
/// message `id` at `timestamp` (Unix seconds), signed with `key`.
pub fn sign(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    // HMAC takes keys of any length; `new_from_slice` cannot fail for it.
    let mut mac = match Hmac::<Sha256>::new_from_slice(key) {
        Ok(mac) => mac,
        Err(_) => unreachable!("HMAC-SHA256 accepts keys of every length"),
    };
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
}

/// Whether `header` (a `webhook-signature` value: space-separated
/// `v1,<base64>` signatures) holds a valid signature of the message, in
/// constant time per signature. For receivers written in Rust and for
/// tests.
pub fn verify(key: &[u8], id: &str, timestamp: i64, body: &[u8], header: &str) -> bool {
    header.split(' ').any(|candidate| {
        let Some(b64) = candidate.strip_prefix("v1,") else {
            return false;
        };
        let Ok(given) = STANDARD.decode(b64) else {
            return false;
        };
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else {
            return false;
        };
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac.verify_slice(&given).is_ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The specification's own example (standard-webhooks, spec/standard-webhooks.md).
    #[test]
    fn matches_the_standard_webhooks_test_vector() {
        let key = key_of("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD");
        let body = br#"{"email":"test@example.com","username":"test_user"}"#;
        let signature = sign(&key, "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk", 1649367553, body);
        assert_eq!(signature, "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=");
        assert!(verify(
            &key,
            "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk",
            1649367553,
            body,
            &format!("v1,bogus {signature}")
        ));
        // Another body, id, time or key: refused.
        assert!(!verify(
            &key,
            "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk",
            1649367553,
            b"{}",
            &signature
        ));
        assert!(!verify(&key, "msg_other", 1649367553, body, &signature));
        assert!(!verify(
            &key,
            "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk",
            1649367554,
            body,
            &signature
        ));
        assert!(!verify(
            b"wrong",
            "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk",
            1649367553,
            body,
            &signature
        ));
    }

    #[test]
    fn a_plain_secret_signs_with_its_bytes() {
        assert_eq!(key_of("s3cret"), b"s3cret".to_vec());
        // Not valid base64 after the prefix: the whole text is the key.
        assert_eq!(key_of("whsec_!!"), b"whsec_!!".to_vec());
    }
}
