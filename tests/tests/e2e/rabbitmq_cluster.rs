//! A RabbitMQ cluster (issue 18): three nodes started by
//! `scripts/rabbitmq-cluster up` (Debian's package), a `belfry-scheduler`
//! and a `belfry-worker` given all three node URLs in `AMQP_URL`. Ignored
//! by default (three more Erlang VMs are too much for every CI run):
//! `scripts/infra-suite` starts the cluster, runs it and stops it. Under load, the node both are connected to (the
//! first, which answered first) is killed with `kill -9`: both reconnect to
//! another node, the quorum queue keeps its messages on the two left, and
//! every fire of the window runs once.

use std::time::Duration;

use belfry_broker::Broker;
use belfry_protocol::Topology;
use belfry_testkit::eventually;
use belfry_tests::process_window::{Process, ProcessFleet};
use chrono::Utc;

const NODES: [&str; 3] = ["127.0.0.1:55681", "127.0.0.1:55682", "127.0.0.1:55683"];
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/rabbitmq-cluster");

fn node_urls() -> String {
    NODES
        .iter()
        .map(|n| format!("amqp://guest:guest@{n}/%2f"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Whether all three nodes answer; records a skip (a failure with
/// `BELFRY_REQUIRE_SERVICES=1`) when one does not.
async fn cluster_up() -> bool {
    for node in NODES {
        if tokio::net::TcpStream::connect(node).await.is_err() {
            belfry_testkit::skip(&format!(
                "the RabbitMQ cluster is not up ({node} does not answer); \
                 start it with scripts/rabbitmq-cluster up"
            ));
            return false;
        }
    }
    true
}

fn cluster(args: &[&str]) {
    let out = std::process::Command::new(SCRIPT)
        .args(args)
        .stdout(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{SCRIPT}: {e}"));
    assert!(
        out.status.success(),
        "scripts/rabbitmq-cluster {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Starts node 1 again when dropped (errors ignored: a drop must not
/// panic while a failed assertion unwinds).
struct RestartNode1;

impl Drop for RestartNode1 {
    fn drop(&mut self) {
        let _ = std::process::Command::new(SCRIPT)
            .args(["start", "1"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the 3-node cluster of scripts/rabbitmq-cluster; scripts/infra-suite runs it"]
async fn a_node_killed_under_load_loses_and_doubles_nothing() {
    let env = belfry_testkit::service_env!();
    if !cluster_up().await {
        return;
    }
    let fleet = ProcessFleet::start(
        &env,
        "mq",
        10,
        &[
            Process {
                bin: "belfry-scheduler",
                instance: "mq-s1",
            },
            Process {
                bin: "belfry-worker",
                instance: "mq-w1",
            },
        ],
        &[
            ("AMQP_URL", node_urls()),
            // Claims whose publish was lost with the node are republished
            // this long after their claim.
            ("BELFRY_RECONCILE_AFTER", "3s".into()),
        ],
    )
    .await;
    let window_start = Utc::now() + chrono::Duration::seconds(1);
    // /readyz names the node the scheduler is connected to: the first.
    let before = eventually("/readyz to name a node", Duration::from_secs(10), || {
        fleet.readyz_node("mq-s1", "rabbitmq")
    })
    .await;
    assert!(before.contains("55681"), "{before}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Both connected to the first node, which answered first.
    cluster(&["kill", "1"]);
    // The node comes back and rejoins when the test ends, passed or not,
    // for the next run of it.
    let _restart = RestartNode1;
    tokio::time::sleep(Duration::from_secs(12)).await;
    let window_end = Utc::now() - chrono::Duration::seconds(1);
    // ... and after the failover, the node it moved to.
    let after = fleet
        .readyz_node("mq-s1", "rabbitmq")
        .await
        .unwrap_or_default();
    assert!(
        after.contains("55682") || after.contains("55683"),
        "{after:?}"
    );
    // Both processes moved to another node.
    for instance in ["mq-s1", "mq-w1"] {
        let log = fleet.log(instance);
        assert!(
            log.lines().any(|l| l.contains("reconnected to RabbitMQ")
                && (l.contains("55682") || l.contains("55683"))),
            "{instance} did not reconnect to another node:\n{log}"
        );
    }
    let table = fleet.finish(&env, window_start, window_end).await;
    assert!(table.holds(), "{table}");
    assert_eq!(table.rerun, 0, "every run at its first attempt:\n{table}");
    // The namespace's queues and exchanges on the cluster.
    let broker = Broker::connect(
        &node_urls(),
        Topology::new(&env.namespace).unwrap(),
        "cleanup",
    )
    .await
    .unwrap();
    let _ = broker.delete_namespace(&["default"]).await;
    broker.close().await;
}
