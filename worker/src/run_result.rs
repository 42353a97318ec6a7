//! A run's result (issue 22): a small JSON value a handler sets with
//! [`crate::JobContext::set_result`]. The worker stores it in the
//! successful attempt's entry (`attempt_log`, shown by `GET /v1/runs/{id}`)
//! and the follow-up pass hands it to the run's follow-ups
//! (`belfry_protocol::ParentRun::result`, `ctx.parents` in a handler).
//!
//! - **Small by design**: at most [`MAX_RESULT_BYTES`] of JSON; it travels
//!   in every follow-up's message. Bulk data belongs in your own store,
//!   with its key as the result.
//! - **Refused, not mangled**: a value over the bound or holding a NUL
//!   character (which Postgres' `jsonb` cannot store) is refused when set,
//!   with the reason, so the outcome's write never fails on it.
//! - Only a succeeded attempt's result is kept; a later `set_result` in
//!   the same attempt replaces an earlier one.

use std::sync::{Arc, Mutex, PoisonError};

/// The most bytes of JSON a result may take.
pub const MAX_RESULT_BYTES: usize = 64 * 1024;

/// Where an attempt's result waits for its outcome. Cheap to clone (the
/// clones share it).
#[derive(Debug, Clone, Default)]
pub struct RunResult {
    slot: Arc<Mutex<Option<serde_json::Value>>>,
}

/// Why a result was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResultError {
    /// The value could not be encoded as JSON.
    #[error("the run's result cannot be encoded as JSON: {0}")]
    Encode(String),
    /// Over [`MAX_RESULT_BYTES`].
    #[error("the run's result takes {bytes} bytes of JSON, more than the {MAX_RESULT_BYTES} allowed; store bulk data elsewhere and return its key")]
    TooLarge {
        /// Its size.
        bytes: usize,
    },
    /// A string (or key) holds a NUL character.
    #[error("the run's result holds a NUL character, which the ledger cannot store; remove it or encode the value (e.g. base64)")]
    Nul,
}

impl From<ResultError> for crate::JobError {
    /// A refused result is the handler's bug: the run fails for good.
    fn from(e: ResultError) -> Self {
        Self::Permanent(e.to_string())
    }
}

impl RunResult {
    /// Checks and keeps `value` as the attempt's result.
    ///
    /// # Errors
    ///
    /// [`ResultError`] when it cannot be encoded, is over the bound or
    /// holds a NUL; the result kept before (if any) stays.
    pub fn set<T: serde::Serialize + ?Sized>(&self, value: &T) -> Result<(), ResultError> {
        let value = serde_json::to_value(value).map_err(|e| ResultError::Encode(e.to_string()))?;
        if has_nul(&value) {
            return Err(ResultError::Nul);
        }
        let bytes = value.to_string().len();
        if bytes > MAX_RESULT_BYTES {
            return Err(ResultError::TooLarge { bytes });
        }
        *self.slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(value);
        Ok(())
    }

    /// The result set, taken (the worker's, at a successful outcome).
    pub(crate) fn take(&self) -> Option<serde_json::Value> {
        self.slot
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

/// Whether any string or key in `v` holds a NUL.
fn has_nul(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::String(s) => s.contains('\0'),
        serde_json::Value::Array(a) => a.iter().any(has_nul),
        serde_json::Value::Object(o) => o.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_is_kept_replaced_and_refused_with_the_reason() {
        let r = RunResult::default();
        assert_eq!(r.set(&serde_json::json!({"rows": 1})), Ok(()));
        assert_eq!(r.set(&serde_json::json!({"rows": 2})), Ok(()));
        let big = "x".repeat(MAX_RESULT_BYTES);
        assert!(matches!(r.set(&big), Err(ResultError::TooLarge { .. })));
        assert_eq!(
            r.set(&serde_json::json!({"k": ["a\0b"]})),
            Err(ResultError::Nul)
        );
        assert_eq!(r.set(&serde_json::json!({"a\0": 1})), Err(ResultError::Nul));
        // Refused values leave the last good one.
        assert_eq!(r.take(), Some(serde_json::json!({"rows": 2})));
        assert_eq!(r.take(), None);
        let e: crate::JobError = ResultError::Nul.into();
        assert!(matches!(e, crate::JobError::Permanent(m) if m.contains("NUL")));
    }
}
