//! The binaries' own telemetry wiring, end to end: a `belfry-scheduler` and a
//! `belfry-worker` process with `OTEL_EXPORTER_OTLP_ENDPOINT` and
//! `BELFRY_METRICS_ADDR=127.0.0.1:0` set. Both serve `/metrics` (the bound
//! port is read from their JSON log), both export spans of the same run's
//! trace over OTLP/HTTP, and both flush what is left when SIGTERM stops
//! them.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use belfry_testkit::{eventually, queue_consumed, terminate};
use belfry_tests::fault::fleet::bin_dir;
use belfry_tests::otlp_sink::{contains, OtlpSink};

/// The address the process logged for its metrics endpoint.
fn metrics_addr(log: &Path) -> Option<String> {
    std::fs::read_to_string(log).ok()?.lines().find_map(|l| {
        let v: serde_json::Value = serde_json::from_str(l).ok()?;
        (v["message"].as_str()? == "metrics endpoint listening on /metrics")
            .then(|| v["addr"].as_str().map(str::to_owned))?
    })
}

async fn scrape(addr: &str) -> String {
    reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

fn hex_bytes(hex: &str) -> Vec<u8> {
    (0..hex.len() / 2)
        .filter_map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_binaries_serve_metrics_and_export_one_trace_per_run() {
    let env = belfry_testkit::service_env!();
    let sink = OtlpSink::start().await;
    let dir = std::env::temp_dir().join(format!("belfry-otel-{}", env.namespace));
    std::fs::create_dir_all(&dir).unwrap();
    let schedules = dir.join("schedules.toml");
    std::fs::write(
        &schedules,
        "[[schedule]]\nname = \"otel-e2e\"\nevery = \"1s\"\njob_type = \"noop\"\n",
    )
    .unwrap();
    let bins = bin_dir();
    let spawn = |bin: &str, instance: &str, extra: &[(&str, &str)]| {
        let log = dir.join(format!("{instance}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(bins.join(bin))
            .envs(env.process_env())
            .env("BELFRY_INSTANCE", instance)
            .env("BELFRY_LOG_FORMAT", "json")
            .env("RUST_LOG", "info")
            .env("BELFRY_METRICS_ADDR", "127.0.0.1:0")
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", sink.endpoint())
            .env("OTEL_BSP_SCHEDULE_DELAY", "100")
            .envs(extra.iter().copied())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        (child, log)
    };
    let (worker, worker_log) = spawn("belfry-worker", "otel-w", &[]);
    let queue = env.topology.group_queue("default");
    eventually("the worker's queue", Duration::from_secs(30), || async {
        queue_consumed(&env, &queue).await.then_some(())
    })
    .await;
    let schedule_path = schedules.display().to_string();
    let (scheduler, scheduler_log) = spawn(
        "belfry-scheduler",
        "otel-s",
        &[("BELFRY_SCHEDULES", schedule_path.as_str())],
    );
    let trace_id: String = eventually("a run to succeed", Duration::from_secs(30), || async {
        sqlx::query_scalar(
            "SELECT trace_id FROM job_runs WHERE status = 'succeeded' ORDER BY scheduled_at LIMIT 1",
        )
        .fetch_optional(env.ledger.pg_pool().expect("a Postgres ledger"))
        .await
        .ok()
        .flatten()
        .flatten()
    })
    .await;

    let scheduler_metrics =
        metrics_addr(&scheduler_log).expect("the scheduler logs its metrics address");
    let worker_metrics = metrics_addr(&worker_log).expect("the worker logs its metrics address");
    assert_ne!(scheduler_metrics, worker_metrics);
    let text = scrape(&scheduler_metrics).await;
    assert!(
        text.contains("belfry_publishes_total{result=\"confirmed\"}"),
        "{text}"
    );
    assert!(!text.contains("belfry_publishes_total{result=\"confirmed\"} 0\n"));
    // The worker counts a run after recording it in the ledger, so the
    // counter may trail the row the test saw by a moment.
    let succeeded = "belfry_jobs_total{job_type=\"noop\",outcome=\"succeeded\"}";
    let counted = eventually(
        "the worker to count the run",
        Duration::from_secs(10),
        || async {
            let text = scrape(&worker_metrics).await;
            text.contains(succeeded).then_some(text)
        },
    )
    .await;
    assert!(counted.contains(succeeded), "{counted}");

    // SIGTERM: both exit 0 after flushing their spans.
    assert!(terminate(scheduler).await.success());
    assert!(terminate(worker).await.success());
    let trace = hex_bytes(&trace_id);
    assert_eq!(trace.len(), 16, "{trace_id}");
    let bodies = sink.bodies("/v1/traces");
    for b in &bodies {
        eprintln!(
            "export: {} bytes, scheduler {}, worker {}, trace {}",
            b.len(),
            contains(b, b"belfry-scheduler"),
            contains(b, b"belfry-worker"),
            contains(b, &trace)
        );
    }
    let from = |service: &[u8]| {
        bodies
            .iter()
            .any(|b| contains(b, service) && contains(b, &trace))
    };
    assert!(
        from(b"belfry-scheduler"),
        "the scheduler exported spans of the run's trace ({} exports)",
        bodies.len()
    );
    assert!(
        from(b"belfry-worker"),
        "the worker exported spans of the run's trace ({} exports)",
        bodies.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
    env.teardown(&["default"]).await;
}
