//! The embedded ledger: the same `job_runs`, `schedules` and
//! `skipped_fires` rules on SQLite, for `belfry dev` and for programs that
//! run belfry in one process without Postgres.
//!
//! What differs from Postgres, and why each is safe here:
//!
//! - **One process owns the file.** [`SqliteLedger::open`] takes an
//!   exclusive lock on `<database>.lock` for the life of the handle, so a
//!   second `belfry dev` on the same file refuses to start instead of
//!   racing the first. Within the process every write goes through one
//!   connection (`writer`), so writes are serialised in order: a statement
//!   is atomic, and every read-then-write transaction starts with `BEGIN
//!   IMMEDIATE` on that connection, which is what the Postgres code gets
//!   from `FOR UPDATE SKIP LOCKED` and advisory locks. Readers have their
//!   own connections and, with WAL, never wait for the writer.
//! - **Instants are fixed-width UTC text** ([`ts`]): ordering the text
//!   orders the instants, and every instant, `now` included, comes from this
//!   process's clock (there is no other clock to disagree with).
//! - **Schedule changes are announced in-process** (a broadcast channel)
//!   instead of `LISTEN/NOTIFY`.
//! - **Durability**: WAL with `synchronous = NORMAL`: a committed
//!   transaction survives the process being killed (the WAL is in the OS
//!   before the commit returns); only a power loss can take the last
//!   commits back.

mod alerts;
mod fire_history;
mod follow_ups;
mod outbox;
mod run_limits;
mod run_logs;
mod run_partitions;
mod runs;
mod schedules;
mod shards;
mod views;

use std::fs::File;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::sqlite::{
    SqliteArguments, SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::SqlitePool;
use tokio::sync::{broadcast, Notify};

use async_trait::async_trait;

use crate::change_listener::ChangeListener;
use crate::store::{ClockReading, Lifecycle, LocalClock};
use crate::LedgerError;

/// The embedded migrations of `sqlite-migrations/`.
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./sqlite-migrations");

/// The text form of an instant in the embedded ledger: UTC, microseconds,
/// fixed width, so text order is time order.
pub(crate) fn ts(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// `now` in [`ts`] form.
pub(crate) fn now() -> String {
    ts(Utc::now())
}

/// The latest instant [`ts`] writes: later ones would not be fixed-width.
fn latest() -> DateTime<Utc> {
    // 9999-12-31T23:59:59.999999Z
    DateTime::from_timestamp(253_402_300_799, 999_999_000).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// `now + d` in [`ts`] form, saturating at the latest writable instant.
pub(crate) fn now_plus(d: Duration) -> String {
    let later = chrono::Duration::from_std(d)
        .ok()
        .and_then(|d| Utc::now().checked_add_signed(d))
        .unwrap_or_else(latest);
    ts(later.min(latest()))
}

/// `now - d` in [`ts`] form, saturating at the Unix epoch.
pub(crate) fn now_minus(d: Duration) -> String {
    let earlier = chrono::Duration::from_std(d)
        .ok()
        .and_then(|d| Utc::now().checked_sub_signed(d))
        .unwrap_or(DateTime::UNIX_EPOCH);
    ts(earlier.max(DateTime::UNIX_EPOCH))
}

/// A statement of the embedded ledger, its values bound.
pub(crate) type SqliteQuery<'q> = sqlx::query::Query<'q, sqlx::Sqlite, SqliteArguments<'q>>;

/// The embedded ledger's handle (cheap to clone).
#[derive(Debug, Clone)]
pub struct SqliteLedger {
    /// Readers (WAL lets them run beside the writer).
    pub(crate) pool: SqlitePool,
    /// The one writing connection: writers queue here, in order, instead
    /// of contending for SQLite's write lock (which would put them in its
    /// busy handler's sleeps). Every statement that writes uses it.
    pub(crate) writer: SqlitePool,
    /// Names of schedules that changed, for this process's replicas.
    pub(crate) schedule_changes: broadcast::Sender<String>,
    /// Cancel announcements (`crate::cancel`), for this process's workers.
    pub(crate) cancels: broadcast::Sender<String>,
    /// Woken when a message is enqueued, so consumers do not wait out
    /// their poll interval.
    pub(crate) queue_ready: Arc<Notify>,
    /// This opening of the file: queue rows are taken as
    /// `{session}/{consumer}`, so rows of any other session belong to a
    /// process that is gone (one process owns the file).
    pub(crate) session: String,
    /// Whether runs left by a previous owner of the file were taken over.
    taken_over: Arc<std::sync::atomic::AtomicBool>,
    /// Held for the life of the handle (and its clones); see the module
    /// docs.
    _owner: Option<Arc<File>>,
}

impl SqliteLedger {
    /// Opens (creating it if needed) the SQLite database at `url`
    /// (`sqlite://path/to/belfry.db`, `sqlite:belfry.db`) with at most
    /// `max_connections`, and takes the file's ownership lock.
    ///
    /// # Errors
    ///
    /// [`LedgerError::OpenEmbedded`] when the URL is not a SQLite URL or the
    /// file cannot be opened; [`LedgerError::InUse`] when another process has it
    /// open.
    pub async fn open(url: &str, max_connections: u32) -> Result<Self, LedgerError> {
        let connect_err = |source| LedgerError::OpenEmbedded {
            url: belfry_runtime::masked(url),
            source,
        };
        let options = SqliteConnectOptions::from_str(url)
            .map_err(connect_err)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10))
            // As Postgres: `LIKE 'stuck:%'` and the `claimed_by` prefixes of
            // `live_fire` must not match other cases.
            .pragma("case_sensitive_like", "ON");
        let file = options.get_filename().to_path_buf();
        let in_memory = url.contains(":memory:") || url.contains("mode=memory");
        let owner = if in_memory || file.as_os_str().is_empty() {
            None
        } else {
            Some(Arc::new(own(&file)?))
        };
        // The writer first: it creates the file and switches it to WAL.
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options.clone())
            .await
            .map_err(connect_err)?;
        let pool = SqlitePoolOptions::new()
            .max_connections(max_connections.max(1))
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await
            .map_err(connect_err)?;
        let (schedule_changes, _) = broadcast::channel(1024);
        let (cancels, _) = broadcast::channel(1024);
        Ok(Self {
            pool,
            writer,
            schedule_changes,
            cancels,
            queue_ready: Arc::new(Notify::new()),
            session: uuid::Uuid::new_v4().simple().to_string(),
            taken_over: Arc::default(),
            _owner: owner,
        })
    }

    /// A run left `running` in the file belongs to a process that is gone
    /// (this one owns the file, and has not started anything yet): its
    /// lease is ended now instead of when it would have run out, so the
    /// run's redelivered message takes it over at once, its attempt count
    /// intact. (On Postgres another worker may be alive, so only the lease
    /// running out can say it is not.)
    async fn take_over_from_previous_owner(&self) -> Result<(), LedgerError> {
        let at = now();
        let ended = sqlx::query(
            "UPDATE job_runs SET lease_until = ?1 \
             WHERE status = 'running' AND (lease_until IS NULL OR lease_until > ?1)",
        )
        .bind(&at)
        .execute(&self.writer)
        .await?;
        if ended.rows_affected() > 0 {
            tracing::warn!(
                runs = ended.rows_affected(),
                "runs were left running by a process that stopped without finishing them; \
                 their redelivered messages take them over"
            );
        }
        Ok(())
    }

    /// Starts a transaction that holds the write lock from its first
    /// statement, for read-then-write decisions.
    pub(crate) async fn write_tx(
        &self,
    ) -> Result<sqlx::Transaction<'static, sqlx::Sqlite>, LedgerError> {
        Ok(self.writer.begin_with("BEGIN IMMEDIATE").await?)
    }

    /// Runs `statement`, a guarded write of one row (its `WHERE` says
    /// whether the row may move), on the writer: whether the row moved.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the statement fails.
    pub(crate) async fn moved(&self, statement: SqliteQuery<'_>) -> Result<bool, LedgerError> {
        Ok(statement.execute(&self.writer).await?.rows_affected() == 1)
    }

    /// Announces a cancel request to this process's workers, after the
    /// commit that stored it; no receiver (no worker here) is fine.
    pub(crate) fn announce_cancel(&self, request: &crate::cancel::CancelRequest<'_>) {
        let notice = crate::cancel::CancelNotice {
            id: request.id,
            immediate: request.immediate,
        };
        let _ = self.cancels.send(notice.payload());
    }

    /// Announces a changed schedule to this process's replicas.
    pub(crate) fn announce(&self, name: &str) {
        // No receiver (no replica running) is fine: nothing to tell.
        let _ = self.schedule_changes.send(name.to_owned());
    }
}

#[async_trait]
impl Lifecycle for SqliteLedger {
    /// Applies pending migrations of the embedded schema.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Migrate`] when a migration fails or the file holds a
    /// migration this build does not know.
    async fn migrate(&self) -> Result<(), LedgerError> {
        MIGRATOR.run(&self.writer).await?;
        // Once per opening of the file: later calls (a replica and a worker
        // of this process migrating in turn) must not end this process's
        // own live leases.
        if self
            .taken_over
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return Ok(());
        }
        self.take_over_from_previous_owner().await
    }

    /// Whether the database answers a trivial query.
    async fn ping(&self) -> bool {
        sqlx::query("SELECT 1").execute(&self.pool).await.is_ok()
    }

    /// The embedded database has no clock of its own: its answer is the
    /// system clock.
    async fn clock_probe(&self, local: &LocalClock<'_>) -> Result<ClockReading, LedgerError> {
        let before = local();
        Ok((before, Utc::now(), local()))
    }

    /// In-process announcements stand for `LISTEN/NOTIFY` (one process
    /// owns the file).
    async fn listen_schedules(&self, _channel: &str) -> Result<ChangeListener, LedgerError> {
        Ok(ChangeListener::local(self.schedule_changes.subscribe()))
    }

    async fn listen_cancels(&self) -> Result<ChangeListener, LedgerError> {
        Ok(ChangeListener::local(self.cancels.subscribe()))
    }

    /// Closes the pool (connections finish their statements first).
    async fn close(&self) {
        self.pool.close().await;
        self.writer.close().await;
    }

    fn pg_pool(&self) -> Option<&sqlx::PgPool> {
        None
    }

    fn embedded(&self) -> Option<&SqliteLedger> {
        Some(self)
    }
}

/// Takes the exclusive ownership lock of the database at `file`.
fn own(file: &std::path::Path) -> Result<File, LedgerError> {
    let mut lock_path: PathBuf = file.to_path_buf();
    let mut name = lock_path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".lock");
    lock_path.set_file_name(name);
    if let Some(dir) = lock_path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| LedgerError::InUse {
            path: file.display().to_string(),
            detail: format!("cannot create its directory: {e}"),
        })?;
    }
    let handle = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| LedgerError::InUse {
            path: file.display().to_string(),
            detail: format!("cannot open {}: {e}", lock_path.display()),
        })?;
    match handle.try_lock() {
        Ok(()) => Ok(handle),
        Err(std::fs::TryLockError::WouldBlock) => Err(LedgerError::InUse {
            path: file.display().to_string(),
            detail: "another belfry process has it open (one process owns an embedded \
                     database; stop the other one, or give this one its own file)"
                .into(),
        }),
        Err(std::fs::TryLockError::Error(e)) => Err(LedgerError::InUse {
            path: file.display().to_string(),
            detail: format!("cannot lock {}: {e}", lock_path.display()),
        }),
    }
}
