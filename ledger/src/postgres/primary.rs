//! Several hosts in a Postgres URL: the ledger writes to whichever of them
//! is the primary, and follows it through a failover.
//!
//! `postgres://user:password@db1:5432,db2:5432/belfry` names a primary and
//! its standbys, as libpq's multi-host URLs with
//! `target_session_attrs=read-write` do (that parameter, if given, is
//! accepted and is what happens anyway). sqlx connects to one host, so:
//!
//! - at start, each host is tried in order and the first that answers and
//!   is not in recovery (`pg_is_in_recovery()` false) becomes the pool's
//!   target;
//! - every new pool connection checks the same and is refused on a standby,
//!   so no statement ever runs on one (they would fail as read-only);
//! - a follower task checks the target every second on a connection of its
//!   own; when it is down or has become a standby, it looks for the primary
//!   among all hosts again and points the pool's new connections there.
//!   Connections to the old primary die with it and the pool replaces them
//!   (it tests idle connections before lending them).
//!
//! So a failover costs the fires of the seconds Postgres had no primary:
//! their claims fail, exactly as during an outage, and misfire recovery and
//! the outbox catch up afterwards. No committed row is lost only if the
//! standby had it: run synchronous replication (`synchronous_commit = on`
//! and `synchronous_standby_names`); with asynchronous replication a claim
//! committed just before the failover may be missing after it and the fire
//! claimed a second time. A primary that is cut off but still running
//! (split brain) is not detected here: fencing it is the failover manager's
//! job (Patroni, pg_auto_failover, a managed service).

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection as _, PgConnection, PgPool};

use belfry_runtime::host_list;

use crate::LedgerError;

/// The hosts of a multi-host URL, and the options of its first host.
pub(crate) type Hosts = (PgConnectOptions, Vec<(String, u16)>);

/// How often the follower checks that the target is still the primary.
const CHECK_EVERY: Duration = Duration::from_secs(1);
/// How long one host may take to connect and answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The hosts of a URL that names more than one; `None` for a one-host URL.
///
/// The options are those of the URL with its first host (and without
/// `target_session_attrs`, which sqlx does not know).
///
/// # Errors
///
/// [`LedgerError::Connect`] naming the URL (password masked) when the
/// host list or the rest of the URL is malformed.
pub(crate) fn hosts_of(url: &str) -> Result<Option<Hosts>, LedgerError> {
    let Some(several) = host_list::several(url, 5432) else {
        return Ok(None);
    };
    let error = |message: String| LedgerError::Connect {
        url: belfry_runtime::masked(url),
        source: sqlx::Error::Configuration(message.into()),
    };
    let (scheme, list) = several.map_err(error)?;
    let path = without_target_session_attrs(list.path);
    let first = list.url_for(scheme, &list.hosts[0], &path);
    let options: PgConnectOptions = first
        .parse()
        .map_err(|e: sqlx::Error| error(e.to_string()))?;
    Ok(Some((options, list.hosts)))
}

/// `path` without a `target_session_attrs=` query parameter.
fn without_target_session_attrs(path: &str) -> String {
    let Some((before, query)) = path.split_once('?') else {
        return path.to_owned();
    };
    let kept: Vec<&str> = query
        .split('&')
        .filter(|p| !p.starts_with("target_session_attrs="))
        .collect();
    if kept.is_empty() {
        before.to_owned()
    } else {
        format!("{before}?{}", kept.join("&"))
    }
}

/// Whether `options` reach a server that answers and is not in recovery;
/// `Err` says why not.
async fn is_primary(options: &PgConnectOptions) -> Result<(), String> {
    let probe = async {
        let mut conn = PgConnection::connect_with(options).await?;
        let standby: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
            .fetch_one(&mut conn)
            .await?;
        let _ = conn.close().await;
        Ok::<bool, sqlx::Error>(standby)
    };
    match tokio::time::timeout(PROBE_TIMEOUT, probe).await {
        Err(_) => Err(format!("no answer within {PROBE_TIMEOUT:?}")),
        Ok(Err(e)) => Err(e.to_string()),
        Ok(Ok(true)) => Err("a standby (in recovery)".into()),
        Ok(Ok(false)) => Ok(()),
    }
}

/// `options` pointed at the first of `hosts` that is the primary.
///
/// # Errors
///
/// Why each host is not, in one line.
pub(crate) async fn find(
    options: &PgConnectOptions,
    hosts: &[(String, u16)],
) -> Result<PgConnectOptions, String> {
    let mut why = Vec::new();
    for (host, port) in hosts {
        let candidate = options.clone().host(host).port(*port);
        match is_primary(&candidate).await {
            Ok(()) => return Ok(candidate),
            Err(e) => why.push(format!("{host}:{port}: {e}")),
        }
    }
    Err(format!("no primary among the hosts ({})", why.join("; ")))
}

/// Pool options that refuse a connection to a standby.
pub(crate) fn refusing_standbys(pool: PgPoolOptions) -> PgPoolOptions {
    pool.after_connect(|conn, _| {
        Box::pin(async move {
            let standby: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
                .fetch_one(&mut *conn)
                .await?;
            if standby {
                return Err(sqlx::Error::Protocol(
                    "connected to a standby (in recovery), not the primary; the ledger looks for the primary again".into(),
                ));
            }
            Ok(())
        })
    })
}

/// Keeps `pool` pointed at the primary among `hosts` until `stop`'s sender
/// is dropped (with the ledger) or the pool is closed.
pub(crate) fn follow(
    pool: PgPool,
    hosts: Vec<(String, u16)>,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(CHECK_EVERY);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // Either the next check is due or the ledger is gone; the
            // receiver is polled by reference, so a tick never consumes
            // the stop signal.
            tokio::select! {
                _ = &mut stop => return,
                _ = interval.tick() => {}
            }
            if pool.is_closed() {
                return;
            }
            let current = (*pool.connect_options()).clone();
            let Err(why) = is_primary(&current).await else {
                continue;
            };
            match find(&current, &hosts).await {
                Ok(primary)
                    if primary.get_host() != current.get_host()
                        || primary.get_port() != current.get_port() =>
                {
                    tracing::warn!(
                        from = %format!("{}:{}", current.get_host(), current.get_port()),
                        to = %format!("{}:{}", primary.get_host(), primary.get_port()),
                        reason = %why,
                        "the Postgres primary moved; new connections go to the new one"
                    );
                    pool.set_connect_options(primary);
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "no Postgres primary answers; claims wait until one does");
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_one_host_url_is_left_to_sqlx() {
        assert!(matches!(hosts_of("postgres://u@db:5432/belfry"), Ok(None)));
    }

    #[test]
    fn several_hosts_keep_the_credentials_database_and_parameters() {
        let Ok(Some((options, hosts))) = hosts_of(
            "postgres://u:pw@db1,db2:5433/belfry?target_session_attrs=read-write&sslmode=disable",
        ) else {
            panic!("not parsed as several hosts");
        };
        assert_eq!(
            hosts,
            vec![("db1".to_owned(), 5432), ("db2".to_owned(), 5433)]
        );
        assert_eq!(options.get_host(), "db1");
        assert_eq!(options.get_database(), Some("belfry"));
        assert_eq!(options.get_username(), "u");
    }

    #[test]
    fn a_malformed_host_list_names_the_url_without_its_password() {
        let message = match hosts_of("postgres://u:secret@db1,,db2/belfry") {
            Err(e) => e.to_string(),
            Ok(_) => panic!("accepted"),
        };
        assert!(
            message.contains("stray comma") && !message.contains("secret"),
            "{message}"
        );
    }
}
