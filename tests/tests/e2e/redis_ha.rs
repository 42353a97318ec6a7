//! The claim lock on the Redis deployments production runs: a Sentinel
//! group through forced failovers, and a Redis Cluster whose keys spread
//! over its masters. Servers from `scripts/redis-ha` (started by
//! `scripts/test`); replicas race for the same fires as in `exactly_once`.
//!
//! What a failover may do to the lock, and what it must not do to the
//! runs: replication to a Redis replica is asynchronous, so a lock written
//! just before the master is lost may be missing on the promoted replica,
//! and a second replica then takes "the same" lock. The ledger's unique
//! insert turns it away — one row per fire, always.

use std::time::Duration;

use belfry_scheduler::{FireCounters, FireOutcome, FireSource};
use belfry_testkit::eventually;
use belfry_tests::process_window::{Process, ProcessFleet};
use belfry_tests::{at, every, race};
use chrono::{DateTime, Utc};
use redis::AsyncCommands as _;

const MASTER_NAME: &str = "belfry";

/// The Sentinel tests fail the group over: one at a time (they share it).
static SENTINEL_GROUP: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
const SENTINELS: [u16; 3] = [56390, 56391, 56392];
const CLUSTER: [u16; 6] = [56400, 56401, 56402, 56403, 56404, 56405];

fn sentinel_url() -> String {
    std::env::var("BELFRY_TEST_REDIS_SENTINEL_URL").unwrap_or_else(|_| {
        let hosts: Vec<String> = SENTINELS.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        format!("redis+sentinel://{}/{MASTER_NAME}", hosts.join(","))
    })
}

fn cluster_url() -> String {
    std::env::var("BELFRY_TEST_REDIS_CLUSTER_URL").unwrap_or_else(|_| {
        let hosts: Vec<String> = CLUSTER.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        format!("redis+cluster://{}", hosts.join(","))
    })
}

/// A plain connection to one server of the set-up on `port`.
async fn node(port: u16) -> Option<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
    tokio::time::timeout(
        Duration::from_secs(2),
        client.get_multiplexed_async_connection(),
    )
    .await
    .ok()?
    .ok()
}

/// Whether every server on `ports` answers; records a skip (a failure with
/// `BELFRY_REQUIRE_SERVICES=1`) when one does not.
async fn up(what: &str, ports: &[u16]) -> bool {
    for port in ports {
        let answers = match node(*port).await {
            Some(mut c) => redis::cmd("PING")
                .query_async::<String>(&mut c)
                .await
                .is_ok(),
            None => false,
        };
        if !answers {
            belfry_testkit::skip(&format!(
                "the Redis {what} is not up (nothing answers on 127.0.0.1:{port}); start it with scripts/redis-ha up"
            ));
            return false;
        }
    }
    true
}

/// The port of the master the sentinels name now.
async fn sentinel_master() -> u16 {
    let mut s = node(SENTINELS[0]).await.expect("a sentinel answers");
    let (_, port): (String, u16) = redis::cmd("SENTINEL")
        .arg("GET-MASTER-ADDR-BY-NAME")
        .arg(MASTER_NAME)
        .query_async(&mut s)
        .await
        .expect("the sentinel names the master");
    port
}

async fn role(port: u16) -> Option<String> {
    let mut c = node(port).await?;
    let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut c).await.ok()?;
    match role.first() {
        Some(redis::Value::BulkString(b)) => Some(String::from_utf8_lossy(b).into_owned()),
        Some(redis::Value::SimpleString(s)) => Some(s.clone()),
        _ => None,
    }
}

/// Waits until every sentinel names `master` (other than `old`), it answers
/// as master, and the other data server answers as its replica: the group
/// settled after a failover.
async fn settled_away_from(old: u16) -> u16 {
    eventually(
        "the Sentinel group to fail over and settle",
        Duration::from_secs(30),
        || async {
            let mut named = Vec::new();
            for port in SENTINELS {
                let mut s = node(port).await?;
                let (_, p): (String, u16) = redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(MASTER_NAME)
                    .query_async(&mut s)
                    .await
                    .ok()?;
                named.push(p);
            }
            let new = named[0];
            let settled = named.iter().all(|p| *p == new)
                && new != old
                && role(new).await.as_deref() == Some("master")
                && role(old).await.as_deref() == Some("slave");
            settled.then_some(new)
        },
    )
    .await
}

/// `SENTINEL FAILOVER` away from the master on port `from`; the port of
/// the new master once the group settled.
async fn forced_failover(from: u16) -> u16 {
    let mut s = node(SENTINELS[0]).await.expect("a sentinel answers");
    let _: String = redis::cmd("SENTINEL")
        .arg("FAILOVER")
        .arg(MASTER_NAME)
        .query_async(&mut s)
        .await
        .expect("SENTINEL FAILOVER");
    settled_away_from(from).await
}

fn instants(from: &str, count: i64) -> Vec<DateTime<Utc>> {
    let base = at(from);
    (0..count)
        .map(|i| base + chrono::Duration::seconds(i))
        .collect()
}

/// Continues a stopped process when dropped, so a failing test never leaves
/// a Redis server frozen for the next.
struct Stopped(u32);

impl Stopped {
    fn stop(pid: u32) -> Self {
        signal("-STOP", pid);
        Self(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        signal("-CONT", self.0);
    }
}

fn signal(sig: &str, pid: u32) {
    let status = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill {sig} {pid}");
}

async fn pid_of(port: u16) -> u32 {
    let mut c = node(port).await.expect("the server answers");
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut c)
        .await
        .expect("INFO server");
    info.lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|p| p.trim().parse().ok())
        .expect("INFO names the process id")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sentinel_failovers_move_the_lock_and_never_duplicate_a_fire() {
    let env = belfry_testkit::service_env!("noop");
    if !up("Sentinel group", &SENTINELS).await {
        return;
    }
    let _group = SENTINEL_GROUP.lock().await;
    let name = "sentinel-race";
    let schedule = every(name, "1s", "noop");
    let replicas = race::replicas(&env, name, 3, Some(&sentinel_url())).await;

    // 1. A settled group: the lock turns every loser away.
    let first = instants("2026-07-26T03:00:00Z", 5);
    let outcomes = race::fire_all(&replicas, &schedule, &first).await;
    race::assert_one_run_each(&env, name, &first, &outcomes).await;
    assert_eq!(race::total(&replicas, |c| &c.lock_fallbacks), 0);
    assert_eq!(race::total(&replicas, |c| &c.claims_lost_lock), 10);
    let before = sentinel_master().await;
    assert!(
        replicas[0]
            .service_nodes()
            .current()
            .iter()
            .any(|(service, node)| *service == "redis"
                && node.ends_with(&format!("master 127.0.0.1:{before}"))),
        "the node metric names the master in use: {:?}",
        replicas[0].service_nodes().current()
    );

    // 2. A forced failover (SENTINEL FAILOVER): the replica is promoted and
    //    the old master demoted, which then refuses writes (READONLY).
    let after = forced_failover(before).await;

    // 3. The fires right after it: every replica's write to the old master
    //    fails, it falls back to the ledger — one run each all the same —
    //    and asks the sentinels again.
    let second = instants("2026-07-26T04:00:00Z", 5);
    let outcomes = race::fire_all(&replicas, &schedule, &second).await;
    race::assert_one_run_each(&env, name, &second, &outcomes).await;

    // 4. Then the lock works again, on the new master.
    let fallbacks = race::total(&replicas, |c| &c.lock_fallbacks);
    let filtered = race::total(&replicas, |c| &c.claims_lost_lock);
    let third = instants("2026-07-26T05:00:00Z", 5);
    let outcomes = race::fire_all(&replicas, &schedule, &third).await;
    race::assert_one_run_each(&env, name, &third, &outcomes).await;
    assert_eq!(
        race::total(&replicas, |c| &c.lock_fallbacks),
        fallbacks,
        "no fallback once moved"
    );
    assert_eq!(
        race::total(&replicas, |c| &c.claims_lost_lock),
        filtered + 10
    );
    assert!(
        replicas.iter().all(|r| r
            .service_nodes()
            .current()
            .iter()
            .any(|(service, node)| *service == "redis"
                && node.ends_with(&format!("master 127.0.0.1:{after}")))),
        "every replica follows the master to 127.0.0.1:{after}"
    );
    env.teardown(&["default"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lock_lost_in_a_sentinel_failover_lets_a_second_replica_through_and_the_ledger_refuses_it(
) {
    let env = belfry_testkit::service_env!("noop");
    if !up("Sentinel group", &SENTINELS).await {
        return;
    }
    let _group = SENTINEL_GROUP.lock().await;
    let name = "sentinel-lost-lock";
    let schedule = every(name, "1s", "noop");
    let first = race::replicas(&env, &format!("{name}-a"), 1, Some(&sentinel_url())).await;
    let second = race::replicas(&env, &format!("{name}-b"), 1, Some(&sentinel_url())).await;
    let (a, b) = (&first[0], &second[0]);
    // Up to three tries: the loss needs the write to miss the replica (which
    // the sleep below makes sure of, as long as the test's steps take less
    // than half a second); a try where replication won anyway is
    // recognised and repeated with a new fire.
    for attempt in 0..3_i64 {
        let fire = at("2026-07-26T06:00:00Z") + chrono::Duration::minutes(attempt);
        let run_key = belfry_protocol::run_key(name, fire).expect("run key");
        let key = env.topology.lock_key(name, &run_key);
        let master = sentinel_master().await;
        let replica_port = if master == 56380 { 56381 } else { 56380 };
        // b is connected to the master, as a running replica is: a fire of
        // its own went through the lock (after an earlier try, b may first
        // meet the demoted master and fall back once).
        let mut connected = false;
        for k in 1..=5 {
            let fallbacks = FireCounters::get(&b.counters().lock_fallbacks);
            let warm_up = b.fire(&schedule, fire - chrono::Duration::hours(k)).await;
            assert!(
                matches!(warm_up, FireOutcome::Dispatched { .. }),
                "{warm_up:?}"
            );
            if FireCounters::get(&b.counters().lock_fallbacks) == fallbacks {
                connected = true;
                break;
            }
        }
        assert!(connected, "b's lock reaches the master before the failover");
        let fallbacks_before = FireCounters::get(&b.counters().lock_fallbacks);
        let master_pid = pid_of(master).await;
        // Hold the replica's event loop for half a second (DEBUG SLEEP),
        // then cut the master's link to it: it cannot reconnect before it
        // wakes, so a write meanwhile reaches the master only.
        let mut r = node(replica_port).await.expect("the replica answers");
        let asleep = tokio::spawn(async move {
            redis::cmd("DEBUG")
                .arg("SLEEP")
                .arg("0.5")
                .query_async::<String>(&mut r)
                .await
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut m = node(master).await.expect("the master answers");
        let _: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("replica")
            .query_async(&mut m)
            .await
            .expect("CLIENT KILL TYPE replica");
        // Replica a fires: lock on the master, row in the ledger.
        let outcome = a.fire(&schedule, fire).await;
        assert!(
            matches!(outcome, FireOutcome::Dispatched { .. }),
            "{outcome:?}"
        );
        // Freeze the master before the replica wakes: the sentinels see it
        // down after 1 s and promote the replica, which never had the lock.
        let frozen = Stopped::stop(master_pid);
        asleep
            .await
            .expect("the DEBUG SLEEP task")
            .expect("the replica slept (DEBUG enabled for local clients)");
        let promoted = eventually(
            "the sentinels to promote the replica",
            Duration::from_secs(30),
            || async {
                let new = sentinel_master().await;
                (new == replica_port && role(new).await.as_deref() == Some("master")).then_some(new)
            },
        )
        .await;
        let mut p = node(promoted).await.expect("the promoted master answers");
        let has_lock: Option<String> = p.get(&key).await.expect("GET");
        if has_lock.is_some() {
            // Replication reconnected first this time; thaw and try again.
            drop(frozen);
            settled_away_from(master).await;
            continue;
        }
        // Replica b: its first try finds the old master frozen (a timeout)
        // and falls back to the ledger, which refuses it; it then asks the
        // sentinels again.
        let refused_before = FireCounters::get(&b.counters().claims_lost_ledger);
        let outcome = b.fire(&schedule, fire).await;
        assert!(matches!(outcome, FireOutcome::Lost), "{outcome:?}");
        // Its next try reaches the new master, where the lock is missing:
        // b takes "the same" lock a holds — and the unique insert refuses it.
        let mut taken = false;
        for _ in 0..10 {
            let fallbacks = FireCounters::get(&b.counters().lock_fallbacks);
            let outcome = b.fire(&schedule, fire).await;
            assert!(matches!(outcome, FireOutcome::Lost), "{outcome:?}");
            if FireCounters::get(&b.counters().lock_fallbacks) == fallbacks {
                taken = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        assert!(taken, "b reached the new master");
        assert!(
            FireCounters::get(&b.counters().lock_fallbacks) > fallbacks_before,
            "b first met the frozen master (a timeout) and fell back to the ledger"
        );
        eprintln!("the lock was lost in the failover on try {}", attempt + 1);
        let holder: Option<String> = p.get(&key).await.expect("GET");
        assert_eq!(
            holder.as_deref(),
            Some(b.instance()),
            "b holds the lock a held before the failover"
        );
        let refused = FireCounters::get(&b.counters().claims_lost_ledger) - refused_before;
        assert!(refused >= 2, "the ledger refused b each time: {refused}");
        let rows: Vec<_> = env
            .all_runs()
            .await
            .into_iter()
            .filter(|r| r.run_key == run_key)
            .collect();
        assert_eq!(rows.len(), 1, "one row for the fire: {rows:?}");
        assert_eq!(rows[0].claimed_by.as_deref(), Some(a.instance()));
        drop(frozen);
        settled_away_from(master).await;
        env.teardown(&["default"]).await;
        return;
    }
    panic!("in three tries replication always reached the replica before the master froze");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_cluster_locks_spread_over_the_masters_and_filter_every_loser() {
    let env = belfry_testkit::service_env!("noop");
    if !up("Cluster", &CLUSTER).await {
        return;
    }
    let name = "cluster-race";
    let schedule = every(name, "1s", "noop");
    let replicas = race::replicas(&env, name, 3, Some(&cluster_url())).await;
    // One fire at a time (a single SET) ...
    let single = instants("2026-07-26T03:00:00Z", 20);
    let outcomes = race::fire_all(&replicas, &schedule, &single).await;
    race::assert_one_run_each(&env, name, &single, &outcomes).await;
    // ... and batches (concurrent SETs: no pipeline may cross slots).
    let batch = instants("2026-07-26T04:00:00Z", 40);
    let fires: Vec<_> = batch.iter().map(|at| (schedule.clone(), *at)).collect();
    let outcomes: Vec<FireOutcome> = futures::future::join_all(
        replicas
            .iter()
            .map(|r| r.fire_batch(&fires, FireSource::Timer)),
    )
    .await
    .into_iter()
    .flatten()
    .collect();
    race::assert_one_run_each(&env, name, &batch, &outcomes).await;
    assert_eq!(
        race::total(&replicas, |c| &c.lock_fallbacks),
        0,
        "the cluster answered every fire"
    );
    assert_eq!(
        race::total(&replicas, |c| &c.claims_lost_lock),
        2 * 60,
        "the lock filtered every loser"
    );
    // The 60 lock keys are spread over the masters, by hash slot.
    let mut holding = 0;
    for port in CLUSTER {
        if role(port).await.as_deref() != Some("master") {
            continue;
        }
        let mut c = node(port).await.expect("a master answers");
        let keys: Vec<String> = c
            .keys(format!("{}:lock:*", env.topology.namespace()))
            .await
            .expect("KEYS");
        if !keys.is_empty() {
            holding += 1;
        }
    }
    assert!(holding >= 2, "lock keys on {holding} master(s)");
    env.teardown(&["default"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_scheduler_processes_and_a_worker_run_through_a_sentinel_failover() {
    let env = belfry_testkit::service_env!("noop");
    if !up("Sentinel group", &SENTINELS).await {
        return;
    }
    let _group = SENTINEL_GROUP.lock().await;
    let fleet = ProcessFleet::start(
        &env,
        "sentinel-fleet",
        5,
        &[
            Process {
                bin: "belfry-scheduler",
                instance: "sf-s1",
            },
            Process {
                bin: "belfry-scheduler",
                instance: "sf-s2",
            },
            Process {
                bin: "belfry-worker",
                instance: "sf-w1",
            },
        ],
        &[("REDIS_URL", sentinel_url())],
    )
    .await;
    let window_start = Utc::now() + chrono::Duration::seconds(1);
    let before = sentinel_master().await;
    for s in ["sf-s1", "sf-s2"] {
        let node = eventually(
            "/readyz to name the Redis master",
            Duration::from_secs(10),
            || fleet.readyz_node(s, "redis"),
        )
        .await;
        assert!(
            node.ends_with(&format!("master 127.0.0.1:{before}")),
            "{s}: {node}"
        );
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = forced_failover(before).await;
    // Both schedulers move to the new master (their next failed write
    // sends them to the sentinels).
    for s in ["sf-s1", "sf-s2"] {
        eventually(
            "/readyz to name the new master",
            Duration::from_secs(15),
            || async {
                let node = fleet.readyz_node(s, "redis").await?;
                node.ends_with(&format!("master 127.0.0.1:{after}"))
                    .then_some(())
            },
        )
        .await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let window_end = Utc::now() - chrono::Duration::seconds(1);
    let table = fleet.finish(&env, window_start, window_end).await;
    assert!(table.holds(), "{table}");
    assert_eq!(table.rerun, 0, "every run at its first attempt:\n{table}");
    env.teardown(&["default"]).await;
}

/// The TLS set-ups of `scripts/redis-ha` (certificates of
/// `scripts/tls-servers`).
const TLS_SENTINELS: [u16; 3] = [56394, 56395, 56396];
const TLS_CLUSTER: [u16; 6] = [56410, 56411, 56412, 56413, 56414, 56415];

fn tls_dir() -> std::path::PathBuf {
    std::env::var("BELFRY_TLS_DIR").map_or_else(
        |_| std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target/tls")),
        std::path::PathBuf::from,
    )
}

/// The client TLS settings trusting `ca` (a file of the TLS directory).
fn trusting(ca: &str) -> belfry_runtime::ClientTls {
    let settings = belfry_runtime::Settings::from_pairs([(
        "BELFRY_REDIS_TLS_CA",
        tls_dir().join(ca).display().to_string(),
    )]);
    belfry_runtime::ClientTls::from_settings(&settings, "BELFRY_REDIS_TLS")
        .unwrap_or_else(|e| panic!("{e}"))
}

fn tls_url(scheme: &str, ports: &[u16], path: &str) -> String {
    let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    format!("{scheme}://{}{path}", hosts.join(","))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn over_tls_a_sentinel_group_and_a_cluster_filter_every_loser_and_refuse_an_unknown_ca() {
    let env = belfry_testkit::service_env!("noop");
    for port in TLS_SENTINELS.iter().chain(&TLS_CLUSTER) {
        if tokio::net::TcpStream::connect(("127.0.0.1", *port))
            .await
            .is_err()
        {
            belfry_testkit::skip(&format!(
                "the TLS Redis set-ups are not up (nothing answers on 127.0.0.1:{port}); start them with scripts/tls-servers up && scripts/redis-ha up"
            ));
            return;
        }
    }
    let urls = [
        (
            "sentinel",
            tls_url("rediss+sentinel", &TLS_SENTINELS, "/belfry-tls"),
        ),
        ("cluster", tls_url("rediss+cluster", &TLS_CLUSTER, "")),
    ];
    for (label, url) in &urls {
        let name = format!("tls-{label}");
        let schedule = every(&name, "1s", "noop");
        let mut replicas = Vec::new();
        for i in 0..3 {
            let instance = format!("{name}-{i}");
            let lock = belfry_scheduler::ClaimLock::with_tls(
                url,
                &trusting("ca.crt"),
                env.topology.clone(),
                &instance,
                Duration::from_secs(60),
            )
            .unwrap_or_else(|e| panic!("{e}"));
            replicas.push(std::sync::Arc::new(
                belfry_tests::replica_locked(&env, &instance, Some(lock)).await,
            ));
        }
        let fires = instants("2026-07-26T03:00:00Z", 5);
        let outcomes = race::fire_all(&replicas, &schedule, &fires).await;
        race::assert_one_run_each(&env, &name, &fires, &outcomes).await;
        assert_eq!(
            race::total(&replicas, |c| &c.lock_fallbacks),
            0,
            "{label}: TLS answered every fire"
        );
        assert_eq!(
            race::total(&replicas, |c| &c.claims_lost_lock),
            10,
            "{label}: the lock filtered every loser"
        );
        // A CA that did not sign the servers' certificates: refused, never
        // a fallback to plaintext (the claim falls back to Postgres).
        let stranger = belfry_scheduler::ClaimLock::with_tls(
            url,
            &trusting("other-ca.crt"),
            env.topology.clone(),
            "stranger",
            Duration::from_secs(60),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let refused = stranger
            .try_acquire(&name, "tls-probe@2026-07-26T05:00:00Z")
            .await;
        assert!(
            refused.is_err(),
            "{label}: an unknown CA was accepted: {refused:?}"
        );
    }
    env.teardown(&["default"]).await;
}
