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
//! - **Order.** An attempt numbers its lines (`seq`) and queues each under
//!   one lock, so the channel, and with it every batch, holds an attempt's
//!   lines in `seq` order even when the handler logs from several tasks: a
//!   follower that read up to seq 6 never finds a seq 5 stored after it.
//! - **End.** The worker closes the attempt's log once the outcome is
//!   known (after the failure line): a task the handler spawned with a
//!   clone of its context cannot add lines after the error, its writes are
//!   dropped and counted (`belfry_run_log_lines_late_total`). The number
//!   of lines the attempt sent is recorded
//!   in its attempt entry (`log_lines`), so a reader knows when the log is
//!   all in ([`belfry_ledger::log_is_complete`]) instead of guessing.
//! - **Outages.** A batch that cannot be written is kept and tried again
//!   every [`RETRY_EVERY`], at most [`GIVE_UP_AFTER`] times (then dropped
//!   and counted: a batch the database refuses for good must not stop every
//!   later line); lines arriving meanwhile queue in the channel and, past
//!   its capacity, are dropped and counted. Logs are a diagnostic: they
//!   never hold up an outcome.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use belfry_ledger::{Ledger, LogKind, RunLogLine};
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
/// Tries of one batch before it is dropped (and counted): a minute of
/// outage at [`RETRY_EVERY`].
pub const GIVE_UP_AFTER: u32 = 60;

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

pub(crate) enum Request {
    Line(RunLogLine),
    Flush(oneshot::Sender<()>),
}

/// The worker's side of the writer: where attempts send their lines.
#[derive(Debug, Clone)]
pub(crate) struct RunLogSink {
    tx: mpsc::Sender<Request>,
    dropped: Arc<AtomicU64>,
    late: Arc<AtomicU64>,
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
    /// after writing what it holds. `dropped` counts lines given up (a
    /// full queue, a batch given up), `late` lines written after their
    /// attempt's outcome.
    pub(crate) fn start(ledger: Ledger, dropped: Arc<AtomicU64>, late: Arc<AtomicU64>) -> Self {
        let (tx, rx) = mpsc::channel(CHANNEL_LINES);
        tokio::spawn(write_lines(ledger, rx, dropped.clone()));
        Self { tx, dropped, late }
    }

    /// Waits until every line sent before this call is stored (or `within`
    /// passed: the database may be down).
    pub(crate) async fn flush(&self, within: Duration) -> bool {
        let (done, stored) = oneshot::channel();
        // One deadline for both steps. A full channel: wait for room (the
        // flush itself must not be lost), then for the writer's answer.
        let flushed = tokio::time::timeout(within, async {
            self.tx.send(Request::Flush(done)).await.is_ok() && stored.await.is_ok()
        })
        .await;
        flushed.unwrap_or(false)
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
                state: Mutex::new(LineState {
                    next_seq: 0,
                    lines: stored_before.0,
                    bytes: stored_before.1,
                    truncated: false,
                    closed: false,
                }),
                bounds,
            })),
        }
    }

    /// Queues `line`; false (and counted) when the channel is full.
    fn send(&self, line: RunLogLine) -> bool {
        let sent = self.tx.try_send(Request::Line(line)).is_ok();
        if !sent {
            self.drop_lines(1);
        }
        sent
    }

    fn drop_lines(&self, n: u64) {
        self.dropped.fetch_add(n, Ordering::Relaxed);
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
    state: Mutex<LineState>,
    bounds: RunLogBounds,
}

/// An attempt's count, under one lock: the seq a line gets and its place
/// in the channel are decided together (see the module's "Order").
#[derive(Debug)]
struct LineState {
    /// The seq of the next line queued; also how many were queued.
    next_seq: i32,
    /// Lines counted against the bound (the run's earlier attempts' too).
    lines: u64,
    /// Bytes counted against the bound.
    bytes: u64,
    /// The bound was reached: the marker is queued, later lines dropped.
    truncated: bool,
    /// The attempt's outcome is known: nothing more is queued.
    closed: bool,
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
        let Some(a) = &self.inner else { return };
        let mut state = a.lock();
        if state.closed {
            return;
        }
        a.queue(
            &mut state,
            LogKind::Error,
            tracing::Level::ERROR,
            text,
            None,
            None,
            None,
        );
    }

    /// Ends the attempt's log: later writes (from tasks the handler left
    /// running) are dropped and counted. Returns how many lines the attempt
    /// queued, for its attempt entry's `log_lines`.
    pub(crate) fn close(&self) -> Option<i32> {
        let a = self.inner.as_ref()?;
        let mut state = a.lock();
        state.closed = true;
        Some(state.next_seq)
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
        let mut state = a.lock();
        if state.closed {
            // A task outliving its attempt: counted, never stored after the
            // attempt's error line.
            a.sink.late.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if state.truncated {
            return;
        }
        let size = line_bytes(message, fields.as_ref());
        state.lines += 1;
        state.bytes += size;
        if state.lines > u64::from(a.bounds.max_lines) || state.bytes > a.bounds.max_bytes {
            state.truncated = true;
            let text = format!(
                "log truncated: the run's bound of {} lines / {} bytes was reached; later lines were dropped",
                a.bounds.max_lines, a.bounds.max_bytes
            );
            a.queue(
                &mut state,
                LogKind::Truncated,
                tracing::Level::WARN,
                &text,
                None,
                None,
                None,
            );
            return;
        }
        a.queue(&mut state, kind, level, message, fields, done, total);
    }
}

impl AttemptLines {
    /// The attempt's count. A writer that panicked while holding it left
    /// nothing half-done that matters (a count), so poisoning is ignored.
    fn lock(&self) -> std::sync::MutexGuard<'_, LineState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues one line with the next seq; called with the attempt's lock
    /// held (`state`), so seq order is channel order. `try_send` never
    /// waits, so the lock is held only for a push. A line the full channel
    /// refused takes no seq (the seqs stored stay `0..log_lines`).
    #[allow(clippy::too_many_arguments)]
    fn queue(
        &self,
        state: &mut LineState,
        kind: LogKind,
        level: tracing::Level,
        message: &str,
        fields: Option<serde_json::Value>,
        done: Option<i64>,
        total: Option<i64>,
    ) {
        let sent = self.sink.send(RunLogLine {
            run_id: self.run_id,
            attempt: self.attempt,
            seq: state.next_seq,
            at: Utc::now(),
            kind,
            level: level.as_str().to_ascii_lowercase(),
            message: message.to_owned(),
            fields,
            done,
            total,
        });
        if sent {
            state.next_seq += 1;
        }
    }
}

/// What a line counts against the bound: its text and its fields' JSON.
fn line_bytes(message: &str, fields: Option<&serde_json::Value>) -> u64 {
    message.len() as u64 + fields.map_or(0, |f| f.to_string().len() as u64)
}

/// What a run's earlier attempts stored: `(lines, bytes)`, one aggregate
/// read per attempt after the first; `(0, 0)` when the database cannot
/// say `within` (a stalled pool would otherwise hold the retry for its
/// acquire timeout), so a retry is never held up by its log.
pub(crate) async fn stored_before(ledger: &Ledger, run_id: Uuid, within: Duration) -> (u64, u64) {
    let Ok(Ok(extent)) = tokio::time::timeout(within, ledger.run_log_extent(run_id)).await else {
        return (0, 0);
    };
    extent.iter().fold((0, 0), |(lines, bytes), a| {
        (
            lines + u64::try_from(a.lines).unwrap_or(0),
            bytes + u64::try_from(a.bytes).unwrap_or(0),
        )
    })
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
        // Lines keep arriving while a batch is retried; past the channel's
        // capacity the senders drop theirs (counted there).
        let mut tries = 0;
        while !batch.is_empty() {
            match ledger.append_run_logs(&batch).await {
                Ok(_) => batch.clear(),
                Err(e) if tries + 1 >= GIVE_UP_AFTER => {
                    tracing::error!(error = %e, lines = batch.len(), tries = tries + 1,
                        "run log lines given up: the database did not store them");
                    dropped.fetch_add(batch.len() as u64, Ordering::Relaxed);
                    batch.clear();
                }
                Err(e) => {
                    tries += 1;
                    tracing::warn!(error = %e, lines = batch.len(), tries, "run log lines not stored; retrying");
                    tokio::time::sleep(RETRY_EVERY).await;
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

/// A sink without a writer, for unit tests: what was queued is read back
/// in channel order with [`test_lines`].
#[cfg(test)]
pub(crate) fn test_sink(capacity: usize) -> (RunLogSink, mpsc::Receiver<Request>) {
    let (tx, rx) = mpsc::channel(capacity);
    (
        RunLogSink {
            tx,
            dropped: Arc::new(AtomicU64::new(0)),
            late: Arc::new(AtomicU64::new(0)),
        },
        rx,
    )
}

/// The lines queued in a [`test_sink`], in channel order.
#[cfg(test)]
pub(crate) fn test_lines(rx: &mut mpsc::Receiver<Request>) -> Vec<RunLogLine> {
    let mut out = Vec::new();
    while let Ok(Request::Line(l)) = rx.try_recv() {
        out.push(l);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sink() -> (RunLogSink, mpsc::Receiver<Request>) {
        test_sink(100)
    }

    fn lines(rx: &mut mpsc::Receiver<Request>) -> Vec<RunLogLine> {
        test_lines(rx)
    }

    #[test]
    fn lines_from_concurrent_writers_are_queued_in_seq_order() {
        let (sink, mut rx) = test_sink(100_000);
        let log = sink.attempt(Uuid::nil(), 1, RunLogBounds::default(), (0, 0));
        let writers: Vec<_> = (0..4)
            .map(|t| {
                let log = log.clone();
                std::thread::spawn(move || {
                    for i in 0..2_000 {
                        log.write(
                            tracing::Level::INFO,
                            &format!("{t}-{i}"),
                            serde_json::Value::Null,
                        );
                    }
                })
            })
            .collect();
        for w in writers {
            assert!(w.join().is_ok());
        }
        let seqs: Vec<i32> = lines(&mut rx).iter().map(|l| l.seq).collect();
        // 4 x 2,000 writes, bounded at 10,000 lines: all queued.
        assert_eq!(seqs.len(), 8_000);
        let out_of_order = seqs.windows(2).filter(|w| w[1] != w[0] + 1).count();
        assert_eq!(
            out_of_order, 0,
            "a seq was queued after a higher one: a follower past the higher would miss it"
        );
    }

    #[test]
    fn a_closed_log_takes_no_more_lines_and_says_how_many_it_queued() {
        let (sink, mut rx) = sink();
        let log = sink.attempt(Uuid::nil(), 1, RunLogBounds::default(), (0, 0));
        let spawned = log.clone();
        log.write(tracing::Level::INFO, "a", serde_json::Value::Null);
        log.error("boom");
        assert_eq!(log.close(), Some(2));
        // A task the handler left running writes after the outcome.
        spawned.write(tracing::Level::INFO, "late", serde_json::Value::Null);
        spawned.progress(1, None, "late");
        log.error("again");
        let got: Vec<String> = lines(&mut rx).into_iter().map(|l| l.message).collect();
        assert_eq!(got, ["a", "boom"]);
        assert_eq!(sink.late.load(Ordering::Relaxed), 2);
        assert_eq!(sink.dropped.load(Ordering::Relaxed), 0);
        assert_eq!(RunLog::disabled().close(), None);
    }

    #[test]
    fn a_line_the_full_channel_refused_takes_no_seq() {
        let (sink, mut rx) = test_sink(1);
        let log = sink.attempt(Uuid::nil(), 1, RunLogBounds::default(), (0, 0));
        log.write(tracing::Level::INFO, "0", serde_json::Value::Null);
        log.write(tracing::Level::INFO, "refused", serde_json::Value::Null);
        assert_eq!(lines(&mut rx).len(), 1);
        log.write(tracing::Level::INFO, "1", serde_json::Value::Null);
        let got: Vec<(i32, String)> = lines(&mut rx)
            .into_iter()
            .map(|l| (l.seq, l.message))
            .collect();
        assert_eq!(got, [(1, "1".to_owned())]);
        assert_eq!(log.close(), Some(2));
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
        let (sink, mut rx) = test_sink(2);
        let log = sink.attempt(Uuid::nil(), 1, RunLogBounds::default(), (0, 0));
        for _ in 0..5 {
            log.progress(1, None, "x");
        }
        assert_eq!(sink.dropped.load(Ordering::Relaxed), 3);
        assert_eq!(lines(&mut rx).len(), 2);
    }
}
