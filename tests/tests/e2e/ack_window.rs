//! The consumer's acknowledgement window (issue 21): acks of deliveries
//! that finished in order go out as one `multiple` ack, but such an ack
//! never covers a delivery still running or one given back to the queue,
//! and acks held behind a running delivery are sent before the consumer's
//! channel closes.

use std::time::Duration;

use belfry_broker::{Consumption, Delivery};
use belfry_testkit::queue_len;

async fn next(c: &mut Consumption) -> Delivery {
    tokio::time::timeout(Duration::from_secs(10), c.next())
        .await
        .expect("a delivery within 10 s")
        .expect("the consumer is open")
        .expect("a delivery, not an error")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multiple_acks_never_cover_a_running_or_requeued_delivery() {
    let env = belfry_testkit::service_env!("noop");
    if env.is_embedded() {
        return;
    }
    env.declare_default_group(&["noop"]).await;
    let queue = env.topology.group_queue("default");
    for i in 0..10 {
        env.publish_raw("noop", format!("m{i}").as_bytes()).await;
    }
    let mut first = env.broker.consume(&queue, "ack-window", 64).await.unwrap();
    let mut held = Vec::new();
    for _ in 0..10 {
        held.push(next(&mut first).await);
    }
    let bodies: Vec<String> = held
        .iter()
        .map(|d| String::from_utf8_lossy(&d.data).into_owned())
        .collect();
    assert_eq!(bodies[0], "m0", "delivered in publish order: {bodies:?}");
    // m0 keeps running; m5 goes back to the queue after the acks before it
    // (a multiple ack covering it would make its requeue fail and close the
    // channel) and comes back.
    for d in &held[1..5] {
        d.ack().await.unwrap();
    }
    held[5].requeue().await.unwrap();
    let again = next(&mut first).await;
    assert_eq!(
        String::from_utf8_lossy(&again.data),
        "m5",
        "the requeued delivery comes back"
    );
    // The rest finish, and the consumer closes at once: these acks are still
    // held behind m0 (for up to 20 ms), so the close must send them.
    for d in &held[6..] {
        d.ack().await.unwrap();
    }
    again.ack().await.unwrap();
    // Closed with m0 unsettled: the acks held behind it are sent first, and
    // m0 alone goes back to the queue.
    drop(held.remove(0));
    first.close().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut ready = queue_len(&env, &queue).await;
    while ready == Some(0) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        ready = queue_len(&env, &queue).await;
    }
    assert_eq!(
        ready,
        Some(1),
        "only the running delivery goes back to the queue (0: a multiple ack covered it; \
         more: held acks were lost at close or the requeued one was acked twice)"
    );
    let mut second = env.broker.consume(&queue, "ack-window-2", 1).await.unwrap();
    let back = next(&mut second).await;
    assert_eq!(String::from_utf8_lossy(&back.data), "m0");
    back.ack().await.unwrap();
    second.close().await;
    assert_eq!(queue_len(&env, &queue).await, Some(0));
    env.teardown(&["default"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_low_priority_delivery_held_back_past_the_bound_is_handed_out() {
    let env = belfry_testkit::service_env!("noop");
    if env.is_embedded() {
        return;
    }
    env.declare_default_group(&["noop"]).await;
    // One low run, then a backlog of normal ones that keeps the consumer
    // busy well past the (shortened) bound.
    env.publish_raw("low:noop", b"low").await;
    for i in 0..30 {
        env.publish_raw("noop", format!("n{i}").as_bytes()).await;
    }
    let mut c = env
        .broker
        .consume_group("default", "aging", 8)
        .await
        .unwrap()
        .with_lower_level_bound(Duration::from_millis(300));
    // Every level's deliveries arrive before the first is chosen.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut order = Vec::new();
    for _ in 0..31 {
        let d = next(&mut c).await;
        order.push(String::from_utf8_lossy(&d.data).into_owned());
        d.ack().await.unwrap();
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    c.close().await;
    // Held back while normal deliveries were ready (not first), then
    // handed out once it had waited 300 ms, not last.
    let at = order.iter().position(|b| b == "low").unwrap();
    assert!(
        (1..20).contains(&at),
        "the low delivery came at {at}: {order:?}"
    );
    env.teardown(&["default"]).await;
}
