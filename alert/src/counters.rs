//! What the alert deliverer did, per channel, as Prometheus metrics:
//! `belfry_alerts_sent_total{channel}`, `belfry_alerts_failed_total{channel}`
//! (given up) and `belfry_alert_attempts_failed_total{channel}` (every
//! failed attempt, retried or not). Read at scrape time; counts only grow.

use std::collections::BTreeMap;
use std::sync::Mutex;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::MetricType;

/// One metric family: name, help, and which count it reports.
type Family = (&'static str, &'static str, fn(&ChannelCounts) -> u64);

/// Per-channel counts.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ChannelCounts {
    /// Alerts the channel accepted.
    pub sent: u64,
    /// Alerts given up.
    pub failed: u64,
    /// Failed attempts (each retry counts).
    pub attempts_failed: u64,
}

/// The deliverer's counters.
#[derive(Debug, Default)]
pub struct AlertCounters {
    by_channel: Mutex<BTreeMap<String, ChannelCounts>>,
}

impl AlertCounters {
    /// Adds to `channel`'s counts.
    pub(crate) fn add(&self, channel: &str, change: impl FnOnce(&mut ChannelCounts)) {
        // A poisoned lock only means another thread panicked mid-update of
        // plain integers: the counts are still usable.
        let mut map = self
            .by_channel
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        change(map.entry(channel.to_owned()).or_default());
    }

    /// The counts of `channel` so far.
    pub fn of(&self, channel: &str) -> ChannelCounts {
        let map = self
            .by_channel
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.get(channel).copied().unwrap_or_default()
    }

    fn snapshot(&self) -> Vec<(String, ChannelCounts)> {
        let map = self
            .by_channel
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.iter().map(|(k, v)| (k.clone(), *v)).collect()
    }
}

impl Collector for AlertCounters {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let snapshot = self.snapshot();
        let families: [Family; 3] = [
            ("belfry_alerts_sent", "Alerts a channel accepted.", |c| {
                c.sent
            }),
            (
                "belfry_alerts_failed",
                "Alerts given up (refused by the receiver, or failing past give_up_after).",
                |c| c.failed,
            ),
            (
                "belfry_alert_attempts_failed",
                "Failed attempts at sending an alert, retried or not.",
                |c| c.attempts_failed,
            ),
        ];
        for (name, help, value) in families {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (channel, counts) in &snapshot {
                let labels = [("channel", channel.as_str())];
                ConstCounter::new(value(counts)).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}
