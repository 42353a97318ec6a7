//! belfry in one process: a scheduler replica, a worker and the REST API
//! together, for trying belfry and writing job handlers on a laptop
//! (`belfry dev`), and for programs that want scheduled jobs without running
//! services.
//!
//! [`Mode`] is chosen from the environment: with no `DATABASE_URL`, or a
//! `sqlite:` one, everything runs on the embedded SQLite database (ledger
//! and job queue in one file, no lock service: one process owns the file);
//! with a Postgres `DATABASE_URL` (and `AMQP_URL`, `REDIS_URL`) the same
//! call runs the distributed mode's parts against the real services. Either
//! way the scheduling, dispatch, retry and API code is the distributed
//! mode's own: only the ledger, lock and broker behind them differ.
//!
//! Custom job types work the same as in a worker binary: build a
//! [`belfry_worker::Registry`] with them and pass it to [`start`].

mod dev;
mod mode;

pub use dev::{start, Dev, DevError};
pub use mode::{Mode, DEFAULT_DATABASE_URL};
