//! The fault suite's count of alerts: every scheduler replica of the suite
//! sends every alert event (no throttling) to one webhook receiver; at the
//! end every event must have reached it, and no event may be recorded twice.
//!
//! Delivery is at-least-once by design (a replica killed, or the ledger
//! restarted, between a receiver's 200 and the recorded result sends it
//! again after the lease): a delivery received twice is counted, not
//! failed, like a poison message dead-lettered twice; three times or more
//! must not happen.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

use belfry_alert::{AlertDeliverer, AlertsConfig};
use belfry_runtime::Settings;
use belfry_testkit::TestEnv;

use crate::alert_sink::WebhookSink;

/// A skipped span: after (exclusive), until (inclusive).
type Span = (chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>);

/// The variable the schedulers read the receiver's secret from.
pub const SECRET_VAR: &str = "BELFRY_FAULT_ALERT_SECRET";
/// The receiver's secret.
pub const SECRET: &str = "whsec_ZmF1bHQtc3VpdGUtYWxlcnQtc2VjcmV0";

/// The alerts file of the suite's schedulers: one webhook channel taking
/// every event, unthrottled, retried quickly.
pub fn alerts_file(url: &str) -> String {
    format!(
        "retry_initial = \"500ms\"\nretry_max = \"2s\"\ngive_up_after = \"1h\"\n\
         [channels.suite]\ntype = \"webhook\"\nurl = \"{url}\"\nsecret_env = \"{SECRET_VAR}\"\ntimeout = \"2s\"\n\
         [[routes]]\nchannels = [\"suite\"]\nthrottle = \"0s\"\n"
    )
}

/// What became of the alerts of one run.
#[derive(Debug, Default, Clone)]
pub struct AlertTally {
    /// Events recorded, by kind.
    pub by_kind: BTreeMap<String, usize>,
    /// Events in all.
    pub events: usize,
    /// Events recorded twice (the same kind, subject, run, key and
    /// detail, or a skipped span overlapping another of its schedule's):
    /// must be 0.
    pub duplicate_events: usize,
    /// Events whose alert never reached the receiver: must be 0.
    pub missing: usize,
    /// Alerts the receiver got twice (at-least-once; see the module).
    pub repeated: usize,
    /// Alerts the receiver got three times or more: must be 0.
    pub repeated_more: usize,
    /// Deliveries given up: must be 0.
    pub given_up: usize,
    /// Whether every event was routed and sent within the deadline.
    pub settled: bool,
    /// The first few events recorded twice, described.
    pub duplicate_examples: Vec<String>,
}

impl AlertTally {
    /// Whether every "must be 0" count is 0 and it settled.
    pub fn passed(&self) -> bool {
        self.duplicate_events == 0
            && self.missing == 0
            && self.repeated_more == 0
            && self.given_up == 0
            && self.settled
    }
}

/// Sends what the schedulers left unsent (they are stopped by now: a
/// deliverer of the suite's own finishes, as a replica would after a
/// restart), then counts.
///
/// # Panics
///
/// When the ledger cannot be read.
pub async fn settle_and_count(env: &TestEnv, sink: &WebhookSink, within: Duration) -> AlertTally {
    let config = AlertsConfig::parse(
        &alerts_file(&sink.url()),
        Path::new("fault-suite-alerts.toml"),
        &Settings::from_pairs([(SECRET_VAR, SECRET)]),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let deliverer = AlertDeliverer::new(env.ledger.clone(), Some(config), &env.namespace, "suite")
        .unwrap_or_else(|e| panic!("{e}"));
    let deadline = std::time::Instant::now() + within;
    let mut settled = false;
    while std::time::Instant::now() < deadline {
        if let Err(e) = deliverer.pass_once().await {
            println!("fault suite: alert pass failed: {e}");
        }
        let unrouted = env
            .ledger
            .unrouted_alerts(1)
            .await
            .map(|v| v.len())
            .unwrap_or(1);
        let pending = env
            .ledger
            .alert_deliveries(Some("pending"), 1)
            .await
            .map(|v| v.len())
            .unwrap_or(1);
        if unrouted == 0 && pending == 0 {
            settled = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let events = env
        .ledger
        .alert_events(1_000_000)
        .await
        .unwrap_or_else(|e| panic!("reading alert events: {e}"));
    let deliveries = env
        .ledger
        .alert_deliveries(None, 1_000_000)
        .await
        .unwrap_or_else(|e| panic!("reading alert deliveries: {e}"));
    let mut tally = AlertTally {
        events: events.len(),
        settled,
        ..AlertTally::default()
    };
    let mut seen = HashSet::new();
    let mut spans: HashMap<String, Vec<Span>> = HashMap::new();
    for e in &events {
        *tally.by_kind.entry(e.kind.clone()).or_default() += 1;
        let identity = (
            e.kind.clone(),
            e.subject.clone(),
            e.run_id,
            e.run_key.clone(),
            e.detail.clone(),
            e.count,
        );
        let mut twice = !seen.insert(identity);
        // A skipped span overlapping another of its schedule's tells of
        // the same instants again.
        if let (Some(from), Some(until)) = (e.covers_from, e.covers_until) {
            let theirs = spans.entry(e.subject.clone()).or_default();
            twice |= theirs.iter().any(|(f, u)| *f < until && *u > from);
            theirs.push((from, until));
        }
        if twice {
            tally.duplicate_events += 1;
            if tally.duplicate_examples.len() < 6 {
                tally.duplicate_examples.push(format!(
                    "{} {} run {:?} key {:?} count {} span {:?}..{:?}: {}",
                    e.kind,
                    e.subject,
                    e.run_id,
                    e.run_key,
                    e.count,
                    e.covers_from,
                    e.covers_until,
                    e.detail
                ));
            }
        }
    }
    let mut received: HashMap<String, usize> = HashMap::new();
    for r in sink.received() {
        *received
            .entry(r.headers.get("webhook-id").cloned().unwrap_or_default())
            .or_default() += 1;
    }
    let delivered_events: HashSet<uuid::Uuid> = deliveries
        .iter()
        .filter(|d| received.contains_key(&d.id.to_string()))
        .map(|d| d.event_id)
        .collect();
    tally.missing = events
        .iter()
        .filter(|e| !delivered_events.contains(&e.id))
        .count();
    tally.repeated = received.values().filter(|n| **n == 2).count();
    tally.repeated_more = received.values().filter(|n| **n >= 3).count();
    tally.given_up = deliveries.iter().filter(|d| d.status == "failed").count();
    tally
}
