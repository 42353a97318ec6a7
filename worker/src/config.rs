//! Worker configuration, from environment variables.
//!
//! | variable | default | meaning |
//! | --- | --- | --- |
//! | `DATABASE_URL` | `postgres://postgres@127.0.0.1:5432/postgres` | Postgres ledger; a `sqlite:` URL runs on an embedded database and its job queue instead (`AMQP_URL`, `REDIS_URL` unused). TLS with libpq's parameters: `sslmode=disable\|prefer\|require\|verify-ca\|verify-full`, `sslrootcert`, `sslcert`, `sslkey` (files checked at start). Several hosts (`…@db1:5432,db2:5432/db`): the primary among them, followed through a failover |
//! | `BELFRY_DATABASE_DIRECT_URL` | unset | set when `DATABASE_URL` leads through a transaction pooler (PgBouncer `pool_mode = transaction`): the Postgres URL that bypasses it, used only for `LISTEN` and migrations; statements over `DATABASE_URL` then run unnamed, each in its own transaction |
//! | `AMQP_URL` | `amqp://guest:guest@127.0.0.1:5672/%2f` | RabbitMQ; `amqps://` for TLS; several comma-separated node URLs of one cluster: the first that answers, the next one when the connection drops |
//! | `BELFRY_AMQP_TLS_CA` | unset (system trust store) | PEM file of a CA to trust for RabbitMQ besides the system's |
//! | `BELFRY_AMQP_TLS_CERT`, `BELFRY_AMQP_TLS_KEY` | unset | client certificate and its key (PEM; the key PKCS#8, `BEGIN PRIVATE KEY`) for RabbitMQ |
//! | `BELFRY_INSTANCE` | `{hostname}-{pid}` | name in `job_runs.worker` |
//! | `BELFRY_NAMESPACE` | `belfry` | prefix of every exchange and queue |
//! | `BELFRY_WORKER_GROUP` | `default` | group; its queues are `{ns}.jobs.{group}` and `.high` / `.low` beside it (priorities) |
//! | `BELFRY_JOB_TYPES` | all registered | comma-separated job types this worker serves |
//! | `BELFRY_PREFETCH` | `32` | unacknowledged deliveries held at once, per queue (one queue per priority) |
//! | `BELFRY_CONCURRENCY` | `16` | jobs run at once |
//! | `BELFRY_JOB_TIMEOUT` | `5m` | per-attempt timeout |
//! | `BELFRY_LEASE` | `20s` | how long a running attempt owns its run without a heartbeat; renewed every quarter of it, so a dead worker's runs are taken over about this long after it died |
//! | `BELFRY_MAX_ATTEMPTS` | `5` | attempts per run, the first included |
//! | `BELFRY_RETRY_INITIAL` | `1s` | delay after the first failed attempt |
//! | `BELFRY_RETRY_MULTIPLIER` | `2` | growth of the delay per failure |
//! | `BELFRY_RETRY_MAX_DELAY` | `5m` | cap of the delay |
//! | `BELFRY_RETRY_JITTER` | `true` | stretch delays randomly by up to 100 % |
//! | `BELFRY_RETRY_REQUEUE_AFTER` | `10s` | longer delays go through the ledger instead of holding a prefetch slot |
//! | `BELFRY_DB_POOL` | `8` | Postgres connections (embedded: readers; writes use one more); the lease heartbeat has 1 more of its own |
//! | `BELFRY_SHUTDOWN_TIMEOUT` | `30s` | how long in-flight jobs may finish after SIGTERM |
//! | `BELFRY_LOG_FORMAT` | `text` | `text` or `json` |
//! | `BELFRY_START_TIMEOUT` | `30s` | how long start-up retries while Postgres or RabbitMQ is unreachable (then exit 1); `0s` fails at once |
//! | `BELFRY_METRICS_ADDR` | unset (off) | `host:port` of the Prometheus `/metrics` endpoint; port `0` picks a free one |

use std::time::Duration;

use belfry_runtime::client_tls::{check_postgres_tls_files, database_direct_url};
use belfry_runtime::{default_instance, ClientTls, LogFormat, SettingError, Settings};

use crate::RetryPolicy;

/// Everything a worker needs to start.
#[derive(Clone)]
pub struct WorkerConfig {
    /// Postgres URL (may hold a password).
    pub database_url: String,
    /// Postgres URL bypassing a transaction pooler that `database_url`
    /// leads through (`BELFRY_DATABASE_DIRECT_URL`); `None`: no pooler.
    pub database_direct_url: Option<String>,
    /// RabbitMQ URL (may hold a password).
    pub amqp_url: String,
    /// TLS material for an `amqps://` RabbitMQ (`BELFRY_AMQP_TLS_*`).
    pub amqp_tls: ClientTls,
    /// This worker's name.
    pub instance: String,
    /// Namespace of AMQP objects.
    pub namespace: String,
    /// Worker group.
    pub group: String,
    /// Job types this worker serves (`None`: every registered type).
    pub job_types: Option<Vec<String>>,
    /// Retry delays at least this long are handed to the ledger (the
    /// delivery is acked and a scheduler's reconciler republishes the run
    /// when the delay ends) instead of holding a prefetch slot.
    pub requeue_after: Duration,
    /// Prefetch (unacked deliveries).
    pub prefetch: u16,
    /// Concurrent jobs.
    pub concurrency: usize,
    /// Per-attempt timeout.
    pub job_timeout: Duration,
    /// Lease of a running attempt, renewed by the heartbeat.
    pub lease: Duration,
    /// How long a cancelled run's handler gets to return after its
    /// cancellation token fires, before the attempt is abandoned
    /// (`BELFRY_CANCEL_GRACE`, 30 s).
    pub cancel_grace: Duration,
    /// Retry policy.
    pub retry: RetryPolicy,
    /// Postgres pool size.
    pub db_pool: u32,
    /// Shutdown deadline.
    pub shutdown_timeout: Duration,
    /// Log format.
    pub log_format: LogFormat,
    /// Where `/metrics` is served (`BELFRY_METRICS_ADDR`); `None`: off.
    pub metrics_addr: Option<String>,
    /// How long start-up retries while a service is unreachable
    /// (`BELFRY_START_TIMEOUT`).
    pub start_timeout: Duration,
    /// How much of a run's log is kept (`BELFRY_RUN_LOG_MAX_LINES`, 10,000;
    /// `BELFRY_RUN_LOG_MAX_BYTES`, 1 MiB).
    pub run_log: crate::run_log::RunLogBounds,
}

impl std::fmt::Debug for WorkerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerConfig")
            .field("database_url", &belfry_runtime::masked(&self.database_url))
            .field(
                "database_direct_url",
                &self
                    .database_direct_url
                    .as_deref()
                    .map(belfry_runtime::masked),
            )
            .field("amqp_url", &belfry_runtime::masked(&self.amqp_url))
            .field("amqp_tls", &self.amqp_tls)
            .field("instance", &self.instance)
            .field("namespace", &self.namespace)
            .field("group", &self.group)
            .field("job_types", &self.job_types)
            .field("requeue_after", &self.requeue_after)
            .field("prefetch", &self.prefetch)
            .field("concurrency", &self.concurrency)
            .field("job_timeout", &self.job_timeout)
            .field("lease", &self.lease)
            .field("cancel_grace", &self.cancel_grace)
            .field("retry", &self.retry)
            .field("db_pool", &self.db_pool)
            .field("shutdown_timeout", &self.shutdown_timeout)
            .field("log_format", &self.log_format)
            .field("metrics_addr", &self.metrics_addr)
            .field("start_timeout", &self.start_timeout)
            .field("run_log", &self.run_log)
            .finish()
    }
}

/// Default of `BELFRY_CANCEL_GRACE`.
pub const DEFAULT_CANCEL_GRACE: Duration = Duration::from_secs(30);

impl WorkerConfig {
    /// Reads the configuration from `settings`.
    ///
    /// # Errors
    ///
    /// [`SettingError`] naming the first variable with an unusable value.
    pub fn from_settings(s: &Settings) -> Result<Self, SettingError> {
        let defaults = RetryPolicy::default();
        let multiplier: f32 = s.parsed(
            "BELFRY_RETRY_MULTIPLIER",
            defaults.multiplier,
            "a number from 1 to 100",
        )?;
        if !(1.0..=100.0).contains(&multiplier) {
            return Err(SettingError::Invalid {
                var: "BELFRY_RETRY_MULTIPLIER".into(),
                value: multiplier.to_string(),
                reason: "expected a number from 1 to 100".into(),
            });
        }
        let num = |var, default, min, max| s.number(var, default, min, max);
        let database_url = s.string(
            "DATABASE_URL",
            "postgres://postgres@127.0.0.1:5432/postgres",
        );
        check_postgres_tls_files("DATABASE_URL", &database_url)?;
        let database_direct_url = database_direct_url(s, &database_url)?;
        let amqp_url = s.string("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f");
        let amqp_tls = ClientTls::from_settings(s, "BELFRY_AMQP_TLS")?;
        amqp_tls.check_scheme("BELFRY_AMQP_TLS", "AMQP_URL", &amqp_url, "amqps")?;
        Ok(Self {
            database_url,
            database_direct_url,
            amqp_url,
            amqp_tls,
            instance: s.string("BELFRY_INSTANCE", &default_instance()),
            namespace: s.string(
                "BELFRY_NAMESPACE",
                belfry_protocol::topology::DEFAULT_NAMESPACE,
            ),
            group: s.string("BELFRY_WORKER_GROUP", "default"),
            job_types: s.get("BELFRY_JOB_TYPES").map(|v| {
                v.split(',')
                    .map(|t| t.trim().to_owned())
                    .filter(|t| !t.is_empty())
                    .collect()
            }),
            requeue_after: s.duration(
                "BELFRY_RETRY_REQUEUE_AFTER",
                Duration::from_secs(10),
                Duration::ZERO,
            )?,
            prefetch: u16::try_from(num("BELFRY_PREFETCH", 32, 1, 65_535)?).unwrap_or(32),
            concurrency: usize::try_from(num("BELFRY_CONCURRENCY", 16, 1, 100_000)?).unwrap_or(16),
            job_timeout: s.duration(
                "BELFRY_JOB_TIMEOUT",
                Duration::from_secs(300),
                Duration::from_millis(1),
            )?,
            lease: s.duration(
                "BELFRY_LEASE",
                crate::lease::DEFAULT_LEASE,
                Duration::from_secs(2),
            )?,
            cancel_grace: s.duration(
                "BELFRY_CANCEL_GRACE",
                DEFAULT_CANCEL_GRACE,
                Duration::ZERO,
            )?,
            retry: RetryPolicy {
                max_attempts: u32::try_from(num("BELFRY_MAX_ATTEMPTS", 5, 1, 1_000)?).unwrap_or(5),
                initial_delay: s.duration(
                    "BELFRY_RETRY_INITIAL",
                    defaults.initial_delay,
                    Duration::ZERO,
                )?,
                multiplier,
                max_delay: s.duration(
                    "BELFRY_RETRY_MAX_DELAY",
                    defaults.max_delay,
                    Duration::ZERO,
                )?,
                jitter: s.parsed("BELFRY_RETRY_JITTER", defaults.jitter, "true or false")?,
            },
            db_pool: u32::try_from(num("BELFRY_DB_POOL", 8, 1, 1_000)?).unwrap_or(8),
            shutdown_timeout: s.duration(
                "BELFRY_SHUTDOWN_TIMEOUT",
                Duration::from_secs(30),
                Duration::ZERO,
            )?,
            log_format: s.parsed("BELFRY_LOG_FORMAT", LogFormat::Text, "\"text\" or \"json\"")?,
            // `get` already treats a blank value as unset.
            metrics_addr: s.get("BELFRY_METRICS_ADDR").map(|a| a.trim().to_owned()),
            start_timeout: s.duration(
                "BELFRY_START_TIMEOUT",
                Duration::from_secs(30),
                Duration::ZERO,
            )?,
            run_log: crate::run_log::RunLogBounds {
                max_lines: u32::try_from(num("BELFRY_RUN_LOG_MAX_LINES", 10_000, 0, 10_000_000)?)
                    .unwrap_or(10_000),
                max_bytes: num(
                    "BELFRY_RUN_LOG_MAX_BYTES",
                    1024 * 1024,
                    0,
                    1024 * 1024 * 1024,
                )?,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_retry_settings_and_masks() {
        let c = WorkerConfig::from_settings(&Settings::from_pairs([
            ("AMQP_URL", "amqp://u:topsecret@mq/%2f"),
            ("BELFRY_MAX_ATTEMPTS", "3"),
            ("BELFRY_RETRY_INITIAL", "50ms"),
            ("BELFRY_RETRY_JITTER", "false"),
        ]))
        .unwrap();
        assert_eq!(c.retry.max_attempts, 3);
        assert_eq!(c.retry.initial_delay, Duration::from_millis(50));
        assert!(!c.retry.jitter);
        assert!(!format!("{c:?}").contains("topsecret"));
    }

    #[test]
    fn refuses_bad_values() {
        for (var, value) in [
            ("BELFRY_RETRY_MULTIPLIER", "0.5"),
            ("BELFRY_PREFETCH", "0"),
            ("BELFRY_RETRY_JITTER", "maybe"),
            ("BELFRY_JOB_TIMEOUT", "forever"),
        ] {
            let e = WorkerConfig::from_settings(&Settings::from_pairs([(var, value)]))
                .unwrap_err()
                .to_string();
            assert!(e.contains(var), "{e}");
        }
    }
}
