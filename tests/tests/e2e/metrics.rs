//! The Prometheus endpoints: a replica's and a worker's `/metrics`, served
//! on port 0 as the binaries serve them, scraped before and after a fire
//! that succeeds and one that fails.

use std::time::Duration;

use chrono::{DurationRound, Utc};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use belfry_runtime::metrics_server::{serve as serve_metrics, CONTENT_TYPE_OPENMETRICS};
use belfry_testkit::redis_url;
use belfry_tests::{builtins, every, every_with, replica, worker, RunningWorker};

/// The value of the series `series` (name with labels, as printed).
fn find(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// The value of the series `series`, which must be present.
fn value(text: &str, series: &str) -> f64 {
    find(text, series).unwrap_or_else(|| panic!("no series {series} in:\n{text}"))
}

async fn scrape(addr: std::net::SocketAddr) -> String {
    let response = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        CONTENT_TYPE_OPENMETRICS
    );
    response.text().await.unwrap()
}

belfry_testkit::both_backends! {
    async fn both_endpoints_count_a_fire_and_a_failure(env: TestEnv) {
        let stop = CancellationToken::new();
        let one_attempt = [("BELFRY_MAX_ATTEMPTS", "1")];
        let w = worker(&env, "metrics-w", "default", builtins(), &one_attempt).await;
        let worker_addr = serve_metrics("127.0.0.1:0", w.metrics_registry().into(), stop.clone())
            .await
            .unwrap();
        let running = RunningWorker::spawn(w);
        let r = replica(&env, "metrics-r", Some(&redis_url())).await;
        let replica_addr = serve_metrics("127.0.0.1:0", r.metrics_registry().into(), stop.clone())
            .await
            .unwrap();
        assert_ne!(worker_addr.port(), 0, "port 0 picks a free port");

        let before_s = scrape(replica_addr).await;
        let before_w = scrape(worker_addr).await;
        assert_eq!(value(&before_s, "belfry_fires_total"), 0.0);
        assert_eq!(value(&before_w, "belfry_jobs_in_flight"), 0.0);
        assert!(before_s.contains("# TYPE belfry_fire_lateness_seconds histogram"));

        let at = Utc::now()
            .duration_trunc(chrono::Duration::seconds(1))
            .unwrap();
        let ok = every("metrics-ok", "1s", "noop");
        // An http job to a port where nothing listens: the only attempt fails.
        let failing = every_with("metrics-fail", "1s", "http", |spec| {
            spec.payload = Some(json!({"url": "http://127.0.0.1:1/", "timeout_ms": 500}));
        });
        r.fire(&ok, at).await;
        r.fire(&failing, at).await;
        let succeeded = env.wait_fire("metrics-ok", at, Duration::from_secs(10)).await;
        let failed = env.wait_fire("metrics-fail", at, Duration::from_secs(10)).await;
        assert_eq!(succeeded.status_text, "succeeded");
        assert_ne!(failed.status_text, "succeeded");
        // The worker counts a run once its delivery is settled (acked or
        // dead-lettered), just after the outcome is recorded.
        let after_w = belfry_testkit::eventually(
            "the worker to settle both runs",
            Duration::from_secs(10),
            || async {
                let text = scrape(worker_addr).await;
                let settled: f64 = text
                    .lines()
                    .filter(|l| l.starts_with("belfry_jobs_total{"))
                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .sum();
                (settled >= 2.0 && find(&text, "belfry_jobs_in_flight") == Some(0.0)).then_some(text)
            },
        )
        .await;
        let after_s = scrape(replica_addr).await;

        assert_eq!(value(&after_s, "belfry_fires_total"), 2.0);
        assert_eq!(value(&after_s, "belfry_claims_total{result=\"won\"}"), 2.0);
        assert_eq!(
            value(&after_s, "belfry_publishes_total{result=\"confirmed\"}"),
            2.0
        );
        assert_eq!(value(&after_s, "belfry_fire_lateness_seconds_count"), 2.0);
        assert!(value(&after_s, "belfry_fire_lateness_seconds_sum") > 0.0);
        assert_eq!(value(&after_s, "belfry_publish_latency_seconds_count"), 2.0);

        let outcome = format!(
            "belfry_jobs_total{{job_type=\"http\",outcome=\"{}\"}}",
            failed.status_text
        );
        assert_eq!(find(&before_w, &outcome), None, "no series before a run");
        assert_eq!(value(&after_w, &outcome), 1.0, "{after_w}");
        assert_eq!(
            value(
                &after_w,
                "belfry_jobs_total{job_type=\"noop\",outcome=\"succeeded\"}"
            ),
            1.0
        );
        assert_eq!(
            value(&after_w, "belfry_attempts_total{job_type=\"http\"}"),
            1.0
        );
        assert_eq!(
            value(
                &after_w,
                "belfry_attempt_duration_seconds_count{job_type=\"noop\"}"
            ),
            1.0
        );
        assert_eq!(value(&after_w, "belfry_jobs_in_flight"), 0.0);
        if failed.status_text == "dead" {
            assert_eq!(value(&after_w, "belfry_dead_lettered_total"), 1.0);
        }
        stop.cancel();
        running.stop_and_teardown(env).await;
    }
}
