//! `JobMessage` v1: the JSON body of every job published to the broker.
//!
//! The format is documented for producers in other languages in
//! `docs/wire-format.md`; its JSON Schema is `docs/job-message.schema.json`.
//! Unknown fields are ignored so that later minor additions stay readable by
//! older workers; a different `version` is refused, since its meaning is not
//! known.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use thiserror::Error;
use uuid::Uuid;

use crate::job_options::JobOptions;
use crate::name::{validate_name, NameError};
use crate::trace_context::TraceContext;

/// The message format version this crate writes and reads.
pub const MESSAGE_VERSION: u32 = 1;

/// One job to run: a fire of a schedule, or an ad-hoc job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobMessage {
    /// Format version; always [`MESSAGE_VERSION`] for messages this crate writes.
    pub version: u32,
    /// Unique per run; equal to the `job_runs.id` of the run. A republished
    /// message keeps it, so consumers can recognise duplicates.
    pub message_id: Uuid,
    /// The schedule (or ad-hoc job) name.
    pub job_name: String,
    /// The job type; also the AMQP routing key. Selects the handler.
    pub job_type: String,
    /// `{job_name}@{scheduled_at}`; see [`crate::run_key`].
    pub run_key: String,
    /// The nominal fire instant (UTC).
    pub scheduled_at: DateTime<Utc>,
    /// When this copy of the message was published (UTC).
    pub published_at: DateTime<Utc>,
    /// The attempt this delivery is expected to make (1 for a first
    /// delivery). The durable count in `job_runs.attempts` wins when they
    /// differ.
    #[serde(default = "first_attempt")]
    pub attempt: u32,
    /// The job's input; any JSON value, decoded by the job type's handler.
    #[serde(default)]
    pub payload: serde_json::Value,
    /// W3C trace context of the run, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceContext>,
    /// Overrides of the job type's retry policy and timeout for this run.
    #[serde(default, skip_serializing_if = "JobOptions::is_empty")]
    pub options: JobOptions,
}

fn first_attempt() -> u32 {
    1
}

/// Why a message body could not be read as a [`JobMessage`].
#[derive(Debug, Error)]
pub enum MessageError {
    /// The body is not JSON, or lacks a required field.
    #[error("message body is not a valid job message: {0}")]
    Malformed(#[from] serde_json::Error),
    /// The body declares a version this code does not understand.
    #[error(
        "message version {found} is not supported; this build reads version {MESSAGE_VERSION}"
    )]
    UnsupportedVersion {
        /// The version the message declared.
        found: u32,
    },
    /// A name inside the message breaks the naming rule.
    #[error("invalid message: {0}")]
    BadName(#[from] NameError),
    /// The run key is not `{job_name}@{identity}` with a printable identity
    /// of at most 200 bytes.
    #[error("invalid message: {0}")]
    BadRunKey(#[from] crate::InvalidRunKey),
    /// A value the ledger cannot store (a NUL character, an over-long trace
    /// header).
    #[error("invalid message: {0}")]
    Unstorable(#[from] crate::Unstorable),
}

impl JobMessage {
    /// Decodes and validates a message body.
    ///
    /// # Errors
    ///
    /// [`MessageError`] when the body is not JSON, lacks a required field,
    /// has another version, carries an invalid job name or type, a run key
    /// that does not belong to its job name or breaks the run-key rule, or a
    /// value the ledger cannot store (NUL in the payload or trace context).
    pub fn from_slice(body: &[u8]) -> Result<Self, MessageError> {
        #[derive(Deserialize)]
        struct Version {
            version: u32,
        }
        let Version { version } = serde_json::from_slice(body)?;
        if version != MESSAGE_VERSION {
            return Err(MessageError::UnsupportedVersion { found: version });
        }
        let message: JobMessage = serde_json::from_slice(body)?;
        validate_name("job name", &message.job_name)?;
        validate_name("job type", &message.job_type)?;
        crate::validate_run_key(&message.job_name, &message.run_key)?;
        // Every value that reaches the ledger must be storable there, or the
        // message could never be recorded (see `crate::storable`).
        crate::check_storable_json("payload", &message.payload)?;
        // The options are stored as JSON too (a follow-up's payload, a
        // parent's error text).
        if let Ok(options) = serde_json::to_value(&message.options) {
            crate::check_storable_json("options", &options)?;
        }
        if let Some(trace) = &message.trace {
            let max = crate::storable::MAX_TRACE_HEADER_BYTES;
            crate::check_storable_text("trace.traceparent", &trace.traceparent, max)?;
            if let Some(state) = &trace.tracestate {
                crate::check_storable_text("trace.tracestate", state, max)?;
            }
        }
        Ok(message)
    }

    /// Encodes the message as JSON.
    pub fn to_vec(&self) -> Vec<u8> {
        // Serialising a struct of strings, numbers, timestamps and a
        // `serde_json::Value` cannot fail (no maps with non-string keys).
        serde_json::to_vec(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn sample() -> JobMessage {
        let at = Utc.with_ymd_and_hms(2026, 7, 26, 3, 0, 0).single().unwrap();
        JobMessage {
            version: MESSAGE_VERSION,
            message_id: Uuid::new_v4(),
            job_name: "nightly-report".into(),
            job_type: "noop".into(),
            run_key: crate::run_key("nightly-report", at).unwrap(),
            scheduled_at: at,
            published_at: at,
            attempt: 1,
            payload: serde_json::json!({"k": [1, 2]}),
            trace: Some(TraceContext::new_root()),
            options: JobOptions {
                retry: Some(crate::RetryOverride {
                    max_attempts: Some(3),
                    ..Default::default()
                }),
                timeout_ms: Some(1000),
                concurrency: Some(4),
                concurrency_key: Some("{payload.k}".into()),
                rate_limit: Some(crate::RateLimit {
                    starts: 50,
                    per_ms: 1000,
                }),
                rate_limit_key: Some("{payload.k}".into()),
                priority: Some(crate::Priority::High),
                follow_ups: crate::FollowUps {
                    on_success: vec![crate::FollowUp {
                        job_name: "load".into(),
                        job_type: "noop".into(),
                        after: vec!["extract".into()],
                        ..Default::default()
                    }],
                    ..Default::default()
                },
                parents: vec![crate::ParentRun {
                    id: Uuid::new_v4(),
                    job_name: "extract".into(),
                    run_key: "extract@2026-07-26T03:00:00Z".into(),
                    status: "succeeded".into(),
                    error: None,
                    result: Some(serde_json::json!({"rows": 42})),
                }],
            },
        }
    }

    #[test]
    fn round_trips() {
        let m = sample();
        assert_eq!(JobMessage::from_slice(&m.to_vec()).unwrap(), m);
    }

    #[test]
    fn reads_a_hand_written_message() {
        let body = br#"{"version":1,"message_id":"5b8c2f5e-4b8a-4a43-9d0e-1b2f3c4d5e6f",
            "job_name":"py-export","job_type":"noop","run_key":"py-export@2026-07-26T03:00:00Z",
            "scheduled_at":"2026-07-26T03:00:00Z","published_at":"2026-07-26T03:00:00.5Z",
            "extra":"ignored"}"#;
        let m = JobMessage::from_slice(body).unwrap();
        assert_eq!(m.attempt, 1);
        assert_eq!(m.payload, serde_json::Value::Null);
    }

    #[test]
    fn refuses_other_versions_garbage_and_foreign_run_keys() {
        let mut v = serde_json::to_value(sample()).unwrap();
        v["version"] = 2.into();
        assert!(matches!(
            JobMessage::from_slice(v.to_string().as_bytes()),
            Err(MessageError::UnsupportedVersion { found: 2 })
        ));
        assert!(matches!(
            JobMessage::from_slice(b"{not json"),
            Err(MessageError::Malformed(_))
        ));
        let mut v = serde_json::to_value(sample()).unwrap();
        v["run_key"] = "other@2026-07-26T03:00:00Z".into();
        assert!(matches!(
            JobMessage::from_slice(v.to_string().as_bytes()),
            Err(MessageError::BadRunKey(_))
        ));
    }

    #[test]
    fn refuses_values_the_ledger_cannot_store() {
        let cases: [(&str, serde_json::Value); 5] = [
            ("run_key", "nightly-report@2026\u{0}".into()),
            (
                "run_key",
                format!("nightly-report@{}", "x".repeat(201)).into(),
            ),
            ("payload", serde_json::json!({"deep": [{"s": "a\u{0}b"}]})),
            ("trace", serde_json::json!({"traceparent": "00-\u{0}"})),
            ("trace", serde_json::json!({"traceparent": "x".repeat(513)})),
        ];
        for (field, value) in cases {
            let mut v = serde_json::to_value(sample()).unwrap();
            v[field] = value.clone();
            let e = JobMessage::from_slice(v.to_string().as_bytes())
                .expect_err(&format!("{field} = {value} accepted"));
            assert!(
                !e.to_string().contains('\u{0}'),
                "the reason itself must be printable: {e:?}"
            );
        }
        let mut v = serde_json::to_value(sample()).unwrap();
        v["payload"] = serde_json::json!({"deep": [{"s": "a\u{0}b"}]});
        let e = JobMessage::from_slice(v.to_string().as_bytes()).unwrap_err();
        assert!(e.to_string().contains("payload.deep[0].s"), "{e}");
    }

    #[test]
    fn the_committed_json_schema_matches_the_type() {
        let schema: serde_json::Value =
            serde_json::from_str(include_str!("../../docs/job-message.schema.json")).unwrap();
        let props: Vec<&str> = schema["properties"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let written = serde_json::to_value(sample()).unwrap();
        let mut fields: Vec<&str> = written
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let mut props_sorted = props.clone();
        props_sorted.sort_unstable();
        fields.sort_unstable();
        assert_eq!(
            props_sorted, fields,
            "schema properties and JobMessage fields differ"
        );
        // Exactly the fields without a serde default are required.
        let required: Vec<&str> = schema["required"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v.as_str())
            .collect();
        for field in fields {
            let mut partial = written.clone();
            partial.as_object_mut().unwrap().remove(field);
            let decodes = JobMessage::from_slice(partial.to_string().as_bytes()).is_ok();
            assert_eq!(
                !decodes,
                required.contains(&field),
                "field {field}: required in schema vs in code"
            );
        }
    }
}
