//! A run's log, as its handler writes it (issue 23): [`RunLog`] is the
//! per-attempt handle in [`crate::JobContext`]; the worker's one writer
//! task stores the lines in batches through
//! [`belfry_ledger::Ledger::append_run_logs`].
//!
//! - **Off the hot path.** `log` and `progress` never wait: a line goes into
//!   a bounded channel (`try_send`); the writer takes up to [`BATCH_LINES`]
//!   lines, or what came within [`BATCH_WAIT`] of the first, into one
//!   statement. A full channel (the database slower than the handlers for
//!   long) drops the line and counts it (`belfry_run_log_lines_dropped_total`)
//!   rather than slowing the handler.
//! - **Bounded per run.** [`RunLogBounds`] (default 10,000 lines and
//!   1 MiB of text): the first line past either bound is replaced by one
//!   `truncated` marker and every later line of the run is dropped. A
//!   retried run's later attempts start from what its earlier attempts
//!   stored (read once per attempt after the first), so the bound is the
//!   run's, not each attempt's. The attempt's failure is written after the
//!   bound (one `error` line), so a truncated log still ends with why.
//! - **Outages.** A batch that cannot be written is kept and tried again
//!   every [`RETRY_EVERY`]; lines arriving meanwhile queue in the channel
//!   and, past its capacity, are dropped and counted. Logs are a
//!   diagnostic: they never hold up an outcome.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use belfry_ledger::{Ledger, LogCursor, LogKind, RunLogLine};
use chrono::Utc;
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

/// Lines written in one statement at most.
pub const BATCH_LINES: usize = 500;
/// How long the writer waits for more lines after the first of a batch.
pub const BATCH_WAIT: Duration = Duration::from_millis(100);
/// Pause before a failed batch is written again.
pub const RETRY_EVERY: Duration = Duration::from_secs(1);
/// Lines waiting for the writer at most (then dropped and counted).
pub const CHANNEL_LINES: usize = 20_000;

/// How much of a run's log is kept (`BELFRY_RUN_LOG_MAX_LINES`,
/// `BELFRY_RUN_LOG_MAX_BYTES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunLogBounds {
    /// Lines per run (10,000).
    pub max_lines: u32,
    /// Bytes of text (message and fields) per run (1 MiB).
    pub max_bytes: u64,
}

impl Default for RunLogBounds {
    fn default() -> Self {
        Self {
            max_lines: 10_000,
            max_bytes: 1024 * 1024,
        }
    }
}

enum Request {
    Line(RunLogLine),
    Flush(oneshot::Sender<()>),
}

/// The worker's side of the writer: where attempts send their lines.
#[derive(Debug, Clone)]
pub(crate) struct RunLogSink {
    tx: mpsc::Sender<Request>,
    dropped: Arc<AtomicU64>,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Line(l) => write!(f, "Line({}.{})", l.attempt, l.seq),
            Self::Flush(_) => write!(f, "Flush"),
        }
    }
}

impl RunLogSink {
    /// Starts the writer on `ledger`; it ends when every sender is gone,
    /// after writing what it holds. `dropped` counts lines given up.
    pub(crate) fn start(ledger: Ledger, dropped: Arc<AtomicU64>) -> Self {
        let (tx, rx) = mpsc::channel(CHANNEL_LINES);
        tokio::spawn(write_lines(ledger, rx, dropped.clone()));
        Self { tx, dropped }
    }

    /// Waits until every line sent before this call is stored (or `within`
    /// passed: the database may be down).
    pub(crate) async fn flush(&self, within: Duration) -> bool {
        let (done, stored) = oneshot::channel();
        // A full channel: wait for room (the flush itself must not be lost).
        let sent = tokio::time::timeout(within, self.tx.send(Request::Flush(done))).await;
        if !matches!(sent, Ok(Ok(()))) {
            return false;
        }
        matches!(tokio::time::timeout(within, stored).await, Ok(Ok(())))
    }

    /// The handle for one attempt of run `run_id`; `stored_before` is what
    /// the run's earlier attempts stored (lines, bytes).
    pub(crate) fn attempt(
        &self,
        run_id: Uuid,
        attempt: u32,
        bounds: RunLogBounds,
        stored_before: (u64, u64),
    ) -> RunLog {
        RunLog {
            inner: Some(Arc::new(AttemptLines {
                sink: self.clone(),
                run_id,
                attempt: i32::try_from(attempt).unwrap_or(i32::MAX),
                seq: AtomicI32::new(0),
                lines: AtomicU64::new(stored_before.0),
                bytes: AtomicU64::new(stored_before.1),
                truncated: AtomicBool::new(false),
                bounds,
            })),
        }
    }

    fn send(&self, line: RunLogLine) {
        if self.tx.try_send(Request::Line(line)).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// One attempt's log: what [`crate::JobContext`]'s `log` and `progress`
/// write to. Cheap to clone (the clones share the attempt's count).
#[derive(Debug, Clone, Default)]
pub struct RunLog {
    inner: Option<Arc<AttemptLines>>,
}

#[derive(Debug)]
struct AttemptLines {
    sink: RunLogSink,
    run_id: Uuid,
    attempt: i32,
    seq: AtomicI32,
    lines: AtomicU64,
    bytes: AtomicU64,
    truncated: AtomicBool,
    bounds: RunLogBounds,
}

impl RunLog {
    /// A log that stores nothing (a context built outside a worker, e.g.
    /// in a handler's unit test).
    pub fn disabled() -> Self {
        Self::default()
    }

    /// Writes one line at `level` with structured `fields` (a JSON object,
    /// or `Null` for none).
    pub fn write(&self, level: tracing::Level, message: &str, fields: serde_json::Value) {
        let fields = (!fields.is_null()).then_some(fields);
        self.push(LogKind::Log, level, message, fields, None, None);
    }

    /// Records progress: `done` of `total` (if known), with a note.
    pub fn progress(&self, done: u64, total: Option<u64>, note: &str) {
        let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.push(
            LogKind::Progress,
            tracing::Level::INFO,
            note,
            None,
            Some(n(done)),
            total.map(n),
        );
    }

    /// The attempt's failure, written by the worker after the handler's
    /// lines whatever the bound.
    pub(crate) fn error(&self, text: &str) {
        if let Some(a) = &self.inner {
            a.send(
                LogKind::Error,
                tracing::Level::ERROR,
                text,
                None,
                None,
                None,
            );
        }
    }

    fn push(
        &self,
        kind: LogKind,
        level: tracing::Level,
        message: &str,
        fields: Option<serde_json::Value>,
        done: Option<i64>,
        total: Option<i64>,
    ) {
        let Some(a) = &self.inner else { return };
        if a.truncated.load(Ordering::Relaxed) {
            return;
        }
        let size = line_bytes(message, fields.as_ref());
        // Counted before the check, so concurrent writers of one attempt
        // cannot both slip under the bound.
        let lines = a.lines.fetch_add(1, Ordering::Relaxed) + 1;
        let bytes = a.bytes.fetch_add(size, Ordering::Relaxed) + size;
        if lines > u64::from(a.bounds.max_lines) || bytes > a.bounds.max_bytes {
            // Only the first writer past the bound writes the marker.
            if !a.truncated.swap(true, Ordering::Relaxed) {
                let text = format!(
                    "log truncated: the run's bound of {} lines / {} bytes was reached; later lines were dropped",
                    a.bounds.max_lines, a.bounds.max_bytes
                );
                a.send(
                    LogKind::Truncated,
                    tracing::Level::WARN,
                    &text,
                    None,
                    None,
                    None,
                );
            }
            return;
        }
        a.send(kind, level, message, fields, done, total);
    }
}

impl AttemptLines {
    fn send(
        &self,
        kind: LogKind,
        level: tracing::Level,
        message: &str,
        fields: Option<serde_json::Value>,
        done: Option<i64>,
        total: Option<i64>,
    ) {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        self.sink.send(RunLogLine {
            run_id: self.run_id,
            attempt: self.attempt,
            seq,
            at: Utc::now(),
            kind,
            level: level.as_str().to_ascii_lowercase(),
            message: message.to_owned(),
            fields,
            done,
            total,
        });
    }
}

/// What a line counts against the bound: its text and its fields' JSON.
fn line_bytes(message: &str, fields: Option<&serde_json::Value>) -> u64 {
    message.len() as u64 + fields.map_or(0, |f| f.to_string().len() as u64)
}

/// What a run's earlier attempts stored: `(lines, bytes)`, counted from
/// their lines (read once per attempt after the first; `(0, 0)` when the
/// database cannot say, so a retry is never held up by its log).
pub(crate) async fn stored_before(ledger: &Ledger, run_id: Uuid) -> (u64, u64) {
    let mut after = LogCursor::START;
    let (mut lines, mut bytes) = (0u64, 0u64);
    loop {
        let Ok(page) = ledger.run_logs(run_id, after, 1_000).await else {
            return (lines, bytes);
        };
        for l in &page {
            lines += 1;
            bytes += line_bytes(&l.message, l.fields.as_ref());
        }
        match page.last() {
            Some(last) if page.len() == 1_000 => after = last.cursor(),
            _ => return (lines, bytes),
        }
    }
}

/// The writer: batches lines into statements until every sender is gone.
async fn write_lines(ledger: Ledger, mut rx: mpsc::Receiver<Request>, dropped: Arc<AtomicU64>) {
    let mut batch: Vec<RunLogLine> = Vec::with_capacity(BATCH_LINES);
    let mut waiting: Vec<oneshot::Sender<()>> = Vec::new();
    loop {
        let Some(first) = rx.recv().await else {
            return;
        };
        let mut closed = false;
        take(first, &mut batch, &mut waiting);
        let until = tokio::time::Instant::now() + BATCH_WAIT;
        // A flush request writes at once; otherwise gather a batch.
        while batch.len() < BATCH_LINES && waiting.is_empty() {
            tokio::select! {
                next = rx.recv() => match next {
                    Some(r) => take(r, &mut batch, &mut waiting),
                    None => { closed = true; break; }
                },
                _ = tokio::time::sleep_until(until) => break,
            }
        }
        while !batch.is_empty() {
            match ledger.append_run_logs(&batch).await {
                Ok(_) => batch.clear(),
                Err(e) => {
                    tracing::warn!(error = %e, lines = batch.len(), "run log lines not stored; retrying");
                    tokio::time::sleep(RETRY_EVERY).await;
                    // Lines keep arriving meanwhile; past the channel's
                    // capacity the senders drop theirs (counted there).
                    if batch.len() > CHANNEL_LINES {
                        let extra = batch.len() - CHANNEL_LINES;
                        batch.drain(..extra);
                        dropped.fetch_add(extra as u64, Ordering::Relaxed);
                    }
                }
            }
        }
        for w in waiting.drain(..) {
            let _ = w.send(());
        }
        if closed {
            return;
        }
    }
}

fn take(r: Request, batch: &mut Vec<RunLogLine>, waiting: &mut Vec<oneshot::Sender<()>>) {
    match r {
        Request::Line(l) => batch.push(l),
        Request::Flush(done) => waiting.push(done),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sink() -> (RunLogSink, mpsc::Receiver<Request>) {
        let (tx, rx) = mpsc::channel(100);
        (
            RunLogSink {
                tx,
                dropped: Arc::new(AtomicU64::new(0)),
            },
            rx,
        )
    }

    fn lines(rx: &mut mpsc::Receiver<Request>) -> Vec<RunLogLine> {
        let mut out = Vec::new();
        while let Ok(Request::Line(l)) = rx.try_recv() {
            out.push(l);
        }
        out
    }

    #[test]
    fn lines_past_the_bound_become_one_marker_and_the_error_still_follows() {
        let (sink, mut rx) = sink();
        let bounds = RunLogBounds {
            max_lines: 3,
            max_bytes: 1_000,
        };
        // One line stored by an earlier attempt counts against the run.
        let log = sink.attempt(Uuid::nil(), 2, bounds, (1, 5));
        for i in 0..5 {
            log.write(
                tracing::Level::INFO,
                &format!("line {i}"),
                serde_json::Value::Null,
            );
        }
        log.error("boom");
        let got: Vec<(i32, LogKind, String)> = lines(&mut rx)
            .into_iter()
            .map(|l| (l.seq, l.kind, l.message))
            .collect();
        assert_eq!(got.len(), 4, "{got:?}");
        assert_eq!(got[0], (0, LogKind::Log, "line 0".into()));
        assert_eq!(got[1], (1, LogKind::Log, "line 1".into()));
        assert_eq!(got[2].1, LogKind::Truncated);
        assert_eq!(got[3], (3, LogKind::Error, "boom".into()));
    }

    #[test]
    fn the_byte_bound_counts_fields_and_a_disabled_log_stores_nothing() {
        let (sink, mut rx) = sink();
        let bounds = RunLogBounds {
            max_lines: 100,
            max_bytes: 20,
        };
        let log = sink.attempt(Uuid::nil(), 1, bounds, (0, 0));
        log.write(
            tracing::Level::INFO,
            "0123456789",
            serde_json::json!({"k": 1}),
        );
        log.write(tracing::Level::INFO, "0123456789", serde_json::Value::Null);
        let got = lines(&mut rx);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].fields, Some(serde_json::json!({"k": 1})));
        assert_eq!(got[1].kind, LogKind::Truncated);
        RunLog::disabled().write(tracing::Level::INFO, "x", serde_json::Value::Null);
        RunLog::disabled().progress(1, Some(2), "x");
    }

    #[test]
    fn a_full_channel_drops_and_counts_instead_of_waiting() {
        let (tx, mut rx) = mpsc::channel(2);
        let sink = RunLogSink {
            tx,
            dropped: Arc::new(AtomicU64::new(0)),
        };
        let log = sink.attempt(Uuid::nil(), 1, RunLogBounds::default(), (0, 0));
        for _ in 0..5 {
            log.progress(1, None, "x");
        }
        assert_eq!(sink.dropped.load(Ordering::Relaxed), 3);
        assert_eq!(lines(&mut rx).len(), 2);
    }
}
