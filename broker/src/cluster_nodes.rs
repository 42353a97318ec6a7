//! The RabbitMQ nodes a broker handle may connect to: one URL, or the
//! node URLs of a cluster (`AMQP_URL=amqp://…@mq1/%2f,amqp://…@mq2/%2f`).
//!
//! At start the nodes are tried in the order given and the first that
//! answers is used. When the connection drops, the reconnect tries the
//! *next* node first and comes back round to the one that failed last: a
//! node that died is usually still dead a moment later, while a restarted
//! single node is simply tried again. Queues are quorum queues, so any
//! node of a cluster with a majority up serves them; which node a process
//! is connected to is only where its traffic enters.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The node URLs, and which one the current connection went to.
#[derive(Debug)]
pub(crate) struct ClusterNodes {
    urls: Vec<String>,
    current: AtomicUsize,
}

impl ClusterNodes {
    /// The nodes of `list` (one URL or several, comma-separated); `None`
    /// when it holds none.
    pub(crate) fn parse(list: &str) -> Option<Self> {
        let urls: Vec<String> = belfry_runtime::url_list(list)
            .into_iter()
            .map(str::to_owned)
            .collect();
        (!urls.is_empty()).then(|| Self {
            urls,
            current: AtomicUsize::new(0),
        })
    }

    /// Every node URL.
    pub(crate) fn urls(&self) -> &[String] {
        &self.urls
    }

    /// The nodes to try for a first connection: in the order given.
    pub(crate) fn for_start(&self) -> Vec<(usize, &str)> {
        self.urls.iter().map(String::as_str).enumerate().collect()
    }

    /// The nodes to try after the current connection dropped: the next
    /// node first, the one that failed last.
    pub(crate) fn for_reconnect(&self) -> Vec<(usize, &str)> {
        let n = self.urls.len();
        let after = self.current.load(Ordering::Relaxed) + 1;
        (0..n)
            .map(|k| (after + k) % n)
            .map(|i| (i, self.urls[i].as_str()))
            .collect()
    }

    /// Records that the connection now goes to node `i`.
    pub(crate) fn connected_to(&self, i: usize) {
        // Relaxed: read only to order the next reconnect and to report
        // the node; written under the connection's lock.
        self.current.store(i, Ordering::Relaxed);
    }

    /// The URL of the node connected to (or last connected to), password
    /// masked.
    pub(crate) fn current(&self) -> String {
        let i = self.current.load(Ordering::Relaxed);
        belfry_runtime::masked(&self.urls[i.min(self.urls.len() - 1)])
    }
}

#[cfg(test)]
mod tests {
    use super::ClusterNodes;

    #[test]
    fn reconnects_try_the_next_node_first_and_the_failed_one_last() {
        let nodes = ClusterNodes::parse("amqp://mq1, amqp://mq2,amqp://mq3").unwrap();
        let order = |v: Vec<(usize, &str)>| v.into_iter().map(|(i, _)| i).collect::<Vec<_>>();
        assert_eq!(order(nodes.for_start()), [0, 1, 2]);
        assert_eq!(order(nodes.for_reconnect()), [1, 2, 0]);
        nodes.connected_to(2);
        assert_eq!(order(nodes.for_reconnect()), [0, 1, 2]);
        assert_eq!(nodes.current(), "amqp://mq3");
        let single = ClusterNodes::parse("amqp://u:secret@mq/%2f").unwrap();
        assert_eq!(order(single.for_reconnect()), [0]);
        assert_eq!(single.current(), "amqp://u:***@mq/%2f");
        assert!(ClusterNodes::parse(" , ").is_none());
    }
}
