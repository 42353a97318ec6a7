//! belfry's ledger: the `job_runs` and `schedules` tables, in Postgres or,
//! for the embedded single-process mode, in SQLite.
//!
//! `job_runs` is the source of truth for every run. Its
//! `UNIQUE(job_name, run_key)` constraint decides which scheduler replica
//! owns a fire ([`Ledger::claim`]), and every later state change of the run
//! (dispatched, each attempt, the outcome) is a guarded `UPDATE` here, so a
//! duplicate delivery can never move a finished run backwards.
//!
//! The ledger is one narrow seam: the scheduler's claim and dispatch and the
//! worker's outcome recording only talk to the database through it.
//! [`Ledger::connect`] picks the backend from the URL (`postgres://` or
//! `sqlite:`) once; every method means the same on both (the same states,
//! the same guards, the same unique constraint), and only the SQL differs.
//! The modules named after what they do (`runs`, `schedules`, `outbox`,
//! ...) hold the types and the documented API; the SQL lives behind one
//! seam (`store`: traits both backends implement with the same signatures)
//! in `postgres/` and `sqlite/`, which mirror each other file for file
//! (see `sqlite/` for what the embedded database does differently and why
//! it is safe). The embedded
//! database also holds the job queue ([`JobQueue`]) that replaces RabbitMQ
//! in embedded mode.

mod alerts;
mod attempt_batch;
mod cancel;
mod change_listener;
mod claim_batch;
mod concurrency;
mod dashboard;
mod error;
mod fire_history;
mod follow_up;
mod missed_fire;
mod outbox;
mod overlap;
mod postgres;
mod rate_limit;
mod retention;
mod run_limits;
mod run_log;
mod run_partitions;
mod run_query;
mod run_rows;
mod runs;
mod schedules;
mod shards;
mod skipped_range;
mod sqlite;
mod status;
mod store;
mod stored_text;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

pub use alerts::{
    AlertEvent, AlertKind, AlertRoute, DeliveryRecord, DeliveryResult, DueDelivery, NewAlertEvent,
};
pub use attempt_batch::{AttemptBatcher, BeginRequest, EndRequest, LeaseRenewal};
pub use cancel::{CancelNotice, CancelOutcome, CancelRequest, CANCEL_CHANNEL};
pub use change_listener::ChangeListener;
pub use concurrency::ConcurrencyLimit;
pub use dashboard::{MinuteCount, Overview, RecentFire};
pub use error::LedgerError;
pub use fire_history::{ExclusiveClaim, LateClaim};
pub use follow_up::{FollowUpPass, JOIN_WAIT};
pub use missed_fire::MissedFire;
pub use overlap::OverlapRule;
pub use rate_limit::StartRate;
pub use run_limits::{LimitKind, RunLimits};
pub use run_log::{
    log_is_complete, AttemptLogExtent, BadLogCursor, LogCursor, LogKind, RunLogLine,
};
pub use run_partitions::{days_ahead, PartitionDrop, RunPartition, PARTITION_DAYS_AHEAD};
pub use run_query::{RunCursor, RunFilter};
pub use runs::{AttemptEntry, AttemptStart, NewRun, RunRecord, RUN_COLUMNS};
pub use schedules::ScheduleRow;
pub use shards::{ShardLease, ShardPass};
pub use skipped_range::SkippedRange;
pub use status::RunStatus;
pub use stored_text::storable;

/// The connections of an embedded database, as its job queue needs them.
#[derive(Debug, Clone)]
pub struct EmbeddedFile {
    /// Readers (WAL lets them run beside the writer).
    pub reader: sqlx::SqlitePool,
    /// The file's one writing connection: the queue writes through it too,
    /// so its writes and the ledger's are serialised together.
    pub writer: sqlx::SqlitePool,
    /// This opening of the file (one process owns it).
    pub session: String,
    /// Woken after every publish and requeue; shared by every handle.
    pub queue_ready: Arc<tokio::sync::Notify>,
}

/// Parses a Postgres URL, naming it (password masked) when it is invalid.
fn pg_options(url: &str) -> Result<PgConnectOptions, LedgerError> {
    url.parse().map_err(|source| LedgerError::Connect {
        url: belfry_runtime::masked(url),
        source,
    })
}

/// Pool options of the ledger: `max` connections, a 5 s wait for one, and
/// with `several_hosts` no connection to a standby.
fn pool_options(max: u32, several_hosts: bool) -> PgPoolOptions {
    let options = PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(5));
    if several_hosts {
        postgres::primary::refusing_standbys(options)
    } else {
        options
    }
}

/// Starts keeping `pool` on the primary among `hosts`; it stops when the
/// returned sender is dropped (with the store).
fn follow(pool: &PgPool, hosts: Vec<(String, u16)>) -> tokio::sync::oneshot::Sender<()> {
    let (stop, stopped) = tokio::sync::oneshot::channel();
    postgres::primary::follow(pool.clone(), hosts, stopped);
    stop
}

/// A handle on the ledger database (cheap to clone: a pool).
#[derive(Debug, Clone)]
pub struct Ledger {
    /// The database, chosen once by [`Ledger::connect`].
    store: Arc<dyn store::Store>,
}

impl Ledger {
    /// Connects to the database at `url` with at most `max_connections`:
    /// Postgres for `postgres://` / `postgresql://` URLs, the embedded
    /// SQLite ledger for `sqlite:` URLs (the file is created if missing and
    /// owned by this process until the handle is dropped).
    ///
    /// Fails fast (5 s) so that a wrong URL or a stopped server gives one
    /// clear error at start instead of a hang.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Connect`] naming the URL (password masked) when the
    /// URL is invalid or the server does not answer;
    /// [`LedgerError::InUse`] when another process owns the SQLite file.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, LedgerError> {
        Self::connect_routed(url, None, max_connections).await
    }

    /// [`Ledger::connect`], where `url` may lead through a transaction
    /// pooler: with `direct_url` (`BELFRY_DATABASE_DIRECT_URL`), `url` is
    /// taken to be a transaction-pooling proxy (PgBouncer's
    /// `pool_mode = transaction`), so every statement over it is an unnamed
    /// one in a transaction of its own, and no startup parameter a pooler
    /// may refuse is sent; `LISTEN` and the migrations, which need a
    /// session, use `direct_url` (at most 2 connections, opened when first
    /// needed). See `postgres::pooler` for why.
    ///
    /// # Errors
    ///
    /// As [`Ledger::connect`], for either URL; [`LedgerError::Connect`]
    /// when `direct_url` is given with a `sqlite:` `url` or is not a
    /// Postgres URL.
    pub async fn connect_routed(
        url: &str,
        direct_url: Option<&str>,
        max_connections: u32,
    ) -> Result<Self, LedgerError> {
        if url.starts_with("sqlite:") {
            if direct_url.is_some() {
                return Err(LedgerError::Connect {
                    url: belfry_runtime::masked(url),
                    source: sqlx::Error::Configuration(
                        "BELFRY_DATABASE_DIRECT_URL is for a Postgres ledger behind a pooler; \
                         unset it with a sqlite: DATABASE_URL"
                            .into(),
                    ),
                });
            }
            let store = sqlite::SqliteLedger::open(url, max_connections).await?;
            return Ok(Self {
                store: Arc::new(store),
            });
        }
        let mut followers = Vec::new();
        let (options, hosts) = match postgres::primary::hosts_of(url)? {
            None => (pg_options(url)?, None),
            Some((options, hosts)) => {
                // Several hosts: start on the primary among them.
                let primary = postgres::primary::find(&options, &hosts)
                    .await
                    .map_err(|e| LedgerError::Connect {
                        url: belfry_runtime::masked(url),
                        source: sqlx::Error::Configuration(e.into()),
                    })?;
                (primary, Some(hosts))
            }
        };
        let direct = match direct_url {
            None => None,
            Some(direct_url) => {
                let (direct_options, direct_hosts) = match postgres::primary::hosts_of(direct_url)?
                {
                    None => (pg_options(direct_url)?, None),
                    Some((options, hosts)) => (options, Some(hosts)),
                };
                // Lazy: LISTEN and the migrations open it when they run;
                // a wrong URL shows there, with the URL named.
                let pool =
                    pool_options(2, direct_hosts.is_some()).connect_lazy_with(direct_options);
                if let Some(hosts) = direct_hosts {
                    followers.push(follow(&pool, hosts));
                }
                Some(pool)
            }
        };
        let options = if direct.is_some() {
            // Behind a pooler: no statement cache (nothing is named), and
            // no `extra_float_digits` startup parameter, which PgBouncer
            // refuses unless told to ignore it.
            options.statement_cache_capacity(0).extra_float_digits(None)
        } else {
            options
        };
        let pool = pool_options(max_connections, hosts.is_some())
            .connect_with(options)
            .await
            .map_err(|source| LedgerError::Connect {
                url: belfry_runtime::masked(url),
                source,
            })?;
        if let Some(hosts) = hosts {
            followers.push(follow(&pool, hosts));
        }
        let route = match direct {
            None => postgres::pooler::PgRoute::direct(pool),
            Some(_) => postgres::pooler::PgRoute::through_pooler(pool),
        };
        Ok(Self {
            store: Arc::new(postgres::PgStore {
                route,
                direct,
                followers: Arc::new(followers),
                hints: Arc::default(),
                tables: Arc::default(),
            }),
        })
    }

    /// Wraps an existing Postgres pool (tests, embedding applications).
    pub fn from_pool(pool: PgPool) -> Self {
        Self {
            store: Arc::new(postgres::PgStore {
                route: postgres::pooler::PgRoute::direct(pool),
                direct: None,
                followers: Arc::default(),
                hints: Arc::default(),
                tables: Arc::default(),
            }),
        }
    }

    /// The Postgres pool, for callers that need their own queries; `None`
    /// for the embedded ledger.
    pub fn pg_pool(&self) -> Option<&PgPool> {
        self.store.pg_pool()
    }

    /// The Postgres node statements go to (`host:port/database` of
    /// `DATABASE_URL`: a pooler's address when there is one); `None` for
    /// the embedded ledger.
    pub fn node(&self) -> Option<String> {
        self.store.pg_pool().map(|pool| {
            let options = pool.connect_options();
            format!(
                "{}:{}/{}",
                options.get_host(),
                options.get_port(),
                options.get_database().unwrap_or("")
            )
        })
    }

    /// Whether this is the embedded (SQLite) ledger.
    pub fn is_embedded(&self) -> bool {
        self.store.embedded().is_some()
    }

    /// The embedded database's connections, for the job queue that lives
    /// in the same file (`belfry_broker::JobQueue`); `None` on Postgres
    /// (the distributed mode queues in RabbitMQ).
    pub fn embedded_file(&self) -> Option<EmbeddedFile> {
        self.store.embedded().map(|lite| EmbeddedFile {
            reader: lite.pool.clone(),
            writer: lite.writer.clone(),
            session: lite.session.clone(),
            queue_ready: lite.queue_ready.clone(),
        })
    }

    /// Applies pending migrations.
    ///
    /// Safe when several replicas start at once: sqlx takes a Postgres
    /// advisory lock for the duration of the migration run, so one replica
    /// migrates while the others wait and then find nothing to do. The
    /// embedded database has its own migrations (`sqlite-migrations/`).
    ///
    /// # Errors
    ///
    /// [`LedgerError::Migrate`] when a migration fails or the database holds
    /// a migration this build does not know (a newer version ran here).
    pub async fn migrate(&self) -> Result<(), LedgerError> {
        self.store.migrate().await
    }

    /// Whether the database answers a trivial query.
    pub async fn ping(&self) -> bool {
        self.store.ping().await
    }

    /// Reads the database's clock, with this process's clock (`local`) read
    /// just before and just after: `(before, database, after)`. The
    /// embedded database has no clock of its own; its answer is the
    /// system clock.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn clock_probe(
        &self,
        local: &(dyn Fn() -> DateTime<Utc> + Send + Sync),
    ) -> Result<(DateTime<Utc>, DateTime<Utc>, DateTime<Utc>), LedgerError> {
        self.store.clock_probe(local).await
    }

    /// Follows changes to `schedules`: Postgres `LISTEN` on `channel`, or the
    /// embedded ledger's in-process announcements.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the listener cannot connect.
    pub async fn listen_schedules(&self, channel: &str) -> Result<ChangeListener, LedgerError> {
        self.store.listen_schedules(channel).await
    }

    /// Closes the pool (and, for the embedded ledger, gives up the file
    /// once every clone is dropped).
    pub async fn close(&self) {
        self.store.close().await
    }
}
