//! Connecting to the broker and declaring belfry's topology: RabbitMQ in
//! distributed mode, or the embedded database's job queue
//! ([`Broker::embedded`]) in embedded mode. Callers see one type either way.

use crate::cluster_nodes::ClusterNodes;
use lapin::options::{
    BasicConsumeOptions, BasicQosOptions, ExchangeDeclareOptions, ExchangeDeleteOptions,
    QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};

use std::sync::Arc;
use std::time::{Duration, Instant};

use belfry_protocol::{Priority, Topology};
use belfry_runtime::ClientTls;
use lapin::tcp::OwnedTLSConfig;

use crate::consumption::Consumption;
use crate::embedded_queue::{EmbeddedLink, JobQueue};
use crate::publisher::Publisher;
use crate::BrokerError;

/// How long one connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// After a failed reconnect, how long callers get the error at once before
/// the next attempt (so a dead broker is not hammered once per fire).
const RECONNECT_PAUSE: Duration = Duration::from_secs(1);

struct ConnectionState {
    connection: Arc<Connection>,
    failed_at: Option<Instant>,
}

struct Inner {
    /// The node URLs (one, or a cluster's), and which one is in use.
    nodes: ClusterNodes,
    connection_name: String,
    /// TLS for an `amqps://` URL, kept for every reconnect.
    tls: OwnedTLSConfig,
    topology: Topology,
    // A tokio mutex: reconnecting awaits. Held only to read or replace the
    // connection; channels are opened after it is released.
    link: tokio::sync::Mutex<ConnectionState>,
}

/// A connection to the broker for one namespace.
///
/// Cheap to clone (shared). On RabbitMQ, when the connection drops (broker
/// restart, network loss) the next call that needs a channel reconnects, at
/// most once per second, so publishers and consumers recover on their own.
/// In embedded mode the queue is a table of the embedded database, and
/// every operation is a statement on it.
#[derive(Clone)]
pub struct Broker {
    link: Link,
}

#[derive(Clone)]
enum Link {
    Amqp(Arc<Inner>),
    Embedded(EmbeddedLink),
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.link {
            Link::Amqp(inner) => f
                .debug_struct("Broker")
                .field(
                    "nodes",
                    &belfry_runtime::masked(&inner.nodes.urls().join(",")),
                )
                .field("node", &inner.nodes.current())
                .field("namespace", &inner.topology.namespace())
                .finish(),
            Link::Embedded(e) => f
                .debug_struct("Broker")
                .field("embedded", &true)
                .field("namespace", &e.topology.namespace())
                .finish(),
        }
    }
}

impl Broker {
    /// Connects to `url` (an `amqp://` URL, or the comma-separated node
    /// URLs of a cluster: the first that answers; a lost connection moves
    /// to the next node) and names the connection `connection_name`
    /// in the management UI.
    ///
    /// # Errors
    ///
    /// [`BrokerError::Connect`] naming the URL (password masked) when the
    /// broker cannot be reached or refuses the credentials.
    pub async fn connect(
        url: &str,
        topology: Topology,
        connection_name: &str,
    ) -> Result<Self, BrokerError> {
        Self::connect_tls(url, &ClientTls::default(), topology, connection_name).await
    }

    /// As [`Broker::connect`], with `tls` for an `amqps://` URL: a CA to
    /// trust besides the system's and an optional client certificate (see
    /// [`crate::amqp_tls`]). The server's certificate is always verified.
    ///
    /// # Errors
    ///
    /// [`BrokerError::Tls`] when the TLS material is unusable;
    /// [`BrokerError::Connect`] as for [`Broker::connect`], a server
    /// certificate that does not verify included.
    pub async fn connect_tls(
        url: &str,
        tls: &ClientTls,
        topology: Topology,
        connection_name: &str,
    ) -> Result<Self, BrokerError> {
        let nodes = ClusterNodes::parse(url).ok_or_else(|| BrokerError::Connect {
            url: belfry_runtime::masked(url),
            source: lapin::Error::IOError(Arc::new(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "no RabbitMQ URL given",
            ))),
        })?;
        if tls.is_configured() && nodes.urls().iter().any(|u| !u.starts_with("amqps://")) {
            return Err(BrokerError::Tls(crate::amqp_tls::TlsMaterialError {
                what: "AMQP_URL",
                path: belfry_runtime::masked(url),
                reason: "TLS settings are given, so it must be an amqps:// URL (every node's)"
                    .into(),
            }));
        }
        let tls = crate::amqp_tls::lapin_tls(tls)?;
        let (node, connection) = open_any(&nodes.for_start(), connection_name, &tls).await?;
        nodes.connected_to(node);
        if nodes.urls().len() > 1 {
            tracing::info!(node = %nodes.current(), nodes = nodes.urls().len(), "connected to RabbitMQ");
        }
        Ok(Self {
            link: Link::Amqp(Arc::new(Inner {
                nodes,
                connection_name: connection_name.to_owned(),
                tls,
                topology,
                link: tokio::sync::Mutex::new(ConnectionState {
                    connection: Arc::new(connection),
                    failed_at: None,
                }),
            })),
        })
    }

    /// The job queue of an embedded database as the broker: no RabbitMQ,
    /// the same routing, confirms, acks and dead letters (see
    /// [`JobQueue`]).
    pub fn embedded(queue: JobQueue, topology: Topology) -> Self {
        Self {
            link: Link::Embedded(EmbeddedLink { queue, topology }),
        }
    }

    /// The embedded queue when there is one (`queue`: the job queue of an
    /// embedded ledger's file), or else RabbitMQ at `amqp_url`, named
    /// `connection_name`.
    ///
    /// # Errors
    ///
    /// As [`Broker::connect`], without an embedded queue.
    pub async fn embedded_or_connect(
        queue: Option<JobQueue>,
        amqp_url: &str,
        amqp_tls: &ClientTls,
        topology: Topology,
        connection_name: &str,
    ) -> Result<Self, BrokerError> {
        match queue {
            Some(queue) => Ok(Self::embedded(queue, topology)),
            None => Self::connect_tls(amqp_url, amqp_tls, topology, connection_name).await,
        }
    }

    /// Whether this is the embedded queue.
    pub fn is_embedded(&self) -> bool {
        matches!(self.link, Link::Embedded(_))
    }

    /// The OpenTelemetry `messaging.system` of its spans: `rabbitmq`, or
    /// `belfry-embedded` for the embedded queue.
    pub fn messaging_system(&self) -> &'static str {
        match self.link {
            Link::Amqp(_) => "rabbitmq",
            Link::Embedded(_) => "belfry-embedded",
        }
    }

    /// The names this broker handle uses.
    pub fn topology(&self) -> &Topology {
        match &self.link {
            Link::Amqp(inner) => &inner.topology,
            Link::Embedded(e) => &e.topology,
        }
    }

    /// The RabbitMQ node the connection goes to (or last went to), its URL
    /// with the password masked; `None` for the embedded queue.
    pub fn node(&self) -> Option<String> {
        self.amqp().ok().map(|inner| inner.nodes.current())
    }

    /// Whether the current connection is open (embedded: whether the
    /// database answers).
    pub async fn is_connected(&self) -> bool {
        match &self.link {
            Link::Amqp(inner) => inner.link.lock().await.connection.status().connected(),
            Link::Embedded(e) => e.queue.ping().await,
        }
    }

    /// The RabbitMQ state, or the embedded link.
    fn amqp(&self) -> Result<&Arc<Inner>, &EmbeddedLink> {
        match &self.link {
            Link::Amqp(inner) => Ok(inner),
            Link::Embedded(e) => Err(e),
        }
    }
}

impl Inner {
    /// The open connection, reconnecting when it dropped.
    async fn connection(&self) -> Result<Arc<Connection>, BrokerError> {
        let mut link = self.link.lock().await;
        if link.connection.status().connected() {
            return Ok(link.connection.clone());
        }
        if link
            .failed_at
            .is_some_and(|t| t.elapsed() < RECONNECT_PAUSE)
        {
            return Err(BrokerError::Disconnected {
                url: self.nodes.current(),
            });
        }
        // The lock is held while the nodes are tried: every caller waits for
        // the one reconnect instead of opening connections of its own.
        match open_any(
            &self.nodes.for_reconnect(),
            &self.connection_name,
            &self.tls,
        )
        .await
        {
            Ok((node, connection)) => {
                self.nodes.connected_to(node);
                tracing::info!(node = %self.nodes.current(), "reconnected to RabbitMQ");
                link.connection = Arc::new(connection);
                link.failed_at = None;
                Ok(link.connection.clone())
            }
            Err(e) => {
                if link.failed_at.is_none() {
                    tracing::warn!(error = %e, "RabbitMQ connection lost; reconnecting");
                }
                link.failed_at = Some(Instant::now());
                Err(e)
            }
        }
    }

    async fn channel(&self) -> Result<Channel, BrokerError> {
        self.connection()
            .await?
            .create_channel()
            .await
            .map_err(BrokerError::amqp("channel open"))
    }
}

impl Broker {
    /// Declares the job exchange and the dead-letter exchange and queue.
    /// Idempotent; both binaries call it at start.
    ///
    /// # Errors
    ///
    /// [`BrokerError::Amqp`] when a declaration fails, for example because an
    /// object of the same name exists with other settings.
    pub async fn declare_core(&self) -> Result<(), BrokerError> {
        // The embedded queue's tables exist once the database is migrated.
        let Ok(inner) = self.amqp() else {
            return Ok(());
        };
        let channel = inner.channel().await?;
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        };
        for (exchange, kind, what) in [
            (
                inner.topology.jobs_exchange(),
                ExchangeKind::Topic,
                "declare job exchange",
            ),
            (
                inner.topology.dead_letter_exchange(),
                ExchangeKind::Fanout,
                "declare dead-letter exchange",
            ),
        ] {
            channel
                .exchange_declare(&exchange, kind, durable, FieldTable::default())
                .await
                .map_err(BrokerError::amqp(what))?;
        }
        let dlq = inner.topology.dead_letter_queue();
        channel
            .queue_declare(&dlq, durable_queue(), quorum_args(None))
            .await
            .map_err(BrokerError::amqp("declare dead-letter queue"))?;
        channel
            .queue_bind(
                &dlq,
                &inner.topology.dead_letter_exchange(),
                "",
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(BrokerError::amqp("bind dead-letter queue"))?;
        let _ = channel.close(200, "declared").await;
        Ok(())
    }

    /// Declares worker group `group`'s queue and binds it to exactly the job
    /// types in `job_types`, so the group never receives a type it has no
    /// handler for.
    ///
    /// The queue is a quorum queue (replicated, durable, poison-message
    /// aware) whose rejected messages go to the dead-letter exchange.
    ///
    /// # Errors
    ///
    /// [`BrokerError::Amqp`] when a declaration or binding fails.
    pub async fn declare_group<S: AsRef<str>>(
        &self,
        group: &str,
        job_types: &[S],
    ) -> Result<String, BrokerError> {
        let inner = match self.amqp() {
            Ok(inner) => inner,
            Err(e) => {
                for priority in Priority::ALL {
                    let queue = e.topology.group_queue_at(group, priority);
                    let keys: Vec<String> = job_types
                        .iter()
                        .map(|t| priority.routing_key(t.as_ref()))
                        .collect();
                    e.queue
                        .bind(&queue, &keys)
                        .await
                        .map_err(|err| BrokerError::Embedded(err.to_string()))?;
                }
                return Ok(e.topology.group_queue(group));
            }
        };
        let channel = inner.channel().await?;
        let dlx = inner.topology.dead_letter_exchange();
        // A queue per priority (see `belfry_protocol::priority`); the
        // `normal` one is the group queue belfry always declared, with
        // the same arguments, so an existing queue is declared as it is.
        for priority in Priority::ALL {
            let queue = inner.topology.group_queue_at(group, priority);
            channel
                .queue_declare(&queue, durable_queue(), quorum_args(Some(&dlx)))
                .await
                .map_err(BrokerError::amqp("declare group queue"))?;
            for job_type in job_types {
                channel
                    .queue_bind(
                        &queue,
                        &inner.topology.jobs_exchange(),
                        &priority.routing_key(job_type.as_ref()),
                        QueueBindOptions::default(),
                        FieldTable::default(),
                    )
                    .await
                    .map_err(BrokerError::amqp("bind group queue"))?;
            }
        }
        let _ = channel.close(200, "declared").await;
        Ok(inner.topology.group_queue(group))
    }

    /// Opens a confirming publisher on its own channel.
    ///
    /// # Errors
    ///
    /// [`BrokerError::Amqp`] when the channel cannot be opened or put in
    /// confirm mode.
    pub async fn publisher(&self) -> Result<Publisher, BrokerError> {
        match self.amqp() {
            Ok(inner) => Publisher::open(inner.channel().await?, inner.topology.clone()).await,
            Err(e) => Ok(Publisher::embedded(e.clone())),
        }
    }

    /// Starts consuming `queue` as `consumer_tag` with manual acks and at
    /// most `prefetch` unacknowledged deliveries (embedded: up to `prefetch`
    /// messages are taken per statement when [`Consumption::next`] finds
    /// none taken).
    ///
    /// # Errors
    ///
    /// [`BrokerError::Amqp`] when the channel, QoS or consume call fails;
    /// [`BrokerError::Embedded`] when the embedded queue cannot be read.
    pub async fn consume(
        &self,
        queue: &str,
        consumer_tag: &str,
        prefetch: u16,
    ) -> Result<Consumption, BrokerError> {
        self.consume_in_order(&[queue.to_owned()], consumer_tag, prefetch)
            .await
    }

    /// Consumes worker group `group`'s queues of every priority, on a
    /// channel each: a ready delivery of a higher level is handed out
    /// before any of a lower one (see `belfry_protocol::priority`).
    /// `prefetch` applies per queue.
    ///
    /// # Errors
    ///
    /// As [`Broker::consume`].
    pub async fn consume_group(
        &self,
        group: &str,
        consumer_tag: &str,
        prefetch: u16,
    ) -> Result<Consumption, BrokerError> {
        let topology = match self.amqp() {
            Ok(inner) => &inner.topology,
            Err(e) => &e.topology,
        };
        let queues: Vec<String> = Priority::ALL
            .iter()
            .map(|p| topology.group_queue_at(group, *p))
            .collect();
        self.consume_in_order(&queues, consumer_tag, prefetch).await
    }

    /// Consumes `queues`, the first first (see [`Consumption::next`]).
    async fn consume_in_order(
        &self,
        queues: &[String],
        consumer_tag: &str,
        prefetch: u16,
    ) -> Result<Consumption, BrokerError> {
        let inner = match self.amqp() {
            Ok(inner) => inner,
            Err(e) => {
                return Consumption::embedded(e.queue.clone(), queues, consumer_tag, prefetch).await
            }
        };
        let mut consumers = Vec::new();
        for (i, queue) in queues.iter().enumerate() {
            // A channel per queue, each with the prefetch (see
            // `Consumption`).
            let channel = inner.channel().await?;
            channel
                .basic_qos(prefetch, BasicQosOptions::default())
                .await
                .map_err(BrokerError::amqp("set prefetch"))?;
            // The first keeps the plain tag (what one-queue consumers
            // always had); the others are told apart by a suffix.
            let tag = if i == 0 {
                consumer_tag.to_owned()
            } else {
                format!("{consumer_tag}-{i}")
            };
            let consumer = channel
                .basic_consume(
                    queue,
                    &tag,
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(BrokerError::amqp("consume"))?;
            consumers.push((channel, consumer, tag));
        }
        Ok(Consumption::amqp(consumers))
    }

    /// Deletes the namespace's exchanges, the dead-letter queue and the
    /// queues of `groups`. For tests and for decommissioning a namespace;
    /// messages in those queues are lost.
    ///
    /// # Errors
    ///
    /// [`BrokerError::Amqp`] when a delete fails.
    pub async fn delete_namespace(&self, groups: &[&str]) -> Result<(), BrokerError> {
        // The embedded queue lives and dies with its database.
        let Ok(inner) = self.amqp() else {
            return Ok(());
        };
        let channel = inner.channel().await?;
        let mut queues: Vec<String> = groups
            .iter()
            .flat_map(|g| {
                Priority::ALL
                    .iter()
                    .map(|p| inner.topology.group_queue_at(g, *p))
            })
            .collect();
        queues.push(inner.topology.dead_letter_queue());
        for queue in queues {
            channel
                .queue_delete(&queue, QueueDeleteOptions::default())
                .await
                .map_err(BrokerError::amqp("delete queue"))?;
        }
        for exchange in [
            inner.topology.jobs_exchange(),
            inner.topology.dead_letter_exchange(),
        ] {
            channel
                .exchange_delete(&exchange, ExchangeDeleteOptions::default())
                .await
                .map_err(BrokerError::amqp("delete exchange"))?;
        }
        let _ = channel.close(200, "deleted").await;
        Ok(())
    }

    /// Closes the connection (after in-flight confirms were awaited by their
    /// publishers).
    pub async fn close(&self) {
        // The embedded queue closes with the ledger that owns the database.
        if let Ok(inner) = self.amqp() {
            let connection = inner.link.lock().await.connection.clone();
            let _ = connection.close(200, "shutdown").await;
        }
    }
}

/// Connects to the first of `nodes` that answers; its index and the
/// connection, or the last node's error (each failure is logged).
async fn open_any(
    nodes: &[(usize, &str)],
    connection_name: &str,
    tls: &OwnedTLSConfig,
) -> Result<(usize, Connection), BrokerError> {
    let mut last = None;
    for &(i, url) in nodes {
        match open(url, connection_name, tls).await {
            Ok(connection) => return Ok((i, connection)),
            Err(e) => {
                if nodes.len() > 1 {
                    tracing::warn!(error = %e, "RabbitMQ node not answering; trying the next");
                }
                last = Some(e);
            }
        }
    }
    Err(last.unwrap_or_else(|| BrokerError::Disconnected {
        url: "no RabbitMQ node".into(),
    }))
}

async fn open(
    url: &str,
    connection_name: &str,
    tls: &OwnedTLSConfig,
) -> Result<Connection, BrokerError> {
    // lapin runs its I/O on the caller's tokio runtime instead of a private
    // thread pool.
    let properties = ConnectionProperties::default()
        .with_executor(tokio_executor_trait::Tokio::current())
        .with_reactor(tokio_reactor_trait::Tokio)
        .with_connection_name(LongString::from(connection_name.to_owned()));
    let connect_err = |source| BrokerError::Connect {
        url: belfry_runtime::masked(url),
        source,
    };
    // An `amqp://` URL ignores `tls`; an `amqps://` one verifies the server
    // and never falls back to plaintext.
    let connecting = Connection::connect_with_config(url, properties, crate::amqp_tls::copy(tls));
    match tokio::time::timeout(CONNECT_TIMEOUT, connecting).await {
        Ok(result) => result.map_err(connect_err),
        Err(_) => Err(connect_err(lapin::Error::IOError(Arc::new(
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "no answer within {CONNECT_TIMEOUT:?} (the node may be unreachable, or up \
                     but out of file handles: such a node takes the TCP connection and never \
                     answers; see the File Descriptors of `rabbitmq-diagnostics status`)"
                ),
            ),
        )))),
    }
}

fn durable_queue() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    }
}

fn quorum_args(dead_letter_exchange: Option<&str>) -> FieldTable {
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    if let Some(dlx) = dead_letter_exchange {
        args.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString(dlx.into()),
        );
    }
    args
}
