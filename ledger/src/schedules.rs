//! `schedules`: the stored schedule definitions.
//!
//! The scheduler syncs its schedule file into this table at start (upsert by
//! name), so the definitions an operator sees in the database are the ones
//! the replicas run.

use chrono::{DateTime, Utc};
use sqlx::query::{Query, QueryAs};

use crate::{Ledger, LedgerError};

/// A row of `schedules`.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct ScheduleRow {
    /// Unique schedule name (= job name of its runs).
    pub name: String,
    /// Cron expression, for cron schedules.
    pub cron: Option<String>,
    /// Period in milliseconds, for interval schedules.
    pub every_ms: Option<i64>,
    /// IANA time zone the cron expression is read in.
    pub timezone: String,
    /// Job type of its runs.
    pub job_type: String,
    /// Payload of its runs.
    pub payload: serde_json::Value,
    /// Whether firing is paused.
    pub paused: bool,
    /// Retry/timeout overrides of its runs (JSON `JobOptions`).
    pub options: serde_json::Value,
    /// The whole definition (JSON `ScheduleSpec`), which replicas run.
    pub spec: Option<serde_json::Value>,
    /// When the row last changed.
    #[sqlx(default)]
    pub updated_at: Option<DateTime<Utc>>,
    /// With `remaining_runs` in the spec: fires left (maintained by the
    /// ledger: set from the spec, decremented with each winning claim of a
    /// fire of the timetable).
    #[sqlx(default)]
    pub remaining_runs: Option<i64>,
    /// Why it is paused (an operator's note, or belfry's own reason).
    #[sqlx(default)]
    pub pause_note: Option<String>,
}

/// The columns of [`ScheduleRow`].
pub(crate) const SCHEDULE_COLUMNS: &str = "name, cron, every_ms, timezone, job_type, payload, \
     paused, options, spec, updated_at, remaining_runs, pause_note";

/// What [`crate::store::ScheduleStore::write_schedule`] does when a schedule
/// of the same name is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IfStored {
    /// Replace its definition if it changed, keeping its paused state and
    /// creation time ([`Ledger::upsert_schedule`]).
    Update,
    /// Leave it alone ([`Ledger::insert_schedule`]).
    Keep,
}

/// Which stored schedules [`crate::store::ScheduleStore::schedules`] reads:
/// the lookups of [`Ledger::schedules`], [`Ledger::schedules_page`] and
/// [`Ledger::schedule`].
#[derive(Debug, Clone, Copy)]
pub(crate) enum ScheduleLookup<'a> {
    /// All of them, by name.
    All,
    /// At most this many by name, after the name given, if any (keyset
    /// pagination on the primary key).
    Page(Option<&'a str>, i64),
    /// The one of this name.
    Name(&'a str),
}

impl<'a> ScheduleLookup<'a> {
    /// The `SELECT` of the lookup, the same on both backends (SQLite reads
    /// the `$n` placeholders as Postgres does).
    pub(crate) fn sql(self) -> String {
        let rows = match self {
            Self::All => " ORDER BY name",
            Self::Page(..) => {
                " WHERE (CAST($1 AS TEXT) IS NULL OR name > $1) ORDER BY name LIMIT $2"
            }
            Self::Name(_) => " WHERE name = $1",
        };
        format!("SELECT {SCHEDULE_COLUMNS} FROM schedules{rows}")
    }

    /// `sql` (this lookup's [`ScheduleLookup::sql`]) with the lookup's
    /// values bound, on either backend.
    pub(crate) fn query<DB>(self, sql: &'a str) -> QueryAs<'a, DB, ScheduleRow, DB::Arguments<'a>>
    where
        DB: sqlx::Database,
        ScheduleRow: for<'r> sqlx::FromRow<'r, DB::Row>,
        Option<&'a str>: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
        &'a str: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
        i64: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
    {
        let query = sqlx::query_as(sql);
        match self {
            Self::All => query,
            Self::Page(after, limit) => query.bind(after).bind(limit),
            Self::Name(name) => query.bind(name),
        }
    }
}

impl ScheduleRow {
    /// `count`, or fewer when the schedule has fewer runs left
    /// (`remaining_runs`): how many upcoming instants a preview shows.
    pub fn capped_by_runs_left(&self, count: usize) -> usize {
        match self.remaining_runs {
            Some(left) => count.min(usize::try_from(left.max(0)).unwrap_or(usize::MAX)),
            None => count,
        }
    }

    /// Binds the definition to `query`, the first eight parameters of both
    /// backends' writes: name, cron, every_ms, timezone, job_type, payload,
    /// options, spec. The paused flag, which a replace may keep, is the
    /// caller's.
    pub(crate) fn bind_definition<'q, DB>(
        &'q self,
        query: Query<'q, DB, DB::Arguments<'q>>,
    ) -> Query<'q, DB, DB::Arguments<'q>>
    where
        DB: sqlx::Database,
        String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
        Option<String>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
        Option<i64>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
        serde_json::Value: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
        Option<serde_json::Value>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    {
        query
            .bind(&self.name)
            .bind(&self.cron)
            .bind(self.every_ms)
            .bind(&self.timezone)
            .bind(&self.job_type)
            .bind(&self.payload)
            .bind(&self.options)
            .bind(&self.spec)
    }
}

impl Ledger {
    /// Inserts or replaces the definition of `row.name`, keeping its paused
    /// state and creation time.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached or the row
    /// breaks a table constraint.
    pub async fn upsert_schedule(&self, row: &ScheduleRow) -> Result<(), LedgerError> {
        self.store.write_schedule(row, IfStored::Update).await?;
        Ok(())
    }

    /// Stores a new schedule (with `row.paused`). Returns `false`, and
    /// changes nothing, when a schedule of that name exists.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached or the row
    /// breaks a table constraint.
    pub async fn insert_schedule(&self, row: &ScheduleRow) -> Result<bool, LedgerError> {
        Ok(self.store.write_schedule(row, IfStored::Keep).await? == 1)
    }

    /// Replaces the definition of the existing schedule `row.name`; its
    /// paused state becomes `paused` when given and is kept otherwise.
    /// Returns `false`, and changes nothing, when there is no such schedule.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached or the row
    /// breaks a table constraint.
    pub async fn replace_schedule(
        &self,
        row: &ScheduleRow,
        paused: Option<bool>,
    ) -> Result<bool, LedgerError> {
        self.store.replace_schedule(row, paused).await
    }

    /// Deletes one schedule; its runs stay in `job_runs`. Returns whether
    /// it existed.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn delete_schedule(&self, name: &str) -> Result<bool, LedgerError> {
        self.store.delete_schedule(name).await
    }

    /// All stored schedules, by name.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn schedules(&self) -> Result<Vec<ScheduleRow>, LedgerError> {
        self.store.schedules(ScheduleLookup::All).await
    }

    /// Up to `limit` stored schedules by name, after `after` (keyset
    /// pagination on the primary key).
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn schedules_page(
        &self,
        after: Option<&str>,
        limit: i64,
    ) -> Result<Vec<ScheduleRow>, LedgerError> {
        self.store
            .schedules(ScheduleLookup::Page(after, limit))
            .await
    }

    /// One stored schedule.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn schedule(&self, name: &str) -> Result<Option<ScheduleRow>, LedgerError> {
        Ok(self
            .store
            .schedules(ScheduleLookup::Name(name))
            .await?
            .pop())
    }

    /// The stored schedules of the shards `wanted` out of `shards` (see
    /// [`belfry_protocol::shard_of`]), by name: what a replica loads when
    /// it takes shards.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn schedules_in_shards(
        &self,
        shards: u32,
        wanted: &[u32],
    ) -> Result<Vec<ScheduleRow>, LedgerError> {
        if wanted.is_empty() {
            return Ok(Vec::new());
        }
        self.store.schedules_in_shards(shards.max(1), wanted).await
    }

    /// The name and last change of every stored schedule: what a replica
    /// compares against its timer in a periodic resync.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn schedule_versions(&self) -> Result<Vec<(String, DateTime<Utc>)>, LedgerError> {
        self.store.schedule_versions().await
    }

    /// [`Ledger::schedule_versions`] of the schedules in the `wanted`
    /// shards out of `shards`: a sharded replica's resync, which compares
    /// only what its timer holds.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn schedule_versions_in_shards(
        &self,
        shards: u32,
        wanted: &[u32],
    ) -> Result<Vec<(String, DateTime<Utc>)>, LedgerError> {
        if wanted.is_empty() {
            return Ok(Vec::new());
        }
        self.store
            .schedule_versions_in_shards(shards.max(1), wanted)
            .await
    }

    /// Sets a schedule's paused flag, with `note` saying why when pausing
    /// (resuming clears the note, and `pause_after_failures` counts from
    /// then on). Returns whether the schedule exists.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn set_paused(
        &self,
        name: &str,
        paused: bool,
        note: Option<&str>,
    ) -> Result<bool, LedgerError> {
        let note = note.map(crate::storable);
        self.store.set_paused(name, paused, note.as_deref()).await
    }

    /// Deletes the stored schedules whose names are not in `keep`; returns
    /// the deleted names. Their runs stay in `job_runs`.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn delete_schedules_except(
        &self,
        keep: &[String],
    ) -> Result<Vec<String>, LedgerError> {
        self.store.delete_schedules_except(keep).await
    }
}
