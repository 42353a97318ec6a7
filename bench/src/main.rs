//! `belfry-bench`: benchmarks against the real services, each reported as
//! a ratio to a baseline measured in the same run (the machine is shared
//! and noisy, so absolute numbers from different runs do not compare).
//!
//! ```text
//! cargo run --release -p belfry-bench -- worker [--jobs 5000] [--rounds 3]
//! cargo run --release -p belfry-bench -- timer [--seconds 10] [--big 1000000]
//! cargo run --release -p belfry-bench -- traces [--fires 3000] [--rounds 5]
//! cargo run --release -p belfry-bench -- dispatch [--raw-fires 8000] [--steady-seconds 10]
//! cargo run --release -p belfry-bench -- ui [--schedules 1000] [--runs 1000000] [--rounds 20]
//! cargo run --release -p belfry-bench -- embedded [--fires 2000] [--jobs 5000] [--rounds 3]
//! cargo run --release -p belfry-bench -- pooler [--fires 2000] [--rounds 5]   # scripts/pgbouncer up first
//! cargo run --release -p belfry-bench -- fire-cost [--fires 2000] [--rounds 3]
//! cargo run --release -p belfry-bench -- shard-scale [--small 10000] [--large 100000] [--rounds 3]
//! cargo run --release -p belfry-bench -- failover [--schedules 1000] [--rounds 3]   # builds: -p belfry-server too
//! cargo run --release -p belfry-bench -- retention [--rows 10000000] [--rounds 3]
//! cargo run --release -p belfry-bench -- million [--schedules 1000000] [--raw 100000]   # builds: -p belfry-server -p belfry-worker too
//! cargo run --release -p belfry-bench -- limits [--runs 60] [--seconds 60]   # builds: -p belfry-server -p belfry-worker too
//! cargo run --release -p belfry-bench -- follow-ups [--runs 200] [--depth 8]   # builds: -p belfry-server -p belfry-worker too
//! cargo run --release -p belfry-bench -- run-logs [--jobs 5000] [--rounds 3] [--lines 200]
//! cargo run --release -p belfry-bench -- schedule-scans [--schedules 1000000] [--deadlines 30] [--rounds 7]
//! ```

mod autovacuum_stand_in;
mod dispatch_burst;
mod embedded_mode;
mod failover;
mod fire_cost;
mod follow_up_latency;
mod limit_accuracy;
mod million;
mod pooler_cost;
mod processes;
mod retention_volume;
mod run_log_cost;
mod sample;
mod schedule_scans;
mod shard_scale;
mod timer_lateness;
mod trace_export;
mod ui_pages;
mod worker_throughput;

#[global_allocator]
static ALLOC: timer_lateness::CountingAlloc = timer_lateness::CountingAlloc;

/// Every command and the flags it reads (each takes a whole number).
const COMMANDS: &[(&str, &[&str])] = &[
    ("worker", &["--jobs", "--sleep-jobs", "--rounds"]),
    ("timer", &["--seconds", "--big"]),
    ("traces", &["--fires", "--rounds"]),
    ("dispatch", &["--raw-fires", "--steady-seconds"]),
    ("ui", &["--schedules", "--runs", "--rounds"]),
    ("embedded", &["--fires", "--jobs", "--rounds"]),
    ("pooler", &["--fires", "--rounds"]),
    ("fire-cost", &["--fires", "--rounds"]),
    ("shard-scale", &["--small", "--large", "--rounds"]),
    ("failover", &["--schedules", "--rounds"]),
    ("retention", &["--rows", "--rounds"]),
    ("million", &["--schedules", "--raw"]),
    ("limits", &["--runs", "--seconds"]),
    ("follow-ups", &["--runs", "--depth"]),
    ("run-logs", &["--jobs", "--rounds", "--lines"]),
    (
        "schedule-scans",
        &["--schedules", "--deadlines", "--rounds"],
    ),
];

fn usage() -> String {
    let lines: Vec<String> = COMMANDS
        .iter()
        .map(|(command, flags)| {
            let flags: Vec<String> = flags.iter().map(|f| format!("[{f} N]")).collect();
            format!("belfry-bench {command} {}", flags.join(" "))
        })
        .collect();
    format!("usage: {}", lines.join("\n       "))
}

/// Refuses `args` (after the command) unless they are `flag value` pairs
/// of the command's flags: a mistyped flag must not start a long run with
/// defaults (`--help` once started the million-schedule run).
fn check_flags(command: &str, args: &[String]) -> anyhow::Result<()> {
    let known = COMMANDS
        .iter()
        .find(|(c, _)| *c == command)
        .map(|(_, flags)| *flags)
        .unwrap_or(&[]);
    for pair in args.chunks(2) {
        if !known.contains(&pair[0].as_str()) {
            anyhow::bail!(
                "{command}: unknown flag {:?}; it takes {}\n{}",
                pair[0],
                if known.is_empty() {
                    "no flags".to_owned()
                } else {
                    known.join(", ")
                },
                usage()
            );
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{}", usage());
        return Ok(());
    }
    if let Some(command) = args.first() {
        if command != "traces-child" {
            check_flags(command, &args[1..])?;
        }
    }
    let flag = |name: &str, default: usize| -> anyhow::Result<usize> {
        match args.iter().position(|a| a == name) {
            None => Ok(default),
            Some(i) => {
                let v = args
                    .get(i + 1)
                    .ok_or_else(|| anyhow::anyhow!("{name} needs a value"))?;
                v.parse()
                    .map_err(|_| anyhow::anyhow!("{name} {v:?}: expected a whole number"))
            }
        }
    };
    match args.first().map(String::as_str) {
        Some("timer") => {
            timer_lateness::run(
                u64::try_from(flag("--seconds", 10)?)?,
                flag("--big", 1_000_000)?,
            )
            .await
        }
        Some("worker") => {
            worker_throughput::run(
                flag("--jobs", 5000)?,
                flag("--sleep-jobs", 240)?,
                flag("--rounds", 3)?,
            )
            .await
        }
        Some("embedded") => {
            embedded_mode::run(
                flag("--fires", 2000)?,
                flag("--jobs", 5000)?,
                flag("--rounds", 3)?,
            )
            .await
        }
        Some("failover") => failover::run(flag("--schedules", 1000)?, flag("--rounds", 3)?).await,
        Some("shard-scale") => {
            shard_scale::run(
                &[flag("--small", 10_000)?, flag("--large", 100_000)?],
                flag("--rounds", 3)?,
            )
            .await
        }
        Some("million") => {
            million::run(flag("--schedules", 1_000_000)?, flag("--raw", 100_000)?).await
        }
        Some("retention") => {
            retention_volume::run(flag("--rows", 10_000_000)?, flag("--rounds", 3)?).await
        }
        Some("run-logs") => {
            run_log_cost::run(
                flag("--jobs", 5000)?,
                flag("--rounds", 3)?,
                u64::try_from(flag("--lines", 200)?)?,
            )
            .await
        }
        Some("follow-ups") => {
            follow_up_latency::run(flag("--runs", 200)?, flag("--depth", 8)?).await
        }
        Some("schedule-scans") => {
            schedule_scans::run(
                flag("--schedules", 1_000_000)?,
                flag("--deadlines", 30)?,
                flag("--rounds", 7)?,
            )
            .await
        }
        Some("limits") => limit_accuracy::run(flag("--runs", 60)?, flag("--seconds", 60)?).await,
        Some("fire-cost") => fire_cost::run(flag("--fires", 2000)?, flag("--rounds", 3)?).await,
        Some("pooler") => pooler_cost::run(flag("--fires", 2000)?, flag("--rounds", 5)?).await,
        Some("traces") => trace_export::run(flag("--fires", 3000)?, flag("--rounds", 5)?).await,
        Some("dispatch") => {
            dispatch_burst::run(
                flag("--raw-fires", 8000)?,
                u64::try_from(flag("--steady-seconds", 10)?)?,
            )
            .await
        }
        Some("ui") => {
            ui_pages::run(
                flag("--schedules", 1000)?,
                flag("--runs", 1_000_000)?,
                flag("--rounds", 20)?,
            )
            .await
        }
        Some("traces-child") => trace_export::child(flag("--fires", 3000)?).await,
        _ => {
            eprintln!("{}", usage());
            std::process::exit(2);
        }
    }
}
