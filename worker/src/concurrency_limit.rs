//! The cluster-wide concurrency limit a run is started under (issue 22):
//! `concurrency` and `concurrency_key` of the job type's options (given
//! with the handler, [`crate::RegistryBuilder::job_with`]) or of the run's
//! own (`options` of the message: an ad-hoc job's request), the run's
//! winning. The ledger enforces it (`belfry_ledger::ConcurrencyLimit`: a
//! slot is a running attempt under a live lease), so it holds across every
//! worker of every host, and a worker that dies frees its slots when its
//! leases run out.
//!
//! The limit key is the job type, or the job type and the value the
//! `concurrency_key` template names in the payload: `"{payload.tenant}"`
//! limits each tenant separately (`report:acme`). A template may mix text
//! and several fields (`"{payload.region}/{payload.tenant}"`). A field the
//! payload does not have reads as `null`, so runs without it share one
//! limit rather than escape it; a string is used as it is, any other value
//! as its JSON text.

use std::time::Duration;

use belfry_ledger::ConcurrencyLimit;
use belfry_protocol::{JobMessage, JobOptions};

/// How long a run that finds every slot taken waits in the ledger before
/// it is published again (the outbox publishes it at its next pass after
/// that, about a second later by default).
pub const LIMIT_WAIT: Duration = Duration::from_secs(1);

/// The limit `message` is started under, from the job type's `registered`
/// options and the message's own; `None` when neither sets `concurrency`.
pub fn limit_of(registered: &JobOptions, message: &JobMessage) -> Option<ConcurrencyLimit> {
    let max = message.options.concurrency.or(registered.concurrency)?;
    let template = message
        .options
        .concurrency_key
        .as_deref()
        .or(registered.concurrency_key.as_deref());
    let key = match template {
        None => message.job_type.clone(),
        Some(t) => format!("{}:{}", message.job_type, render(t, &message.payload)),
    };
    Some(ConcurrencyLimit {
        key,
        max: max.max(1),
        wait: LIMIT_WAIT,
    })
}

/// `template` with every `{payload.a.b}` replaced by that field of
/// `payload`; other text, and braces that name no payload field, kept as
/// written.
pub fn render(template: &str, payload: &serde_json::Value) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find("{payload.") {
        let Some(close) = rest[open..].find('}') else {
            break;
        };
        out.push_str(&rest[..open]);
        let path = &rest[open + "{payload.".len()..open + close];
        let value = path
            .split('.')
            .try_fold(payload, |v, field| v.get(field))
            .unwrap_or(&serde_json::Value::Null);
        match value {
            serde_json::Value::String(s) => out.push_str(s),
            other => out.push_str(&other.to_string()),
        }
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_template_reads_payload_fields_and_keeps_other_text() {
        let p = json!({"tenant": "acme", "region": {"name": "eu"}, "n": 7});
        assert_eq!(render("{payload.tenant}", &p), "acme");
        assert_eq!(
            render("{payload.region.name}/{payload.tenant}", &p),
            "eu/acme"
        );
        assert_eq!(render("n={payload.n}", &p), "n=7");
        // Missing fields share one key; unclosed braces are text.
        assert_eq!(render("{payload.missing}", &p), "null");
        assert_eq!(render("{payload.tenant", &p), "{payload.tenant");
        assert_eq!(render("{other}", &p), "{other}");
    }

    #[test]
    fn the_runs_own_limit_wins_and_no_concurrency_means_no_limit() {
        let at = chrono::Utc::now();
        let mut m = JobMessage {
            version: belfry_protocol::MESSAGE_VERSION,
            message_id: uuid::Uuid::new_v4(),
            job_name: "r".into(),
            job_type: "report".into(),
            run_key: "r@1".into(),
            scheduled_at: at,
            published_at: at,
            attempt: 1,
            payload: json!({"tenant": "acme"}),
            trace: None,
            options: JobOptions::default(),
        };
        let typed = JobOptions {
            concurrency: Some(4),
            ..JobOptions::default()
        };
        assert_eq!(limit_of(&JobOptions::default(), &m), None);
        let l = limit_of(&typed, &m).unwrap();
        assert_eq!((l.key.as_str(), l.max), ("report", 4));
        m.options.concurrency = Some(2);
        m.options.concurrency_key = Some("{payload.tenant}".into());
        let l = limit_of(&typed, &m).unwrap();
        assert_eq!((l.key.as_str(), l.max), ("report:acme", 2));
    }
}
