//! How the ledger's statements reach Postgres: straight through its pool,
//! or through a transaction-pooling proxy (PgBouncer with
//! `pool_mode = transaction`, the common production set-up).
//!
//! A transaction pooler lends a server connection to a client for one
//! transaction and takes it back when the server reports itself idle. Two
//! things sqlx does by default break under it (PgBouncer before 1.21, as in
//! Debian 12, does not track prepared statements):
//!
//! - **Named prepared statements** (`sqlx_s_N`, cached per connection): the
//!   next statement may run on a server connection that never saw the
//!   name ("prepared statement does not exist"), or one where another
//!   client already used it ("already exists").
//! - **Parse and execute in two round trips**: sqlx sends Parse/Describe
//!   and Sync, then Bind/Execute and Sync. Outside a transaction the server
//!   is idle after the first Sync, so the pooler may hand the Bind to
//!   another server connection, where the statement does not exist (or,
//!   for the unnamed statement, is someone else's).
//!
//! So behind a pooler ([`PgRoute::through_pooler`]) every statement is an
//! unnamed one and runs inside a transaction of its own (`BEGIN`, the
//! statement, `COMMIT`): the pooler keeps one server connection for the
//! whole transaction, and the unnamed statement never outlives it. A single
//! statement in its own transaction means what it means in autocommit, so
//! no statement's meaning changes. The cost is round trips (four instead of
//! one; batched statements amortise them) — measured in BENCHMARKS.md.
//! Statements the store runs in its own explicit transactions go through
//! [`PgRoute::on`], which makes them unnamed behind a pooler.
//!
//! Session state is never relied on in either route: the ledger's locks are
//! transaction-scoped (`pg_advisory_xact_lock`), and what needs a session —
//! `LISTEN` for schedule changes and the migrations' advisory lock — goes
//! over the direct connection (`BELFRY_DATABASE_DIRECT_URL`, see
//! [`crate::Ledger::connect`]).

use futures::future::BoxFuture;
use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArguments, PgQueryResult, PgRow, PgStatement, PgTypeInfo};
use sqlx::Describe;
use sqlx::{Either, Execute, Executor, PgConnection, PgPool, Postgres, Transaction};

/// The pool and the route its statements take; see the module docs.
#[derive(Debug, Clone)]
pub(crate) struct PgRoute {
    pool: PgPool,
    through_pooler: bool,
}

impl PgRoute {
    /// Statements straight through `pool` (cached prepared statements).
    pub(crate) fn direct(pool: PgPool) -> Self {
        Self {
            pool,
            through_pooler: false,
        }
    }

    /// Statements through a transaction pooler reached by `pool`: each an
    /// unnamed statement in a transaction of its own.
    pub(crate) fn through_pooler(pool: PgPool) -> Self {
        Self {
            pool,
            through_pooler: true,
        }
    }

    /// The pool itself.
    pub(crate) fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Begins an explicit transaction; its statements go through
    /// [`PgRoute::on`].
    ///
    /// # Errors
    ///
    /// When no connection can be had or `BEGIN` fails.
    pub(crate) async fn begin(&self) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        self.pool.begin().await
    }

    /// An executor for one statement on `conn` (an open transaction's
    /// connection): unnamed behind a pooler, as every statement there.
    pub(crate) fn on<'t>(&self, conn: &'t mut PgConnection) -> OnConnection<'t> {
        OnConnection {
            conn,
            unnamed: self.through_pooler,
        }
    }
}

/// One statement on a held connection; see [`PgRoute::on`].
#[derive(Debug)]
pub(crate) struct OnConnection<'t> {
    conn: &'t mut PgConnection,
    unnamed: bool,
}

impl<'t> Executor<'t> for OnConnection<'t> {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        't: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if self.unnamed {
            self.conn.fetch_many(Unnamed(query))
        } else {
            self.conn.fetch_many(query)
        }
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        't: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if self.unnamed {
            self.conn.fetch_optional(Unnamed(query))
        } else {
            self.conn.fetch_optional(query)
        }
    }

    fn prepare_with<'e, 'q: 'e>(
        self,
        sql: &'q str,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement<'q>, sqlx::Error>>
    where
        't: 'e,
    {
        self.conn.prepare_with(sql, parameters)
    }

    fn describe<'e, 'q: 'e>(
        self,
        sql: &'q str,
    ) -> BoxFuture<'e, Result<Describe<Postgres>, sqlx::Error>>
    where
        't: 'e,
    {
        self.conn.describe(sql)
    }
}

/// `query`, run as an unnamed statement.
struct Unnamed<E>(E);

impl<'q, E: Execute<'q, Postgres>> Execute<'q, Postgres> for Unnamed<E> {
    fn sql(&self) -> &'q str {
        self.0.sql()
    }

    fn statement(&self) -> Option<&PgStatement<'q>> {
        self.0.statement()
    }

    fn take_arguments(&mut self) -> Result<Option<PgArguments>, BoxDynError> {
        self.0.take_arguments()
    }

    fn persistent(&self) -> bool {
        false
    }
}

/// Runs `query` unnamed in a transaction of its own and collects what it
/// returns (the ledger's statements return bounded pages).
async fn in_own_transaction<'q, E>(
    pool: PgPool,
    query: E,
) -> Result<Vec<Either<PgQueryResult, PgRow>>, sqlx::Error>
where
    E: 'q + Execute<'q, Postgres>,
{
    let mut tx = pool.begin().await?;
    let results = (&mut *tx)
        .fetch_many(Unnamed(query))
        .try_collect::<Vec<_>>()
        .await?;
    // A statement that failed rolled the transaction back when `tx` was
    // dropped on the `?` above; one that succeeded is committed here.
    tx.commit().await?;
    Ok(results)
}

impl<'c> Executor<'c> for &'c PgRoute {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if !self.through_pooler {
            return self.pool.fetch_many(query);
        }
        let pool = self.pool.clone();
        stream::once(in_own_transaction(pool, query))
            .map_ok(|results| stream::iter(results.into_iter().map(Ok)))
            .try_flatten()
            .boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if !self.through_pooler {
            return self.pool.fetch_optional(query);
        }
        let pool = self.pool.clone();
        Box::pin(async move {
            let results = in_own_transaction(pool, query).await?;
            Ok(results.into_iter().find_map(|r| r.right()))
        })
    }

    fn prepare_with<'e, 'q: 'e>(
        self,
        sql: &'q str,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement<'q>, sqlx::Error>>
    where
        'c: 'e,
    {
        // Not used by the ledger (it never holds prepared statements);
        // behind a pooler a prepared statement would not survive anyway.
        self.pool.prepare_with(sql, parameters)
    }

    fn describe<'e, 'q: 'e>(
        self,
        sql: &'q str,
    ) -> BoxFuture<'e, Result<Describe<Postgres>, sqlx::Error>>
    where
        'c: 'e,
    {
        self.pool.describe(sql)
    }
}
