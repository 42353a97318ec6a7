//! Helpers for the collectors of plain-atomic counter structs (the
//! scheduler's fires, the worker's attempts): each value is read at scrape
//! time and written as OpenMetrics. Serving them is
//! [`metrics_server`](crate)'s job (feature `metrics-server`).

/// Writes a counter read from an atomic at scrape time (collectors of
/// plain-atomic counter structs use it).
///
/// # Errors
///
/// Only when the encoder's writer fails.
pub fn encode_counter(
    encoder: &mut prometheus_client::encoding::DescriptorEncoder,
    name: &str,
    help: &str,
    value: u64,
) -> std::fmt::Result {
    use prometheus_client::encoding::EncodeMetric as _;
    let counter = prometheus_client::metrics::counter::ConstCounter::new(value);
    counter.encode(encoder.encode_descriptor(name, help, None, counter.metric_type())?)
}

/// Writes one counter family with a single label, e.g.
/// `belfry_claims_total{result="won"}`.
///
/// # Errors
///
/// Only when the encoder's writer fails.
pub fn encode_labeled_counter(
    encoder: &mut prometheus_client::encoding::DescriptorEncoder,
    name: &str,
    help: &str,
    label: &'static str,
    values: &[(&'static str, u64)],
) -> std::fmt::Result {
    use prometheus_client::encoding::EncodeMetric as _;
    let mut family = encoder.encode_descriptor(
        name,
        help,
        None,
        prometheus_client::metrics::MetricType::Counter,
    )?;
    for (value, n) in values {
        let labels = [(label, *value)];
        let counter = prometheus_client::metrics::counter::ConstCounter::new(*n);
        counter.encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// Writes a metric object (a histogram, a gauge, a family) under `name`.
///
/// # Errors
///
/// Only when the encoder's writer fails.
pub fn encode_metric(
    encoder: &mut prometheus_client::encoding::DescriptorEncoder,
    name: &str,
    help: &str,
    metric: &impl prometheus_client::encoding::EncodeMetric,
) -> std::fmt::Result {
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

/// Buckets for latencies in seconds: 1 ms to about 65 s, doubling.
pub fn latency_buckets() -> impl Iterator<Item = f64> {
    prometheus_client::metrics::histogram::exponential_buckets(0.001, 2.0, 17)
}
