//! The `belfry` binary against a real API (in-process, port 0) on the real
//! services: every command, its output, and the exit codes scripts rely on.

use std::sync::Arc;

use belfry_server::api::Tokens;
use belfry_testkit::{redis_url, TestEnv};
use belfry_tests::{replica, TestApi};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_belfry");

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

async fn belfry(api: &str, args: &[&str], envs: &[(&str, &str)]) -> Out {
    let out = tokio::process::Command::new(BIN)
        .env_remove("BELFRY_API_URL")
        .env_remove("BELFRY_API_TOKEN")
        .envs(envs.iter().copied())
        .arg("--api")
        .arg(api)
        .args(args)
        .output()
        .await
        .unwrap();
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn ok(out: &Out) -> &str {
    assert_eq!(
        out.code, 0,
        "stdout: {}\nstderr: {}",
        out.stdout, out.stderr
    );
    &out.stdout
}

fn fails(out: &Out, code: i32, mentions: &str) {
    assert_eq!(
        out.code, code,
        "stdout: {}\nstderr: {}",
        out.stdout, out.stderr
    );
    assert!(
        out.stderr.contains(mentions),
        "stderr lacks {mentions:?}: {}",
        out.stderr
    );
}

/// The CLI only talks HTTP to an API: it is tested on the real services
/// when they answer, on the embedded backends otherwise.
async fn setup() -> (TestEnv, TestApi) {
    let env = if TestEnv::services_reachable().await || belfry_testkit::services_required() {
        TestEnv::new().await
    } else {
        TestEnv::embedded().await
    };
    env.declare_default_group(&["noop"]).await;
    let r = Arc::new(replica(&env, "cli-replica", Some(&redis_url())).await);
    let api = TestApi::serve(r, Tokens::default()).await;
    (env, api)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_commands_print_tables_json_and_exit_codes() {
    let (env, api) = setup().await;
    let b = api.base.as_str();
    let added = belfry(
        b,
        &[
            "schedules",
            "add",
            "nightly",
            "--job-type",
            "noop",
            "--cron",
            "0 0 3 * * *",
            "--timezone",
            "Asia/Shanghai",
            "--payload",
            "{\"k\": 1}",
        ],
        &[],
    )
    .await;
    assert!(
        ok(&added).contains("nightly") && added.stdout.contains("0 0 3 * * * (Asia/Shanghai)"),
        "{}",
        added.stdout
    );
    fails(
        &belfry(
            b,
            &[
                "schedules",
                "add",
                "nightly",
                "--job-type",
                "noop",
                "--every",
                "1s",
            ],
            &[],
        )
        .await,
        4,
        "exists",
    );
    fails(
        &belfry(
            b,
            &[
                "schedules",
                "add",
                "bad",
                "--job-type",
                "noop",
                "--cron",
                "61 * * * * *",
            ],
            &[],
        )
        .await,
        5,
        "field `cron`",
    );
    fails(
        &belfry(
            b,
            &[
                "schedules",
                "add",
                "bad",
                "--job-type",
                "noop",
                "--every",
                "1s",
                "--payload",
                "{oops",
            ],
            &[],
        )
        .await,
        2,
        "--payload is not valid JSON",
    );
    fails(
        &belfry(
            b,
            &["schedules", "add", "--file", "/nonexistent/s.toml"],
            &[],
        )
        .await,
        2,
        "cannot read",
    );
    let file = std::env::temp_dir().join(format!("belfry-cli-{}.toml", env.namespace));
    std::fs::write(&file, "[[schedule]]\nname = \"from-file-1\"\nevery = \"1h\"\njob_type = \"noop\"\n\n[[schedule]]\nname = \"from-file-2\"\nevery = \"2h\"\njob_type = \"noop\"\n").unwrap();
    let from_file = belfry(
        b,
        &["schedules", "add", "-f", file.to_str().unwrap(), "--paused"],
        &[],
    )
    .await;
    assert!(
        ok(&from_file).contains("from-file-2") && from_file.stdout.contains("paused"),
        "{}",
        from_file.stdout
    );

    let got = belfry(b, &["schedules", "get", "nightly"], &[]).await;
    assert!(ok(&got).contains("Asia/Shanghai"), "{}", got.stdout);
    fails(
        &belfry(b, &["schedules", "get", "ghost"], &[]).await,
        3,
        "no schedule named",
    );
    let ls = belfry(b, &["schedules", "ls"], &[]).await;
    let lines: Vec<&str> = ok(&ls).lines().collect();
    assert!(
        lines[0].starts_with("NAME") && lines.len() == 4,
        "{}",
        ls.stdout
    );
    let page = belfry(b, &["schedules", "ls", "--limit", "1"], &[]).await;
    assert!(
        ok(&page).contains("(more: --cursor from-file-1"),
        "{}",
        page.stdout
    );
    let all: Value = serde_json::from_str(ok(&belfry(
        b,
        &["--json", "schedules", "ls", "--limit", "1", "--all"],
        &[],
    )
    .await))
    .unwrap();
    assert_eq!(all["schedules"].as_array().unwrap().len(), 3);
    assert!(all["next_cursor"].is_null());

    ok(&belfry(
        b,
        &["schedules", "edit", "nightly", "--cron", "0 30 4 * * *"],
        &[],
    )
    .await);
    let row = env.ledger.schedule("nightly").await.unwrap().unwrap();
    assert_eq!(
        (row.cron.as_deref(), row.timezone.as_str()),
        (Some("0 30 4 * * *"), "Asia/Shanghai")
    );
    assert_eq!(
        row.payload,
        serde_json::json!({"k": 1}),
        "edit keeps the other fields"
    );
    ok(&belfry(b, &["schedules", "edit", "nightly", "--every", "10s"], &[]).await);
    assert_eq!(
        env.ledger
            .schedule("nightly")
            .await
            .unwrap()
            .unwrap()
            .every_ms,
        Some(10_000)
    );
    fails(
        &belfry(
            b,
            &["schedules", "edit", "nightly", "--overlap", "sometimes"],
            &[],
        )
        .await,
        5,
        "field `overlap`",
    );

    assert!(
        ok(&belfry(b, &["schedules", "pause", "nightly"], &[]).await).contains("paused nightly")
    );
    assert!(env.paused("nightly").await);
    ok(&belfry(b, &["schedules", "resume", "nightly"], &[]).await);
    assert!(!env.paused("nightly").await);
    let preview = belfry(b, &["schedules", "preview", "nightly", "-n", "3"], &[]).await;
    assert_eq!(ok(&preview).lines().count(), 3, "{}", preview.stdout);
    let trig = belfry(b, &["schedules", "trigger", "nightly"], &[]).await;
    assert!(
        ok(&trig).starts_with("dispatched run ") && trig.stdout.contains("nightly@manual-"),
        "{}",
        trig.stdout
    );
    let now = chrono::Utc::now();
    let from = (now - chrono::Duration::seconds(40))
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let to = (now - chrono::Duration::seconds(10))
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let bf = belfry(
        b,
        &[
            "schedules",
            "backfill",
            "nightly",
            "--from",
            &from,
            "--to",
            &to,
        ],
        &[],
    )
    .await;
    assert!(
        ok(&bf).contains("instants in") && bf.stdout.contains("dispatched 3"),
        "{}",
        bf.stdout
    );
    fails(
        &belfry(
            b,
            &[
                "schedules",
                "backfill",
                "nightly",
                "--from",
                &to,
                "--to",
                &from,
            ],
            &[],
        )
        .await,
        5,
        "field `to`",
    );

    assert!(ok(&belfry(b, &["schedules", "rm", "nightly"], &[]).await).contains("deleted nightly"));
    fails(
        &belfry(b, &["schedules", "rm", "nightly"], &[]).await,
        3,
        "no schedule named",
    );
    // clap's own usage errors are exit 2.
    assert_eq!(belfry(b, &["schedules", "frobnicate"], &[]).await.code, 2);
    let _ = std::fs::remove_file(file);
    drop(api);
    env.teardown(&["default"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_and_job_commands() {
    let (env, api) = setup().await;
    let b = api.base.as_str();
    let enq = belfry(
        b,
        &[
            "--json",
            "jobs",
            "enqueue",
            "noop",
            "--payload",
            "{\"a\": 1}",
            "--name",
            "adhoc",
            "--key",
            "k-1",
        ],
        &[],
    )
    .await;
    let v: Value = serde_json::from_str(ok(&enq)).unwrap();
    assert_eq!(v["created"], true);
    let id = v["run_id"].as_str().unwrap().to_owned();
    let again = belfry(
        b,
        &["jobs", "enqueue", "noop", "--name", "adhoc", "--key", "k-1"],
        &[],
    )
    .await;
    assert!(
        ok(&again).starts_with("already enqueued"),
        "{}",
        again.stdout
    );
    fails(
        &belfry(b, &["jobs", "enqueue", "no such"], &[]).await,
        5,
        "field `job_type`",
    );
    fails(
        &belfry(b, &["jobs", "enqueue", "noop", "--delay", "whenever"], &[]).await,
        5,
        "field `delay`",
    );

    let show = belfry(b, &["runs", "show", &id], &[]).await;
    assert!(
        ok(&show).contains("adhoc@k-1") && show.stdout.contains("origin         adhoc"),
        "{}",
        show.stdout
    );
    let ls = belfry(b, &["runs", "ls", "--schedule", "adhoc"], &[]).await;
    assert!(
        ok(&ls).lines().nth(1).is_some_and(|l| l.starts_with(&id)),
        "{}",
        ls.stdout
    );
    for i in 0..3 {
        ok(&belfry(
            b,
            &[
                "jobs",
                "enqueue",
                "noop",
                "--name",
                "many",
                "--key",
                &format!("k{i}"),
            ],
            &[],
        )
        .await);
    }
    let page = belfry(
        b,
        &["runs", "ls", "--schedule", "many", "--limit", "2"],
        &[],
    )
    .await;
    assert!(ok(&page).contains("(more: --cursor"), "{}", page.stdout);
    let all: Value = serde_json::from_str(ok(&belfry(
        b,
        &[
            "--json",
            "runs",
            "ls",
            "--schedule",
            "many",
            "--limit",
            "2",
            "--all",
        ],
        &[],
    )
    .await))
    .unwrap();
    assert_eq!(all["runs"].as_array().unwrap().len(), 3);
    fails(
        &belfry(b, &["runs", "ls", "--status", "lost"], &[]).await,
        5,
        "field `status`",
    );
    fails(
        &belfry(b, &["runs", "show", "not-a-uuid"], &[]).await,
        5,
        "not a run id",
    );
    fails(
        &belfry(b, &["runs", "show", &uuid::Uuid::now_v7().to_string()], &[]).await,
        3,
        "no run with id",
    );
    drop(api);
    env.teardown(&["default"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_and_unreachable_apis_have_their_own_exit_codes() {
    let env = belfry_testkit::service_env!();
    let r = Arc::new(replica(&env, "cli-auth", Some(&redis_url())).await);
    let tokens = Tokens::parse(
        Some("ops:admin-secret-0123456789"),
        Some("viewer:read-secret-0123456789"),
    )
    .unwrap();
    let api = TestApi::serve(r, tokens).await;
    let b = api.base.as_str();
    fails(&belfry(b, &["schedules", "ls"], &[]).await, 6, "Bearer");
    fails(
        &belfry(
            b,
            &["--token", "wrong-secret-0123456789", "schedules", "ls"],
            &[],
        )
        .await,
        6,
        "not valid",
    );
    ok(&belfry(
        b,
        &["schedules", "ls"],
        &[("BELFRY_API_TOKEN", "read-secret-0123456789")],
    )
    .await);
    fails(
        &belfry(
            b,
            &[
                "schedules",
                "add",
                "x",
                "--job-type",
                "noop",
                "--every",
                "1h",
            ],
            &[("BELFRY_API_TOKEN", "read-secret-0123456789")],
        )
        .await,
        6,
        "read-only",
    );
    ok(&belfry(
        b,
        &[
            "--token",
            "admin-secret-0123456789",
            "schedules",
            "add",
            "x",
            "--job-type",
            "noop",
            "--every",
            "1h",
        ],
        &[],
    )
    .await);
    // Nothing listens on port 1.
    fails(
        &belfry("http://127.0.0.1:1", &["runs", "ls"], &[]).await,
        7,
        "cannot reach the belfry API",
    );
    drop(api);
    env.teardown(&[]).await;
}
