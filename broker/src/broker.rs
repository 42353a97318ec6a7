//! Connecting to RabbitMQ and declaring belfry's topology.

use lapin::options::{
    BasicConsumeOptions, BasicQosOptions, ExchangeDeclareOptions, ExchangeDeleteOptions,
    QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{Channel, Connection, ConnectionProperties, Consumer, ExchangeKind};

use std::sync::Arc;
use std::time::{Duration, Instant};

use belfry_protocol::Topology;

use crate::publisher::Publisher;
use crate::BrokerError;

/// How long one connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// After a failed reconnect, how long callers get the error at once before
/// the next attempt (so a dead broker is not hammered once per fire).
const RECONNECT_PAUSE: Duration = Duration::from_secs(1);

struct Link {
    connection: Arc<Connection>,
    failed_at: Option<Instant>,
}

struct Inner {
    url: String,
    connection_name: String,
    topology: Topology,
    // A tokio mutex: reconnecting awaits. Held only to read or replace the
    // connection; channels are opened after it is released.
    link: tokio::sync::Mutex<Link>,
}

/// A connection to RabbitMQ for one namespace, reopened on demand.
///
/// Cheap to clone (shared). When the connection drops (broker restart,
/// network loss) the next call that needs a channel reconnects, at most
/// once per second, so publishers and consumers recover on their own.
#[derive(Clone)]
pub struct Broker {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("url", &belfry_runtime::masked(&self.inner.url))
            .field("namespace", &self.inner.topology.namespace())
            .finish()
    }
}

impl Broker {
    /// Connects to `url` (an `amqp://` URL) and names the connection
    /// `connection_name` in the management UI.
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
        let connection = open(url, connection_name).await?;
        Ok(Self {
            inner: Arc::new(Inner {
                url: url.to_owned(),
                connection_name: connection_name.to_owned(),
                topology,
                link: tokio::sync::Mutex::new(Link {
                    connection: Arc::new(connection),
                    failed_at: None,
                }),
            }),
        })
    }

    /// The names this broker handle uses.
    pub fn topology(&self) -> &Topology {
        &self.inner.topology
    }

    /// Whether the current connection is open.
    pub async fn is_connected(&self) -> bool {
        self.inner.link.lock().await.connection.status().connected()
    }

    /// The open connection, reconnecting when it dropped.
    async fn connection(&self) -> Result<Arc<Connection>, BrokerError> {
        let mut link = self.inner.link.lock().await;
        if link.connection.status().connected() {
            return Ok(link.connection.clone());
        }
        let url = belfry_runtime::masked(&self.inner.url);
        if link
            .failed_at
            .is_some_and(|t| t.elapsed() < RECONNECT_PAUSE)
        {
            return Err(BrokerError::Disconnected { url });
        }
        match open(&self.inner.url, &self.inner.connection_name).await {
            Ok(connection) => {
                tracing::info!(%url, "reconnected to RabbitMQ");
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

    /// Declares the job exchange and the dead-letter exchange and queue.
    /// Idempotent; both binaries call it at start.
    ///
    /// # Errors
    ///
    /// [`BrokerError::Amqp`] when a declaration fails, for example because an
    /// object of the same name exists with other settings.
    pub async fn declare_core(&self) -> Result<(), BrokerError> {
        let channel = self.channel().await?;
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        };
        channel
            .exchange_declare(
                &self.inner.topology.jobs_exchange(),
                ExchangeKind::Topic,
                durable,
                FieldTable::default(),
            )
            .await
            .map_err(BrokerError::amqp("declare job exchange"))?;
        channel
            .exchange_declare(
                &self.inner.topology.dead_letter_exchange(),
                ExchangeKind::Fanout,
                durable,
                FieldTable::default(),
            )
            .await
            .map_err(BrokerError::amqp("declare dead-letter exchange"))?;
        let dlq = self.inner.topology.dead_letter_queue();
        channel
            .queue_declare(&dlq, durable_queue(), quorum_args(None))
            .await
            .map_err(BrokerError::amqp("declare dead-letter queue"))?;
        channel
            .queue_bind(
                &dlq,
                &self.inner.topology.dead_letter_exchange(),
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
        let channel = self.channel().await?;
        let queue = self.inner.topology.group_queue(group);
        let dlx = self.inner.topology.dead_letter_exchange();
        channel
            .queue_declare(&queue, durable_queue(), quorum_args(Some(&dlx)))
            .await
            .map_err(BrokerError::amqp("declare group queue"))?;
        for job_type in job_types {
            channel
                .queue_bind(
                    &queue,
                    &self.inner.topology.jobs_exchange(),
                    job_type.as_ref(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(BrokerError::amqp("bind group queue"))?;
        }
        let _ = channel.close(200, "declared").await;
        Ok(queue)
    }

    /// Opens a confirming publisher on its own channel.
    ///
    /// # Errors
    ///
    /// [`BrokerError::Amqp`] when the channel cannot be opened or put in
    /// confirm mode.
    pub async fn publisher(&self) -> Result<Publisher, BrokerError> {
        Publisher::open(self.channel().await?, self.inner.topology.clone()).await
    }

    /// Starts consuming `queue` with manual acks and at most `prefetch`
    /// unacknowledged deliveries.
    ///
    /// # Errors
    ///
    /// [`BrokerError::Amqp`] when the channel, QoS or consume call fails.
    pub async fn consume(
        &self,
        queue: &str,
        consumer_tag: &str,
        prefetch: u16,
    ) -> Result<(Channel, Consumer), BrokerError> {
        let channel = self.channel().await?;
        channel
            .basic_qos(prefetch, BasicQosOptions::default())
            .await
            .map_err(BrokerError::amqp("set prefetch"))?;
        let consumer = channel
            .basic_consume(
                queue,
                consumer_tag,
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(BrokerError::amqp("consume"))?;
        Ok((channel, consumer))
    }

    /// Deletes the namespace's exchanges, the dead-letter queue and the
    /// queues of `groups`. For tests and for decommissioning a namespace;
    /// messages in those queues are lost.
    ///
    /// # Errors
    ///
    /// [`BrokerError::Amqp`] when a delete fails.
    pub async fn delete_namespace(&self, groups: &[&str]) -> Result<(), BrokerError> {
        let channel = self.channel().await?;
        let mut queues: Vec<String> = groups
            .iter()
            .map(|g| self.inner.topology.group_queue(g))
            .collect();
        queues.push(self.inner.topology.dead_letter_queue());
        for queue in queues {
            channel
                .queue_delete(&queue, QueueDeleteOptions::default())
                .await
                .map_err(BrokerError::amqp("delete queue"))?;
        }
        for exchange in [
            self.inner.topology.jobs_exchange(),
            self.inner.topology.dead_letter_exchange(),
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
        let connection = self.inner.link.lock().await.connection.clone();
        let _ = connection.close(200, "shutdown").await;
    }
}

async fn open(url: &str, connection_name: &str) -> Result<Connection, BrokerError> {
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
    match tokio::time::timeout(CONNECT_TIMEOUT, Connection::connect(url, properties)).await {
        Ok(result) => result.map_err(connect_err),
        Err(_) => Err(connect_err(lapin::Error::IOError(Arc::new(
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {CONNECT_TIMEOUT:?}"),
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
