//! The fault suite's verdict: what was expected to fire, what the ledger
//! holds, and what the probe saw executed, side by side.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::probe::Execution;
use super::{FaultConfig, Injected, Observations};
use belfry_testkit::TestEnv;

const TERMINAL: &str = "('succeeded', 'failed', 'dead')";

/// `(id, job_name, scheduled_at, status, finished_at, last_error,
/// claimed_by)` of a `job_runs` row.
type Row = (
    Uuid,
    String,
    DateTime<Utc>,
    String,
    Option<DateTime<Utc>>,
    Option<String>,
    Option<String>,
);

/// Pairs of executions of one run where the later started before the
/// earlier was answered, each as one line naming the run, the attempts and
/// the instants.
fn overlapping(executions: &[Execution]) -> Vec<(Uuid, String)> {
    let mut by_run: HashMap<Uuid, Vec<&Execution>> = HashMap::new();
    for e in executions {
        by_run.entry(e.run_id).or_default().push(e);
    }
    let mut pairs = Vec::new();
    for (run, list) in &mut by_run {
        list.sort_by_key(|e| e.arrived);
        for pair in list.windows(2) {
            if let Some(done) = pair[0].answered.filter(|done| pair[1].arrived < *done) {
                pairs.push((
                    *run,
                    format!(
                        "run {run}: attempt {} arrived {} and was answered {}; attempt {} arrived {}",
                        pair[0].attempt,
                        pair[0].arrived.format("%T%.3f"),
                        done.format("%T%.3f"),
                        pair[1].attempt,
                        pair[1].arrived.format("%T%.3f"),
                    ),
                ));
            }
        }
    }
    pairs
}

/// The `q` quantile of sorted `values` (nearest rank).
fn quantile(values: &[f64], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    Some(values[rank - 1])
}

/// Target for the takeover time of a killed worker's runs (p99).
pub const TAKEOVER_P99_TARGET_SECS: f64 = 30.0;

/// The table printed at the end of a run.
#[derive(Debug, Default)]
pub struct Report {
    /// Seed of the run.
    pub seed: u64,
    /// Length of the measured window in seconds.
    pub window_secs: i64,
    /// Schedules × seconds of the window.
    pub fires_expected: usize,
    /// Every `job_runs` row (the window and the fires around it).
    pub rows: usize,
    /// Rows whose fire instant is inside the window.
    pub rows_in_window: usize,
    /// Rows beyond the first for one (schedule, fire instant): must be 0.
    pub duplicate_rows: usize,
    /// Expected fires with no row and no policy skip: must be 0.
    pub fires_lost: usize,
    /// Expected fires skipped by the misfire policy (recorded in
    /// `skipped_fires`).
    pub fires_skipped_by_policy: usize,
    /// Rows not `succeeded`, `failed` or `dead` at the end: must be 0.
    pub not_terminal: usize,
    /// Rows `succeeded`.
    pub succeeded: usize,
    /// Rows `failed` or `dead`, with their errors (first few).
    pub failed_or_dead: Vec<String>,
    /// Handler executions the probe saw.
    pub executions: usize,
    /// Runs executed more than once before they succeeded (a crash
    /// between the handler and its recorded outcome: at-least-once).
    pub runs_rerun_before_success: usize,
    /// Executions that started after their run was recorded `succeeded`:
    /// must be 0.
    pub reexecutions_of_succeeded: usize,
    /// Succeeded runs the probe never saw executed: must be 0.
    pub succeeded_without_execution: usize,
    /// Rows claimed by a replica while its clock was skewed: must be 0.
    pub claims_while_skewed: usize,
    /// The schedules' misfire policy.
    pub misfire: String,
    /// Rows `dead` because their policy skipped them (claimed on time, not
    /// published before they were late): recorded with the reason.
    pub rows_skipped_by_policy: usize,
    /// Handler executions of rows their policy skipped: must be 0.
    pub executions_of_skipped: usize,
    /// Executions of one run that overlapped in time (one started before
    /// the previous one was answered): must be 0. Each pair as the run and
    /// a line that describes it.
    pub overlapping_executions: Vec<(Uuid, String)>,
    /// Poison messages published by the storms.
    pub poison_sent: usize,
    /// Poison messages never dead-lettered (with a reason): must be 0.
    pub poison_not_dead_lettered: usize,
    /// Poison messages dead-lettered twice: allowed here, where workers are
    /// killed and aborted at `before_ack` while they hold deliveries. A
    /// worker that dies after the dead-letter publish was confirmed and
    /// before its ack sees the delivery come back to another worker, which
    /// dead-letters it again (at-least-once; the same worker code
    /// dead-letters exactly once without a crash, as
    /// `poison_values::unstorable_messages_are_dead_lettered_once_and_good_ones_flow`
    /// checks).
    pub poison_dead_lettered_twice: usize,
    /// Poison messages dead-lettered three times or more: must be 0 (one
    /// crash between publish and ack makes at most one extra copy).
    pub poison_dead_lettered_more: usize,
    /// Dead letters that are not storm poison (with their reasons, first few).
    pub other_dead_letters: Vec<String>,
    /// Good messages of the storms.
    pub storm_good: usize,
    /// Good storm messages whose run did not succeed: must be 0.
    pub storm_good_not_succeeded: usize,
    /// Seconds from a worker's `kill -9` to the next attempt of each of its
    /// runs starting, sorted.
    pub takeover_secs: Vec<f64>,
    /// Runs of killed workers not timed: a service restart or a freeze of a
    /// worker (the other consumer) began within
    /// 30 s after the kill (nothing can be taken over while the ledger or
    /// the broker is down), or no later attempt started (the outcome was
    /// recorded just before the kill).
    pub takeovers_not_timed: usize,
    /// Faults injected, in order.
    pub injected: Vec<Injected>,
    /// Processes that exited while nobody stopped them: must be empty.
    pub unexpected_exits: Vec<String>,
    /// Graceful stops that did not exit 0 in time: must be empty.
    pub unclean_stops: Vec<String>,
    /// Succeeded runs of the schedules with a follow-up.
    pub follow_ups_expected: usize,
    /// Of those, runs with no follow-up row (by its derived run key): must
    /// be 0. (Two rows for one key cannot exist: the key is unique.)
    pub follow_ups_missing: usize,
    /// Follow-up rows whose parent did not succeed: must be 0.
    pub follow_ups_unexpected: usize,
    /// Whether everything finished within the drain deadlines.
    pub settled: bool,
    /// Log tails, when the run failed.
    pub log_tails: String,
    /// What became of the alert events of the run.
    pub alerts: super::alert_tally::AlertTally,
}

/// Whether schedule `i` of the suite has a follow-up on success (every
/// tenth).
pub fn has_follow_up(i: usize) -> bool {
    i.is_multiple_of(10)
}

/// The follow-up of schedule `i`'s runs.
pub fn follow_up_name(i: usize) -> String {
    format!("fault-{i:04}-then")
}

/// Waits until every fire of the window has a row or a policy skip and
/// every such row is terminal, and every ended run's follow-ups are
/// enqueued and ended too; returns whether that happened in `within`.
pub async fn wait_settled(
    env: &TestEnv,
    config: &FaultConfig,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    within: Duration,
) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(accounting) = Accounting::read(env).await {
            let open = accounting.open_in(from, to);
            let unaccounted = accounting.unaccounted(config, from, to).count();
            if open == 0 && unaccounted == 0 && accounting.follow_ups_pending_in(from, to) == 0 {
                return true;
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Spans `(after, until]` of skipped fires.
type Spans = Vec<(DateTime<Utc>, DateTime<Utc>)>;

/// What the ledger says about each fire: rows, skipped fires and spans of
/// skipped fires.
struct Accounting {
    /// `(job_name, scheduled_at)` → status, of every row.
    rows: HashMap<(String, DateTime<Utc>), String>,
    /// Fires recorded in `skipped_fires`.
    skipped: HashSet<(String, DateTime<Utc>)>,
    /// Spans `(after, until]` of `skipped_ranges`, by schedule.
    spans: HashMap<String, Spans>,
    /// Fire instants of ended runs whose follow-ups are not decided yet.
    undecided: Vec<DateTime<Utc>>,
    /// Run keys of follow-up runs not ended.
    open_follow_ups: Vec<String>,
}

impl Accounting {
    async fn read(env: &TestEnv) -> Option<Self> {
        let pool = env.ledger.pg_pool()?;
        let rows: Vec<(String, DateTime<Utc>, String)> =
            sqlx::query_as("SELECT job_name, scheduled_at, status FROM job_runs")
                .fetch_all(pool)
                .await
                .ok()?;
        let skipped: Vec<(String, DateTime<Utc>)> =
            sqlx::query_as("SELECT job_name, scheduled_at FROM skipped_fires")
                .fetch_all(pool)
                .await
                .ok()?;
        let spans: Vec<(String, DateTime<Utc>, DateTime<Utc>)> =
            sqlx::query_as("SELECT job_name, after_at, until_at FROM skipped_ranges")
                .fetch_all(pool)
                .await
                .ok()?;
        let undecided: Vec<DateTime<Utc>> = sqlx::query_scalar(
            "SELECT scheduled_at FROM job_runs WHERE follow_ups_done_at IS NULL \
                 AND options ? 'follow_ups' AND status IN ('succeeded', 'failed', 'dead', 'cancelled')",
        )
        .fetch_all(pool)
        .await
        .ok()?;
        let open_follow_ups: Vec<String> = sqlx::query_scalar(&format!(
            "SELECT run_key FROM job_runs WHERE job_name LIKE '%-then' AND status NOT IN {TERMINAL}"
        ))
        .fetch_all(pool)
        .await
        .ok()?;
        let mut by_schedule: HashMap<String, Spans> = HashMap::new();
        for (name, after, until) in spans {
            by_schedule.entry(name).or_default().push((after, until));
        }
        Some(Self {
            rows: rows.into_iter().map(|(n, at, st)| ((n, at), st)).collect(),
            skipped: skipped.into_iter().collect(),
            spans: by_schedule,
            undecided,
            open_follow_ups,
        })
    }

    /// Follow-ups of the window's fires not enqueued or not ended yet:
    /// undecided parents of the window, and follow-up runs whose key names
    /// an instant of the window (fires keep coming during the drain, and
    /// theirs are not waited for).
    fn follow_ups_pending_in(&self, from: DateTime<Utc>, to: DateTime<Utc>) -> usize {
        let in_window = |at: DateTime<Utc>| at >= from && at < to;
        let parents = self.undecided.iter().filter(|at| in_window(**at)).count();
        let children = self
            .open_follow_ups
            .iter()
            .filter(|key| {
                key.split_once('@')
                    .and_then(|(_, at)| at.parse::<DateTime<Utc>>().ok())
                    .is_none_or(in_window)
            })
            .count();
        parents + children
    }

    /// Rows of the window not terminal.
    fn open_in(&self, from: DateTime<Utc>, to: DateTime<Utc>) -> usize {
        self.rows
            .iter()
            .filter(|((_, at), st)| {
                *at >= from && *at < to && !matches!(st.as_str(), "succeeded" | "failed" | "dead")
            })
            .count()
    }

    /// Whether a policy recorded `(name, at)` as skipped.
    fn policy_skipped(&self, name: &str, at: DateTime<Utc>) -> bool {
        self.skipped.contains(&(name.to_owned(), at))
            || self
                .spans
                .get(name)
                .is_some_and(|spans| spans.iter().any(|(a, u)| *a < at && at <= *u))
    }

    /// Expected fires of the window with neither a row nor a policy skip.
    fn unaccounted<'a>(
        &'a self,
        config: &FaultConfig,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> impl Iterator<Item = (String, DateTime<Utc>)> + 'a {
        let seconds = (to - from).num_seconds();
        (0..config.schedules)
            .flat_map(move |i| {
                let name = format!("fault-{i:04}");
                (0..seconds).map(move |s| (name.clone(), from + chrono::Duration::seconds(s)))
            })
            .filter(|(name, at)| {
                !self.rows.contains_key(&(name.clone(), *at)) && !self.policy_skipped(name, *at)
            })
    }
}

/// Waits until no row at all is non-terminal; returns whether that
/// happened in `within`.
pub async fn wait_all_terminal(env: &TestEnv, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let open: Option<i64> = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM job_runs WHERE status NOT IN {TERMINAL}"
        ))
        .fetch_one(env.ledger.pg_pool().expect("a Postgres ledger"))
        .await
        .ok();
        if open == Some(0) {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn expected_count(config: &FaultConfig, from: DateTime<Utc>, to: DateTime<Utc>) -> usize {
    config.schedules * usize::try_from((to - from).num_seconds()).unwrap_or(0)
}

impl Report {
    /// Reads the ledger and compares it with the expected fires and the
    /// probe's executions.
    ///
    /// # Panics
    ///
    /// When the ledger cannot be read.
    pub async fn collect(
        env: &TestEnv,
        config: &FaultConfig,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        executions: &[Execution],
        injected: Vec<Injected>,
        observed: &Observations,
    ) -> Self {
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT id, job_name, scheduled_at, status, finished_at, last_error, claimed_by FROM job_runs",
        )
        .fetch_all(env.ledger.pg_pool().expect("a Postgres ledger"))
        .await
        .unwrap_or_else(|e| panic!("reading job_runs: {e}"));

        let mut report = Report {
            seed: config.seed,
            window_secs: (to - from).num_seconds(),
            fires_expected: expected_count(config, from, to),
            rows: rows.len(),
            injected,
            misfire: config.misfire.clone(),
            ..Default::default()
        };
        let skipped_rows: HashSet<Uuid> = rows
            .iter()
            .filter(|r| {
                r.3 == "dead"
                    && r.5
                        .as_deref()
                        .is_some_and(|e| e.starts_with("skipped by misfire policy"))
            })
            .map(|r| r.0)
            .collect();
        report.rows_skipped_by_policy = skipped_rows.len();
        let mut fires: HashSet<(String, DateTime<Utc>)> = HashSet::new();
        for (id, name, at, status, _, error, claimed_by) in &rows {
            // A follow-up's instant is when it was enqueued (a pass
            // enqueues several of one name at one instant); its key is
            // unique and accounted for in `follow_ups`.
            if !name.ends_with("-then") && !fires.insert((name.clone(), *at)) {
                report.duplicate_rows += 1;
            }
            if *at >= from && *at < to && !name.ends_with("-then") {
                report.rows_in_window += 1;
            }
            match status.as_str() {
                "succeeded" => report.succeeded += 1,
                "dead" if skipped_rows.contains(id) => {}
                "failed" | "dead" => {
                    if report.failed_or_dead.len() < 5 {
                        report.failed_or_dead.push(format!(
                            "{name}@{at}: {status}: {}",
                            error.as_deref().unwrap_or("")
                        ));
                    } else {
                        report.failed_or_dead.push(String::new());
                    }
                }
                _ => report.not_terminal += 1,
            }
            // A fire claimed while skewed; a follow-up's key does not
            // depend on the replica's clock (it is derived from its
            // parent's), so its pass is not held by the clock guard.
            if claimed_by
                .as_deref()
                .is_some_and(|c| c.ends_with("-skewed") && !c.starts_with("follow-up:"))
            {
                report.claims_while_skewed += 1;
            }
        }
        let accounting = Accounting::read(env)
            .await
            .unwrap_or_else(|| panic!("reading the ledger's accounting"));
        let seconds = (to - from).num_seconds();
        for i in 0..config.schedules {
            let name = format!("fault-{i:04}");
            for s in 0..seconds {
                let at = from + chrono::Duration::seconds(s);
                if fires.contains(&(name.clone(), at)) {
                    continue;
                }
                if accounting.policy_skipped(&name, at) {
                    report.fires_skipped_by_policy += 1;
                } else {
                    report.fires_lost += 1;
                }
            }
        }

        report.follow_ups(env, config, &rows, (from, to)).await;
        report.executions = executions.len();
        let finished: HashMap<Uuid, Option<DateTime<Utc>>> = rows
            .iter()
            .filter(|r| r.3 == "succeeded")
            .map(|r| (r.0, r.4))
            .collect();
        let mut per_run: HashMap<Uuid, usize> = HashMap::new();
        for e in executions {
            *per_run.entry(e.run_id).or_default() += 1;
            if let Some(Some(done)) = finished.get(&e.run_id) {
                if e.arrived > *done {
                    report.reexecutions_of_succeeded += 1;
                }
            }
        }
        report.runs_rerun_before_success = finished
            .keys()
            .filter(|id| per_run.get(id).copied().unwrap_or(0) > 1)
            .count();
        report.succeeded_without_execution = finished
            .keys()
            .filter(|id| !per_run.contains_key(id))
            .count();
        report.executions_of_skipped = executions
            .iter()
            .filter(|e| skipped_rows.contains(&e.run_id))
            .count();
        report.overlapping_executions = overlapping(executions);
        report.takeovers(executions, observed);
        report.storm(env, observed, &rows).await;
        report
    }

    /// The follow-ups' accounting: every succeeded fire of the window of a
    /// schedule with a follow-up has its follow-up, keyed
    /// `{follow-up}@{fire instant}`, and no follow-up exists but those of
    /// succeeded fires. (Fires after the window may end after the last
    /// scheduler stopped, and a follow-up is enqueued by a scheduler's
    /// pass: theirs wait, undecided, for the next start, so they are not
    /// expected here.)
    async fn follow_ups(
        &mut self,
        env: &TestEnv,
        config: &FaultConfig,
        rows: &[Row],
        (from, to): (DateTime<Utc>, DateTime<Utc>),
    ) {
        let keys: Vec<String> =
            sqlx::query_scalar("SELECT run_key FROM job_runs WHERE job_name LIKE '%-then'")
                .fetch_all(env.ledger.pg_pool().expect("a Postgres ledger"))
                .await
                .unwrap_or_else(|e| panic!("reading follow-up runs: {e}"));
        let mut children: HashSet<String> = keys.into_iter().collect();
        let parents: HashMap<String, String> = (0..config.schedules)
            .filter(|i| has_follow_up(*i))
            .map(|i| (format!("fault-{i:04}"), follow_up_name(i)))
            .collect();
        for (_, name, at, status, ..) in rows {
            let Some(child) = parents.get(name) else {
                continue;
            };
            if status != "succeeded" {
                continue;
            }
            let key = format!("{child}@{}", at.format("%Y-%m-%dT%H:%M:%SZ"));
            let found = children.remove(&key);
            if *at >= from && *at < to {
                self.follow_ups_expected += 1;
                if !found {
                    self.follow_ups_missing += 1;
                }
            }
        }
        self.follow_ups_unexpected = children.len();
    }

    /// Seconds from each worker kill to the next attempt of each run it was
    /// running (runs that got no later attempt had recorded their outcome
    /// just before the kill).
    fn takeovers(&mut self, executions: &[Execution], observed: &Observations) {
        for (killed_at, running) in &observed.worker_kills {
            // A service restart, or the other worker frozen, within 30 s
            // of the kill: the takeover waits for it, not for the lease.
            let blocked =
                observed
                    .outages
                    .iter()
                    .chain(&observed.worker_freezes)
                    .any(|(began, ended)| {
                        *ended >= *killed_at && *began <= *killed_at + chrono::Duration::seconds(30)
                    });
            for (id, attempt) in running {
                if blocked {
                    self.takeovers_not_timed += 1;
                    continue;
                }
                let next = executions
                    .iter()
                    .filter(|e| e.run_id == *id && i64::from(e.attempt) > i64::from(*attempt))
                    .map(|e| e.arrived)
                    .min();
                match next {
                    Some(next) => self
                        .takeover_secs
                        .push((next - *killed_at).num_milliseconds() as f64 / 1000.0),
                    None => self.takeovers_not_timed += 1,
                }
            }
        }
        self.takeover_secs.sort_by(f64::total_cmp);
    }

    /// The storms' accounting: every poison body dead-lettered exactly
    /// once, every good message's run succeeded.
    async fn storm(&mut self, env: &TestEnv, observed: &Observations, rows: &[Row]) {
        self.poison_sent = observed.storm.poison.len();
        self.storm_good = observed.storm.good.len();
        let dead = env.drain_dead_letters().await;
        let mut seen: HashMap<&[u8], usize> = HashMap::new();
        for (body, reason) in &dead {
            if observed.storm.poison.iter().any(|p| p == body) && !reason.is_empty() {
                *seen.entry(body.as_slice()).or_default() += 1;
            } else if self.other_dead_letters.len() < 5 {
                self.other_dead_letters
                    .push(format!("{:.80}: {reason}", String::from_utf8_lossy(body)));
            } else {
                self.other_dead_letters.push(String::new());
            }
        }
        let copies = |n: &dyn Fn(usize) -> bool| {
            observed
                .storm
                .poison
                .iter()
                .filter(|p| n(seen.get(p.as_slice()).copied().unwrap_or(0)))
                .count()
        };
        self.poison_not_dead_lettered = copies(&|n| n == 0);
        self.poison_dead_lettered_twice = copies(&|n| n == 2);
        self.poison_dead_lettered_more = copies(&|n| n > 2);
        let succeeded: HashSet<&str> = rows
            .iter()
            .filter(|r| r.3 == "succeeded")
            .map(|r| r.1.as_str())
            .collect();
        self.storm_good_not_succeeded = observed
            .storm
            .good
            .iter()
            .filter(|name| !succeeded.contains(name.as_str()))
            .count();
    }

    /// The `q` quantile (0..=1) of the takeover times.
    pub fn takeover_quantile(&self, q: f64) -> Option<f64> {
        quantile(&self.takeover_secs, q)
    }

    /// Whether every "must be 0" line is 0 and everything settled.
    pub fn passed(&self) -> bool {
        self.duplicate_rows == 0
            && self.fires_lost == 0
            && self.not_terminal == 0
            && self.reexecutions_of_succeeded == 0
            && self.succeeded_without_execution == 0
            && self.claims_while_skewed == 0
            && self.executions_of_skipped == 0
            && self.overlapping_executions.is_empty()
            && self.poison_not_dead_lettered == 0
            && self.poison_dead_lettered_more == 0
            && self.storm_good_not_succeeded == 0
            && self
                .takeover_quantile(0.99)
                .is_none_or(|p99| p99 < TAKEOVER_P99_TARGET_SECS)
            && self.unexpected_exits.is_empty()
            && self.unclean_stops.is_empty()
            && self.follow_ups_missing == 0
            && self.follow_ups_unexpected == 0
            && self.settled
            && self.alerts.passed()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "| fault suite (seed {}) | value | must be |", self.seed)?;
        writeln!(f, "| --- | ---: | --- |")?;
        let rows: [(&str, String, &str); 19] = [
            ("measured window (s)", self.window_secs.to_string(), ""),
            ("faults injected", self.injected.len().to_string(), ""),
            (
                "fires expected in the window",
                self.fires_expected.to_string(),
                "",
            ),
            (
                "`job_runs` rows of fires in the window (follow-ups aside)",
                self.rows_in_window.to_string(),
                "= expected − skipped",
            ),
            ("`job_runs` rows in all", self.rows.to_string(), ""),
            (
                "duplicate rows (same schedule and instant)",
                self.duplicate_rows.to_string(),
                "0",
            ),
            (
                "fires lost (no row, no policy skip)",
                self.fires_lost.to_string(),
                "0",
            ),
            (
                "fires skipped by the misfire policy",
                self.fires_skipped_by_policy.to_string(),
                "",
            ),
            (
                "rows not terminal at the end",
                self.not_terminal.to_string(),
                "0",
            ),
            ("rows succeeded", self.succeeded.to_string(), ""),
            (
                "rows failed or dead",
                self.failed_or_dead.len().to_string(),
                "",
            ),
            (
                "handler executions (probe)",
                self.executions.to_string(),
                "",
            ),
            (
                "runs executed again before success (at-least-once)",
                self.runs_rerun_before_success.to_string(),
                "",
            ),
            (
                "executions of already-succeeded runs",
                self.reexecutions_of_succeeded.to_string(),
                "0",
            ),
            (
                "succeeded runs never executed",
                self.succeeded_without_execution.to_string(),
                "0",
            ),
            (
                "claims by a replica with a skewed clock",
                self.claims_while_skewed.to_string(),
                "0",
            ),
            (
                "succeeded fires of the window with a follow-up",
                self.follow_ups_expected.to_string(),
                "",
            ),
            (
                "of those, without their follow-up run",
                self.follow_ups_missing.to_string(),
                "0",
            ),
            (
                "follow-up runs of a run that did not succeed",
                self.follow_ups_unexpected.to_string(),
                "0",
            ),
        ];
        for (what, value, must) in rows {
            writeln!(f, "| {what} | {value} | {must} |")?;
        }
        let q = |q: f64| {
            self.takeover_quantile(q)
                .map_or_else(|| "–".to_owned(), |v| format!("{v:.1}"))
        };
        let more: [(&str, String, String); 12] = [
            ("misfire policy", self.misfire.clone(), String::new()),
            (
                "rows skipped by the policy after their claim (dead, with the reason)",
                self.rows_skipped_by_policy.to_string(),
                String::new(),
            ),
            (
                "executions of rows the policy skipped",
                self.executions_of_skipped.to_string(),
                "0".into(),
            ),
            (
                "overlapping executions of one run",
                self.overlapping_executions.len().to_string(),
                "0".into(),
            ),
            (
                "poison messages published (storms)",
                self.poison_sent.to_string(),
                String::new(),
            ),
            (
                "poison messages never dead-lettered",
                self.poison_not_dead_lettered.to_string(),
                "0".into(),
            ),
            (
                "poison messages dead-lettered twice (a worker died between the dead-letter publish and its ack)",
                self.poison_dead_lettered_twice.to_string(),
                String::new(),
            ),
            (
                "poison messages dead-lettered three times or more",
                self.poison_dead_lettered_more.to_string(),
                "0".into(),
            ),
            (
                "good storm messages not succeeded",
                format!("{} of {}", self.storm_good_not_succeeded, self.storm_good),
                "0".into(),
            ),
            (
                "other dead letters",
                self.other_dead_letters.len().to_string(),
                String::new(),
            ),
            (
                "runs of killed workers (timed / not timed: an outage or a worker frozen within 30 s, or finished)",
                format!(
                    "{} / {}",
                    self.takeover_secs.len(),
                    self.takeovers_not_timed
                ),
                String::new(),
            ),
            (
                "kill -9 of a worker → next attempt, s (p50 / p99 / max)",
                format!("{} / {} / {}", q(0.5), q(0.99), q(1.0)),
                format!("p99 < {TAKEOVER_P99_TARGET_SECS}"),
            ),
        ];
        for (what, value, must) in more {
            writeln!(f, "| {what} | {value} | {must} |")?;
        }
        writeln!(
            f,
            "| processes that exited on their own | {} | 0 |",
            self.unexpected_exits.len()
        )?;
        writeln!(
            f,
            "| graceful stops not exiting 0 in time | {} | 0 |",
            self.unclean_stops.len()
        )?;
        writeln!(
            f,
            "| settled within the drain deadline | {} | yes |",
            if self.settled { "yes" } else { "no" }
        )?;
        let a = &self.alerts;
        let kinds: Vec<String> = a.by_kind.iter().map(|(k, n)| format!("{k} {n}")).collect();
        writeln!(
            f,
            "| alert events ({}) | {} | |",
            if kinds.is_empty() {
                "none".to_owned()
            } else {
                kinds.join(", ")
            },
            a.events
        )?;
        writeln!(
            f,
            "| alert events recorded twice | {} | 0 |",
            a.duplicate_events
        )?;
        writeln!(f, "| alert events never alerted | {} | 0 |", a.missing)?;
        writeln!(
            f,
            "| alerts received twice (a replica died between the send and its record) | {} | |",
            a.repeated
        )?;
        writeln!(
            f,
            "| alerts received three times or more | {} | 0 |",
            a.repeated_more
        )?;
        writeln!(f, "| alert deliveries given up | {} | 0 |", a.given_up)?;
        writeln!(
            f,
            "| alerts settled within 60 s of the end | {} | yes |",
            if a.settled { "yes" } else { "no" }
        )?;
        writeln!(f)?;
        for i in &self.injected {
            writeln!(f, "- t+{:.1}s ({:.1}s): {}", i.at, i.took, i.what)?;
        }
        for e in self.failed_or_dead.iter().filter(|e| !e.is_empty()) {
            writeln!(f, "- failed/dead: {e}")?;
        }
        for e in self.other_dead_letters.iter().filter(|e| !e.is_empty()) {
            writeln!(f, "- other dead letter: {e}")?;
        }
        for e in &self.alerts.duplicate_examples {
            writeln!(f, "- alert event recorded twice: {e}")?;
        }
        for (_, pair) in &self.overlapping_executions {
            writeln!(f, "- overlapping executions: {pair}")?;
        }
        for e in self.unexpected_exits.iter().chain(&self.unclean_stops) {
            writeln!(f, "- {e}")?;
        }
        if !self.log_tails.is_empty() {
            writeln!(f, "\n{}", self.log_tails)?;
        }
        Ok(())
    }
}
