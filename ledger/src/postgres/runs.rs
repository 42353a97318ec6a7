//! Runs on Postgres: the claim (`INSERT ... ON CONFLICT DO NOTHING` on
//! `UNIQUE(job_name, run_key, key_instant)`, one statement for a batch),
//! dispatch,
//! attempts under leases (guarded `UPDATE`s, so a duplicate delivery never
//! moves a finished run back) and lookups.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use async_trait::async_trait;
use belfry_protocol::JobMessage;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::partition_map::{Lookup, PARENT};
use super::run_partitions::{is_code, UNDEFINED_TABLE};
use super::PgStore;
use crate::attempt_batch::{BeginRequest, EndRequest, LeaseRenewal};
use crate::cancel::{CancelNotice, CancelOutcome, CancelRequest, CANCEL_CHANNEL};
use crate::run_rows::{options_json, FromMessage, RunLookup};
use crate::runs::{NewRun, RunRecord, RunState};
use crate::status::{waiting_statuses, WAITING};
use crate::store::RunStore;
use crate::{LedgerError, RunStatus};

/// A batched statement's guard on a run's status, written so that no index
/// can serve it: `status` is `NOT NULL`, so this is `j.status`, but the
/// planner cannot match it to the partial index on unfinished runs'
/// `(status, updated_at)`. That index keeps an entry for every version of
/// every run that was once waiting or running until a vacuum removes it,
/// and bitmap scans never mark such entries dead, so a plan that finds the
/// batch's rows through it (which Postgres chose for the end's generic
/// plan once statistics showed few running runs) reads every run finished
/// since the last vacuum at each statement: the worker's end went from 1.3
/// to 3.9 ms over 17 s of a 20,000-job run, and back at each vacuum. The
/// statements find their rows by id or run key instead.
macro_rules! guard_status {
    () => {
        "coalesce(j.status, '')"
    };
}
pub(crate) use guard_status;

/// The guard of a start: the run `j` is not being run by any attempt —
/// waiting, or running under a lease that expired (and not being
/// cancelled). Shared by the batched start and the limited one
/// (`super::concurrency`), so both start exactly the same runs.
macro_rules! startable {
    () => {
        concat!(
            "(",
            $crate::postgres::runs::guard_status!(),
            " IN ",
            $crate::status::waiting_statuses!(),
            " OR (",
            $crate::postgres::runs::guard_status!(),
            " = 'running' AND (j.lease_until IS NULL OR j.lease_until < now()) \
             AND j.cancel_requested_at IS NULL))"
        )
    };
}
pub(crate) use startable;

/// The statement of [`RunStore::end_batch`], a format string: `{table}` is
/// the table written (the parent or one day's partition, see
/// `partition_map`); `$hint` narrows it to the partitions named by `$8` (a
/// literal: two prepared statements per table, each planned once).
macro_rules! end_batch_sql {
    ($hint:literal) => {
        concat!(
            "WITH b AS (SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::bool[], $5::jsonb[], \
                                    $6::timestamptz[], $7::int[]) \
                                    AS b(id, status, last_error, terminal, entry, redispatch_at, attempt)), \
                              locked AS ( \
                             SELECT j.id FROM {table} j JOIN b ON j.id = b.id \
                             WHERE ", guard_status!(), " = 'running' AND j.attempts = b.attempt", $hint, " \
                             ORDER BY j.id FOR UPDATE OF j) \
                         UPDATE {table} j SET \
                             status = CASE WHEN NOT b.terminal AND j.cancel_requested_at IS NOT NULL \
                                 THEN 'cancelled' ELSE b.status END, \
                             last_error = CASE WHEN b.status = 'cancelled' OR (NOT b.terminal AND j.cancel_requested_at IS NOT NULL) \
                                 THEN COALESCE(j.cancel_reason, b.last_error) ELSE b.last_error END, \
                             finished_at = CASE WHEN b.terminal OR j.cancel_requested_at IS NOT NULL THEN now() ELSE NULL END, \
                             attempt_log = j.attempt_log || jsonb_build_array(b.entry), \
                             next_dispatch_at = CASE WHEN j.cancel_requested_at IS NULL THEN b.redispatch_at END, \
                             lease_until = NULL, updated_at = now() \
                         FROM b, locked \
                         WHERE j.id = locked.id AND j.id = b.id AND ", guard_status!(), " = 'running' AND j.attempts = b.attempt", $hint, " \
                         RETURNING j.id, j.attempts"
        )
    };
}

/// The statement of [`RunStore::renew_leases`]; `{table}` and `$hint` as
/// in [`end_batch_sql`], the partitions in `$4`.
macro_rules! renew_leases_sql {
    ($hint:literal) => {
        concat!(
            "WITH b AS (SELECT * FROM unnest($1::uuid[], $2::int[]) AS b(id, attempt)), \
                              locked AS ( \
                             SELECT j.id FROM {table} j JOIN b ON j.id = b.id \
                             WHERE ", guard_status!(), " = 'running' AND j.attempts = b.attempt", $hint, " \
                             ORDER BY j.id FOR UPDATE OF j) \
                         UPDATE {table} j SET lease_until = now() + make_interval(secs => $3) \
                         FROM b, locked \
                         WHERE j.id = locked.id AND j.id = b.id AND ", guard_status!(), " = 'running' AND j.attempts = b.attempt", $hint, " \
                         RETURNING j.id, j.attempts, j.cancel_requested_at IS NOT NULL, j.cancel_immediate"
        )
    };
}

/// `statement` with its partition hints bound as its last value, when it
/// has them (its text then names them; see `partition_hints`).
fn with_hints<'q, O>(
    statement: sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments>,
    hints: Option<Vec<DateTime<Utc>>>,
) -> sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments> {
    match hints {
        Some(hints) => statement.bind(hints),
        None => statement,
    }
}

/// The statement of [`RunStore::begin_batch`], a format string: `{table}`
/// as in [`end_batch_sql`]. The guard of a startable run (waiting, or
/// running under an expired lease), row by row. A run named twice in one
/// batch is updated once; the other request gets no row and takes the slow
/// path, which sees the run held. Rows are locked in id order first (as the
/// schedulers' batched `dispatched` update and `end_batch` do), so
/// concurrent batches wait instead of deadlocking.
macro_rules! begin_batch_sql {
    () => {
        concat!("WITH b AS (SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::float8[]) \
                    AS b(job_name, run_key, worker, lease)), \
              locked AS ( \
             SELECT j.id FROM {table} j JOIN b ON j.job_name = b.job_name AND j.run_key = b.run_key \
             WHERE j.key_instant = ANY($5) AND ", startable!(), " \
             ORDER BY j.id FOR UPDATE OF j) \
         UPDATE {table} j SET status = 'running', attempts = j.attempts + 1, \
             started_at = COALESCE(j.started_at, now()), worker = b.worker, next_dispatch_at = NULL, \
             lease_until = now() + make_interval(secs => b.lease), updated_at = now() \
         FROM b, locked \
         WHERE j.id = locked.id AND j.key_instant = ANY($5) \
           AND j.job_name = b.job_name AND j.run_key = b.run_key \
           AND ", startable!(), " \
         RETURNING j.job_name, j.run_key, j.id, j.attempts, j.key_instant")
    };
}

/// Whether `e` says a table a statement named does not exist: a day
/// partition retention dropped after the map was read.
fn is_undefined_table(e: &LedgerError) -> bool {
    matches!(e, LedgerError::Query(q) if is_code(q, UNDEFINED_TABLE))
}

/// A row [`RunStore::begin_batch`] started: name, key, id, attempt, key
/// instant.
type StartedRow = (String, String, Uuid, i32, DateTime<Utc>);
/// A lease [`RunStore::renew_leases`] extended: id, attempt, cancel
/// requested, immediate.
type RenewedRow = (Uuid, i32, bool, bool);

impl PgStore {
    /// The table a statement on runs with partition keys `instants` names:
    /// the one day partition holding them all, else the parent (see
    /// `partition_map`). Reads the catalog when the map is stale; a failed
    /// read names the parent (the statement then reports the outage).
    async fn day_table(&self, instants: &[DateTime<Utc>]) -> String {
        let now = std::time::Instant::now();
        let lookup = match self.tables.lookup(instants, now) {
            Lookup::Stale => match super::run_partitions::list(&self.route).await {
                Ok(partitions) => {
                    self.tables.store(partitions, now);
                    self.tables.lookup(instants, now)
                }
                Err(e) => {
                    tracing::debug!(error = %e, "cannot read the run partitions; writing through the parent table");
                    Lookup::Parent
                }
            },
            known => known,
        };
        match lookup {
            Lookup::Table(table) => table,
            Lookup::Parent | Lookup::Stale => PARENT.to_owned(),
        }
    }

    /// Runs a batched by-id statement `run` (its table, its rows, their
    /// partition hints) on the day table holding every row of `rows` when
    /// there is one, then on the parent for every row that did not settle
    /// there (`key` of a request against `settled` of an answer): a row
    /// the day's table did not hold, or all of them when the table was
    /// gone. A superseded attempt is thus asked twice and refused twice;
    /// a stale map can cost a statement, never an outcome.
    async fn on_day_table<'a, T, R, F, Fut>(
        &self,
        rows: &[&'a T],
        key: impl Fn(&T) -> (Uuid, i32),
        settled: impl Fn(&R) -> (Uuid, i32),
        run: F,
    ) -> Result<Vec<R>, LedgerError>
    where
        F: Fn(String, Vec<&'a T>, Option<Vec<DateTime<Utc>>>) -> Fut,
        Fut: std::future::Future<Output = Result<Vec<R>, LedgerError>>,
    {
        let hints = self.hints.of(rows.iter().map(|r| key(r).0));
        let table = match &hints {
            Some(h) => self.day_table(h).await,
            None => PARENT.to_owned(),
        };
        if table == PARENT {
            return run(table, rows.to_vec(), hints).await;
        }
        let mut out = match run(table, rows.to_vec(), hints).await {
            Ok(out) => out,
            Err(e) if is_undefined_table(&e) => {
                self.tables.invalidate();
                Vec::new()
            }
            Err(e) => return Err(e),
        };
        let done: HashSet<(Uuid, i32)> = out.iter().map(&settled).collect();
        let rest: Vec<&T> = rows
            .iter()
            .copied()
            .filter(|r| !done.contains(&key(r)))
            .collect();
        if !rest.is_empty() {
            let hints = self.hints.of(rest.iter().map(|r| key(r).0));
            out.extend(run(PARENT.to_owned(), rest, hints).await?);
        }
        Ok(out)
    }

    /// [`RunStore::begin_batch`]'s statement on `table`.
    async fn begin_rows(
        &self,
        table: &str,
        batch: &[BeginRequest],
        instants: &[DateTime<Utc>],
    ) -> Result<Vec<StartedRow>, LedgerError> {
        let names: Vec<&str> = batch.iter().map(|r| r.job_name.as_str()).collect();
        let keys: Vec<&str> = batch.iter().map(|r| r.run_key.as_str()).collect();
        let workers: Vec<&str> = batch.iter().map(|r| r.worker.as_str()).collect();
        let leases: Vec<f64> = batch.iter().map(|r| r.lease.as_secs_f64()).collect();
        let sql = format!(begin_batch_sql!(), table = table);
        Ok(sqlx::query_as(&sql)
            .bind(&names)
            .bind(&keys)
            .bind(&workers)
            .bind(&leases)
            .bind(instants)
            .fetch_all(&self.route)
            .await?)
    }

    /// [`RunStore::end_batch`]'s statement on `table` for `batch`: the
    /// `(id, attempt)` of every outcome written.
    async fn end_rows(
        &self,
        table: String,
        batch: Vec<&EndRequest>,
        hints: Option<Vec<DateTime<Utc>>>,
    ) -> Result<Vec<(Uuid, i32)>, LedgerError> {
        let ids: Vec<Uuid> = batch.iter().map(|r| r.id).collect();
        let statuses: Vec<&str> = batch.iter().map(|r| r.status.as_str()).collect();
        let errors: Vec<Option<&str>> = batch.iter().map(|r| r.last_error.as_deref()).collect();
        let terminal: Vec<bool> = batch.iter().map(|r| r.status.is_terminal()).collect();
        let entries = batch
            .iter()
            .map(|r| r.entry.to_json())
            .collect::<Result<Vec<_>, _>>()?;
        let redispatch: Vec<Option<DateTime<Utc>>> =
            batch.iter().map(|r| r.redispatch_at).collect();
        let attempts: Vec<i32> = batch.iter().map(|r| r.entry.attempt).collect();
        // With `$8`, the runs' partitions, when this process started them
        // all (`partition_hints`); else the statement searches every one.
        // Only the attempt that holds the run writes its outcome. Rows are
        // locked in id order first (see `begin_batch`). A run with a cancel
        // request does not continue: an outcome that is not terminal (a
        // retry) ends it `cancelled`, with the canceller's reason.
        let sql = match hints {
            Some(_) => format!(
                end_batch_sql!(" AND j.key_instant = ANY($8)"),
                table = table
            ),
            None => format!(end_batch_sql!(""), table = table),
        };
        let statement = sqlx::query_as(&sql)
            .bind(&ids)
            .bind(&statuses)
            .bind(&errors)
            .bind(&terminal)
            .bind(&entries)
            .bind(&redispatch)
            .bind(&attempts);
        Ok(with_hints(statement, hints).fetch_all(&self.route).await?)
    }

    /// [`RunStore::renew_leases`]'s statement on `table` for `held`.
    async fn renew_rows(
        &self,
        table: String,
        held: Vec<&(Uuid, i32)>,
        hints: Option<Vec<DateTime<Utc>>>,
        lease: Duration,
    ) -> Result<Vec<RenewedRow>, LedgerError> {
        let ids: Vec<Uuid> = held.iter().map(|(id, _)| *id).collect();
        let attempts: Vec<i32> = held.iter().map(|(_, a)| *a).collect();
        // Rows are locked in id order first, as the other batched
        // statements do, so a heartbeat never deadlocks with them.
        // `updated_at` is left alone: a heartbeat is not progress.
        let sql = match hints {
            Some(_) => format!(
                renew_leases_sql!(" AND j.key_instant = ANY($4)"),
                table = table
            ),
            None => format!(renew_leases_sql!(""), table = table),
        };
        let statement = sqlx::query_as(&sql)
            .bind(&ids)
            .bind(&attempts)
            .bind(lease.as_secs_f64());
        Ok(with_hints(statement, hints).fetch_all(&self.route).await?)
    }
}

#[async_trait]
impl RunStore for PgStore {
    async fn mark_dispatched(&self, id: Uuid) -> Result<bool, LedgerError> {
        let update = sqlx::query(
            "UPDATE job_runs SET status = 'dispatched', dispatched_at = now(), \
                 next_dispatch_at = NULL, updated_at = now() \
             WHERE id = $1 AND status = 'claimed'",
        );
        let moved = self.moved(update.bind(id)).await?;
        // dispatched_at is also worth having when the worker was faster.
        if !moved {
            sqlx::query(
                "UPDATE job_runs SET dispatched_at = now() WHERE id = $1 AND dispatched_at IS NULL",
            )
            .bind(id)
            .execute(&self.route)
            .await?;
        }
        Ok(moved)
    }

    async fn mark_dead(&self, id: Uuid, reason: &str) -> Result<bool, LedgerError> {
        let update = sqlx::query(concat!(
            "UPDATE job_runs SET status = 'dead', last_error = $2, finished_at = now(), \
                 updated_at = now() \
             WHERE id = $1 AND status IN ",
            waiting_statuses!()
        ));
        self.moved(update.bind(id).bind(reason)).await
    }

    async fn hand_back(&self, id: Uuid, attempt: i32, reason: &str) -> Result<bool, LedgerError> {
        // A run with a cancel request is not handed back: it ends.
        let update = sqlx::query(
            "UPDATE job_runs SET \
                 status = CASE WHEN cancel_requested_at IS NULL THEN 'retrying' ELSE 'cancelled' END, \
                 last_error = COALESCE(cancel_reason, $2), \
                 finished_at = CASE WHEN cancel_requested_at IS NULL THEN NULL ELSE now() END, \
                 lease_until = NULL, updated_at = now() \
             WHERE id = $1 AND status = 'running' AND attempts = $3",
        );
        self.moved(update.bind(id).bind(reason).bind(attempt)).await
    }

    async fn runs(&self, lookup: RunLookup<'_>) -> Result<Vec<RunRecord>, LedgerError> {
        let mut sql = lookup.sql();
        if matches!(lookup, RunLookup::Key(..)) {
            // The partition key too: one partition probed, not every one.
            sql.push_str(" AND key_instant = belfry_key_instant($1, $2)");
        }
        Ok(lookup.query(&sql).fetch_all(&self.route).await?)
    }

    async fn claim_many(&self, runs: &[NewRun]) -> Result<HashSet<Uuid>, LedgerError> {
        let won = claim_rows(&self.route, runs, false).await?;
        self.hints.remember(won.iter().copied());
        Ok(won.into_iter().map(|(id, _)| id).collect())
    }

    async fn mark_dispatched_many(&self, ids: &[Uuid]) -> Result<u64, LedgerError> {
        let pool = &self.route;
        if ids.is_empty() {
            return Ok(0);
        }
        // Every expression reads the row as it was, so `status = 'claimed'`
        // decides the whole update of a row at once. The rows are locked in
        // id order first: the workers' batched attempt statements lock in
        // the same order, so the two wait for each other instead of
        // deadlocking. `$2`: the runs' partitions when this process claimed
        // them all (`partition_hints`), else NULL (every partition).
        let hints = self.hints.of(ids.iter().copied());
        let done = sqlx::query(
            "WITH locked AS ( \
                 SELECT id FROM job_runs \
                 WHERE id = ANY($1) AND (status = 'claimed' OR dispatched_at IS NULL) \
                   AND ($2::timestamptz[] IS NULL OR key_instant = ANY($2)) \
                 ORDER BY id FOR UPDATE) \
             UPDATE job_runs j SET \
                 status = CASE WHEN j.status = 'claimed' THEN 'dispatched' ELSE j.status END, \
                 next_dispatch_at = CASE WHEN j.status = 'claimed' THEN NULL ELSE j.next_dispatch_at END, \
                 updated_at = CASE WHEN j.status = 'claimed' THEN now() ELSE j.updated_at END, \
                 dispatched_at = COALESCE(j.dispatched_at, now()) \
             FROM locked WHERE j.id = locked.id \
               AND ($2::timestamptz[] IS NULL OR j.key_instant = ANY($2)) \
               AND (j.status = 'claimed' OR j.dispatched_at IS NULL)",
        )
        .bind(ids)
        .bind(hints)
        .execute(pool)
        .await?;
        self.hints.forget(ids.iter().copied());
        Ok(done.rows_affected())
    }

    async fn begin_batch(
        &self,
        batch: &[BeginRequest],
    ) -> Result<Vec<Option<(Uuid, i32)>>, LedgerError> {
        // The runs' partitions, computed here as the database does
        // (`belfry_protocol::key_instant`), so only those are planned and
        // probed. A run the hint misses is not started here and takes the
        // slow path, which finds it by the database's own function.
        let instants = super::partition_hints::distinct(
            batch
                .iter()
                .map(|r| belfry_protocol::key_instant(&r.job_name, &r.run_key))
                .collect(),
        );
        // The day's table when every run lies in one (`partition_map`): a
        // run it does not hold is not started and takes the slow path too.
        let table = self.day_table(&instants).await;
        let rows = match self.begin_rows(&table, batch, &instants).await {
            Err(e) if table != PARENT && is_undefined_table(&e) => {
                self.tables.invalidate();
                self.begin_rows(PARENT, batch, &instants).await?
            }
            rows => rows?,
        };
        self.hints
            .remember(rows.iter().map(|(_, _, id, _, instant)| (*id, *instant)));
        let mut started: HashMap<_, _> = rows
            .into_iter()
            .map(|(name, key, id, attempt, _)| ((name, key), (id, attempt)))
            .collect();
        Ok(batch
            .iter()
            .map(|r| started.remove(&(r.job_name.clone(), r.run_key.clone())))
            .collect())
    }

    async fn end_batch(&self, batch: &[EndRequest]) -> Result<Vec<bool>, LedgerError> {
        let all: Vec<&EndRequest> = batch.iter().collect();
        let written = self
            .on_day_table(
                &all,
                |r| (r.id, r.entry.attempt),
                |w| *w,
                |table, rows, hints| self.end_rows(table, rows, hints),
            )
            .await?;
        let written: HashSet<(Uuid, i32)> = written.into_iter().collect();
        // Ended attempts' runs are forgotten (a retried run gets a fresh
        // hint from its next start); a refused (superseded) attempt's run
        // keeps its hint for the attempt that holds it.
        self.hints.forget(written.iter().map(|(id, _)| *id));
        Ok(batch
            .iter()
            .map(|r| written.contains(&(r.id, r.entry.attempt)))
            .collect())
    }

    async fn renew_leases(
        &self,
        held: &[(Uuid, i32)],
        lease: Duration,
    ) -> Result<LeaseRenewal, LedgerError> {
        let all: Vec<&(Uuid, i32)> = held.iter().collect();
        let rows = self
            .on_day_table(
                &all,
                |held| *held,
                |(id, attempt, _, _)| (*id, *attempt),
                |table, rows, hints| self.renew_rows(table, rows, hints, lease),
            )
            .await?;
        Ok(LeaseRenewal::from_rows(rows))
    }

    async fn state_of(&self, message: &JobMessage) -> Result<Option<RunState>, LedgerError> {
        let row: Option<(Uuid, String, Option<DateTime<Utc>>, bool, DateTime<Utc>)> =
            sqlx::query_as(
                "SELECT id, status, lease_until, cancel_requested_at IS NOT NULL, now() \
             FROM job_runs WHERE job_name = $1 AND run_key = $2 \
               AND key_instant = belfry_key_instant($1, $2)",
            )
            .bind(&message.job_name)
            .bind(&message.run_key)
            .fetch_optional(&self.route)
            .await?;
        row.map(|(id, status, lease_until, cancel, now)| {
            RunState::parse((id, status, lease_until, cancel), now)
        })
        .transpose()
    }

    async fn cancel_run(&self, request: &CancelRequest<'_>) -> Result<CancelOutcome, LedgerError> {
        let mut tx = self.route.begin().await?;
        let outcome = cancel_in(&self.route, &mut tx, request).await?;
        tx.commit().await?;
        Ok(outcome)
    }

    async fn finish_cancelled(&self, id: Uuid) -> Result<bool, LedgerError> {
        let update = sqlx::query(
            "UPDATE job_runs SET status = 'cancelled', last_error = cancel_reason, \
                 finished_at = now(), lease_until = NULL, updated_at = now() \
             WHERE id = $1 AND status = 'running' AND cancel_requested_at IS NOT NULL \
               AND (lease_until IS NULL OR lease_until < now())",
        );
        self.moved(update.bind(id)).await
    }

    async fn insert_from_message(&self, run: FromMessage<'_>) -> Result<u64, LedgerError> {
        let on_conflict = match run {
            FromMessage::Dispatched(_) => "DO NOTHING".to_owned(),
            FromMessage::Dead(..) => format!(
                "DO UPDATE SET status = 'dead', last_error = EXCLUDED.last_error, \
                 finished_at = now(), updated_at = now() WHERE job_runs.status IN {WAITING}"
            ),
        };
        let insert = format!(
            "INSERT INTO job_runs (id, job_name, run_key, job_type, status, payload, scheduled_at, \
                 dispatched_at, last_error, finished_at, trace_id, traceparent, options, key_instant) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, CASE WHEN $10 THEN now() END, $11, $12, $13, \
                     belfry_key_instant($2, $3)) \
             ON CONFLICT (job_name, run_key, key_instant) {on_conflict}"
        );
        // The primary key is (id, key_instant): unique per partition only.
        // A message names its own id, so another run (another key, maybe
        // another day) may hold it already: checked under a lock on the id,
        // the ids of scheduled and enqueued runs being fresh UUIDv7s.
        let message = run.message();
        let mut tx = self.route.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock(23, hashtext($1::text))")
            .bind(message.message_id)
            .execute(self.route.on(&mut tx))
            .await?;
        let taken: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM job_runs WHERE id = $1 \
                            AND NOT (job_name = $2 AND run_key = $3))",
        )
        .bind(message.message_id)
        .bind(&message.job_name)
        .bind(&message.run_key)
        .fetch_one(self.route.on(&mut tx))
        .await?;
        if taken {
            tx.rollback().await?;
            return Err(crate::run_rows::id_conflict(&run));
        }
        // `$1` to `$13` in the order of the columns above.
        let done = run
            .bind(sqlx::query(&insert), |at| at)?
            .execute(self.route.on(&mut tx))
            .await
            .map_err(|e| crate::run_rows::from_message_error(&run, e))?;
        tx.commit().await?;
        Ok(done.rows_affected())
    }
}

/// Claims `runs` on `executor` (the pool, or an open transaction): one
/// multi-row `INSERT ... ON CONFLICT (job_name, run_key, key_instant) DO
/// NOTHING`, each row decided by the unique constraint on its own (the
/// partition key `key_instant` is a function of the run key, see the
/// partitioned-runs migration, so this is uniqueness of the run key); the
/// ids inserted, each with its `key_instant` (a partition hint). With
/// `buffered` the rows are held (`buffered`, nothing due) for an overlap
/// policy instead of `claimed`.
pub(crate) async fn claim_rows<'e, E>(
    executor: E,
    runs: &[NewRun],
    buffered: bool,
) -> Result<Vec<(Uuid, DateTime<Utc>)>, LedgerError>
where
    E: sqlx::Executor<'e, Database = sqlx::Postgres>,
{
    if runs.is_empty() {
        return Ok(Vec::new());
    }
    let mut ids = Vec::with_capacity(runs.len());
    let mut names = Vec::with_capacity(runs.len());
    let mut keys = Vec::with_capacity(runs.len());
    let mut types = Vec::with_capacity(runs.len());
    let mut payloads = Vec::with_capacity(runs.len());
    let mut instants: Vec<DateTime<Utc>> = Vec::with_capacity(runs.len());
    let mut claimers = Vec::with_capacity(runs.len());
    let mut trace_ids = Vec::with_capacity(runs.len());
    let mut traceparents = Vec::with_capacity(runs.len());
    let mut options = Vec::with_capacity(runs.len());
    let mut next_dispatch: Vec<DateTime<Utc>> = Vec::with_capacity(runs.len());
    for r in runs {
        ids.push(r.id);
        names.push(r.job_name.as_str());
        keys.push(r.run_key.as_str());
        types.push(r.job_type.as_str());
        payloads.push(r.payload.clone());
        instants.push(r.scheduled_at);
        claimers.push(r.claimed_by.as_str());
        trace_ids.push(r.trace_id.as_deref());
        traceparents.push(r.traceparent.as_deref());
        options.push(options_json(&r.options)?);
        next_dispatch.push(r.next_dispatch_at);
    }
    // Rows of the batch are inserted in its order; each conflict is
    // decided per row, exactly as the single-row claim.
    let won: Vec<(Uuid, DateTime<Utc>)> = sqlx::query_as(
        "INSERT INTO job_runs (id, job_name, run_key, job_type, status, payload, scheduled_at, \
             claimed_by, claimed_at, trace_id, traceparent, options, next_dispatch_at, key_instant) \
         SELECT id, job_name, run_key, job_type, CASE WHEN $12 THEN 'buffered' ELSE 'claimed' END, \
             payload, scheduled_at, claimed_by, now(), trace_id, traceparent, options, \
             CASE WHEN $12 THEN NULL ELSE next_dispatch_at END, belfry_key_instant(job_name, run_key) \
         FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::jsonb[], \
                     $6::timestamptz[], $7::text[], $8::text[], $9::text[], $10::jsonb[], \
                     $11::timestamptz[]) \
              AS b(id, job_name, run_key, job_type, payload, scheduled_at, claimed_by, \
                   trace_id, traceparent, options, next_dispatch_at) \
         ON CONFLICT (job_name, run_key, key_instant) DO NOTHING \
         RETURNING id, key_instant",
    )
    .bind(&ids)
    .bind(&names)
    .bind(&keys)
    .bind(&types)
    .bind(&payloads)
    .bind(&instants)
    .bind(&claimers)
    .bind(&trace_ids)
    .bind(&traceparents)
    .bind(&options)
    .bind(&next_dispatch)
    .bind(buffered)
    .fetch_all(executor)
    .await?;
    Ok(won)
}

/// Cancels a run inside the open transaction on `conn` (see
/// `crate::cancel`): the run's row is locked for the decision; a request
/// for a running run is announced with `NOTIFY`, delivered at commit. Used
/// by the API's cancel and by the overlap policies that cancel the
/// previous run, in the transaction of their decision.
///
/// # Errors
///
/// [`LedgerError::Query`] when a statement fails.
pub(crate) async fn cancel_in(
    route: &super::pooler::PgRoute,
    conn: &mut sqlx::PgConnection,
    request: &CancelRequest<'_>,
) -> Result<CancelOutcome, LedgerError> {
    // The row is locked for the decision, so a worker's begin, end or
    // heartbeat of this run waits for it and then sees its result.
    let row: Option<(String, bool)> = sqlx::query_as(
        "SELECT status, status = 'running' AND lease_until IS NOT NULL AND lease_until < now() \
             FROM job_runs WHERE id = $1 FOR UPDATE",
    )
    .bind(request.id)
    .fetch_optional(route.on(&mut *conn))
    .await?;
    let Some((status, lease_expired)) = row else {
        return Ok(CancelOutcome::NotFound);
    };
    let status: RunStatus = status.parse().map_err(LedgerError::Corrupt)?;
    Ok(match status {
        s if s.is_terminal() => CancelOutcome::Finished(s),
        RunStatus::Running if !lease_expired => {
            sqlx::query(
                "UPDATE job_runs SET cancel_requested_at = COALESCE(cancel_requested_at, now()), \
                         cancel_reason = COALESCE(cancel_reason, $2), \
                         cancel_immediate = cancel_immediate OR $3, updated_at = now() \
                     WHERE id = $1",
            )
            .bind(request.id)
            .bind(request.reason)
            .bind(request.immediate)
            .execute(route.on(&mut *conn))
            .await?;
            // Delivered at commit, so never before the request is
            // stored.
            let notice = CancelNotice {
                id: request.id,
                immediate: request.immediate,
            };
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(CANCEL_CHANNEL)
                .bind(notice.payload())
                .execute(route.on(&mut *conn))
                .await?;
            CancelOutcome::Requested
        }
        was => {
            // Waiting, or running under an expired lease (its worker
            // is gone): nothing executes it, so it ends now.
            sqlx::query(
                "UPDATE job_runs SET status = 'cancelled', last_error = $2, finished_at = now(), \
                         next_dispatch_at = NULL, lease_until = NULL, \
                         cancel_requested_at = COALESCE(cancel_requested_at, now()), \
                         cancel_reason = COALESCE(cancel_reason, $2), updated_at = now() \
                     WHERE id = $1",
            )
            .bind(request.id)
            .bind(request.reason)
            .execute(route.on(&mut *conn))
            .await?;
            CancelOutcome::Cancelled { was }
        }
    })
}
