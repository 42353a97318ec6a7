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
//! ```

mod dispatch_burst;
mod embedded_mode;
mod failover;
mod fire_cost;
mod million;
mod pooler_cost;
mod processes;
mod retention_volume;
mod sample;
mod shard_scale;
mod timer_lateness;
mod trace_export;
mod ui_pages;
mod worker_throughput;

#[global_allocator]
static ALLOC: timer_lateness::CountingAlloc = timer_lateness::CountingAlloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
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
            eprintln!("usage: belfry-bench worker [--jobs N] [--sleep-jobs N] [--rounds N]\n       belfry-bench timer [--seconds N] [--big N]\n       belfry-bench traces [--fires N] [--rounds N]\n       belfry-bench dispatch [--raw-fires N] [--steady-seconds N]\n       belfry-bench ui [--schedules N] [--runs N] [--rounds N]\n       belfry-bench embedded [--fires N] [--jobs N] [--rounds N]\n       belfry-bench pooler [--fires N] [--rounds N]\n       belfry-bench fire-cost [--fires N] [--rounds N]\n       belfry-bench shard-scale [--small N] [--large N] [--rounds N]\n       belfry-bench failover [--schedules N] [--rounds N]\n       belfry-bench retention [--rows N] [--rounds N]\n       belfry-bench million [--schedules N] [--raw N]");
            std::process::exit(2);
        }
    }
}
