//! Which node of each service a process is connected to: Postgres (the
//! host of `DATABASE_URL`, a pooler's when there is one), RabbitMQ (the
//! cluster node the connection goes to now; it changes at a failover) and
//! Redis. Exported as an info metric, one series per service,
//!
//! ```text
//! belfry_service_node{service="rabbitmq",node="amqp://guest:***@127.0.0.1:55682/%2f"} 1
//! ```
//!
//! and read by the scheduler's `/readyz`. Every node is read when asked, so
//! a failover shows at the next scrape; URLs are masked.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

/// Reads one service's node now; `None` when the service is not used.
pub type NodeSource = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// The services of a process and how to read their nodes.
#[derive(Clone, Default)]
pub struct ServiceNodes {
    sources: Vec<(&'static str, NodeSource)>,
}

impl std::fmt::Debug for ServiceNodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.current()).finish()
    }
}

impl ServiceNodes {
    /// Adds `service`, whose node `source` reads.
    #[must_use]
    pub fn with(
        mut self,
        service: &'static str,
        source: impl Fn() -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.sources.push((service, Arc::new(source)));
        self
    }

    /// `(service, node)` of every service in use, now.
    pub fn current(&self) -> Vec<(&'static str, String)> {
        self.sources
            .iter()
            .filter_map(|(service, source)| source().map(|node| (*service, node)))
            .collect()
    }
}

impl Collector for ServiceNodes {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut family = encoder.encode_descriptor(
            "belfry_service_node",
            "The node of each service this process is connected to (value 1; the node label says which)",
            None,
            MetricType::Gauge,
        )?;
        for (service, node) in self.current() {
            let labels = [("service", service), ("node", node.as_str())];
            ConstGauge::new(1i64).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::ServiceNodes;

    #[test]
    fn every_scrape_reads_the_node_now_and_leaves_out_unused_services() {
        let node = std::sync::Arc::new(std::sync::Mutex::new("mq1".to_owned()));
        let read = node.clone();
        let nodes = ServiceNodes::default()
            .with("rabbitmq", move || Some(read.lock().unwrap().clone()))
            .with("redis", || None);
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(nodes.clone()));
        let scrape = |registry: &prometheus_client::registry::Registry| {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
            text
        };
        assert!(
            scrape(&registry).contains(r#"belfry_service_node{service="rabbitmq",node="mq1"} 1"#)
        );
        *node.lock().unwrap() = "mq2".into();
        let text = scrape(&registry);
        assert!(
            text.contains(r#"node="mq2""#) && !text.contains("redis"),
            "{text}"
        );
        assert_eq!(nodes.current(), [("rabbitmq", "mq2".to_owned())]);
    }
}
