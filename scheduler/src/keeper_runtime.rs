//! A thread and runtime of the shard keeper's own, so a replica renews its
//! leases on time while its main runtime is saturated.
//!
//! On the main runtime the keeper's task is one of thousands when a large
//! instant is due: every fire batch, claim and publish is a task in the
//! same queues, and on a machine whose cores are shared with the database,
//! the broker and the other replicas, a task woken by its timer can wait
//! seconds for a worker thread. The million-schedule run showed it: every
//! replica's leases lapsed 25–30 s after the instant, before any lease
//! pass had failed or even been slow, and the shards churned between
//! replicas that were all alive. A lease missed for that reason fires
//! nothing sooner anywhere (the replica that takes the shard is as busy)
//! and costs a recovery pass per shard moved.
//!
//! Here the keeper runs on a single-threaded runtime on a thread of its
//! own, which the operating system schedules beside the main runtime's
//! workers whatever those have queued. Its lease passes use a pool opened
//! on this runtime, so their sockets are driven by this thread's reactor,
//! not by the busy one. What the keeper reads of the rest of the replica
//! (the timer loop's progress, the clock guard, the follower's reports)
//! is shared memory; what it tells them goes through a watch channel;
//! neither needs a runtime.
//!
//! The thread ends when the [`KeeperRuntime`] is dropped: its runtime
//! stops, dropping whatever task is still on it (the keeper's loop has
//! left its shards by then, when the replica shut down in order).

use std::future::Future;

use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

/// A single-threaded runtime on a thread of its own, running what is
/// spawned on it until dropped.
#[derive(Debug)]
pub struct KeeperRuntime {
    handle: Handle,
    stop: CancellationToken,
}

impl KeeperRuntime {
    /// Starts the thread `name` and its runtime.
    ///
    /// # Errors
    ///
    /// The operating system's error when the thread or the runtime's
    /// reactor cannot be created (out of threads or file descriptors).
    pub fn start(name: &str) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        // Not joined (detached): the thread only has to drop its runtime
        // once stopped, and a drop inside an async context must not block.
        std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                // `block_on` drives everything spawned on the handle until
                // the stop; the runtime is then dropped here, outside any
                // async context (dropping it inside one panics).
                runtime.block_on(stopped.cancelled());
            })?;
        Ok(Self { handle, stop })
    }

    /// Runs `future` on this runtime's thread and waits for its output.
    /// A panic in `future` is resumed here.
    pub async fn run<F>(&self, future: F) -> F::Output
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match self.spawn(future).await {
            Ok(output) => output,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Only a dropped runtime cancels its tasks, and this one lives
            // as long as `self`.
            Err(e) => unreachable!("a task of a live keeper runtime was cancelled: {e}"),
        }
    }

    /// Spawns `future` on this runtime's thread.
    pub fn spawn<F>(&self, future: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handle.spawn(future)
    }
}

impl Drop for KeeperRuntime {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn runs_work_on_its_own_thread_while_the_callers_thread_is_blocked() {
        let keeper = KeeperRuntime::start("belfry-keeper-test").unwrap();
        let caller = std::thread::current().id();
        let (tx, rx) = std::sync::mpsc::channel();
        let ticking = keeper.spawn(async move {
            for _ in 0..3 {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                let on = std::thread::current();
                tx.send((on.id(), on.name().map(str::to_owned))).unwrap();
            }
        });
        // The caller's (only) thread is blocked: the ticks come anyway.
        for _ in 0..3 {
            let (on, name) = rx
                .recv_timeout(std::time::Duration::from_secs(5))
                .expect("a tick while the caller's thread is blocked");
            assert_ne!(on, caller);
            assert_eq!(name.as_deref(), Some("belfry-keeper-test"));
        }
        ticking.await.unwrap();
        assert_eq!(keeper.run(async { 6 * 7 }).await, 42);
    }
}
