//! Scheduler configuration, from environment variables. The settings of
//! the REST API and web view (`BELFRY_API_ADDR`, `BELFRY_API_*_TOKENS`,
//! `BELFRY_TRACE_UI_URL`) are the server's (`belfry_server::config`).
//!
//! | variable | default | meaning |
//! | --- | --- | --- |
//! | `DATABASE_URL` | `postgres://postgres@127.0.0.1:5432/postgres` | Postgres ledger; a `sqlite:` URL runs on an embedded database and its job queue instead (`AMQP_URL`, `REDIS_URL` unused). TLS with libpq's parameters: `sslmode=disable\|prefer\|require\|verify-ca\|verify-full`, `sslrootcert`, `sslcert`, `sslkey` (files checked at start). Several hosts (`…@db1:5432,db2:5432/db`): the primary among them, followed through a failover |
//! | `BELFRY_DATABASE_DIRECT_URL` | unset | set when `DATABASE_URL` leads through a transaction pooler (PgBouncer `pool_mode = transaction`): the Postgres URL that bypasses it, used only for `LISTEN` and migrations; statements over `DATABASE_URL` then run unnamed, each in its own transaction |
//! | `REDIS_URL` | `redis://127.0.0.1:6379/` | claim lock; `-` disables it; `rediss://` for TLS; `redis+sentinel://s1:26379,s2:26379/MASTER_NAME` (Sentinel), `redis+cluster://n1:6379,n2:6379` (Cluster) |
//! | `BELFRY_REDIS_TLS_CA` | unset (system trust store) | PEM file of the CA that signed Redis' certificate (then the only one trusted) |
//! | `BELFRY_REDIS_TLS_CERT`, `BELFRY_REDIS_TLS_KEY` | unset | client certificate and its key (PEM) for Redis |
//! | `AMQP_URL` | `amqp://guest:guest@127.0.0.1:5672/%2f` | RabbitMQ; `amqps://` for TLS; several comma-separated node URLs of one cluster: the first that answers, the next one when the connection drops |
//! | `BELFRY_AMQP_TLS_CA` | unset (system trust store) | PEM file of a CA to trust for RabbitMQ besides the system's |
//! | `BELFRY_AMQP_TLS_CERT`, `BELFRY_AMQP_TLS_KEY` | unset | client certificate and its key (PEM; the key PKCS#8, `BEGIN PRIVATE KEY`) for RabbitMQ |
//! | `BELFRY_INSTANCE` | `{hostname}-{pid}` | name in `job_runs.claimed_by` |
//! | `BELFRY_NAMESPACE` | `belfry` | prefix of every exchange, queue and Redis key |
//! | `BELFRY_SCHEDULES` | `examples/schedules.toml` | schedule file |
//! | `BELFRY_SCHEDULES_PRUNE` | `false` | delete stored schedules that are not in the file |
//! | `BELFRY_SCHEDULE_RESYNC` | `30s` | full comparison of stored schedules (notifications cover changes in between) |
//! | `BELFRY_LOCK_TTL` | `60s` | how long a fire's Redis lock lives |
//! | `BELFRY_SHARDING` | `on` | `on`: replicas share the fires by shard, each firing the schedules of the shards it leases; `off`: every replica races every fire (the embedded ledger never shards) |
//! | `BELFRY_SHARDS` | `256` | shards the schedules are split into (1 to 65536; the same on every replica: one with another count is refused while others run) |
//! | `BELFRY_SHARD_LEASE_TTL` | `5s` | how long a shard lease lasts unless renewed (renewed every fifth of it; stretched to 4 × the slowest recent lease pass, at most 4 ×); a dead replica's shards are taken within about this |
//! | `BELFRY_SHARD_STALL_AFTER` | `15s` | a timer loop busy this long without handing off a batch of fires (stretched to 3 × the slowest recent batch, at most 8 ×) stops renewing its leases, so other replicas take its shards |
//! | `BELFRY_MAX_INFLIGHT_FIRES` | `1024` | fires claimed/published concurrently |
//! | `BELFRY_MAX_BATCH` | `256` | most fires due together claimed and published as one batch |
//! | `BELFRY_DB_POOL` | `8` | Postgres connections (embedded: readers; writes use one more) |
//! | `BELFRY_SHUTDOWN_TIMEOUT` | `30s` | how long in-flight fires may take after SIGTERM |
//! | `BELFRY_RECONCILE_AFTER` | `30s` | a claimed run not confirmed by then is republished |
//! | `BELFRY_RECONCILE_INTERVAL` | `1s` | how often the outbox reconciler looks for due runs |
//! | `BELFRY_MISFIRE_THRESHOLD` | `10s` | lateness within which a fire is on time; older ones follow the misfire policy |
//! | `BELFRY_MAX_CLOCK_SKEW` | `2s` | clock difference with the database beyond which the replica stops claiming |
//! | `BELFRY_CLOCK_CHECK_INTERVAL` | `10s` | how often the clock is compared with the database's |
//! | `BELFRY_STUCK_AFTER` | `1h` | a run with no progress for this long is reported stuck |
//! | `BELFRY_LOG_FORMAT` | `text` | `text` or `json` |
//! | `BELFRY_START_TIMEOUT` | `30s` | how long start-up retries while Postgres or RabbitMQ is unreachable (then exit 1); `0s` fails at once |
//! | `BELFRY_METRICS_ADDR` | unset (off) | `host:port` of the Prometheus `/metrics` endpoint; port `0` picks a free one |
//! | `BELFRY_RETENTION` | `30d` | finished runs older than this are pruned (the newest fire of each schedule is kept); `off` keeps everything |
//! | `BELFRY_RETENTION_INTERVAL` | `10m` | how often pruning runs |

use std::path::PathBuf;
use std::time::Duration;

use belfry_runtime::client_tls::{check_postgres_tls_files, database_direct_url};
use belfry_runtime::{default_instance, ClientTls, LogFormat, SettingError, Settings};

use crate::replica::ReplicaTiming;

/// Default Postgres URL (the local trust-auth server of a dev machine).
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";
/// Default Redis URL.
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379/";
/// Default RabbitMQ URL.
pub const DEFAULT_AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// Everything a scheduler replica needs to start.
#[derive(Clone)]
pub struct SchedulerConfig {
    /// Postgres URL (may hold a password: never log it unmasked).
    pub database_url: String,
    /// Postgres URL bypassing a transaction pooler that `database_url`
    /// leads through (`BELFRY_DATABASE_DIRECT_URL`); `None`: no pooler.
    pub database_direct_url: Option<String>,
    /// Redis URL; `None` disables the lock (database-only claiming).
    pub redis_url: Option<String>,
    /// RabbitMQ URL (may hold a password).
    pub amqp_url: String,
    /// TLS material for a `rediss://` Redis (`BELFRY_REDIS_TLS_*`).
    pub redis_tls: ClientTls,
    /// TLS material for an `amqps://` RabbitMQ (`BELFRY_AMQP_TLS_*`).
    pub amqp_tls: ClientTls,
    /// This replica's name.
    pub instance: String,
    /// Namespace of AMQP objects and Redis keys.
    pub namespace: String,
    /// Schedule file.
    pub schedules_path: PathBuf,
    /// Whether stored schedules missing from the file are deleted at start.
    pub prune_schedules: bool,
    /// How often the stored schedules are compared in full (notifications
    /// cover changes in between).
    pub schedule_resync: Duration,
    /// Redis lock lifetime.
    pub lock_ttl: Duration,
    /// How replicas share the fires (`BELFRY_SHARDING`, `BELFRY_SHARDS`,
    /// `BELFRY_SHARD_*`); `None`: every replica races every fire.
    pub sharding: Option<crate::ShardSettings>,
    /// Postgres pool size.
    pub db_pool: u32,
    /// In-flight limit, deadlines and intervals of the replica loop.
    pub timing: ReplicaTiming,
    /// Log format.
    pub log_format: LogFormat,
    /// Where `/metrics` is served (`BELFRY_METRICS_ADDR`); `None`: off.
    pub metrics_addr: Option<String>,
    /// How long start-up retries while a service is unreachable
    /// (`BELFRY_START_TIMEOUT`).
    pub start_timeout: Duration,
    /// How long finished runs are kept (`BELFRY_RETENTION`); `None`: forever.
    pub retention: Option<Duration>,
    /// How often pruning runs (`BELFRY_RETENTION_INTERVAL`).
    pub retention_interval: Duration,
}

impl std::fmt::Debug for SchedulerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // URLs are masked: this is what a "config loaded" log line prints.
        f.debug_struct("SchedulerConfig")
            .field("database_url", &belfry_runtime::masked(&self.database_url))
            .field(
                "database_direct_url",
                &self
                    .database_direct_url
                    .as_deref()
                    .map(belfry_runtime::masked),
            )
            .field(
                "redis_url",
                &self.redis_url.as_deref().map(belfry_runtime::masked),
            )
            .field("amqp_url", &belfry_runtime::masked(&self.amqp_url))
            .field("redis_tls", &self.redis_tls)
            .field("amqp_tls", &self.amqp_tls)
            .field("instance", &self.instance)
            .field("namespace", &self.namespace)
            .field("schedules_path", &self.schedules_path)
            .field("prune_schedules", &self.prune_schedules)
            .field("schedule_resync", &self.schedule_resync)
            .field("lock_ttl", &self.lock_ttl)
            .field("sharding", &self.sharding)
            .field("db_pool", &self.db_pool)
            .field("timing", &self.timing)
            .field("log_format", &self.log_format)
            .field("metrics_addr", &self.metrics_addr)
            .field("start_timeout", &self.start_timeout)
            .field("retention", &self.retention)
            .field("retention_interval", &self.retention_interval)
            .finish()
    }
}

impl SchedulerConfig {
    /// Reads the configuration from `settings`.
    ///
    /// # Errors
    ///
    /// [`SettingError`] naming the first variable with an unusable value.
    // Long on purpose: one line per setting, the settings table in code
    // (the README's variable table mirrors it).
    pub fn from_settings(settings: &Settings) -> Result<Self, SettingError> {
        let redis_url = settings.string("REDIS_URL", DEFAULT_REDIS_URL);
        let database_url = settings.string("DATABASE_URL", DEFAULT_DATABASE_URL);
        check_postgres_tls_files("DATABASE_URL", &database_url)?;
        let database_direct_url = database_direct_url(settings, &database_url)?;
        let amqp_url = settings.string("AMQP_URL", DEFAULT_AMQP_URL);
        let redis_tls = ClientTls::from_settings(settings, "BELFRY_REDIS_TLS")?;
        let amqp_tls = ClientTls::from_settings(settings, "BELFRY_AMQP_TLS")?;
        if redis_url != "-" {
            redis_tls.check_scheme("BELFRY_REDIS_TLS", "REDIS_URL", &redis_url, "rediss")?;
            // A malformed URL is a mistake to fix, not an outage to ride
            // out on the database alone: refuse it at start.
            crate::redis_topology::RedisTopology::parse(&redis_url, &redis_tls).map_err(|e| {
                SettingError::Invalid {
                    var: "REDIS_URL".into(),
                    value: e.url,
                    reason: e.message,
                }
            })?;
        }
        amqp_tls.check_scheme("BELFRY_AMQP_TLS", "AMQP_URL", &amqp_url, "amqps")?;
        Ok(Self {
            database_url,
            database_direct_url,
            redis_url: (redis_url != "-").then_some(redis_url),
            amqp_url,
            redis_tls,
            amqp_tls,
            instance: settings.string("BELFRY_INSTANCE", &default_instance()),
            namespace: settings.string(
                "BELFRY_NAMESPACE",
                belfry_protocol::topology::DEFAULT_NAMESPACE,
            ),
            schedules_path: settings
                .string("BELFRY_SCHEDULES", "examples/schedules.toml")
                .into(),
            prune_schedules: settings.parsed("BELFRY_SCHEDULES_PRUNE", false, "true or false")?,
            schedule_resync: settings.duration(
                "BELFRY_SCHEDULE_RESYNC",
                Duration::from_secs(30),
                Duration::from_millis(100),
            )?,
            lock_ttl: settings.duration(
                "BELFRY_LOCK_TTL",
                Duration::from_secs(60),
                Duration::from_secs(1),
            )?,
            sharding: sharding(settings)?,
            db_pool: u32::try_from(settings.number("BELFRY_DB_POOL", 8, 1, 1_000)?).unwrap_or(8),
            timing: ReplicaTiming {
                max_inflight: usize::try_from(settings.number(
                    "BELFRY_MAX_INFLIGHT_FIRES",
                    crate::replica::DEFAULT_MAX_INFLIGHT as u64,
                    1,
                    100_000,
                )?)
                .unwrap_or(crate::replica::DEFAULT_MAX_INFLIGHT),
                max_batch: usize::try_from(settings.number(
                    "BELFRY_MAX_BATCH",
                    crate::replica::DEFAULT_MAX_BATCH as u64,
                    1,
                    10_000,
                )?)
                .unwrap_or(crate::replica::DEFAULT_MAX_BATCH),
                shutdown_timeout: settings.duration(
                    "BELFRY_SHUTDOWN_TIMEOUT",
                    Duration::from_secs(30),
                    Duration::ZERO,
                )?,
                confirm_grace: settings.duration(
                    "BELFRY_RECONCILE_AFTER",
                    Duration::from_secs(30),
                    Duration::from_secs(1),
                )?,
                reconcile_interval: settings.duration(
                    "BELFRY_RECONCILE_INTERVAL",
                    Duration::from_secs(1),
                    Duration::from_millis(10),
                )?,
                // At least 1 s: instants are whole seconds apart, and the timer
                // treats a fire less than a second late as on time.
                misfire_threshold: settings.duration(
                    "BELFRY_MISFIRE_THRESHOLD",
                    Duration::from_secs(10),
                    Duration::from_secs(1),
                )?,
                max_clock_skew: settings.duration(
                    "BELFRY_MAX_CLOCK_SKEW",
                    Duration::from_secs(2),
                    Duration::from_millis(1),
                )?,
                clock_check_interval: settings.duration(
                    "BELFRY_CLOCK_CHECK_INTERVAL",
                    Duration::from_secs(10),
                    Duration::from_millis(100),
                )?,
                stuck_after: settings.duration(
                    "BELFRY_STUCK_AFTER",
                    Duration::from_secs(3600),
                    Duration::from_secs(1),
                )?,
                late_claim_page: usize::try_from(settings.number(
                    "BELFRY_LATE_CLAIM_PAGE",
                    crate::replica::DEFAULT_LATE_CLAIM_PAGE as u64,
                    1,
                    1_000_000,
                )?)
                .unwrap_or(crate::replica::DEFAULT_LATE_CLAIM_PAGE),
            },
            log_format: settings.parsed(
                "BELFRY_LOG_FORMAT",
                LogFormat::Text,
                "\"text\" or \"json\"",
            )?,
            // `get` already treats a blank value as unset.
            metrics_addr: settings
                .get("BELFRY_METRICS_ADDR")
                .map(|a| a.trim().to_owned()),
            start_timeout: settings.duration(
                "BELFRY_START_TIMEOUT",
                Duration::from_secs(30),
                Duration::ZERO,
            )?,
            retention: match settings.get("BELFRY_RETENTION").map(str::trim) {
                Some("off") => None,
                _ => Some(settings.duration(
                    "BELFRY_RETENTION",
                    Duration::from_secs(30 * 24 * 3600),
                    Duration::from_secs(1),
                )?),
            },
            retention_interval: settings.duration(
                "BELFRY_RETENTION_INTERVAL",
                Duration::from_secs(600),
                Duration::from_secs(1),
            )?,
        })
    }
}

/// `BELFRY_SHARDING` and its settings.
fn sharding(settings: &Settings) -> Result<Option<crate::ShardSettings>, SettingError> {
    let on = match settings
        .get("BELFRY_SHARDING")
        .map(|v| v.trim().to_ascii_lowercase())
    {
        None => true,
        Some(v) if v == "on" || v == "true" => true,
        Some(v) if v == "off" || v == "false" => false,
        Some(v) => {
            return Err(SettingError::Invalid {
                var: "BELFRY_SHARDING".into(),
                value: v,
                reason: "expected \"on\" or \"off\"".into(),
            })
        }
    };
    if !on {
        return Ok(None);
    }
    let defaults = crate::ShardSettings::default();
    Ok(Some(crate::ShardSettings {
        shards: u32::try_from(settings.number(
            "BELFRY_SHARDS",
            u64::from(defaults.shards),
            1,
            65_536,
        )?)
        .unwrap_or(defaults.shards),
        lease_ttl: settings.duration(
            "BELFRY_SHARD_LEASE_TTL",
            defaults.lease_ttl,
            Duration::from_millis(500),
        )?,
        stall_after: settings.duration(
            "BELFRY_SHARD_STALL_AFTER",
            defaults.stall_after,
            Duration::from_secs(1),
        )?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_malformed_redis_url_is_refused_at_start_with_what_to_fix() {
        for (url, says) in [
            (
                "redis+sentinel://:secret@s1:26379,s2:26379",
                "names the master",
            ),
            ("redis+cluster://:secret@n1:6379,,n2", "stray comma"),
            ("redis://:secret@h:notaport/", "REDIS_URL"),
        ] {
            let settings = Settings::from_pairs([("REDIS_URL", url)]);
            let e = match SchedulerConfig::from_settings(&settings) {
                Ok(_) => panic!("{url} was accepted"),
                Err(e) => e.to_string(),
            };
            assert!(e.contains("REDIS_URL") && e.contains(says), "{url}: {e}");
            assert!(!e.contains("secret"), "the password is masked: {e}");
        }
    }

    #[test]
    fn defaults_and_masking() {
        let c = SchedulerConfig::from_settings(&Settings::from_pairs([
            ("DATABASE_URL", "postgres://app:hunter2@db/belfry"),
            ("REDIS_URL", "-"),
        ]))
        .unwrap();
        assert_eq!(c.redis_url, None);
        assert_eq!(c.namespace, "belfry");
        assert_eq!(c.lock_ttl, Duration::from_secs(60));
        assert_eq!(c.retention, Some(Duration::from_secs(30 * 24 * 3600)));
        assert_eq!(c.sharding, Some(crate::ShardSettings::default()));
        let shown = format!("{c:?}");
        assert!(
            !shown.contains("hunter2") && shown.contains("app:***@db"),
            "{shown}"
        );
    }

    #[test]
    fn retention_switch() {
        let c =
            SchedulerConfig::from_settings(&Settings::from_pairs([("BELFRY_RETENTION", "off")]))
                .unwrap();
        assert_eq!(c.retention, None);
    }

    #[test]
    fn sharding_switch_and_its_errors() {
        let off =
            SchedulerConfig::from_settings(&Settings::from_pairs([("BELFRY_SHARDING", "off")]))
                .unwrap();
        assert_eq!(off.sharding, None);
        for (var, value) in [
            ("BELFRY_SHARDING", "maybe"),
            ("BELFRY_SHARDS", "0"),
            ("BELFRY_SHARDS", "100000"),
            ("BELFRY_SHARD_LEASE_TTL", "10ms"),
        ] {
            let e = SchedulerConfig::from_settings(&Settings::from_pairs([(var, value)]))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(e.contains(var), "{var}={value}: {e}");
        }
    }

    #[test]
    fn bad_values_name_the_variable() {
        let e = SchedulerConfig::from_settings(&Settings::from_pairs([("BELFRY_LOCK_TTL", "10")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("BELFRY_LOCK_TTL"), "{e}");
    }
}
