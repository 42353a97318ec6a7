//! Claim-and-publish throughput with OpenTelemetry export off and on.
//!
//! Each measurement is a child process (`belfry-bench traces-child`), since
//! the tracing subscriber is process-wide: it sets telemetry up exactly as
//! the binaries do ([`belfry_runtime::init_telemetry`]), then a replica
//! fires `fires` distinct fires of one schedule (Redis lock, ledger insert,
//! confirmed publish, `dispatched`), 64 in flight, against the real
//! services. "Off" has no `OTEL_*` variables (no OpenTelemetry layer);
//! "on" exports every span over OTLP/HTTP to a sink in this process that
//! accepts `POST /v1/traces` and counts what it receives. Rounds alternate
//! the two modes; the median of each is reported with their ratio.

use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;

use belfry_broker::Broker;
use belfry_ledger::Ledger;
use belfry_protocol::ScheduleSpec;
use belfry_scheduler::{ClaimLock, Replica, ReplicaTiming, Schedule};
use belfry_testkit::{amqp_url, redis_url, TestEnv};

use crate::sample::median;

const IN_FLIGHT: usize = 64;

/// Runs `rounds` rounds of off/on children with `fires` fires each.
pub async fn run(fires: usize, rounds: usize) -> anyhow::Result<()> {
    let requests = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let sink = {
        let (requests, bytes) = (requests.clone(), bytes.clone());
        axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: axum::body::Bytes| {
                let (requests, bytes) = (requests.clone(), bytes.clone());
                async move {
                    requests.fetch_add(1, Ordering::Relaxed);
                    bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
                    axum::http::StatusCode::OK
                }
            }),
        )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let endpoint = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, sink).await });

    let exe = std::env::current_exe()?;
    // The binaries' default logging (`RUST_LOG` unset: INFO), which also
    // decides which spans exist: the same in both modes.
    let mut table = Vec::new();
    {
        let label = "RUST_LOG unset (info, the default)".to_owned();
        let log: Option<&str> = None;
        let mut off = Vec::new();
        let mut on = Vec::new();
        for round in 0..rounds {
            // Alternate which mode goes first, so drift favours neither.
            let order = if round % 2 == 0 {
                [false, true]
            } else {
                [true, false]
            };
            for exporting in order {
                let rate =
                    measure(&exe, fires, log, exporting.then_some(endpoint.as_str())).await?;
                println!(
                    "{label}, round {round}: export {}: {rate:.0} fires/s",
                    if exporting { "on " } else { "off" }
                );
                if exporting {
                    on.push(rate)
                } else {
                    off.push(rate)
                }
            }
        }
        table.push((label, median(off), median(on)));
    }
    println!();
    println!("| logging | export off, fires/s | export on, fires/s | ratio on/off |");
    println!("| --- | ---: | ---: | ---: |");
    for (label, off, on) in &table {
        println!("| {label} | {off:.0} | {on:.0} | {:.2} |", on / off);
    }
    println!(
        "\nmedians of {rounds} rounds of {fires} fires; the sink received {} export requests, {} KiB of spans",
        requests.load(Ordering::Relaxed),
        bytes.load(Ordering::Relaxed) / 1024,
    );
    anyhow::ensure!(
        requests.load(Ordering::Relaxed) > 0,
        "export on sent nothing: the measurement would be meaningless"
    );
    Ok(())
}

/// Runs one child; returns its fires per second.
async fn measure(
    exe: &std::path::Path,
    fires: usize,
    log: Option<&str>,
    endpoint: Option<&str>,
) -> anyhow::Result<f64> {
    let mut cmd = tokio::process::Command::new(exe);
    cmd.args(["traces-child", "--fires", &fires.to_string()])
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(log) = log {
        cmd.env("RUST_LOG", log);
    }
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("OTEL_")) {
        cmd.env_remove(k);
    }
    if let Some(endpoint) = endpoint {
        // A queue large enough that no span is dropped: the cost of
        // exporting all of them is what is measured.
        cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
            .env("OTEL_BSP_MAX_QUEUE_SIZE", "262144")
            .env("OTEL_BSP_SCHEDULE_DELAY", "200");
    }
    let out = cmd.output().await?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    anyhow::ensure!(
        out.status.success(),
        "child failed: {}: {stderr}",
        out.status
    );
    stderr
        .lines()
        .find_map(|l| l.strip_prefix("rate: ")?.trim().parse().ok())
        .context("child printed no rate")
}

/// One measurement: prints `rate: {fires per second}` on stderr (stdout
/// carries the logs, as in the binaries).
pub async fn child(fires: usize) -> anyhow::Result<()> {
    let telemetry = belfry_runtime::init_telemetry("belfry-bench", "bench", Default::default())?;
    let env = TestEnv::new().await;
    env.broker.declare_group("default", &["noop"]).await?;
    let lock = ClaimLock::new(
        &redis_url(),
        env.topology.clone(),
        "bench",
        Duration::from_secs(60),
    )?;
    let ledger = Ledger::connect(&env.database_url, 16).await?;
    let broker = Broker::connect(&amqp_url(), env.topology.clone(), "bench").await?;
    let replica = Replica::new(
        "bench",
        Some(lock),
        ledger,
        broker,
        ReplicaTiming::default(),
    );
    let schedule = Arc::new(Schedule::from_spec(&ScheduleSpec {
        name: "traced-bench".into(),
        every: Some("1s".into()),
        job_type: "noop".into(),
        ..Default::default()
    })?);
    let base = chrono::Utc::now() - chrono::Duration::seconds(i64::try_from(fires)?);
    let base = chrono::DurationRound::duration_trunc(base, chrono::Duration::seconds(1))?;
    let started = Instant::now();
    let outcomes: Vec<_> = futures::stream::iter(0..fires)
        .map(|i| {
            let (replica, schedule) = (&replica, &schedule);
            async move {
                let at = base + chrono::Duration::seconds(i64::try_from(i).unwrap_or(0));
                replica.fire(schedule, at).await
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    let took = started.elapsed();
    let dispatched = outcomes
        .iter()
        .filter(|o| o.label() == "dispatched")
        .count();
    anyhow::ensure!(
        dispatched == fires,
        "only {dispatched} of {fires} fires dispatched"
    );
    eprintln!("rate: {:.1}", fires as f64 / took.as_secs_f64());
    telemetry.shutdown().await;
    env.teardown(&["default"]).await;
    Ok(())
}
