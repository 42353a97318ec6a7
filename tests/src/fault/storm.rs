//! A poison-message storm from a foreign producer: bodies that are not job
//! messages, or are job messages the ledger cannot store (NUL in the run
//! key, payload or trace context, huge keys, wrong types, truncated JSON,
//! other versions), published straight to the job exchange and interleaved
//! with good hand-published jobs. Each poison body must reach the
//! dead-letter queue exactly once with a reason, and every good job must
//! run, whatever else the suite is doing.

use serde_json::json;
use uuid::Uuid;

use belfry_testkit::TestEnv;

/// What a storm sent.
#[derive(Debug, Default, Clone)]
pub struct Storm {
    /// The poison bodies, each unique.
    pub poison: Vec<Vec<u8>>,
    /// Job names of the good messages.
    pub good: Vec<String>,
}

/// One round of every kind of poison, each made unique by `tag`.
fn poison_bodies(tag: &str, probe_url: &str) -> Vec<Vec<u8>> {
    let good = |name: &str| {
        json!({
            "version": 1, "message_id": Uuid::new_v4(), "job_name": name, "job_type": "http",
            "run_key": format!("{name}@{tag}"), "scheduled_at": "2026-07-26T03:00:00Z",
            "published_at": "2026-07-26T03:00:00Z",
            "payload": { "url": probe_url, "timeout_ms": 4000 },
        })
    };
    // Names unique per round, so a poison body the ledger did store (as the
    // code before issue 16 would) never looks like a duplicate fire.
    let with = |name: &str, field: &str, value: serde_json::Value| {
        let mut v = good(&format!("{name}-{tag}"));
        v[field] = value;
        v.to_string().into_bytes()
    };
    let truncated = {
        let s = good("p-cut").to_string();
        s.as_bytes()[..s.len() / 2].to_vec()
    };
    vec![
        with(
            "p-nulkey",
            "run_key",
            format!("p-nulkey-{tag}@{tag}\u{0}").into(),
        ),
        with(
            "p-nulpay",
            "payload",
            json!({ "url": probe_url, "note": format!("{tag}\u{0}") }),
        ),
        with(
            "p-nulkeyname",
            "payload",
            json!({ "url": probe_url, format!("k{tag}\u{0}"): 1 }),
        ),
        with(
            "p-nultrace",
            "trace",
            json!({ "traceparent": format!("00-{tag}\u{0}") }),
        ),
        with(
            "p-hugekey",
            "run_key",
            format!("p-hugekey-{tag}@{tag}{}", "k".repeat(5000)).into(),
        ),
        with("p-types", "scheduled_at", json!(12)),
        with("p-version", "version", json!(7)),
        with("p badname", "job_name", format!("p badname {tag}").into()),
        truncated,
        format!("\u{1}\u{2}not json at all {tag}").into_bytes(),
    ]
}

/// Publishes `rounds` rounds of poison, each poison body followed by a
/// good `http` job against `probe_url` (publisher confirms, one connection
/// a message, as separate producers would).
///
/// # Panics
///
/// When RabbitMQ cannot be reached or does not confirm a publish.
pub async fn publish_storm(env: &TestEnv, probe_url: &str, rounds: usize) -> Storm {
    let mut storm = Storm::default();
    for _ in 0..rounds {
        let tag = Uuid::new_v4().simple().to_string();
        for body in poison_bodies(&tag, probe_url) {
            let name = format!("storm-{}", storm.good.len());
            let now = chrono::Utc::now();
            let good = json!({
                "version": 1, "message_id": Uuid::new_v4(), "job_name": name, "job_type": "http",
                "run_key": format!("{name}@{tag}"), "scheduled_at": now, "published_at": now,
                "payload": { "url": probe_url, "timeout_ms": 4000 },
            });
            env.publish_raw("http", &body).await;
            env.publish_raw("http", good.to_string().as_bytes()).await;
            storm.poison.push(body);
            storm.good.push(name);
        }
    }
    storm
}
