//! Which kind of Redis deployment `REDIS_URL` names, and connections to it.
//!
//! Three shapes, told apart by the URL's scheme:
//!
//! - one server: `redis://[user:password@]host[:port][/db]`, or `rediss://`
//!   for TLS;
//! - a Sentinel group: `redis+sentinel://[user:password@]host[:port][,host[:port]…]/master_name[/db]`
//!   (sentinel addresses, default port 26379; the credentials and `db` are
//!   the master's; the sentinels themselves are asked without a password);
//! - a Redis Cluster: `redis+cluster://[user:password@]host[:port][,host[:port]…]`
//!   (seed nodes, default port 6379; the client learns the rest).
//!
//! `rediss+sentinel://` and `rediss+cluster://` speak TLS to every
//! server (the sentinels and the master; every cluster node), with the
//! same CA and optional client certificate (`BELFRY_REDIS_TLS_*`) as
//! `rediss://`; the servers' certificates are always verified.
//!
//! A Sentinel connection is to the master the sentinels name now. The
//! connection is not re-resolved by itself (the redis crate's connection
//! manager reconnects to the same address), so the lock drops it after any
//! failed command and resolves the master again on its next call: after a
//! failover the old master answers writes with `READONLY` or not at all,
//! both failures, and the next fire finds the new master.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{ConnectionAddr, IntoConnectionInfo, RedisFuture, TlsMode};
use thiserror::Error;

use belfry_runtime::host_list::HostList;
use belfry_runtime::ClientTls;

/// Default port of a sentinel.
const SENTINEL_PORT: u16 = 26379;
/// Default port of a Redis server or cluster node.
const REDIS_PORT: u16 = 6379;

/// Why `REDIS_URL` names no usable Redis deployment.
#[derive(Debug, Error)]
#[error("REDIS_URL {url}: {message}")]
pub struct TopologyError {
    /// The URL, password masked.
    pub url: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

/// The Redis deployment behind a claim lock.
pub enum RedisTopology {
    /// One server; the connection manager reconnects to it.
    Node(redis::Client),
    /// A Sentinel group: the master is asked of the sentinels at each
    /// (re)connection. A tokio mutex: resolving takes round trips and only
    /// one resolution at a time is wanted.
    Sentinel {
        /// The sentinels' client (needs `&mut` to resolve).
        client: tokio::sync::Mutex<SentinelClient>,
        /// The master's name in the group.
        master_name: String,
    },
    /// A Redis Cluster; its connection follows slot moves and failovers.
    Cluster(ClusterClient),
}

/// A connection to any of the three shapes: commands are sent the same way.
#[derive(Clone)]
pub enum RedisConnection {
    /// To one server (also a Sentinel group's master).
    Node(ConnectionManager),
    /// To a Redis Cluster.
    Cluster(ClusterConnection),
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> RedisFuture<'a, redis::Value> {
        match self {
            Self::Node(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Self::Node(c) => c.req_packed_commands(cmd, offset, count),
            Self::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Node(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}

/// `tls` as the redis crate takes it: the CA to trust (then the only one)
/// and an optional client certificate.
fn certificates(tls: &ClientTls) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: tls.identity.as_ref().map(|id| redis::ClientTlsConfig {
            client_cert: id.cert.pem.clone(),
            client_key: id.key.pem.clone(),
        }),
        root_cert: tls.ca.as_ref().map(|ca| ca.pem.clone()),
    }
}

/// The hosts of a Sentinel or Cluster URL, which takes no query parameters.
fn host_list(rest: &str, default_port: u16) -> Result<HostList<'_>, String> {
    let list = HostList::parse(rest, default_port)?;
    if list.path.contains('?') {
        return Err("query parameters are not supported in this form".into());
    }
    Ok(list)
}

impl RedisTopology {
    /// The deployment `url` names (see the module's documentation for the
    /// forms), with `tls` for a `rediss://` server.
    ///
    /// # Errors
    ///
    /// [`TopologyError`] naming what is wrong: an unknown scheme, a
    /// malformed host list, a Sentinel URL without a master name, TLS
    /// material the redis crate refuses.
    pub fn parse(url: &str, tls: &ClientTls) -> Result<Self, TopologyError> {
        let error = |message: String| TopologyError {
            url: belfry_runtime::masked(url),
            message,
        };
        let (scheme, rest) = url.split_once("://").ok_or_else(|| {
            error(
                "not a URL (expected redis://, rediss://, redis[s]+sentinel:// or redis[s]+cluster://)"
                    .into(),
            )
        })?;
        match scheme {
            "redis" | "rediss" => {
                let client = if tls.is_configured() {
                    redis::Client::build_with_tls(url, certificates(tls))
                } else {
                    redis::Client::open(url)
                };
                client.map(Self::Node).map_err(|e| error(e.to_string()))
            }
            "redis+sentinel" | "rediss+sentinel" => {
                let secure = scheme == "rediss+sentinel";
                let list = host_list(rest, SENTINEL_PORT).map_err(error)?;
                let mut path = list.path.splitn(2, '/');
                let master_name = path.next().unwrap_or_default().to_owned();
                if master_name.is_empty() {
                    return Err(error(
                        "a Sentinel URL names the master after the hosts: redis+sentinel://host:26379,host:26379/MASTER_NAME[/db]".into(),
                    ));
                }
                let db = path.next().unwrap_or("0");
                // The master's credentials and database, parsed (and
                // percent-decoded) by the redis crate from a one-host URL.
                let master = list
                    .url_for("redis", &(String::from("localhost"), REDIS_PORT), db)
                    .into_connection_info()
                    .map_err(|e| error(format!("the credentials or database: {e}")))?;
                let sentinels = list.hosts.iter().map(|(host, port)| {
                    if secure {
                        ConnectionAddr::TcpTls {
                            host: host.clone(),
                            port: *port,
                            insecure: false,
                            tls_params: None,
                        }
                    } else {
                        ConnectionAddr::Tcp(host.clone(), *port)
                    }
                });
                let mut builder = SentinelClientBuilder::new(
                    sentinels,
                    master_name.clone(),
                    SentinelServerType::Master,
                )
                .map_err(|e| error(e.to_string()))?
                .set_client_to_redis_db(master.redis.db);
                if let Some(user) = master.redis.username {
                    builder = builder.set_client_to_redis_username(user);
                }
                if let Some(password) = master.redis.password {
                    builder = builder.set_client_to_redis_password(password);
                }
                if secure {
                    builder = builder
                        .set_client_to_sentinel_tls_mode(TlsMode::Secure)
                        .set_client_to_redis_tls_mode(TlsMode::Secure);
                    if tls.is_configured() {
                        builder = builder
                            .set_client_to_sentinel_certificates(certificates(tls))
                            .set_client_to_redis_certificates(certificates(tls));
                    }
                }
                let client = builder.build().map_err(|e| error(e.to_string()))?;
                Ok(Self::Sentinel {
                    client: tokio::sync::Mutex::new(client),
                    master_name,
                })
            }
            "redis+cluster" | "rediss+cluster" => {
                let secure = scheme == "rediss+cluster";
                let list = host_list(rest, REDIS_PORT).map_err(error)?;
                if !list.path.is_empty() {
                    return Err(error(
                        "a Redis Cluster has only database 0: drop the path after the hosts".into(),
                    ));
                }
                let node_scheme = if secure { "rediss" } else { "redis" };
                let nodes: Vec<String> = list
                    .hosts
                    .iter()
                    .map(|h| list.url_for(node_scheme, h, "0"))
                    .collect();
                let mut builder = ClusterClient::builder(nodes)
                    .connection_timeout(CONNECT_TIMEOUT)
                    .response_timeout(CONNECT_TIMEOUT)
                    .retries(1);
                if secure {
                    builder = builder.tls(TlsMode::Secure);
                    if tls.is_configured() {
                        builder = builder.certs(certificates(tls));
                    }
                }
                builder
                    .build()
                    .map(Self::Cluster)
                    .map_err(|e| error(e.to_string()))
            }
            other => Err(error(format!(
                "unknown scheme {other:?} (expected redis://, rediss://, redis[s]+sentinel:// or redis[s]+cluster://)"
            ))),
        }
    }

    /// Whether a failed command should drop the connection so that the
    /// next call resolves the deployment again (only a Sentinel master can
    /// move without the connection noticing).
    pub fn re_resolves(&self) -> bool {
        matches!(self, Self::Sentinel { .. })
    }

    /// Whether a pipeline may hold keys of different hash slots (not on a
    /// Cluster: the redis crate refuses a cross-slot pipeline there).
    pub fn pipelines_across_keys(&self) -> bool {
        !matches!(self, Self::Cluster(_))
    }

    /// A new connection; for a Sentinel group, to the master it names now,
    /// which is returned too (`host:port`).
    ///
    /// # Errors
    ///
    /// The redis crate's error when no node (or no sentinel) answers within
    /// the connect timeout.
    pub async fn connect(&self) -> Result<(RedisConnection, Option<String>), String> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(CONNECT_TIMEOUT)
            .set_response_timeout(CONNECT_TIMEOUT)
            .set_number_of_retries(1)
            .set_max_delay(1_000);
        match self {
            Self::Node(client) => ConnectionManager::new_with_config(client.clone(), config)
                .await
                .map(|c| (RedisConnection::Node(c), None))
                .map_err(|e| e.to_string()),
            Self::Sentinel {
                client,
                master_name,
            } => {
                // Held across the resolution's round trips: one resolution
                // at a time; every other caller is turned to the ledger by
                // the timeout below rather than queueing behind it.
                let master = tokio::time::timeout(RESOLVE_TIMEOUT, async {
                    client.lock().await.async_get_client().await
                })
                .await
                .map_err(|_| {
                    format!("no sentinel named master {master_name:?} within {RESOLVE_TIMEOUT:?}")
                })?
                .map_err(|e| format!("sentinels could not name master {master_name:?}: {e}"))?;
                let address = match &master.get_connection_info().addr {
                    ConnectionAddr::Tcp(host, port) => format!("{host}:{port}"),
                    other => other.to_string(),
                };
                ConnectionManager::new_with_config(master, config)
                    .await
                    .map(|c| (RedisConnection::Node(c), Some(address)))
                    .map_err(|e| e.to_string())
            }
            Self::Cluster(client) => client
                .get_async_connection()
                .await
                .map(|c| (RedisConnection::Cluster(c), None))
                .map_err(|e| e.to_string()),
        }
    }
}

/// How long a connection attempt or a command may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// How long asking the sentinels for the master may take.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> Result<RedisTopology, TopologyError> {
        RedisTopology::parse(url, &ClientTls::default())
    }

    #[test]
    fn each_shape_is_told_by_its_scheme() {
        assert!(matches!(
            parse("redis://127.0.0.1:6379/"),
            Ok(RedisTopology::Node(_))
        ));
        assert!(matches!(
            parse("redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster"),
            Ok(RedisTopology::Sentinel { master_name, .. }) if master_name == "mymaster"
        ));
        assert!(matches!(
            parse("redis+cluster://127.0.0.1:7000,127.0.0.1:7001"),
            Ok(RedisTopology::Cluster(_))
        ));
    }

    #[test]
    fn bad_urls_say_what_is_wrong_and_mask_the_password() {
        let cases = [
            (
                "redis+sentinel://:secret@h1,h2",
                "names the master after the hosts",
            ),
            ("redis+sentinel://:secret@h1,,h2/m", "stray comma"),
            ("redis+cluster://:secret@h1:70000", "not a number"),
            ("redis+cluster://:secret@h1/3", "only database 0"),
            ("memcache://:secret@h1", "unknown scheme"),
        ];
        for (url, says) in cases {
            let message = match parse(url) {
                Ok(_) => panic!("{url} was accepted"),
                Err(e) => e.to_string(),
            };
            assert!(message.contains(says), "{url}: {message}");
            assert!(!message.contains("secret"), "{url}: {message}");
        }
    }
}
