//! Connecting to RabbitMQ and declaring belfry's topology.

use lapin::options::{
    BasicConsumeOptions, BasicQosOptions, ExchangeDeclareOptions, ExchangeDeleteOptions,
    QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{Channel, Connection, ConnectionProperties, Consumer, ExchangeKind};

use belfry_protocol::Topology;

use crate::publisher::Publisher;
use crate::BrokerError;

/// A connection to RabbitMQ for one namespace.
#[derive(Clone)]
pub struct Broker {
    connection: std::sync::Arc<Connection>,
    topology: Topology,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("namespace", &self.topology.namespace())
            .field("status", &self.connection.status().state())
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
        // lapin runs its I/O on the caller's tokio runtime instead of a
        // private thread pool.
        let properties = ConnectionProperties::default()
            .with_executor(tokio_executor_trait::Tokio::current())
            .with_reactor(tokio_reactor_trait::Tokio)
            .with_connection_name(LongString::from(connection_name.to_owned()));
        let connect = Connection::connect(url, properties);
        let connection = tokio::time::timeout(std::time::Duration::from_secs(10), connect)
            .await
            .map_err(|_| BrokerError::Connect {
                url: belfry_runtime::masked(url),
                source: lapin::Error::IOError(std::sync::Arc::new(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "no answer within 10s",
                ))),
            })?
            .map_err(|source| BrokerError::Connect {
                url: belfry_runtime::masked(url),
                source,
            })?;
        Ok(Self {
            connection: std::sync::Arc::new(connection),
            topology,
        })
    }

    /// The names this broker handle uses.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Whether the connection is open.
    pub fn is_connected(&self) -> bool {
        self.connection.status().connected()
    }

    async fn channel(&self) -> Result<Channel, BrokerError> {
        self.connection
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
                &self.topology.jobs_exchange(),
                ExchangeKind::Topic,
                durable,
                FieldTable::default(),
            )
            .await
            .map_err(BrokerError::amqp("declare job exchange"))?;
        channel
            .exchange_declare(
                &self.topology.dead_letter_exchange(),
                ExchangeKind::Fanout,
                durable,
                FieldTable::default(),
            )
            .await
            .map_err(BrokerError::amqp("declare dead-letter exchange"))?;
        let dlq = self.topology.dead_letter_queue();
        channel
            .queue_declare(&dlq, durable_queue(), quorum_args(None))
            .await
            .map_err(BrokerError::amqp("declare dead-letter queue"))?;
        channel
            .queue_bind(
                &dlq,
                &self.topology.dead_letter_exchange(),
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
        let queue = self.topology.group_queue(group);
        let dlx = self.topology.dead_letter_exchange();
        channel
            .queue_declare(&queue, durable_queue(), quorum_args(Some(&dlx)))
            .await
            .map_err(BrokerError::amqp("declare group queue"))?;
        for job_type in job_types {
            channel
                .queue_bind(
                    &queue,
                    &self.topology.jobs_exchange(),
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
        Publisher::open(self.channel().await?, self.topology.clone()).await
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
            .map(|g| self.topology.group_queue(g))
            .collect();
        queues.push(self.topology.dead_letter_queue());
        for queue in queues {
            channel
                .queue_delete(&queue, QueueDeleteOptions::default())
                .await
                .map_err(BrokerError::amqp("delete queue"))?;
        }
        for exchange in [
            self.topology.jobs_exchange(),
            self.topology.dead_letter_exchange(),
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
        let _ = self.connection.close(200, "shutdown").await;
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
