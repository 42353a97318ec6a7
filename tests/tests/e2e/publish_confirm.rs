//! Publisher confirms that time out (issue 16, defect 3): the channel is
//! closed before another publish may use it, so a late `basic.return` of
//! the abandoned publish can never be paired with a later confirm, and the
//! next publish goes out on a fresh channel with its own answer.

use std::time::Duration;

use belfry_broker::{BrokerError, PublishOutcome, PublisherSlot};
use belfry_protocol::{JobMessage, MESSAGE_VERSION};
use belfry_tests::held_link::HeldLink;
use chrono::Utc;

fn message(job_type: &str) -> JobMessage {
    let now = Utc::now();
    JobMessage {
        version: MESSAGE_VERSION,
        message_id: uuid::Uuid::now_v7(),
        job_name: "confirm".into(),
        job_type: job_type.into(),
        run_key: format!("confirm@{}", uuid::Uuid::new_v4()),
        scheduled_at: now,
        published_at: now,
        attempt: 1,
        payload: serde_json::Value::Null,
        trace: None,
        options: Default::default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirm_timeout_closes_the_channel_before_the_next_publish() {
    let env = belfry_testkit::service_env!("noop");
    // The publisher reaches RabbitMQ through a link that can be held: held,
    // no confirm comes back in time; released, the late answers arrive.
    let link = HeldLink::start("127.0.0.1:5672".parse().unwrap()).await;
    let url = format!("amqp://guest:guest@{}/%2f", link.addr());
    let broker = belfry_broker::Broker::connect(&url, env.topology.clone(), "held")
        .await
        .unwrap();
    // A fresh publisher that waits 300 ms for a confirm, on a held link.
    let held_publisher = || async {
        let publisher = broker.publisher().await.unwrap();
        let publisher = publisher.with_confirm_timeout(Duration::from_millis(300));
        link.hold(true);
        publisher
    };
    let publisher = held_publisher().await;
    // Unroutable, so the broker's late answer carries a basic.return.
    let abandoned = publisher.publish(&message("nobody-serves-this")).await;
    assert!(
        matches!(abandoned, Err(BrokerError::ConfirmTimeout(_))),
        "{abandoned:?}"
    );
    assert!(
        !publisher.is_open(),
        "the channel stays open after a confirm timeout"
    );
    link.hold(false);
    // Nothing more goes out on that channel: a late return cannot be paired.
    let after = publisher.publish(&message("noop")).await;
    assert!(after.is_err(), "{after:?}");
    // Batched publishes take the same path.
    let publisher = held_publisher().await;
    let answers = publisher
        .publish_many(&[message("noop"), message("nobody-serves-this")])
        .await;
    assert!(
        answers
            .iter()
            .all(|a| matches!(a, Err(BrokerError::ConfirmTimeout(_)))),
        "{answers:?}"
    );
    assert!(!publisher.is_open());
    link.hold(false);
    // A slot replaces a closed channel: each later answer is its own.
    let slot = PublisherSlot::new(broker.clone());
    assert_eq!(
        slot.publish(&message("nobody-serves-this")).await.unwrap(),
        PublishOutcome::Unroutable
    );
    assert_eq!(
        slot.publish(&message("noop")).await.unwrap(),
        PublishOutcome::Confirmed
    );
    broker.close().await;
    env.teardown(&["default"]).await;
}
