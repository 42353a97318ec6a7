//! The embedded job queue: what RabbitMQ does for belfry, in the embedded
//! database (table `job_queue`, created by the embedded ledger's
//! migrations, since one file holds both).
//!
//! - **Routing**: a message goes to every queue bound to its routing key
//!   (`queue_bindings`, written when a worker group starts); none bound is
//!   "unroutable", as a `mandatory` publish returned by the broker.
//! - **Delivery**: a consumer takes the oldest free row, marking it taken
//!   by its session; ack deletes it, a requeue frees it, a reject moves it
//!   to `dead_letters`. Each is one statement (or one transaction), so a
//!   message is never both acked and requeued.
//! - **Durability**: the row is committed before the publisher hears
//!   "confirmed". A process killed with messages taken leaves them taken by
//!   a session that no longer exists; the next process frees them
//!   ([`JobQueue::open_consumer`]) before consuming, which is the broker
//!   requeueing a dead connection's unacknowledged deliveries. A row is
//!   taken as `{session}/{consumer}` (the session is this opening of the
//!   file), and only the consumer holding a message can ack, requeue or
//!   reject it.

//!
//! The queue shares the ledger's connections to the file (the embedded
//! ledger hands them out: `Ledger::embedded_file`, so that this crate
//! needs no ledger): every write goes through the ledger's one writing
//! connection, so queue writes and ledger writes are serialised together
//! instead of contending for SQLite's write lock.

use std::sync::Arc;

use chrono::Utc;
use sqlx::{Row, SqlitePool};
use tokio::sync::Notify;

use belfry_protocol::Topology;

/// A message taken from a queue, not yet acknowledged.
#[derive(Debug, Clone)]
pub struct QueuedMessage {
    /// Its position in the queue (the handle for ack, requeue, reject).
    pub seq: i64,
    /// The routing key it was published with (its job type).
    pub routing_key: String,
    /// The body, byte for byte.
    pub body: Vec<u8>,
    /// The W3C traceparent it was published with.
    pub traceparent: Option<String>,
    /// How many times it has been taken, this time included.
    pub deliveries: i64,
}

/// One message to publish.
#[derive(Debug, Clone)]
pub struct OutgoingMessage<'a> {
    /// The routing key (job type).
    pub routing_key: &'a str,
    /// The body.
    pub body: &'a [u8],
    /// The message id, for operators reading the table.
    pub message_id: Option<String>,
    /// The W3C traceparent.
    pub traceparent: Option<&'a str>,
}

/// The embedded job queue of one embedded database (cheap to clone); see
/// the module docs.
#[derive(Debug, Clone)]
pub struct JobQueue {
    reader: SqlitePool,
    writer: SqlitePool,
    session: String,
    ready: Arc<Notify>,
}

/// The embedded queue with the names of its namespace: what
/// [`crate::Broker`] and [`crate::Publisher`] hold in embedded mode.
#[derive(Clone, Debug)]
pub(crate) struct EmbeddedLink {
    pub(crate) queue: JobQueue,
    pub(crate) topology: Topology,
}

/// `now` as the embedded database writes instants: UTC, microseconds,
/// fixed width (the ledger's format, so that text order is time order).
fn now() -> String {
    Utc::now().format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

impl JobQueue {
    /// The queue of an embedded database: `reader` and `writer` are the
    /// ledger's pools on the file (every write of the queue goes through
    /// `writer`, the file's one writing connection), `session` names this
    /// opening of the file (rows are taken as `{session}/{consumer}`; rows
    /// of any other session belong to a process that is gone) and `ready`
    /// is woken after every publish and requeue (shared by every handle on
    /// the file).
    pub fn new(
        reader: SqlitePool,
        writer: SqlitePool,
        session: String,
        ready: Arc<Notify>,
    ) -> Self {
        Self {
            reader,
            writer,
            session,
            ready,
        }
    }

    /// The `taken_by` value of `consumer` in this session.
    fn holder(&self, consumer: &str) -> String {
        format!("{}/{consumer}", self.session)
    }
}

impl JobQueue {
    /// Binds `queue` to each of `job_types` (idempotent).
    ///
    /// # Errors
    ///
    /// [`sqlx::Error`] when the database fails.
    pub async fn bind(&self, queue: &str, job_types: &[String]) -> Result<(), sqlx::Error> {
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        for job_type in job_types {
            sqlx::query("INSERT INTO queue_bindings (job_type, queue) VALUES (?1, ?2) ON CONFLICT DO NOTHING")
                .bind(job_type)
                .bind(queue)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Publishes `messages` in one transaction; for each, how many queues
    /// it went to (0: unroutable, nothing stored).
    ///
    /// # Errors
    ///
    /// [`sqlx::Error`] when the database fails (nothing stored).
    pub async fn publish(&self, messages: &[OutgoingMessage<'_>]) -> Result<Vec<u64>, sqlx::Error> {
        let at = now();
        let mut routed = Vec::with_capacity(messages.len());
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        for m in messages {
            let done = sqlx::query(
                "INSERT INTO job_queue (queue, routing_key, body, message_id, traceparent, enqueued_at) \
                 SELECT queue, ?1, ?2, ?3, ?4, ?5 FROM queue_bindings WHERE job_type = ?1",
            )
            .bind(m.routing_key)
            .bind(m.body)
            .bind(&m.message_id)
            .bind(m.traceparent)
            .bind(&at)
            .execute(&mut *tx)
            .await?;
            routed.push(done.rows_affected());
        }
        tx.commit().await?;
        // After the commit: a woken consumer must find the rows.
        self.ready.notify_waiters();
        Ok(routed)
    }

    /// Takes up to `limit` of the oldest free messages of `queue` for
    /// `consumer`, oldest first.
    ///
    /// # Errors
    ///
    /// [`sqlx::Error`] when the database fails.
    pub async fn take(
        &self,
        queue: &str,
        consumer: &str,
        limit: u16,
    ) -> Result<Vec<QueuedMessage>, sqlx::Error> {
        let rows = sqlx::query(
            "UPDATE job_queue SET taken_by = ?2, deliveries = deliveries + 1 \
             WHERE seq IN (SELECT seq FROM job_queue WHERE queue = ?1 AND taken_by IS NULL \
                           ORDER BY seq LIMIT ?3) \
             RETURNING seq, routing_key, body, traceparent, deliveries",
        )
        .bind(queue)
        .bind(self.holder(consumer))
        .bind(i64::from(limit.max(1)))
        .fetch_all(&self.writer)
        .await?;
        let mut taken = rows
            .into_iter()
            .map(|r| {
                Ok(QueuedMessage {
                    seq: r.try_get("seq")?,
                    routing_key: r.try_get("routing_key")?,
                    body: r.try_get("body")?,
                    traceparent: r.try_get("traceparent")?,
                    deliveries: r.try_get("deliveries")?,
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        // RETURNING has no order of its own.
        taken.sort_by_key(|m| m.seq);
        Ok(taken)
    }

    /// Acknowledges (deletes) a taken message; `false` when it was no
    /// longer held by this process.
    ///
    /// # Errors
    ///
    /// [`sqlx::Error`] when the database fails.
    pub async fn ack(&self, seq: i64, consumer: &str) -> Result<bool, sqlx::Error> {
        let done = sqlx::query("DELETE FROM job_queue WHERE seq = ?1 AND taken_by = ?2")
            .bind(seq)
            .bind(self.holder(consumer))
            .execute(&self.writer)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Gives a taken message back to its queue.
    ///
    /// # Errors
    ///
    /// [`sqlx::Error`] when the database fails.
    pub async fn requeue(&self, seq: i64, consumer: &str) -> Result<bool, sqlx::Error> {
        let done =
            sqlx::query("UPDATE job_queue SET taken_by = NULL WHERE seq = ?1 AND taken_by = ?2")
                .bind(seq)
                .bind(self.holder(consumer))
                .execute(&self.writer)
                .await?;
        self.ready.notify_waiters();
        Ok(done.rows_affected() == 1)
    }

    /// Moves a taken message to the dead letters with `reason`.
    ///
    /// # Errors
    ///
    /// [`sqlx::Error`] when the database fails.
    pub async fn reject(
        &self,
        seq: i64,
        consumer: &str,
        reason: &str,
        by: &str,
    ) -> Result<bool, sqlx::Error> {
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        let moved = sqlx::query(
            "INSERT INTO dead_letters (routing_key, body, reason, dead_by, message_id, traceparent, recorded_at) \
             SELECT routing_key, body, ?3, ?4, message_id, traceparent, ?5 FROM job_queue \
             WHERE seq = ?1 AND taken_by = ?2",
        )
        .bind(seq)
        .bind(self.holder(consumer))
        .bind(reason)
        .bind(by)
        .bind(now())
        .execute(&mut *tx)
        .await?;
        sqlx::query("DELETE FROM job_queue WHERE seq = ?1 AND taken_by = ?2")
            .bind(seq)
            .bind(self.holder(consumer))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(moved.rows_affected() == 1)
    }

    /// Stores a dead letter.
    ///
    /// # Errors
    ///
    /// [`sqlx::Error`] when the database fails.
    pub async fn dead_letter(
        &self,
        message: &OutgoingMessage<'_>,
        reason: &str,
        by: &str,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO dead_letters (routing_key, body, reason, dead_by, message_id, traceparent, recorded_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )
        .bind(message.routing_key)
        .bind(message.body)
        .bind(reason)
        .bind(by)
        .bind(&message.message_id)
        .bind(message.traceparent)
        .bind(now())
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    /// Prepares `queue` for a consumer of this process: frees the messages of `queue`
    /// held by consumers of a process that is gone (another session of the
    /// file); how many were freed.
    ///
    /// # Errors
    ///
    /// [`sqlx::Error`] when the database fails.
    pub async fn open_consumer(&self, queue: &str) -> Result<u64, sqlx::Error> {
        let mine = format!("{}/", self.session);
        let done = sqlx::query(
            "UPDATE job_queue SET taken_by = NULL \
             WHERE queue = ?1 AND taken_by IS NOT NULL AND substr(taken_by, 1, length(?2)) <> ?2",
        )
        .bind(queue)
        .bind(mine)
        .execute(&self.writer)
        .await?;
        Ok(done.rows_affected())
    }

    /// Takes every dead letter: `(body, reason)`, oldest first.
    ///
    /// # Errors
    ///
    /// [`sqlx::Error`] when the database fails.
    pub async fn drain_dead_letters(&self) -> Result<Vec<(Vec<u8>, String)>, sqlx::Error> {
        let rows = sqlx::query("DELETE FROM dead_letters RETURNING seq, body, reason")
            .fetch_all(&self.writer)
            .await?;
        let mut out = rows
            .into_iter()
            .map(|r| {
                Ok((
                    r.try_get::<i64, _>("seq")?,
                    r.try_get("body")?,
                    r.try_get("reason")?,
                ))
            })
            .collect::<Result<Vec<(i64, Vec<u8>, String)>, sqlx::Error>>()?;
        out.sort_by_key(|(seq, _, _)| *seq);
        Ok(out.into_iter().map(|(_, b, r)| (b, r)).collect())
    }

    /// Messages of `queue` ready for delivery (not taken), as a broker's
    /// message count.
    ///
    /// # Errors
    ///
    /// [`sqlx::Error`] when the database fails.
    pub async fn depth(&self, queue: &str) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar("SELECT count(*) FROM job_queue WHERE queue = ?1 AND taken_by IS NULL")
            .bind(queue)
            .fetch_one(&self.reader)
            .await
    }

    /// Closes `consumer`: the messages it holds go back to their queue, as a
    /// broker requeues a closed channel's unacknowledged deliveries.
    ///
    /// # Errors
    ///
    /// [`sqlx::Error`] when the database fails (the messages are
    /// freed by the next consumer to open instead).
    pub async fn close_consumer(&self, consumer: &str) -> Result<u64, sqlx::Error> {
        let done = sqlx::query("UPDATE job_queue SET taken_by = NULL WHERE taken_by = ?1")
            .bind(self.holder(consumer))
            .execute(&self.writer)
            .await?;
        self.ready.notify_waiters();
        Ok(done.rows_affected())
    }

    /// Notified after every publish and requeue (consumers wait on it
    /// between polls).
    pub fn ready(&self) -> Arc<Notify> {
        self.ready.clone()
    }

    /// Whether the database answers.
    pub async fn ping(&self) -> bool {
        sqlx::query("SELECT 1").execute(&self.reader).await.is_ok()
    }
}
