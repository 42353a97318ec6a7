//! TLS to every service (issue 18), against real servers that accept TLS
//! only: a Postgres with `ssl = on` and no plaintext `pg_hba` line, a
//! Redis with only a TLS port, and a RabbitMQ node with a TLS listener,
//! all started by `scripts/tls-servers up` (which `scripts/test` runs)
//! with a CA made at test time. Each client verifies the server's
//! certificate: the right CA connects, an unrelated CA is refused (never a
//! fallback to plaintext), and the two binaries run a schedule end to end
//! with every connection over TLS.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use belfry_broker::Broker;
use belfry_ledger::Ledger;
use belfry_protocol::Topology;
use belfry_runtime::{ClientTls, Settings};
use belfry_scheduler::lock::LockOutcome;
use belfry_scheduler::ClaimLock;
use belfry_testkit::{eventually, noop_every_second, temp_schedule_file, terminate, Reaper};
use belfry_tests::fault::fleet::bin_dir;
use sqlx::Connection as _;

const POSTGRES: &str = "localhost:55432";
const REDIS: &str = "localhost:56379";
const RABBITMQ: &str = "localhost:55671";

/// The servers of `scripts/tls-servers` and the certificates it made.
struct TlsServers {
    dir: PathBuf,
}

impl TlsServers {
    /// The running servers, or `None` after recording a skip (a failure
    /// with `BELFRY_REQUIRE_SERVICES=1`).
    async fn up() -> Option<Self> {
        let dir = std::env::var("BELFRY_TLS_DIR").map_or_else(
            |_| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target/tls")),
            PathBuf::from,
        );
        let missing = ["ca.crt", "other-ca.crt", "client.crt", "client.key"]
            .into_iter()
            .find(|f| !dir.join(f).is_file());
        let mut why = missing.map(|f| format!("{} is missing", dir.join(f).display()));
        for addr in [POSTGRES, REDIS, RABBITMQ] {
            if why.is_none() && tokio::net::TcpStream::connect(addr).await.is_err() {
                why = Some(format!("nothing answers on {addr}"));
            }
        }
        match why {
            None => Some(Self { dir }),
            Some(why) => {
                belfry_testkit::skip(&format!(
                    "the TLS servers are not up ({why}); start them with scripts/tls-servers up"
                ));
                None
            }
        }
    }

    fn file(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    /// A `verify-full` URL of `database` trusting the CA in `ca`.
    fn database_url(&self, database: &str, ca: &str) -> String {
        format!(
            "postgres://postgres@{POSTGRES}/{database}?sslmode=verify-full&sslrootcert={}",
            self.file(ca)
        )
    }

    /// The `BELFRY_{service}_TLS_*` settings trusting `ca`, with the
    /// client certificate when `identity`.
    fn settings(&self, service: &str, ca: &str, identity: bool) -> Vec<(String, String)> {
        let mut vars = vec![(format!("BELFRY_{service}_TLS_CA"), self.file(ca))];
        if identity {
            vars.push((
                format!("BELFRY_{service}_TLS_CERT"),
                self.file("client.crt"),
            ));
            vars.push((format!("BELFRY_{service}_TLS_KEY"), self.file("client.key")));
        }
        vars
    }

    fn client_tls(&self, service: &str, ca: &str, identity: bool) -> ClientTls {
        let settings = Settings::from_pairs(self.settings(service, ca, identity));
        ClientTls::from_settings(&settings, &format!("BELFRY_{service}_TLS")).unwrap()
    }
}

fn namespace() -> String {
    format!("tls{}", &uuid::Uuid::new_v4().simple().to_string()[..10])
}

#[tokio::test]
async fn postgres_over_tls_verifies_the_server_and_never_falls_back() {
    let Some(tls) = TlsServers::up().await else {
        return;
    };
    let ledger = Ledger::connect(&tls.database_url("postgres", "ca.crt"), 2)
        .await
        .unwrap();
    let pool = ledger.pg_pool().unwrap();
    let encrypted: bool =
        sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(pool)
            .await
            .unwrap();
    assert!(encrypted, "the ledger's connection is not encrypted");
    let wrong_ca = Ledger::connect(&tls.database_url("postgres", "other-ca.crt"), 1)
        .await
        .unwrap_err()
        .to_string();
    assert!(wrong_ca.contains("certificate"), "{wrong_ca}");
    let plaintext = format!("postgres://postgres@{POSTGRES}/postgres?sslmode=disable");
    let refused = Ledger::connect(&plaintext, 1)
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains("no encryption"), "{refused}");
}

#[tokio::test]
async fn redis_over_tls_verifies_the_server() {
    let Some(tls) = TlsServers::up().await else {
        return;
    };
    let topology = Topology::new(&namespace()).unwrap();
    let lock = |url: &str, tls: ClientTls| {
        ClaimLock::with_tls(
            url,
            &tls,
            topology.clone(),
            "tls-test",
            Duration::from_secs(5),
        )
        .unwrap()
    };
    let url = format!("rediss://{REDIS}/");
    for identity in [false, true] {
        let lock = lock(&url, tls.client_tls("REDIS", "ca.crt", identity));
        let key = format!("k@{identity}");
        let first = lock.try_acquire("tls", &key).await.unwrap();
        let second = lock.try_acquire("tls", &key).await.unwrap();
        assert_eq!(
            (first, second),
            (LockOutcome::Acquired, LockOutcome::HeldElsewhere)
        );
    }
    let wrong_ca = lock(&url, tls.client_tls("REDIS", "other-ca.crt", false));
    assert!(wrong_ca.try_acquire("tls", "other").await.is_err());
    let plaintext = lock(&format!("redis://{REDIS}/"), ClientTls::default());
    assert!(plaintext.try_acquire("tls", "plain").await.is_err());
}

#[tokio::test]
async fn rabbitmq_over_tls_verifies_the_server() {
    let Some(tls) = TlsServers::up().await else {
        return;
    };
    let url = format!("amqps://guest:guest@{RABBITMQ}/%2f");
    for identity in [false, true] {
        let topology = Topology::new(&namespace()).unwrap();
        let broker = Broker::connect_tls(
            &url,
            &tls.client_tls("AMQP", "ca.crt", identity),
            topology,
            "belfry tls test",
        )
        .await
        .unwrap();
        broker.declare_core().await.unwrap();
        broker.delete_namespace(&[]).await.unwrap();
        broker.close().await;
    }
    let wrong_ca = Broker::connect_tls(
        &url,
        &tls.client_tls("AMQP", "other-ca.crt", false),
        Topology::new(&namespace()).unwrap(),
        "belfry tls test",
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(wrong_ca.contains("certificate"), "{wrong_ca}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binaries_run_a_schedule_with_every_connection_over_tls() {
    let Some(tls) = TlsServers::up().await else {
        return;
    };
    // A database of its own on the TLS server.
    let ns = namespace();
    let mut admin = sqlx::PgConnection::connect(&tls.database_url("postgres", "ca.crt"))
        .await
        .unwrap();
    sqlx::query(&format!("CREATE DATABASE {ns}"))
        .execute(&mut admin)
        .await
        .unwrap();
    let schedules = temp_schedule_file(&noop_every_second("over-tls"));
    let mut env = vec![
        ("DATABASE_URL".to_owned(), tls.database_url(&ns, "ca.crt")),
        ("REDIS_URL".to_owned(), format!("rediss://{REDIS}/")),
        (
            "AMQP_URL".to_owned(),
            format!("amqps://guest:guest@{RABBITMQ}/%2f"),
        ),
        ("BELFRY_NAMESPACE".to_owned(), ns.clone()),
        (
            "BELFRY_SCHEDULES".to_owned(),
            schedules.display().to_string(),
        ),
        ("RUST_LOG".to_owned(), "warn".to_owned()),
    ];
    env.extend(tls.settings("REDIS", "ca.crt", true));
    env.extend(tls.settings("AMQP", "ca.crt", true));
    let spawn = |binary: &str| {
        Command::new(bin_dir().join(binary))
            .envs(env.iter().cloned())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap()
    };
    let mut processes = Reaper(vec![spawn("belfry-scheduler"), spawn("belfry-worker")]);
    let ledger = Ledger::connect(&tls.database_url(&ns, "ca.crt"), 2)
        .await
        .unwrap();
    let pool = ledger.pg_pool().unwrap().clone();
    eventually(
        "three runs to succeed over TLS",
        Duration::from_secs(60),
        || async {
            let done: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM job_runs WHERE job_name = 'over-tls' AND status = 'succeeded'",
            )
            .fetch_one(&pool)
            .await
            .ok()?;
            (done >= 3).then_some(())
        },
    )
    .await;
    // The replica took each fire's lock in the TLS Redis (it would claim
    // through the database alone if it could not): the lock of a recorded
    // fire is still held there, by the replica, when a probe asks for it.
    let run_key: String = sqlx::query_scalar(
        "SELECT run_key FROM job_runs WHERE job_name = 'over-tls' ORDER BY scheduled_at DESC LIMIT 1",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let probe = ClaimLock::with_tls(
        &format!("rediss://{REDIS}/"),
        &tls.client_tls("REDIS", "ca.crt", false),
        Topology::new(&ns).unwrap(),
        "tls-probe",
        Duration::from_secs(5),
    )
    .unwrap();
    assert_eq!(
        probe.try_acquire("over-tls", &run_key).await.unwrap(),
        LockOutcome::HeldElsewhere,
        "the replica did not take its lock in the TLS Redis"
    );
    for process in processes.0.drain(..) {
        assert!(terminate(process).await.success());
    }
    pool.close().await;
    let _ = sqlx::query(&format!("DROP DATABASE {ns} WITH (FORCE)"))
        .execute(&mut admin)
        .await;
    let _ = std::fs::remove_file(schedules);
}
