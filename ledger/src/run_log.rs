//! Run logs and progress (issue 23): the lines a handler writes through the
//! worker's `JobContext::log` and `JobContext::progress`, stored per run
//! and attempt in `run_logs`, in the order written.
//!
//! - **Identity.** A line is `(run_id, attempt, seq)`, `seq` counted from 0
//!   by the attempt's worker. An attempt runs on one worker at a time (the
//!   attempt lease), so nobody else numbers its lines; a batch written
//!   again after a lost answer (`ON CONFLICT DO NOTHING`) stores nothing
//!   twice.
//! - **Kinds.** `log` (a level, a message, structured fields), `progress`
//!   (`done` of `total`, a note as the message), `truncated` (the attempt
//!   reached its bound; the lines after it were dropped) and `error` (the
//!   attempt's failure, written by the worker after the handler's lines, so
//!   the error and the last lines before it read together).
//! - **Reading.** [`Ledger::run_logs`] pages in `(attempt, seq)` order after
//!   a [`LogCursor`]; a follower asks again with the last cursor it saw.
//! - **Retention.** No foreign key ties a line to its run (`job_runs` is
//!   partitioned and loses rows by whole partitions): [`Ledger::prune_run_logs`]
//!   deletes, in batches, the lines older than the horizon whose run is
//!   gone, so a run that retention keeps (unfinished, a schedule's newest
//!   fire) keeps its log.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::{Ledger, LedgerError};

/// What a stored line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogKind {
    /// A line the handler logged.
    Log,
    /// A progress report: `done` of `total`, the note as the message.
    Progress,
    /// The attempt's bound was reached: the lines after this were dropped.
    Truncated,
    /// The attempt's failure (error text or panic message), written by the
    /// worker after the handler's last line.
    Error,
}

impl LogKind {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Log => "log",
            Self::Progress => "progress",
            Self::Truncated => "truncated",
            Self::Error => "error",
        }
    }

    /// The kind a stored name means; an unknown name (a newer version's
    /// kind) reads as a plain line.
    pub fn parse(stored: &str) -> Self {
        match stored {
            "progress" => Self::Progress,
            "truncated" => Self::Truncated,
            "error" => Self::Error,
            _ => Self::Log,
        }
    }
}

/// One stored line.
#[derive(Debug, Clone, PartialEq)]
pub struct RunLogLine {
    /// The run.
    pub run_id: Uuid,
    /// The attempt that wrote it (1-based).
    pub attempt: i32,
    /// Its place in the attempt, from 0.
    pub seq: i32,
    /// When it was written (the worker's clock).
    pub at: DateTime<Utc>,
    /// What it is.
    pub kind: LogKind,
    /// `trace`, `debug`, `info`, `warn` or `error`.
    pub level: String,
    /// The text (stored with NUL escaped, see [`crate::storable`]).
    pub message: String,
    /// Structured fields (a JSON object), if any.
    pub fields: Option<serde_json::Value>,
    /// Progress: units done.
    pub done: Option<i64>,
    /// Progress: units in all, when known.
    pub total: Option<i64>,
}

/// The row as both backends read it (fields as JSON text).
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct StoredLine {
    pub run_id: Uuid,
    pub attempt: i32,
    pub seq: i32,
    pub at: DateTime<Utc>,
    pub kind: String,
    pub level: String,
    pub message: String,
    pub fields: Option<String>,
    pub done: Option<i64>,
    pub total: Option<i64>,
}

/// The columns [`StoredLine`] reads, in order.
pub(crate) const LINE_COLUMNS: &str =
    "run_id, attempt, seq, at, kind, level, message, fields, done, total";

impl From<StoredLine> for RunLogLine {
    fn from(s: StoredLine) -> Self {
        Self {
            run_id: s.run_id,
            attempt: s.attempt,
            seq: s.seq,
            at: s.at,
            kind: LogKind::parse(&s.kind),
            level: s.level,
            message: s.message,
            // Written by `fields_text` from a JSON value: text that does not
            // parse (a hand-edited row) is shown as a string, not dropped.
            fields: s
                .fields
                .map(|t| serde_json::from_str(&t).unwrap_or(serde_json::Value::String(t))),
            done: s.done,
            total: s.total,
        }
    }
}

impl RunLogLine {
    /// The message as stored (NUL escaped).
    pub(crate) fn stored_message(&self) -> String {
        crate::stored_text::storable(&self.message).into_owned()
    }

    /// The fields as stored: JSON text. serde_json writes a NUL inside a
    /// string as the escape `\u0000`, so the text holds no NUL byte.
    pub(crate) fn fields_text(&self) -> Option<String> {
        self.fields.as_ref().map(|f| f.to_string())
    }

    /// Where this line is, as a cursor to read on after it.
    pub fn cursor(&self) -> LogCursor {
        LogCursor {
            attempt: self.attempt,
            seq: self.seq,
        }
    }
}

/// A place in a run's log: read the lines after `(attempt, seq)`. Written
/// `"{attempt}.{seq}"`; the start of the log is `"0.-1"` (or no cursor).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct LogCursor {
    /// The attempt of the last line seen.
    pub attempt: i32,
    /// Its `seq`.
    pub seq: i32,
}

impl LogCursor {
    /// Before the first line.
    pub const START: Self = Self {
        attempt: 0,
        seq: -1,
    };
}

impl fmt::Display for LogCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.attempt, self.seq)
    }
}

/// A cursor that is not `"{attempt}.{seq}"`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("log cursor {0:?} is not ATTEMPT.SEQ (two integers, e.g. \"2.17\"); pass the `next` of the previous page")]
pub struct BadLogCursor(pub String);

impl FromStr for LogCursor {
    type Err = BadLogCursor;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BadLogCursor(s.chars().take(64).collect());
        let (a, q) = s.split_once('.').ok_or_else(bad)?;
        Ok(Self {
            attempt: a.parse().map_err(|_| bad())?,
            seq: q.parse().map_err(|_| bad())?,
        })
    }
}

/// What one attempt of a run has stored: see [`Ledger::run_log_extent`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, sqlx::FromRow)]
pub struct AttemptLogExtent {
    /// The attempt.
    pub attempt: i32,
    /// Lines stored.
    pub lines: i64,
    /// The highest `seq` stored.
    pub last_seq: i32,
    /// Bytes of text stored (message and fields' JSON text, as the worker's
    /// bound counts them, give or take the database's JSON spacing).
    pub bytes: i64,
}

/// Whether the lines of every attempt in `entries` that said how many it
/// sent (`log_lines`) are all stored, by `extent`. Attempts that did not
/// say (ended by a crash or a hand-back, or before run logs existed) are
/// taken as complete: nothing is waiting to be written for them.
pub fn log_is_complete(entries: &[crate::AttemptEntry], extent: &[AttemptLogExtent]) -> bool {
    entries.iter().all(|e| {
        let sent = e.log_lines.unwrap_or(0);
        sent <= 0
            || extent
                .iter()
                .any(|x| x.attempt == e.attempt && x.last_seq >= sent - 1)
    })
}

impl Ledger {
    /// Per attempt of run `run_id`, how much of its log is stored (one
    /// aggregate over the run's primary-key range): what a retry counts
    /// against the run's bound, and what a reader compares with each
    /// attempt's `log_lines` to know the log is all in.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn run_log_extent(&self, run_id: Uuid) -> Result<Vec<AttemptLogExtent>, LedgerError> {
        self.store.run_log_extent(run_id).await
    }

    /// Stores `lines` (any runs, any attempts) in one statement per chunk;
    /// a line already stored (a batch sent again) is skipped. Returns how
    /// many were new.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached; the
    /// caller keeps the batch and sends it again.
    pub async fn append_run_logs(&self, lines: &[RunLogLine]) -> Result<u64, LedgerError> {
        if lines.is_empty() {
            return Ok(0);
        }
        self.store.append_run_logs(lines).await
    }

    /// At most `limit` lines of run `run_id` after `after`, in `(attempt,
    /// seq)` order.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn run_logs(
        &self,
        run_id: Uuid,
        after: LogCursor,
        limit: i64,
    ) -> Result<Vec<RunLogLine>, LedgerError> {
        self.store
            .run_logs(run_id, after, limit.clamp(1, 10_000))
            .await
    }

    /// The latest progress report of run `run_id` (its last attempt's
    /// last), if any.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn latest_progress(&self, run_id: Uuid) -> Result<Option<RunLogLine>, LedgerError> {
        self.store.latest_progress(run_id).await
    }

    /// Deletes at most `limit` lines written before `older_than` whose run
    /// no longer exists; returns how many. Call until it returns less than
    /// `limit`.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn prune_run_logs(
        &self,
        older_than: DateTime<Utc>,
        limit: i64,
    ) -> Result<u64, LedgerError> {
        self.store.prune_run_logs(older_than, limit).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_refuse_what_is_not_two_integers() {
        let c: LogCursor = "2.17".parse().unwrap_or(LogCursor::START);
        assert_eq!(
            c,
            LogCursor {
                attempt: 2,
                seq: 17
            }
        );
        assert_eq!(c.to_string(), "2.17");
        assert_eq!("0.-1".parse::<LogCursor>(), Ok(LogCursor::START));
        for bad in ["", "2", "a.b", "2.", ".3", "1.2.3"] {
            let e = bad.parse::<LogCursor>().err();
            assert!(e.is_some(), "{bad:?} accepted");
        }
        assert!(
            LogCursor {
                attempt: 1,
                seq: 99
            } < LogCursor { attempt: 2, seq: 0 }
        );
    }

    #[test]
    fn kinds_round_trip_and_an_unknown_one_reads_as_a_line() {
        for k in [
            LogKind::Log,
            LogKind::Progress,
            LogKind::Truncated,
            LogKind::Error,
        ] {
            assert_eq!(LogKind::parse(k.as_str()), k);
        }
        assert_eq!(LogKind::parse("future-kind"), LogKind::Log);
    }
}
