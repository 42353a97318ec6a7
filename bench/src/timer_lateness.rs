//! The timer, side by side with tokio-cron-scheduler 0.15.1 on the same
//! schedules in one process: lateness (nominal instant → hand-off to
//! claiming) p50/p99/max and missed fires for 1, 1,000 and 10,000 schedules
//! firing every second; heap bytes per idle schedule; time to load 100,000
//! and 1,000,000 schedules.
//!
//! belfry's side is the replica's own timer ([`belfry_scheduler::Timer`]:
//! one heap, one sleep), driven exactly as `Replica::run` drives it, with
//! the claim replaced by recording the hand-off instant. tokio-cron-
//! scheduler's callback does not receive the scheduled instant, so its
//! nominal instant is the whole second the callback ran in (its lateness is
//! below a second here, so this attributes every call correctly).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, SubsecRound, Utc};
use tokio_util::sync::CancellationToken;

use belfry_protocol::ScheduleSpec;
use belfry_runtime::{SharedClock, SystemClock};
use belfry_scheduler::zoned_cron::CronCache;
use belfry_scheduler::{Schedule, Timer};

/// Counts live heap bytes, for bytes-per-schedule.
pub struct CountingAlloc;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: delegates every call to the system allocator unchanged and only
// adds bookkeeping on an atomic counter.
#[allow(unsafe_code)] // `GlobalAlloc` is an unsafe trait; see bench/Cargo.toml.
unsafe impl std::alloc::GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { std::alloc::System.realloc(ptr, layout, new_size) }
    }
}

fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// Schedule `i`, every second. With `distinct`, schedules get different
/// expression texts (`0-k,k+1-59 ...`: the same meaning, another string;
/// 80,063 different ones, so up to that many schedules share nothing);
/// otherwise all share `* * * * * *`.
fn every_second(i: usize, cache: &mut CronCache, distinct: bool) -> anyhow::Result<Schedule> {
    let expr = if distinct {
        let (k, m, h) = (1 + i % 59, 1 + (i / 59) % 59, 1 + (i / 3481) % 23);
        format!(
            "0-{},{k}-59 0-{},{m}-59 0-{},{h}-23 * * *",
            k - 1,
            m - 1,
            h - 1
        )
    } else {
        "* * * * * *".to_owned()
    };
    Ok(Schedule::from_spec_cached(
        &ScheduleSpec {
            name: format!("job-{i:07}"),
            cron: Some(expr),
            job_type: "noop".into(),
            ..ScheduleSpec::default()
        },
        cache,
    )?)
}

fn schedules(n: usize, distinct: bool) -> anyhow::Result<Vec<Arc<Schedule>>> {
    let mut cache = CronCache::default();
    (0..n)
        .map(|i| every_second(i, &mut cache, distinct).map(Arc::new))
        .collect()
}

/// Lateness statistics of one run.
struct Lateness {
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    fires: usize,
    expected: usize,
}

fn stats(mut late_ms: Vec<f64>, expected: usize) -> Lateness {
    late_ms.sort_by(f64::total_cmp);
    let at = |q: f64| {
        late_ms
            .get(((late_ms.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    Lateness {
        p50_ms: at(0.5),
        p99_ms: at(0.99),
        max_ms: late_ms.last().copied().unwrap_or(f64::NAN),
        fires: late_ms.len(),
        expected,
    }
}

/// The seconds strictly inside the measuring window: every schedule must
/// fire once at each.
fn window(start: DateTime<Utc>, seconds: u64) -> (DateTime<Utc>, DateTime<Utc>) {
    let first = start.trunc_subsecs(0) + chrono::Duration::seconds(2);
    (
        first,
        first + chrono::Duration::seconds(i64::try_from(seconds).unwrap_or(10) - 1),
    )
}

async fn belfry_run(n: usize, seconds: u64, distinct: bool) -> anyhow::Result<Lateness> {
    let schedules = schedules(n, distinct)?;
    let clock: SharedClock = Arc::new(SystemClock);
    let start = Utc::now();
    let (first, last) = window(start, seconds);
    let mut timer = Timer::new(schedules, start);
    let cancel = CancellationToken::new();
    let mut late = Vec::with_capacity(n * usize::try_from(seconds)?);
    loop {
        // The replica's loop: sleep until the earliest wake-up, take what
        // is due, hand it off (here: note when).
        tokio::select! {
            biased;
            _ = cancel.cancelled() => break,
            _ = timer.wait(&clock) => {}
        }
        let due = timer.due(clock.now());
        let handed = Utc::now();
        for fire in &due.fires {
            if fire.at >= first && fire.at <= last {
                late.push((handed - fire.at).num_microseconds().unwrap_or(0) as f64 / 1000.0);
            }
        }
        if handed > last + chrono::Duration::seconds(1) {
            break;
        }
    }
    let expected = n * usize::try_from((last - first).num_seconds() + 1)?;
    Ok(stats(late, expected))
}

async fn tcs_run(n: usize, seconds: u64) -> anyhow::Result<Lateness> {
    use tokio_cron_scheduler::{Job, JobScheduler};
    let mut sched = JobScheduler::new().await?;
    let calls: Arc<Mutex<Vec<DateTime<Utc>>>> = Arc::new(Mutex::new(Vec::with_capacity(
        n * usize::try_from(seconds)?,
    )));
    for _ in 0..n {
        let calls = calls.clone();
        let job = Job::new_async("* * * * * *", move |_id, _s| {
            let calls = calls.clone();
            Box::pin(async move {
                let now = Utc::now();
                calls.lock().unwrap_or_else(|p| p.into_inner()).push(now);
            })
        })?;
        sched.add(job).await?;
    }
    let start = Utc::now();
    let (first, last) = window(start, seconds);
    sched.start().await?;
    let until = (last + chrono::Duration::seconds(2) - Utc::now())
        .to_std()
        .unwrap_or_default();
    tokio::time::sleep(until).await;
    sched.shutdown().await?;
    let calls = calls.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let mut late = Vec::new();
    let mut per_second: HashMap<i64, usize> = HashMap::new();
    for t in calls {
        let nominal = t.trunc_subsecs(0);
        if nominal >= first && nominal <= last {
            late.push((t - nominal).num_microseconds().unwrap_or(0) as f64 / 1000.0);
            *per_second.entry(nominal.timestamp()).or_default() += 1;
        }
    }
    let expected = n * usize::try_from((last - first).num_seconds() + 1)?;
    Ok(stats(late, expected))
}

fn load_belfry(n: usize, distinct: bool) -> anyhow::Result<(Duration, f64)> {
    let before = live();
    let started = Instant::now();
    let schedules = schedules(n, distinct)?;
    let timer = Timer::new(schedules, Utc::now());
    let took = started.elapsed();
    let bytes = live().saturating_sub(before) as f64 / n as f64;
    drop(timer);
    Ok((took, bytes))
}

async fn load_tcs(n: usize, limit: Duration) -> anyhow::Result<(Option<Duration>, usize, f64)> {
    use tokio_cron_scheduler::{Job, JobScheduler};
    let before = live();
    let started = Instant::now();
    let sched = JobScheduler::new().await?;
    let mut added = 0;
    for _ in 0..n {
        let job = Job::new_async("* * * * * *", |_id, _s| Box::pin(async {}))?;
        sched.add(job).await?;
        added += 1;
        if started.elapsed() > limit {
            break;
        }
    }
    let took = started.elapsed();
    let bytes = live().saturating_sub(before) as f64 / added.max(1) as f64;
    Ok(((added == n).then_some(took), added, bytes))
}

/// Runs the timer benchmark and prints markdown tables.
pub async fn run(seconds: u64, big: usize) -> anyhow::Result<()> {
    println!(
        "timer lateness: nominal instant → hand-off, every-second schedules, {seconds} s window"
    );
    println!();
    println!("| schedules | scheduler | fires | missed | p50 ms | p99 ms | max ms |");
    println!("| ---: | --- | ---: | ---: | ---: | ---: | ---: |");
    let row = |n: usize, name: &str, l: &Lateness| {
        println!(
            "| {n} | {name} | {} | {} ({:.1} %) | {:.2} | {:.2} | {:.2} |",
            l.fires,
            l.expected.saturating_sub(l.fires),
            100.0 * l.expected.saturating_sub(l.fires) as f64 / l.expected as f64,
            l.p50_ms,
            l.p99_ms,
            l.max_ms
        );
    };
    for n in [1, 1_000, 10_000] {
        row(n, "belfry", &belfry_run(n, seconds, false).await?);
        if n > 1 {
            row(
                n,
                "belfry, distinct expressions",
                &belfry_run(n, seconds, true).await?,
            );
        }
        row(
            n,
            "tokio-cron-scheduler 0.15.1",
            &tcs_run(n, seconds).await?,
        );
    }
    println!();
    println!("| loading | scheduler | time | heap bytes per schedule |");
    println!("| ---: | --- | ---: | ---: |");
    for n in [100_000, big] {
        let (took, bytes) = load_belfry(n, false)?;
        println!(
            "| {n} | belfry | {:.2} s | {bytes:.0} |",
            took.as_secs_f64()
        );
        let (took, bytes) = load_belfry(n, true)?;
        println!(
            "| {n} | belfry, distinct expressions | {:.2} s | {bytes:.0} |",
            took.as_secs_f64()
        );
        let limit = Duration::from_secs(60);
        let (took, added, bytes) = load_tcs(n, limit).await?;
        match took {
            Some(t) => println!("| {n} | tokio-cron-scheduler 0.15.1 | {:.2} s | {bytes:.0} |", t.as_secs_f64()),
            None => println!("| {n} | tokio-cron-scheduler 0.15.1 | not done in {} s ({added} added) | {bytes:.0} |", limit.as_secs()),
        }
    }
    Ok(())
}
