//! A run's result (issue 22): a small JSON value a handler sets with
//! [`crate::JobContext::set_result`]. The worker stores it in the
//! successful attempt's entry (`attempt_log`, shown by `GET /v1/runs/{id}`)
//! and the follow-up pass hands it to the run's follow-ups
//! (`belfry_protocol::ParentRun::result`, `ctx.parents` in a handler).
//!
//! - **Small by design**: at most [`MAX_RESULT_BYTES`] of JSON; it travels
//!   in every follow-up's message. Bulk data belongs in your own store,
//!   with its key as the result.
//! - **Refused, not mangled**: a value over the bound, nested deeper than
//!   [`MAX_RESULT_DEPTH`] (every reader of a row or a message refuses JSON
//!   past 128 levels, and the result sits a few levels down in each) or
//!   holding a NUL character (which Postgres' `jsonb` cannot store) is
//!   refused when set, with the reason, so the outcome's write and every
//!   later read of the run and its follow-ups never fail on it.
//! - Only a succeeded attempt's result is kept; a later `set_result` in
//!   the same attempt replaces an earlier one.

use std::sync::{Arc, Mutex, PoisonError};

/// The most bytes of JSON a result may take.
pub const MAX_RESULT_BYTES: usize = 64 * 1024;

/// The deepest a result may nest (arrays and objects).
pub const MAX_RESULT_DEPTH: usize = 32;

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
    /// Nested deeper than [`MAX_RESULT_DEPTH`].
    #[error("the run's result nests {depth} levels deep, more than the {MAX_RESULT_DEPTH} allowed; flatten it")]
    TooDeep {
        /// How deep it nests.
        depth: usize,
    },
    /// A string (or key) holds a NUL character; says where.
    #[error("{0}; remove it or encode the value (e.g. base64)")]
    Nul(String),
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
    /// [`ResultError`] when it cannot be encoded, is over a bound or
    /// holds a NUL; the result kept before (if any) stays.
    pub fn set<T: serde::Serialize + ?Sized>(&self, value: &T) -> Result<(), ResultError> {
        let value = serde_json::to_value(value).map_err(|e| ResultError::Encode(e.to_string()))?;
        let depth = depth(&value);
        if depth > MAX_RESULT_DEPTH {
            return Err(ResultError::TooDeep { depth });
        }
        belfry_protocol::check_storable_json("result", &value)
            .map_err(|e| ResultError::Nul(e.to_string()))?;
        let bytes = value.to_string().len();
        if bytes > MAX_RESULT_BYTES {
            return Err(ResultError::TooLarge { bytes });
        }
        *self.slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(value);
        Ok(())
    }

    /// The result set so far (a handler's unit test reads it back).
    pub fn get(&self) -> Option<serde_json::Value> {
        self.slot
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The result set, taken (the worker's, at a successful outcome).
    pub(crate) fn take(&self) -> Option<serde_json::Value> {
        self.slot
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

/// How deep `v` nests (a scalar is 0, `[1]` is 1), counted without
/// recursion.
fn depth(v: &serde_json::Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(v, 0usize)];
    while let Some((v, d)) = stack.pop() {
        deepest = deepest.max(d);
        match v {
            serde_json::Value::Array(a) => stack.extend(a.iter().map(|x| (x, d + 1))),
            serde_json::Value::Object(o) => stack.extend(o.values().map(|x| (x, d + 1))),
            _ => {}
        }
    }
    deepest
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
        let nul = r.set(&serde_json::json!({"k": ["a\0b"]}));
        assert!(
            matches!(&nul, Err(ResultError::Nul(m)) if m.contains("result.k[0]")),
            "{nul:?}"
        );
        assert!(matches!(
            r.set(&serde_json::json!({"a\0": 1})),
            Err(ResultError::Nul(_))
        ));
        let mut deep = serde_json::json!(1);
        for _ in 0..MAX_RESULT_DEPTH {
            deep = serde_json::json!([deep]);
        }
        assert_eq!(depth(&deep), MAX_RESULT_DEPTH);
        let deeper = serde_json::json!({ "k": deep.clone() });
        assert_eq!(
            r.set(&deeper),
            Err(ResultError::TooDeep {
                depth: MAX_RESULT_DEPTH + 1
            })
        );
        // Refused values leave the last good one.
        assert_eq!(r.get(), Some(serde_json::json!({"rows": 2})));
        assert_eq!(r.take(), Some(serde_json::json!({"rows": 2})));
        assert_eq!(r.take(), None);
        assert_eq!(r.set(&deep), Ok(()));
        let e: crate::JobError = nul
            .err()
            .map(Into::into)
            .unwrap_or(crate::JobError::permanent(""));
        assert!(matches!(e, crate::JobError::Permanent(m) if m.contains("NUL")));
    }
}
