//! Alerts (issue 20) on the real ledgers and real receivers: events are
//! recorded in the transaction of the failure (none lost when no replica
//! runs), routed and sent once each even with three replicas racing, a
//! receiver that is down gets its alerts once it is back, a replica that
//! dies holding a delivery does not lose it, throttling folds a burst
//! into one summary and a recovery is told, webhooks are signed (a
//! receiver with another secret refuses them), Slack gets its documented
//! shape, e-mail goes over STARTTLS and never in clear, and a stretch of
//! fires missed while every replica was down is one alert with its count.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use belfry_alert::{AlertDeliverer, AlertsConfig};
use belfry_ledger::{AlertKind, DeliveryRecord, RunStatus};
use belfry_protocol::{JobMessage, ScheduleSpec};
use belfry_runtime::Settings;
use belfry_testkit::{eventually, TestEnv};
use belfry_tests::alert_sink::{SmtpSink, WebhookSink};
use chrono::{SubsecRound, Utc};
use serde_json::Value;

/// The secret the receivers verify with.
const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

/// An alerts configuration from `toml`, with `OPS_SECRET` = [`SECRET`].
fn alerts(toml: &str) -> AlertsConfig {
    alerts_with(toml, &[])
}

/// [`alerts`] with more environment variables.
fn alerts_with(toml: &str, vars: &[(&str, String)]) -> AlertsConfig {
    let mut env = vec![("OPS_SECRET".to_owned(), SECRET.to_owned())];
    env.extend(vars.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
    AlertsConfig::parse(
        toml,
        Path::new("alerts-test.toml"),
        &Settings::from_pairs(env),
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

/// One webhook channel `ops` to `url`, every event, no throttling, quick
/// retries.
fn one_webhook(url: &str) -> AlertsConfig {
    alerts(&format!(
        "retry_initial = \"500ms\"\nretry_max = \"1s\"\n\
         [channels.ops]\ntype = \"webhook\"\nurl = \"{url}\"\nsecret_env = \"OPS_SECRET\"\ntimeout = \"2s\"\n\
         [[routes]]\nchannels = [\"ops\"]\nthrottle = \"0s\"\n"
    ))
}

fn deliverer(env: &TestEnv, config: AlertsConfig, owner: &str) -> AlertDeliverer {
    AlertDeliverer::new(env.ledger.clone(), Some(config), &env.namespace, owner)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A run of `job` enqueued and ended `status` by a worker (one attempt).
async fn ended(env: &TestEnv, job: &str, at_secs_ago: i64, status: RunStatus) -> JobMessage {
    let at = Utc::now().trunc_subsecs(0) - chrono::Duration::seconds(at_secs_ago);
    let message = env.enqueue(job, "noop", serde_json::json!({}), at).await;
    env.finish(&message, "w1", status).await;
    message
}

/// Runs `statement` on `env`'s database, whichever backend.
async fn execute(env: &TestEnv, statement: &str) {
    match (env.ledger.pg_pool(), env.ledger.embedded_file()) {
        (Some(pool), _) => {
            sqlx::query(statement).execute(pool).await.unwrap();
        }
        (None, Some(file)) => {
            sqlx::query(statement).execute(&file.writer).await.unwrap();
        }
        (None, None) => unreachable!("a ledger is Postgres or embedded"),
    }
}

async fn deliveries(env: &TestEnv) -> Vec<DeliveryRecord> {
    env.ledger.alert_deliveries(None, 500).await.unwrap()
}

/// Checks `body` against `docs/alert-webhook.schema.json`: the required
/// fields are there, no field is unknown, and each has its type.
fn assert_matches_schema(body: &Value) {
    let schema: Value =
        serde_json::from_str(include_str!("../../../docs/alert-webhook.schema.json")).unwrap();
    fn check(value: &Value, schema: &Value, path: &str) {
        if let Some(types) = schema.get("type") {
            let types: Vec<&str> = match types {
                Value::String(t) => vec![t.as_str()],
                Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
                _ => vec![],
            };
            let actual = match value {
                Value::Null => "null",
                Value::Bool(_) => "boolean",
                Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
                Value::Number(_) => "number",
                Value::String(_) => "string",
                Value::Array(_) => "array",
                Value::Object(_) => "object",
            };
            assert!(
                types.contains(&actual),
                "{path}: {actual} is not one of {types:?}"
            );
        }
        if let Some(allowed) = schema.get("enum").and_then(Value::as_array) {
            assert!(allowed.contains(value), "{path}: {value} not in the enum");
        }
        if let (Value::Object(fields), Some(props)) = (value, schema.get("properties")) {
            for required in schema["required"].as_array().unwrap() {
                let name = required.as_str().unwrap();
                assert!(fields.contains_key(name), "{path}.{name} is missing");
            }
            for (name, v) in fields {
                let sub = props
                    .get(name)
                    .unwrap_or_else(|| panic!("{path}.{name} is not in the schema"));
                check(v, sub, &format!("{path}.{name}"));
            }
        }
    }
    check(body, &schema, "$");
}

belfry_testkit::both_backends! {
    async fn a_failure_reaches_a_signed_webhook_once_and_a_wrong_secret_is_refused(env: TestEnv) {
        env.declare_default_group(&["noop"]).await;
        let ops = WebhookSink::start(SECRET).await;
        let other = WebhookSink::start("whsec_b3RoZXIgc2VjcmV0IG9mIHRoZSByZWNlaXZlcg==").await;
        let config = alerts(&format!(
            "retry_initial = \"500ms\"\n\
             [channels.ops]\ntype = \"webhook\"\nurl = \"{}\"\nsecret_env = \"OPS_SECRET\"\n\
             [channels.wrong]\ntype = \"webhook\"\nurl = \"{}\"\nsecret_env = \"OPS_SECRET\"\n\
             [[routes]]\nchannels = [\"ops\", \"wrong\"]\nevents = [\"run.failed\"]\nthrottle = \"0s\"\n",
            ops.url(),
            other.url()
        ));
        // The failure is recorded (with its event) before any deliverer
        // exists: nothing depends on a replica watching at that moment.
        let message = ended(&env, "nightly", 60, RunStatus::Failed).await;
        let events = env.ledger.alert_events(10).await.unwrap();
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0].alert_kind(), Some(AlertKind::RunFailed));
        let d = deliverer(&env, config, "r1");
        let report = d.pass_once().await.unwrap();
        assert_eq!((report.routed, report.sent, report.retried), (1, 1, 1), "{report:?}");
        let got = ops.received();
        assert_eq!(got.len(), 1);
        let r = &got[0];
        assert_matches_schema(&r.body);
        assert_eq!(r.body["type"], "run.failed");
        assert_eq!(r.body["data"]["schedule"], "nightly");
        assert_eq!(r.body["data"]["run_key"], message.run_key.as_str());
        assert_eq!(r.body["data"]["run_id"], message.message_id.to_string());
        assert_eq!(r.body["data"]["namespace"], env.namespace.as_str());
        assert_eq!(r.headers["webhook-id"], r.body["data"]["delivery_id"].as_str().unwrap());
        assert_eq!(r.headers["webhook-signature"], r.headers["x-belfry-signature"]);
        assert_eq!(r.headers["x-belfry-event"], "run.failed");
        // The receiver with another secret refused it: retried, the reason kept.
        assert!(other.rejected() >= 1);
        assert!(other.received().is_empty());
        let wrong: Vec<_> = deliveries(&env).await.into_iter().filter(|d| d.channel == "wrong").collect();
        assert_eq!(wrong.len(), 1);
        assert_eq!(wrong[0].status, "pending");
        assert!(wrong[0].last_error.as_deref().unwrap_or("").contains("401"), "{wrong:?}");
        // More passes send nothing again to the receiver that took it.
        tokio::time::sleep(Duration::from_millis(600)).await;
        d.pass_once().await.unwrap();
        assert_eq!(ops.received().len(), 1);
        assert_eq!(d.counters().of("ops").sent, 1);
        assert!(d.counters().of("wrong").attempts_failed >= 2);
        env.teardown(&["default"]).await;
    }
}

belfry_testkit::both_backends! {
    async fn a_replica_without_channels_leaves_alerts_to_one_with_them(env: TestEnv) {
        env.declare_default_group(&["noop"]).await;
        let sink = WebhookSink::start(SECRET).await;
        // A schedule naming a channel the file lacks: that delivery fails
        // with a reason saying so; the configured one is sent.
        let spec = ScheduleSpec {
            name: "nightly".into(),
            every: Some("1h".into()),
            job_type: "noop".into(),
            alerts: Some(vec!["pager".into()]),
            ..ScheduleSpec::default()
        };
        let schedule = belfry_scheduler::Schedule::from_spec(&spec).unwrap();
        env.ledger.upsert_schedule(&schedule.to_stored_row(&spec)).await.unwrap();
        ended(&env, "nightly", 60, RunStatus::Failed).await;
        let bare = AlertDeliverer::new(env.ledger.clone(), None, &env.namespace, "bare").unwrap();
        assert_eq!(bare.pass_once().await.unwrap(), belfry_alert::PassReport::default());
        assert_eq!(env.ledger.unrouted_alerts(10).await.unwrap().len(), 1, "left to others");
        let d = deliverer(&env, one_webhook(&sink.url()), "r1");
        d.pass_once().await.unwrap();
        assert_eq!(sink.received().len(), 1);
        let rows = deliveries(&env).await;
        let pager = rows.iter().find(|r| r.channel == "pager").unwrap();
        assert_eq!(pager.status, "failed");
        assert!(pager.last_error.as_deref().unwrap_or("").contains("no channel \"pager\""), "{pager:?}");
        env.teardown(&["default"]).await;
    }
}

belfry_testkit::both_backends! {
    async fn three_replicas_racing_send_each_alert_once(env: TestEnv) {
        env.declare_default_group(&["noop"]).await;
        let sink = WebhookSink::start(SECRET).await;
        let mut failed = HashSet::new();
        for i in 0..20 {
            let m = ended(&env, &format!("job-{}", i % 4), 100 + i, RunStatus::Failed).await;
            failed.insert(m.message_id.to_string());
        }
        let replicas: Vec<_> = ["r1", "r2", "r3"]
            .iter()
            .map(|r| deliverer(&env, one_webhook(&sink.url()), r))
            .collect();
        for _ in 0..3 {
            let passes = replicas.iter().map(|d| d.pass_once());
            for pass in futures::future::join_all(passes).await {
                pass.unwrap();
            }
        }
        let got = sink.received();
        let ids: HashSet<String> = got.iter().map(|r| r.headers["webhook-id"].clone()).collect();
        let runs: HashSet<String> = got
            .iter()
            .map(|r| r.body["data"]["run_id"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(got.len(), 20, "every failure once: {} received", got.len());
        assert_eq!(ids.len(), 20);
        assert_eq!(runs, failed);
        assert!(deliveries(&env).await.iter().all(|d| d.status == "sent"));
        env.teardown(&["default"]).await;
    }
}

belfry_testkit::both_backends! {
    async fn a_receiver_that_was_down_gets_its_alerts_once_it_is_back(env: TestEnv) {
        env.declare_default_group(&["noop"]).await;
        // Down: its port is free, nothing listens.
        let addr = WebhookSink::start(SECRET).await.stop();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let url = format!("http://{addr}/hook");
        ended(&env, "nightly", 60, RunStatus::Dead).await;
        ended(&env, "hourly", 70, RunStatus::Failed).await;
        let d = deliverer(&env, one_webhook(&url), "r1");
        let report = d.pass_once().await.unwrap();
        assert_eq!((report.sent, report.retried), (0, 2), "{report:?}");
        for row in deliveries(&env).await {
            assert_eq!(row.status, "pending");
            assert!(row.last_error.as_deref().unwrap_or("").contains("connect"), "{row:?}");
        }
        // Back on the same port.
        let sink = WebhookSink::start_on(addr, Some(SECRET)).await;
        eventually("both alerts arrive", Duration::from_secs(15), || async {
            d.pass_once().await.unwrap();
            (sink.received().len() >= 2).then_some(())
        })
        .await;
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            d.pass_once().await.unwrap();
        }
        let kinds: Vec<String> = sink.received().iter().map(|r| r.body["type"].as_str().unwrap().to_owned()).collect();
        assert_eq!(kinds.len(), 2, "once each: {kinds:?}");
        assert!(kinds.contains(&"run.dead".to_owned()) && kinds.contains(&"run.failed".to_owned()));
        env.teardown(&["default"]).await;
    }
}

belfry_testkit::both_backends! {
    async fn a_replica_dying_with_a_delivery_in_hand_does_not_lose_it(env: TestEnv) {
        env.declare_default_group(&["noop"]).await;
        let sink = WebhookSink::start(SECRET).await;
        ended(&env, "nightly", 60, RunStatus::Failed).await;
        let d = deliverer(&env, one_webhook(&sink.url()), "r1");
        d.route_once().await.unwrap();
        // A replica takes it and dies before sending or recording anything.
        let taken = env
            .ledger
            .take_alert_deliveries("dead-replica", &["ops".to_owned()], 10, Duration::from_secs(2))
            .await
            .unwrap();
        assert_eq!(taken.len(), 1);
        // While its lease holds, nobody sends it twice.
        let report = d.deliver_once().await.unwrap();
        assert_eq!(report.sent, 0, "{report:?}");
        // The dead replica's result can never be recorded over a later one.
        tokio::time::sleep(Duration::from_millis(2_200)).await;
        let report = d.deliver_once().await.unwrap();
        assert_eq!(report.sent, 1, "{report:?}");
        assert!(!env
            .ledger
            .finish_alert_delivery(
                taken[0].id,
                "dead-replica",
                taken[0].attempts,
                &belfry_ledger::DeliveryResult::Sent,
            )
            .await
            .unwrap());
        assert_eq!(sink.received().len(), 1);
        let row = &deliveries(&env).await[0];
        assert_eq!((row.status.as_str(), row.attempts), ("sent", 2), "{row:?}");
        env.teardown(&["default"]).await;
    }
}

belfry_testkit::both_backends! {
    async fn throttling_folds_a_burst_into_one_summary_and_a_recovery_is_told(env: TestEnv) {
        env.declare_default_group(&["noop"]).await;
        let spec = ScheduleSpec {
            name: "nightly".into(),
            every: Some("1h".into()),
            job_type: "noop".into(),
            ..ScheduleSpec::default()
        };
        let schedule = belfry_scheduler::Schedule::from_spec(&spec).unwrap();
        env.ledger.upsert_schedule(&schedule.to_stored_row(&spec)).await.unwrap();
        let sink = WebhookSink::start(SECRET).await;
        let config = alerts(&format!(
            "[channels.ops]\ntype = \"webhook\"\nurl = \"{}\"\nsecret_env = \"OPS_SECRET\"\n\
             [[routes]]\nchannels = [\"ops\"]\nevents = [\"run.failed\"]\nthrottle = \"3s\"\n",
            sink.url()
        ));
        let d = deliverer(&env, config, "r1");
        for i in 0..4 {
            ended(&env, "nightly", 600 - i * 60, RunStatus::Failed).await;
            d.pass_once().await.unwrap();
        }
        // The first at once; the second waits for the end of the window
        // carrying the other two.
        assert_eq!(sink.received().len(), 1);
        let statuses: Vec<String> = deliveries(&env).await.iter().map(|d| d.status.clone()).collect();
        assert_eq!(statuses.iter().filter(|s| *s == "folded").count(), 2, "{statuses:?}");
        assert_eq!(statuses.iter().filter(|s| *s == "pending").count(), 1, "{statuses:?}");
        let summary = eventually("the window's summary", Duration::from_secs(10), || async {
            d.pass_once().await.unwrap();
            sink.received().get(1).cloned()
        })
        .await;
        assert_eq!(summary.body["data"]["folded"], 2);
        assert!(summary.body["data"]["summary"].as_str().unwrap().contains("+2 more"), "{}", summary.body);
        // It succeeds again: told at once, whatever the window.
        ended(&env, "nightly", 30, RunStatus::Succeeded).await;
        d.pass_once().await.unwrap();
        let got = sink.received();
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(got[2].body["type"], "schedule.recovered");
        // A second success is not a recovery.
        ended(&env, "nightly", 20, RunStatus::Succeeded).await;
        d.pass_once().await.unwrap();
        assert_eq!(sink.received().len(), 3);
        // Statements that write a finished run's status back unchanged
        // (the outbox marking runs dispatched that a fast worker already
        // finished) are not ends: no failure, no recovery again.
        execute(&env, "UPDATE job_runs SET dispatched_at = NULL").await;
        let failed: Vec<uuid::Uuid> = env
            .all_runs()
            .await
            .iter()
            .filter(|r| r.status_text == "failed")
            .map(|r| r.id)
            .collect();
        assert_eq!(failed.len(), 4);
        assert_eq!(env.ledger.mark_dispatched_many(&failed).await.unwrap(), 4);
        ended(&env, "nightly", 10, RunStatus::Succeeded).await;
        d.pass_once().await.unwrap();
        assert_eq!(sink.received().len(), 3, "{:?}", env.ledger.alert_events(20).await.unwrap());
        env.teardown(&["default"]).await;
    }
}

belfry_testkit::both_backends! {
    async fn slack_gets_its_documented_shape_and_a_revoked_hook_is_given_up(env: TestEnv) {
        env.declare_default_group(&["noop"]).await;
        let slack = WebhookSink::start_unsigned().await;
        let config = alerts_with(
            "public_url = \"https://belfry.example.com/\"\n\
             [channels.team]\ntype = \"slack\"\nurl_env = \"TEAM_HOOK\"\n\
             [[routes]]\nchannels = [\"team\"]\nthrottle = \"0s\"\n",
            &[("TEAM_HOOK", slack.url())],
        );
        let d = deliverer(&env, config, "r1");
        let at = Utc::now().trunc_subsecs(0) - chrono::Duration::seconds(60);
        let message = env.enqueue("report", "noop", serde_json::json!({}), at).await;
        let (id, attempt) = env.start_attempt(&message, "w1", Duration::from_secs(60)).await;
        let mut entry = belfry_testkit::attempt_entry(attempt, "w1", RunStatus::Failed);
        entry.error = Some(format!("<script>alert(1)</script> & {}", "x".repeat(5000)));
        assert!(env
            .ledger
            .end_attempt(id, RunStatus::Failed, &entry, entry.error.as_deref(), None)
            .await
            .unwrap());
        d.pass_once().await.unwrap();
        let got = slack.received();
        assert_eq!(got.len(), 1);
        let body = &got[0].body;
        // https://api.slack.com/messaging/webhooks and the block kit limits.
        let text = body["text"].as_str().unwrap();
        assert!(!text.is_empty() && text.chars().count() <= 3000);
        let blocks = body["blocks"].as_array().unwrap();
        assert!(!blocks.is_empty() && blocks.len() <= 50);
        for block in blocks {
            match block["type"].as_str().unwrap() {
                "header" => {
                    assert_eq!(block["text"]["type"], "plain_text");
                    assert!(block["text"]["text"].as_str().unwrap().chars().count() <= 150);
                }
                "section" => {
                    assert_eq!(block["text"]["type"], "mrkdwn");
                    let t = block["text"]["text"].as_str().unwrap();
                    assert!(t.chars().count() <= 3000);
                    assert!(!t.contains("<script>"), "escaped: {t}");
                }
                "context" => assert!(block["elements"].as_array().unwrap().len() <= 10),
                other => panic!("unexpected block type {other}"),
            }
        }
        assert!(body.to_string().contains("&lt;script&gt;"));
        assert!(body.to_string().contains(&format!("https://belfry.example.com/ui/runs/{id}")));
        // A revoked hook (Slack answers 403): given up at once, with the reason.
        slack.answer(403);
        ended(&env, "other", 50, RunStatus::Dead).await;
        let report = d.pass_once().await.unwrap();
        assert_eq!(report.failed, 1, "{report:?}");
        let failed = env.ledger.alert_deliveries(Some("failed"), 10).await.unwrap();
        assert!(failed[0].last_error.as_deref().unwrap_or("").contains("403"), "{failed:?}");
        assert_eq!(d.counters().of("team").failed, 1);
        env.teardown(&["default"]).await;
    }
}

/// The TLS test material of `scripts/tls-servers`, or `None` after
/// recording a skip (a failure with `BELFRY_REQUIRE_SERVICES=1`).
fn tls_dir() -> Option<PathBuf> {
    let dir = std::env::var("BELFRY_TLS_DIR").map_or_else(
        |_| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target/tls")),
        PathBuf::from,
    );
    if ["ca.crt", "server.crt", "server.key"]
        .iter()
        .all(|f| dir.join(f).is_file())
    {
        Some(dir)
    } else {
        belfry_testkit::skip("the test CA is missing; create it with scripts/tls-servers up");
        None
    }
}

belfry_testkit::both_backends! {
    async fn email_goes_over_starttls_and_never_in_clear(env: TestEnv) {
        let Some(tls) = tls_dir() else { return };
        env.declare_default_group(&["noop"]).await;
        let smtp = SmtpSink::start(Some(&tls)).await;
        let clear = SmtpSink::start(None).await;
        let config = alerts(&format!(
            "retry_initial = \"1s\"\n\
             [channels.mail]\ntype = \"email\"\nsmtp = \"127.0.0.1:{}\"\nca_file = \"{}\"\n\
             from = \"belfry <belfry@example.com>\"\nto = [\"oncall@example.com\"]\ntimeout = \"5s\"\n\
             [channels.clear]\ntype = \"email\"\nsmtp = \"127.0.0.1:{}\"\nca_file = \"{}\"\n\
             from = \"belfry@example.com\"\nto = [\"oncall@example.com\"]\ntimeout = \"5s\"\n\
             [[routes]]\nchannels = [\"mail\", \"clear\"]\nthrottle = \"0s\"\n",
            smtp.addr.port(),
            tls.join("ca.crt").display(),
            clear.addr.port(),
            tls.join("ca.crt").display(),
        ));
        let message = ended(&env, "nightly", 60, RunStatus::Failed).await;
        let d = deliverer(&env, config, "r1");
        let report = d.pass_once().await.unwrap();
        assert_eq!((report.sent, report.retried), (1, 1), "{report:?}");
        let mails = smtp.mails();
        assert_eq!(mails.len(), 1);
        assert!(mails[0].over_tls);
        assert!(mails[0].to[0].contains("oncall@example.com"));
        assert!(mails[0].data.contains("Subject: [belfry "), "{}", mails[0].data);
        assert!(mails[0].data.contains(&message.run_key), "{}", mails[0].data);
        // A relay that offers no STARTTLS gets nothing: retried, never sent in clear.
        assert!(clear.mails().is_empty());
        let row = deliveries(&env).await.into_iter().find(|d| d.channel == "clear").unwrap();
        assert_eq!(row.status, "pending");
        assert!(row.last_error.is_some(), "{row:?}");
        env.teardown(&["default"]).await;
    }
}

belfry_testkit::both_backends! {
    async fn fires_missed_while_every_replica_was_down_are_one_alert_with_their_count(env: TestEnv) {
        env.declare_default_group(&["noop"]).await;
        let sink = WebhookSink::start(SECRET).await;
        let spec = ScheduleSpec {
            name: "every-second".into(),
            every: Some("1s".into()),
            job_type: "noop".into(),
            misfire: Some("skip".into()),
            ..ScheduleSpec::default()
        };
        let schedule = std::sync::Arc::new(belfry_scheduler::Schedule::from_spec(&spec).unwrap());
        env.ledger.upsert_schedule(&schedule.to_stored_row(&spec)).await.unwrap();
        // Its last fire, then every replica stopped for three minutes.
        let now = Utc::now().trunc_subsecs(0);
        let last = now - chrono::Duration::minutes(3);
        let message = env.enqueue("every-second", "noop", serde_json::json!({}), last).await;
        env.finish(&message, "w1", RunStatus::Succeeded).await;
        let missed = schedule.upcoming(last, 400).into_iter().filter(|t| *t <= now).count() as i64;
        // Three replicas come back and each recovers.
        for name in ["a", "b", "c"] {
            let r = belfry_tests::replica(&env, name, Some(&belfry_testkit::redis_url())).await;
            r.recover_after_downtime(std::slice::from_ref(&schedule), now).await.unwrap();
        }
        let d = deliverer(&env, one_webhook(&sink.url()), "r1");
        d.pass_once().await.unwrap();
        let got = sink.received();
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].body["type"], "fire.skipped");
        // Every missed instant but those still within the misfire
        // threshold (the timer's to fire on time).
        let count = got[0].body["data"]["count"].as_i64().unwrap();
        assert!(missed >= 180 && count <= missed && count >= missed - 11, "{count} of {missed}");
        assert!(
            got[0].body["data"]["summary"].as_str().unwrap().contains(&format!("{count} fires skipped")),
            "{}",
            got[0].body
        );
        env.teardown(&["default"]).await;
    }
}

belfry_testkit::both_backends! {
    async fn late_runs_are_alerted_once_across_replicas(env: TestEnv) {
        env.declare_default_group(&["noop"]).await;
        let spec = ScheduleSpec {
            name: "report".into(),
            every: Some("1h".into()),
            job_type: "noop".into(),
            deadline: Some("5s".into()),
            ..ScheduleSpec::default()
        };
        let schedule = belfry_scheduler::Schedule::from_spec(&spec).unwrap();
        env.ledger.upsert_schedule(&schedule.to_stored_row(&spec)).await.unwrap();
        // One run 30 s past its instant, never started; one 1 s past it.
        let now = Utc::now().trunc_subsecs(0);
        let late = env.enqueue("report", "noop", serde_json::json!({}), now - chrono::Duration::seconds(30)).await;
        env.enqueue("report", "noop", serde_json::json!({}), now - chrono::Duration::seconds(1)).await;
        let a = belfry_tests::replica(&env, "a", None).await;
        let b = belfry_tests::replica(&env, "b", None).await;
        assert_eq!(a.report_late_once().await.unwrap(), 1);
        assert_eq!(b.report_late_once().await.unwrap(), 0, "already recorded");
        let events = env.ledger.alert_events(10).await.unwrap();
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0].alert_kind(), Some(AlertKind::RunLate));
        assert_eq!(events[0].run_id, Some(late.message_id));
        assert!(events[0].detail.starts_with("not started"), "{}", events[0].detail);
        env.teardown(&["default"]).await;
    }
}

#[test]
fn a_bad_alerts_file_is_refused_with_what_to_fix() {
    let settings = Settings::from_pairs([("OPS_SECRET", "s"), ("BAD_WHSEC", "whsec_!!!")]);
    let refused = |toml: &str| {
        AlertsConfig::parse(toml, Path::new("a.toml"), &settings)
            .unwrap_err()
            .to_string()
    };
    for (toml, says) in [
        ("[channels.x]\ntype = \"pager\"\n", "use \"webhook\", \"slack\" or \"email\""),
        ("[channels.x]\ntype = \"webhook\"\nurl = \"https://h/x\"\n", "secret_env"),
        ("[channels.x]\ntype = \"webhook\"\nurl = \"https://h/x\"\nsecret_env = \"NOPE\"\n", "NOPE is not set"),
        ("[channels.x]\ntype = \"webhook\"\nurl = \"ftp://h/x\"\nsecret_env = \"OPS_SECRET\"\n", "http"),
        ("[channels.x]\ntype = \"email\"\nsmtp = \"mail.example.com\"\ntls = \"none\"\nfrom = \"a@b.c\"\nto = [\"d@e.f\"]\n", "clear text"),
        ("[channels.x]\ntype = \"email\"\nsmtp = \"m:25\"\nfrom = \"not an address\"\nto = [\"d@e.f\"]\n", "not an e-mail address"),
        ("[[routes]]\nchannels = [\"missing\"]\n", "not defined"),
        ("[channels.x]\ntype = \"webhook\"\nurl = \"https://h/x\"\nsecret_env = \"OPS_SECRET\"\n[[routes]]\nchannels = [\"x\"]\nevents = [\"run.exploded\"]\n", "not an event kind"),
        ("throttle = \"soon\"\n", "throttle"),
        ("[channels.x]\ntype = \"slack\"\nurl = \"https://hooks.slack.com/x\"\n", "url_env"),
        ("[channels.x]\ntype = \"webhook\"\nurl = \"https://h/x\"\nsecret_env = \"BAD_WHSEC\"\n", "not base64"),
        ("colour = \"red\"\n", "unknown field"),
    ] {
        let e = refused(toml);
        assert!(e.contains(says), "{toml:?}: {e}");
    }
    // Secrets never show in a configuration's Debug output.
    let ok = AlertsConfig::parse(
        "[channels.x]\ntype = \"webhook\"\nurl = \"https://h/x\"\nsecret_env = \"OPS_SECRET\"\n",
        Path::new("a.toml"),
        &Settings::from_pairs([("OPS_SECRET", "hunter2-very-secret")]),
    )
    .unwrap();
    assert!(!format!("{ok:?}").contains("hunter2"));
}

/// Starts a real `belfry-scheduler` of `env` as `instance`, alerting
/// through `alerts_file`, logging JSON to `log`; its API address.
async fn scheduler_process(
    env: &TestEnv,
    instance: &str,
    schedules: &Path,
    alerts_file: &Path,
    log: &Path,
) -> (std::process::Child, String) {
    let child =
        std::process::Command::new(belfry_tests::fault::fleet::bin_dir().join("belfry-scheduler"))
            .envs(env.process_env())
            .env("BELFRY_SCHEDULES", schedules)
            .env("BELFRY_INSTANCE", instance)
            .env("BELFRY_ALERTS", alerts_file)
            .env("OPS_SECRET", SECRET)
            .env("BELFRY_API_ADDR", "127.0.0.1:0")
            .env(
                "BELFRY_API_ADMIN_TOKENS",
                "ops:admin-token-0123456789abcdef",
            )
            .env(
                "BELFRY_API_READ_TOKENS",
                "grafana:read-token-0123456789abcdef",
            )
            .env("BELFRY_LOG_FORMAT", "json")
            .env("RUST_LOG", "info")
            .stdout(std::fs::File::create(log).unwrap())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .unwrap();
    let addr = eventually(
        "the API address in the log",
        Duration::from_secs(30),
        || async {
            std::fs::read_to_string(log)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .find_map(|v| {
                    v["message"]
                        .as_str()?
                        .starts_with("API listening")
                        .then(|| v["addr"].as_str().map(str::to_owned))?
                })
        },
    )
    .await;
    (child, format!("http://{addr}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduler_killed_between_a_failure_and_its_alert_loses_nothing() {
    let env = belfry_testkit::service_env!();
    let dir = std::env::temp_dir().join(format!("belfry-alerts-{}", env.namespace));
    std::fs::create_dir_all(&dir).unwrap();
    // A one-shot fire of a type no worker group serves: the replica
    // that claims it records it dead (unroutable), the event with it.
    let schedules = dir.join("schedules.toml");
    std::fs::write(
        &schedules,
        "[[schedule]]\nname = \"orphan\"\nafter = \"1s\"\njob_type = \"nobody-serves-this\"\n",
    )
    .unwrap();
    let sink = WebhookSink::start(SECRET).await;
    // The receiver refuses at first: the first replica's attempts fail,
    // then it is killed (-9) with the alert unsent (holding its lease if
    // the kill comes mid-attempt: the second replica waits it out).
    sink.answer(503);
    let alerts_file = dir.join("alerts.toml");
    std::fs::write(
        &alerts_file,
        format!(
            "retry_initial = \"1s\"\nretry_max = \"1s\"\n\
             [channels.ops]\ntype = \"webhook\"\nurl = \"{}\"\nsecret_env = \"OPS_SECRET\"\ntimeout = \"1s\"\n\
             [[routes]]\nchannels = [\"ops\"]\n",
            sink.url()
        ),
    )
    .unwrap();
    let (mut first, _) = scheduler_process(
        &env,
        "alerts-a",
        &schedules,
        &alerts_file,
        &dir.join("a.log"),
    )
    .await;
    eventually(
        "the replica tried to send the alert",
        Duration::from_secs(30),
        || async { (sink.requests() >= 1).then_some(()) },
    )
    .await;
    first.kill().unwrap();
    first.wait().unwrap();
    let events = env.ledger.alert_events(10).await.unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].alert_kind(), Some(AlertKind::RunDead));
    // The receiver is back; another replica starts and sends it, once.
    sink.answer(200);
    let (second, api) = scheduler_process(
        &env,
        "alerts-b",
        &schedules,
        &alerts_file,
        &dir.join("b.log"),
    )
    .await;
    let got = eventually("the alert arrives", Duration::from_secs(30), || async {
        sink.received().first().cloned()
    })
    .await;
    assert_eq!(got.body["type"], "run.dead");
    assert_eq!(got.body["data"]["schedule"], "orphan");
    assert_eq!(got.body["data"]["event_id"], events[0].id.to_string());

    // The API and the web view of the running replica.
    let http = reqwest::Client::new();
    let admin = "admin-token-0123456789abcdef";
    let read = "read-token-0123456789abcdef";
    let test = |token: &'static str, body: Value| {
        let (http, api) = (http.clone(), api.clone());
        async move {
            http.post(format!("{api}/v1/alerts/test"))
                .bearer_auth(token)
                .json(&body)
                .send()
                .await
                .unwrap()
        }
    };
    assert_eq!(
        test(read, serde_json::json!({"channel": "ops"}))
            .await
            .status(),
        403
    );
    let unknown = test(admin, serde_json::json!({"channel": "pager"})).await;
    assert_eq!(unknown.status(), 422);
    let unknown: Value = unknown.json().await.unwrap();
    assert_eq!(unknown["field"], "channel", "{unknown}");
    let queued = test(
        admin,
        serde_json::json!({"channel": "ops", "note": "hello from the test"}),
    )
    .await;
    assert_eq!(queued.status(), 202);
    let tested = eventually(
        "the test alert arrives",
        Duration::from_secs(15),
        || async {
            sink.received()
                .into_iter()
                .find(|r| r.body["type"] == "alert.test")
        },
    )
    .await;
    assert!(tested.body["data"]["detail"]
        .as_str()
        .unwrap()
        .contains("hello from the test"));
    // The sink has the alert before its sender records it sent (the
    // record follows the receiver's answer): wait for the record.
    let list: Value = eventually(
        "every delivery recorded sent",
        Duration::from_secs(15),
        || async {
            let list: Value = http
                .get(format!("{api}/v1/alerts?limit=10"))
                .bearer_auth(read)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            list["deliveries"]
                .as_array()
                .unwrap()
                .iter()
                .all(|d| d["status"] == "sent")
                .then_some(list)
        },
    )
    .await;
    assert_eq!(list["configured"], true);
    assert_eq!(list["channels"][0]["name"], "ops");
    assert_eq!(list["channels"][0]["type"], "webhook");
    let kinds: Vec<&str> = list["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["kind"].as_str().unwrap())
        .collect();
    assert!(
        kinds.contains(&"run.dead") && kinds.contains(&"alert.test"),
        "{list}"
    );
    assert!(
        list["deliveries"]
            .as_array()
            .unwrap()
            .iter()
            .all(|d| d["status"] == "sent"),
        "{list}"
    );
    let page = http
        .get(format!("{api}/ui"))
        .bearer_auth(admin)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains("Recent alerts") && page.contains("send a test alert"),
        "{page}"
    );
    assert!(page.contains("run.dead") && page.contains("Failed alert deliveries"));
    // Exactly once each, whatever else ran meanwhile.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let dead = sink
        .received()
        .iter()
        .filter(|r| r.body["type"] == "run.dead")
        .count();
    assert_eq!(dead, 1);
    let exit = belfry_testkit::terminate(second).await;
    assert!(exit.success(), "{exit:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

belfry_testkit::both_backends! {
    async fn one_outage_seen_by_several_replicas_is_one_skip_alert(env: TestEnv) {
        let t = Utc::now().trunc_subsecs(0) - chrono::Duration::hours(1);
        let span = |by: &str, after: i64, until: i64| belfry_ledger::SkippedRange {
            job_name: "every-second".into(),
            after: t + chrono::Duration::seconds(after),
            until: t + chrono::Duration::seconds(until),
            skipped: u64::try_from(until - after).unwrap(),
            reason: "skipped by misfire policy \"skip\"".into(),
            recorded_by: by.into(),
        };
        // Three replicas saw the same outage with slightly different ends.
        env.ledger.record_skipped_ranges(&[span("a", 0, 30)]).await.unwrap();
        env.ledger.record_skipped_ranges(&[span("b", 1, 31)]).await.unwrap();
        env.ledger.record_skipped_ranges(&[span("c", 0, 29), span("c", 100, 110)]).await.unwrap();
        let events = env.ledger.alert_events(10).await.unwrap();
        let counts: Vec<i64> = events.iter().rev().map(|e| e.count).collect();
        assert_eq!(counts, vec![30, 10], "one event per outage: {events:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_skipped_by_the_misfire_policy_is_one_skip_alert_not_a_dead_letter() {
    let env = belfry_testkit::service_env!("noop");
    let at = Utc::now().trunc_subsecs(0) - chrono::Duration::minutes(5);
    let message = env.enqueue("late", "noop", serde_json::json!({}), at).await;
    // Claimed on time, never published, now late: the policy skips it.
    sqlx::query(
        "UPDATE job_runs SET next_dispatch_at = now() - interval '1 minute', \
             claimed_at = now() - interval '1 minute' WHERE id = $1",
    )
    .bind(message.message_id)
    .execute(env.ledger.pg_pool().unwrap())
    .await
    .unwrap();
    let skipped = env
        .ledger
        .skip_claimed(
            &[message.message_id],
            "skipped by misfire policy \"fire_once\": claimed on time but not published before it was late",
            "r1",
            Duration::ZERO,
        )
        .await
        .unwrap();
    assert_eq!(skipped, 1);
    let events = env.ledger.alert_events(10).await.unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].alert_kind(), Some(AlertKind::FireSkipped));
    assert_eq!(events[0].run_key.as_deref(), Some(message.run_key.as_str()));
    env.teardown(&["default"]).await;
}
