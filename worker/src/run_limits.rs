//! The cluster-wide limits a run is started under (issue 22): a
//! concurrency limit (`concurrency`, `concurrency_key`) and a rate limit
//! (`rate_limit`, `rate_limit_key`), from the job type's options (given
//! with the handler, [`crate::RegistryBuilder::job_with`]) or the run's own
//! (`options` of the message: a schedule's or an ad-hoc request's), the
//! run's winning field by field. The ledger enforces both
//! (`belfry_ledger::RunLimits`): a concurrency slot is a running attempt
//! under a live lease, a rate start is a row of the key's sliding window,
//! so they hold across every worker of every host, and a worker that dies
//! frees its slots when its leases run out.
//!
//! A limit key is the job type, or the job type and the value the key
//! template names in the payload: `"{payload.tenant}"` limits each tenant
//! separately (`report:acme`). A rate key also names its limit
//! (`report:acme@10/1m`): runs under different rates never share a window. A template may mix text and several fields
//! (`"{payload.region}/{payload.tenant}"`). A field the payload does not
//! have reads as `null`, so runs without it share one limit rather than
//! escape it; a string is used as it is, any other value as its JSON text.

use std::time::Duration;

use belfry_ledger::{ConcurrencyLimit, RunLimits, StartRate};
use belfry_protocol::{JobMessage, JobOptions};

/// How long a run that finds every slot taken waits in the ledger before
/// it is published again (the outbox publishes it at its next pass after
/// that, about a second later by default).
pub const LIMIT_WAIT: Duration = Duration::from_secs(1);

/// The limits `message` is started under, from the job type's `registered`
/// options and the message's own; empty when neither sets `concurrency`
/// or `rate_limit`.
///
/// # Errors
///
/// The reason the run cannot be started under its limits: a rate limit
/// out of range (a message published by hand may carry any numbers). The
/// run is dead-lettered with it; it would be refused every time.
pub fn limits_of(registered: &JobOptions, message: &JobMessage) -> Result<RunLimits, String> {
    let key_of = |template: Option<&str>| match template {
        None => message.job_type.clone(),
        Some(t) => format!("{}:{}", message.job_type, render(t, &message.payload)),
    };
    let concurrency = message
        .options
        .concurrency
        .or(registered.concurrency)
        .map(|max| ConcurrencyLimit {
            key: key_of(
                message
                    .options
                    .concurrency_key
                    .as_deref()
                    .or(registered.concurrency_key.as_deref()),
            ),
            max: max.max(1),
            wait: LIMIT_WAIT,
        });
    let rate = match message.options.rate_limit.or(registered.rate_limit) {
        None => None,
        Some(r) => {
            r.check().map_err(|e| {
                format!("the run's rate_limit cannot be used: {e}; publish it with a rate_limit in range, or none")
            })?;
            // The limit is part of the key: runs under different limits
            // (a type's 50/s, a schedule's 10/1m) never share a window,
            // whose rows are kept for its own length only.
            let key = key_of(
                message
                    .options
                    .rate_limit_key
                    .as_deref()
                    .or(registered.rate_limit_key.as_deref()),
            );
            Some(StartRate {
                key: format!("{key}@{r}"),
                starts: r.starts,
                per: r.per(),
            })
        }
    };
    Ok(RunLimits { concurrency, rate })
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
    use belfry_protocol::RateLimit;
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
    fn the_runs_own_limits_win_and_none_set_means_no_limit() {
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
            payload: json!({"tenant": "acme", "partner": "p1"}),
            trace: None,
            options: JobOptions::default(),
        };
        let per_second = |starts| RateLimit {
            starts,
            per_ms: 1000,
        };
        let typed = JobOptions {
            concurrency: Some(4),
            rate_limit: Some(per_second(50)),
            ..JobOptions::default()
        };
        assert!(limits_of(&JobOptions::default(), &m).unwrap().is_empty());
        let l = limits_of(&typed, &m).unwrap();
        let c = l.concurrency.unwrap();
        assert_eq!((c.key.as_str(), c.max), ("report", 4));
        let r = l.rate.unwrap();
        assert_eq!(
            (r.key.as_str(), r.starts, r.per),
            ("report@50/1s", 50, Duration::from_secs(1))
        );
        m.options.concurrency = Some(2);
        m.options.concurrency_key = Some("{payload.tenant}".into());
        m.options.rate_limit = Some(per_second(5));
        m.options.rate_limit_key = Some("{payload.partner}".into());
        let l = limits_of(&typed, &m).unwrap();
        let c = l.concurrency.unwrap();
        assert_eq!((c.key.as_str(), c.max), ("report:acme", 2));
        let r = l.rate.unwrap();
        assert_eq!((r.key.as_str(), r.starts), ("report:p1@5/1s", 5));
        // A rate limit out of range (a hand-published message) is refused
        // with the reason, never divided by.
        m.options.rate_limit = Some(RateLimit {
            starts: 0,
            per_ms: 1000,
        });
        assert!(limits_of(&typed, &m)
            .unwrap_err()
            .contains("allowed 1 to 10000"));
    }
}
