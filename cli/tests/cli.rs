//! The `belfry` binary against a real API (in-process, port 0) on the real
//! services: every command, its output, and the exit codes scripts rely on.

use belfry_server::api::Tokens;
use belfry_testkit::TestEnv;
use belfry_tests::TestApi;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_belfry");

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Splits a command line on white space, except inside single quotes
/// (which are dropped): `add x --cron '0 0 3 * * *'` is four arguments.
fn argv(line: &str) -> Vec<String> {
    let mut args = Vec::new();
    let mut arg: Option<String> = None;
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                arg.get_or_insert_with(String::new);
            }
            c if c.is_whitespace() && !quoted => args.extend(arg.take()),
            c => arg.get_or_insert_with(String::new).push(c),
        }
    }
    args.extend(arg);
    args
}

/// The `belfry` binary pointed at one API with `--api`.
struct Cli<'a> {
    api: &'a str,
}

impl Cli<'_> {
    /// Runs `belfry --api … {args}` (a command line, see [`argv`]).
    async fn run(&self, args: &str) -> Out {
        self.run_with(args, &[]).await
    }

    /// [`Cli::run`] with `envs` added to its environment.
    async fn run_with(&self, args: &str, envs: &[(&str, &str)]) -> Out {
        let out = tokio::process::Command::new(BIN)
            .env_remove("BELFRY_API_URL")
            .env_remove("BELFRY_API_TOKEN")
            .envs(envs.iter().copied())
            .arg("--api")
            .arg(self.api)
            .args(argv(args))
            .output()
            .await
            .unwrap();
        Out {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Runs `args`, which must succeed: its stdout.
    async fn ok(&self, args: &str) -> String {
        ok(self.run(args).await)
    }

    /// Runs `args`, which must fail with `code` and mention `mentions` on
    /// stderr.
    async fn fails(&self, args: &str, code: i32, mentions: &str) {
        fails(&self.run(args).await, code, mentions);
    }
}

/// The stdout of `out`, which must have exited 0.
fn ok(out: Out) -> String {
    assert_eq!(
        out.code, 0,
        "stdout: {}\nstderr: {}",
        out.stdout, out.stderr
    );
    out.stdout
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
    let (_, api) = TestApi::of_replica(&env, "cli-replica", Tokens::default()).await;
    (env, api)
}

#[test]
fn command_lines_split_on_white_space_outside_quotes() {
    assert_eq!(
        argv(" add  x --cron '0 0 3 * * *' --payload '{\"k\": 1}' --key ''"),
        [
            "add",
            "x",
            "--cron",
            "0 0 3 * * *",
            "--payload",
            "{\"k\": 1}",
            "--key",
            ""
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_commands_print_tables_json_and_exit_codes() {
    let (env, api) = setup().await;
    let cli = Cli { api: &api.base };
    let added = cli
        .ok(
            "schedules add nightly --job-type noop --cron '0 0 3 * * *' \
             --timezone Asia/Shanghai --payload '{\"k\": 1}'",
        )
        .await;
    assert!(
        added.contains("nightly") && added.contains("0 0 3 * * * (Asia/Shanghai)"),
        "{added}"
    );
    cli.fails(
        "schedules add nightly --job-type noop --every 1s",
        4,
        "exists",
    )
    .await;
    cli.fails(
        "schedules add bad --job-type noop --cron '61 * * * * *'",
        5,
        "field `cron`",
    )
    .await;
    cli.fails(
        "schedules add bad --job-type noop --every 1s --payload {oops",
        2,
        "--payload is not valid JSON",
    )
    .await;
    cli.fails("schedules add --file /nonexistent/s.toml", 2, "cannot read")
        .await;
    let file = std::env::temp_dir().join(format!("belfry-cli-{}.toml", env.namespace));
    std::fs::write(&file, "[[schedule]]\nname = \"from-file-1\"\nevery = \"1h\"\njob_type = \"noop\"\n\n[[schedule]]\nname = \"from-file-2\"\nevery = \"2h\"\njob_type = \"noop\"\n").unwrap();
    let from_file = cli
        .ok(&format!("schedules add -f '{}' --paused", file.display()))
        .await;
    assert!(
        from_file.contains("from-file-2") && from_file.contains("paused"),
        "{from_file}"
    );

    let got = cli.ok("schedules get nightly").await;
    assert!(got.contains("Asia/Shanghai"), "{got}");
    cli.fails("schedules get ghost", 3, "no schedule named")
        .await;
    let ls = cli.ok("schedules ls").await;
    let lines: Vec<&str> = ls.lines().collect();
    assert!(lines[0].starts_with("NAME") && lines.len() == 4, "{ls}");
    let page = cli.ok("schedules ls --limit 1").await;
    assert!(page.contains("(more: --cursor from-file-1"), "{page}");
    let all: Value =
        serde_json::from_str(&cli.ok("--json schedules ls --limit 1 --all").await).unwrap();
    assert_eq!(all["schedules"].as_array().unwrap().len(), 3);
    assert!(all["next_cursor"].is_null());

    cli.ok("schedules edit nightly --cron '0 30 4 * * *'").await;
    let row = env.schedule("nightly").await;
    assert_eq!(
        (row.cron.as_deref(), row.timezone.as_str()),
        (Some("0 30 4 * * *"), "Asia/Shanghai")
    );
    assert_eq!(
        row.payload,
        serde_json::json!({"k": 1}),
        "edit keeps the other fields"
    );
    cli.ok("schedules edit nightly --every 10s").await;
    assert_eq!(env.schedule("nightly").await.every_ms, Some(10_000));
    cli.fails(
        "schedules edit nightly --overlap sometimes",
        5,
        "field `overlap`",
    )
    .await;

    assert!(cli
        .ok("schedules pause nightly")
        .await
        .contains("paused nightly"));
    assert!(env.paused("nightly").await);
    cli.ok("schedules resume nightly").await;
    assert!(!env.paused("nightly").await);
    let preview = cli.ok("schedules preview nightly -n 3").await;
    assert_eq!(preview.lines().count(), 3, "{preview}");
    let trig = cli.ok("schedules trigger nightly").await;
    assert!(
        trig.starts_with("dispatched run ") && trig.contains("nightly@manual-"),
        "{trig}"
    );
    let now = chrono::Utc::now();
    let from = (now - chrono::Duration::seconds(40))
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let to = (now - chrono::Duration::seconds(10))
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let bf = cli
        .ok(&format!(
            "schedules backfill nightly --from {from} --to {to}"
        ))
        .await;
    assert!(
        bf.contains("instants in") && bf.contains("dispatched 3"),
        "{bf}"
    );
    cli.fails(
        &format!("schedules backfill nightly --from {to} --to {from}"),
        5,
        "field `to`",
    )
    .await;

    assert!(cli
        .ok("schedules rm nightly")
        .await
        .contains("deleted nightly"));
    cli.fails("schedules rm nightly", 3, "no schedule named")
        .await;
    // clap's own usage errors are exit 2.
    assert_eq!(cli.run("schedules frobnicate").await.code, 2);
    let _ = std::fs::remove_file(file);
    drop(api);
    env.teardown(&["default"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_and_job_commands() {
    let (env, api) = setup().await;
    let cli = Cli { api: &api.base };
    let v: Value = serde_json::from_str(
        &cli.ok("--json jobs enqueue noop --payload '{\"a\": 1}' --name adhoc --key k-1")
            .await,
    )
    .unwrap();
    assert_eq!(v["created"], true);
    let id = v["run_id"].as_str().unwrap().to_owned();
    let again = cli.ok("jobs enqueue noop --name adhoc --key k-1").await;
    assert!(again.starts_with("already enqueued"), "{again}");
    cli.fails("jobs enqueue 'no such'", 5, "field `job_type`")
        .await;
    cli.fails("jobs enqueue noop --delay whenever", 5, "field `delay`")
        .await;

    let show = cli.ok(&format!("runs show {id}")).await;
    assert!(
        show.contains("adhoc@k-1") && show.contains("origin         adhoc"),
        "{show}"
    );
    let ls = cli.ok("runs ls --schedule adhoc").await;
    assert!(
        ls.lines().nth(1).is_some_and(|l| l.starts_with(&id)),
        "{ls}"
    );
    for i in 0..3 {
        cli.ok(&format!("jobs enqueue noop --name many --key k{i}"))
            .await;
    }
    let page = cli.ok("runs ls --schedule many --limit 2").await;
    assert!(page.contains("(more: --cursor"), "{page}");
    let all: Value = serde_json::from_str(
        &cli.ok("--json runs ls --schedule many --limit 2 --all")
            .await,
    )
    .unwrap();
    assert_eq!(all["runs"].as_array().unwrap().len(), 3);
    cli.fails("runs ls --status lost", 5, "field `status`")
        .await;
    cli.fails("runs show not-a-uuid", 5, "not a run id").await;
    // No worker serves `noop` here: the run waits, and is cancelled at once.
    let cancelled = cli
        .ok(&format!("runs cancel {id} --reason 'not needed'"))
        .await;
    assert_eq!(cancelled, format!("run {id} cancelled\n"));
    let show = cli.ok(&format!("runs show {id}")).await;
    assert!(
        show.contains("cancelled") && show.contains("cancelled by anonymous: not needed"),
        "{show}"
    );
    cli.fails(&format!("runs cancel {id}"), 4, "already finished")
        .await;
    // A run with a follow-up on any end: cancelled, its follow-up enqueued
    // by the follow-up pass, and both shown linked.
    let made: Value = reqwest::Client::new()
        .post(format!("{}/v1/jobs", api.base))
        .json(
            &serde_json::json!({"job_type": "noop", "name": "parent", "key": "k-2", "delay": "1h",
                                  "on_finish": [{"name": "cleanup", "job_type": "noop"}]}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let parent = made["run_id"].as_str().unwrap().to_owned();
    cli.ok(&format!("runs cancel {parent}")).await;
    let pass = env.ledger.settle_follow_ups(200, "cli-test").await.unwrap();
    assert_eq!(
        pass.enqueued,
        [("cleanup".to_owned(), "cleanup@k-2".to_owned())]
    );
    let show = cli.ok(&format!("runs show {parent}")).await;
    assert!(
        show.contains("follow-ups:") && show.contains("cleanup@k-2"),
        "{show}"
    );
    let child: Value =
        serde_json::from_str(&cli.ok(&format!("--json runs show {parent}")).await).unwrap();
    let child_id = child["children"][0]["id"].as_str().unwrap().to_owned();
    let show = cli.ok(&format!("runs show {child_id}")).await;
    assert!(
        show.contains("parents:") && show.contains("parent@k-2"),
        "{show}"
    );
    cli.fails(
        &format!("runs show {}", uuid::Uuid::now_v7()),
        3,
        "no run with id",
    )
    .await;
    drop(api);
    env.teardown(&["default"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_and_unreachable_apis_have_their_own_exit_codes() {
    let env = belfry_testkit::service_env!();
    let tokens = Tokens::parse(
        Some("ops:admin-secret-0123456789"),
        Some("viewer:read-secret-0123456789"),
    )
    .unwrap();
    let (_, api) = TestApi::of_replica(&env, "cli-auth", tokens).await;
    let cli = Cli { api: &api.base };
    let reader = [("BELFRY_API_TOKEN", "read-secret-0123456789")];
    cli.fails("schedules ls", 6, "Bearer").await;
    cli.fails(
        "--token wrong-secret-0123456789 schedules ls",
        6,
        "not valid",
    )
    .await;
    ok(cli.run_with("schedules ls", &reader).await);
    fails(
        &cli.run_with("schedules add x --job-type noop --every 1h", &reader)
            .await,
        6,
        "read-only",
    );
    cli.ok("--token admin-secret-0123456789 schedules add x --job-type noop --every 1h")
        .await;
    // Nothing listens on port 1.
    Cli {
        api: "http://127.0.0.1:1",
    }
    .fails("runs ls", 7, "cannot reach the belfry API")
    .await;
    drop(api);
    env.teardown(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alert_commands_list_channels_and_deliveries_and_send_a_test() {
    use std::sync::Arc;

    let (env, _) = setup().await;
    let sink = belfry_tests::alert_sink::WebhookSink::start("cli-alert-secret").await;
    let config = belfry_alert::AlertsConfig::parse(
        &format!(
            "[channels.ops]\ntype = \"webhook\"\nurl = \"{}\"\nsecret_env = \"S\"\n\
             [[routes]]\nchannels = [\"ops\"]\n",
            sink.url()
        ),
        std::path::Path::new("alerts.toml"),
        &belfry_runtime::Settings::from_pairs([("S", "cli-alert-secret")]),
    )
    .unwrap();
    let alerts = Arc::new(
        belfry_alert::AlertDeliverer::new(env.ledger.clone(), Some(config), &env.namespace, "cli")
            .unwrap(),
    );
    let replica = Arc::new(belfry_tests::replica(&env, "cli-alerts", None).await);
    let api = TestApi::serve_state(
        belfry_server::api::ApiState::new(replica, Tokens::default()).with_alerts(alerts.clone()),
    )
    .await;
    let cli = Cli { api: &api.base };
    let out = cli.ok("alerts test ops --note 'from the cli'").await;
    assert!(out.contains("test alert to ops queued"), "{out}");
    alerts.pass_once().await.unwrap();
    assert_eq!(sink.received().len(), 1);
    let out = cli.ok("alerts ls").await;
    for needle in [
        "CHANNEL",
        "ops",
        "webhook",
        "alert.test",
        "sent",
        "from the cli",
    ] {
        assert!(out.contains(needle), "{needle}: {out}");
    }
    let json: Value =
        serde_json::from_str(&cli.ok("--json alerts ls --status sent").await).unwrap();
    assert_eq!(json["deliveries"].as_array().unwrap().len(), 1);
    cli.fails("alerts test pager", 5, "no alert channel").await;
    cli.fails("alerts ls --status lost", 5, "not a delivery status")
        .await;
}

/// Logs two lines and a progress report, waits a moment (so a follower
/// sees the run running), logs a last line and succeeds.
#[derive(Clone, Default)]
struct Chatter;

impl belfry_worker::Job for Chatter {
    const TYPE: &'static str = "chatter";
    type Payload = Value;
    async fn run(
        &self,
        ctx: belfry_worker::JobContext,
        _: Value,
    ) -> Result<(), belfry_worker::JobError> {
        ctx.log(tracing::Level::INFO, "first");
        ctx.log_with(
            tracing::Level::WARN,
            "second",
            serde_json::json!({"rows": 2}),
        );
        ctx.progress(1, Some(2), "half");
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
        ctx.log(tracing::Level::INFO, "last");
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_logs_prints_a_runs_log_and_follows_it_to_the_end() {
    let (env, api) = setup().await;
    env.declare_default_group(&["noop", "chatter"]).await;
    let registry = belfry_worker::Registry::builder()
        .job(Chatter)
        .build()
        .unwrap();
    let worker = belfry_tests::serve(&env, registry, &[]).await;
    let cli = Cli { api: &api.base };
    let m = env
        .enqueue("chatter-job", "chatter", Value::Null, belfry_tests::t0())
        .await;
    let id = m.message_id.to_string();
    // Started while the run waits or runs: it ends on its own once the run
    // has ended and its log is complete.
    let followed = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        cli.run(&format!("runs logs {id} --follow")),
    )
    .await
    .expect("--follow ends once the run has ended");
    let text = ok(followed);
    let shown: Vec<&str> = text.lines().collect();
    assert_eq!(shown.len(), 6, "{text}");
    assert_eq!(shown[0], "── attempt 1 ──");
    assert!(shown[1].ends_with("INFO  first"), "{text}");
    assert!(shown[2].ends_with("WARN  second {\"rows\":2}"), "{text}");
    assert!(shown[3].ends_with("INFO  [1/2] half"), "{text}");
    assert!(shown[4].ends_with("INFO  last"), "{text}");
    assert_eq!(shown[5], "── run succeeded ──");
    // Without --follow: what is stored, no end line; from a cursor: the rest.
    let once = cli.ok(&format!("runs logs {id}")).await;
    assert_eq!(once.lines().count(), 5, "{once}");
    let rest = cli.ok(&format!("--json runs logs {id} --after 1.1")).await;
    let rest: Vec<Value> = rest
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rest.len(), 2);
    assert_eq!(rest[0]["kind"], "progress");
    assert_eq!(rest[1]["message"], "last");
    cli.fails(&format!("runs logs {id} --after soon"), 5, "after")
        .await;
    cli.fails("runs logs not-a-run", 5, "not a run id").await;
    worker.stop().await;
    env.teardown(&["default"]).await;
}
