//! The REST API against the real services: every endpoint, its errors,
//! auth and pagination, and (last test) the operator's story through the
//! API alone on two replicas.

use std::sync::Arc;
use std::time::Duration;

use belfry_ledger::{AttemptEntry, NewRun, RunStatus};
use belfry_protocol::JobOptions;
use belfry_scheduler::Replica;
use belfry_server::api::Tokens;
use belfry_testkit::{redis_url, TestEnv, DEAD_REDIS_URL};
use belfry_tests::{replica, TestApi};
use chrono::{DateTime, SubsecRound, Utc};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

pub(crate) const ADMIN: &str = "ops:admin-secret-0123456789";
pub(crate) const READ: &str = "grafana:read-secret-0123456789";

pub(crate) async fn call(
    method: Method,
    url: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let client = reqwest::Client::new();
    let mut req = client.request(method, url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.unwrap_or_else(|e| panic!("{url}: {e}"));
    let status = resp.status();
    let text = resp.text().await.unwrap();
    let value = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{url} answered non-JSON ({e}): {text}"))
    };
    (status, value)
}

pub(crate) async fn raw(method: Method, url: &str, body: Vec<u8>) -> (StatusCode, Value) {
    let resp = reqwest::Client::new()
        .request(method, url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

pub(crate) fn assert_error(
    got: &(StatusCode, Value),
    status: StatusCode,
    code: &str,
    field: Option<&str>,
) {
    assert_eq!(got.0, status, "{:?}", got.1);
    assert_eq!(got.1["error"], code, "{:?}", got.1);
    assert!(
        got.1["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{:?}",
        got.1
    );
    if let Some(f) = field {
        assert_eq!(got.1["field"], f, "{:?}", got.1);
    }
}

pub(crate) async fn open_api(env: &TestEnv) -> TestApi {
    TestApi::of_replica(env, "api-replica", Tokens::default())
        .await
        .1
}

/// The API of a new replica `instance` of `env` guarded by the tokens
/// `ADMIN` and `READ`, and their secrets: `(replica, api, admin, read)`.
pub(crate) async fn guarded_api(
    env: &TestEnv,
    instance: &str,
) -> (Arc<Replica>, TestApi, &'static str, &'static str) {
    let tokens = Tokens::parse(Some(ADMIN), Some(READ)).unwrap();
    let (r, api) = TestApi::of_replica(env, instance, tokens).await;
    (r, api, secret(ADMIN), secret(READ))
}

/// The secret of a `name:secret` token.
/// The stored run an enqueue answered with.
async fn enqueued_run(env: &TestEnv, answer: &Value) -> belfry_ledger::RunRecord {
    env.ledger
        .run(answer["run_id"].as_str().unwrap().parse().unwrap())
        .await
        .unwrap()
        .unwrap()
}

pub(crate) fn secret(token: &str) -> &str {
    token.split_once(':').unwrap().1
}

belfry_testkit::both_backends! {
    async fn schedules_create_read_replace_pause_delete_with_errors(env: TestEnv) {
        let api = open_api(&env).await;
        let s = |p: &str| api.url(&format!("/v1/schedules{p}"));
        let spec = json!({"name": "nightly", "cron": "0 0 3 * * *", "timezone": "Asia/Shanghai",
                          "job_type": "noop", "payload": {"k": 1}, "retry": {"max_attempts": 3},
                          "concurrency": 2, "concurrency_key": "{payload.k}",
                          "rate_limit": "10/1m", "rate_limit_key": "{payload.k}",
                          "priority": "low"});
        let created = call(Method::POST, &s(""), None, Some(spec.clone())).await;
        assert_eq!(created.0, StatusCode::CREATED, "{:?}", created.1);
        assert_eq!(created.1["cron"], "0 0 3 * * *");
        assert_eq!(created.1["paused"], false);
        assert!(created.1["updated_at"].is_string());
        // The stored definition is what the file would hold.
        let row = env.schedule("nightly").await;
        assert_eq!(row.timezone, "Asia/Shanghai");
        assert_eq!(row.payload, json!({"k": 1}));

        let got = call(Method::GET, &s("/nightly"), None, None).await;
        assert_eq!(got.0, StatusCode::OK);
        assert_eq!(got.1["retry"]["max_attempts"], 3);
        assert_eq!(
            (&got.1["concurrency"], &got.1["concurrency_key"]),
            (&json!(2), &json!("{payload.k}"))
        );
        assert_eq!(
            (&got.1["rate_limit"], &got.1["rate_limit_key"]),
            (&json!("10/1m"), &json!("{payload.k}"))
        );
        assert_eq!(got.1["priority"], "low");
        assert_error(
            &call(Method::POST, &s(""), None, Some(spec.clone())).await,
            StatusCode::CONFLICT,
            "conflict",
            Some("name"),
        );

        // Bad inputs: each names its field, nothing is stored.
        let bad = |patch: Value| {
            let mut b = spec.clone();
            b["name"] = json!("other");
            for (k, v) in patch.as_object().unwrap() {
                if v.is_null() {
                    b.as_object_mut().unwrap().remove(k);
                } else {
                    b[k] = v.clone();
                }
            }
            b
        };
        for (patch, field) in [
            (json!({"cron": "61 * * * * *"}), "cron"),
            (json!({"timezone": "Mars/Olympus"}), "timezone"),
            (json!({"every": "5s"}), "every"),
            (json!({"evry": "5s"}), "evry"),
            (json!({"name": "has space"}), "name"),
            (json!({"name": ""}), "name"),
            (json!({"name": "x".repeat(101)}), "name"),
            (json!({"job_type": "a*b"}), "job_type"),
            (json!({"job_type": null}), "job_type"),
            (json!({"retry": {"max_attempts": 0}}), "retry.max_attempts"),
            (
                json!({"retry": {"max_attempts": "three"}}),
                "retry.max_attempts",
            ),
            (json!({"payload": {"text": "nul\u{0}here"}}), "payload"),
            (json!({"paused": "yes"}), "paused"),
            (json!({"misfire": "sometimes"}), "misfire"),
            (json!({"concurrency": 0}), "concurrency"),
            (json!({"concurrency_key": "{payload."}), "concurrency_key"),
            (json!({"rate_limit": "10 per minute"}), "rate_limit"),
            (json!({"rate_limit": "0/s"}), "rate_limit"),
            (json!({"rate_limit_key": ""}), "rate_limit_key"),
            (json!({"priority": "urgent"}), "priority"),
            (
                json!({"cron": null, "at": "2001-01-01T00:00:00Z", "timezone": null}),
                "at",
            ),
        ] {
            let got = call(Method::POST, &s(""), None, Some(bad(patch.clone()))).await;
            assert_error(
                &got,
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid",
                Some(field),
            );
        }
        assert_error(
            &raw(Method::POST, &s(""), b"{\"name\": ".to_vec()).await,
            StatusCode::BAD_REQUEST,
            "bad_request",
            None,
        );
        assert_error(
            &raw(Method::POST, &s(""), b"[1,2]".to_vec()).await,
            StatusCode::BAD_REQUEST,
            "bad_request",
            None,
        );
        let huge = format!(
            "{{\"name\":\"big\",\"every\":\"1s\",\"job_type\":\"noop\",\"payload\":\"{}\"}}",
            "x".repeat(2 << 20)
        );
        assert_error(
            &raw(Method::POST, &s(""), huge.into_bytes()).await,
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            None,
        );
        assert_eq!(
            env.ledger.schedules().await.unwrap().len(),
            1,
            "a refused request stored something"
        );

        // A one-shot in the future is stored (the old table CHECK refused it).
        let at = (Utc::now() + chrono::Duration::hours(1)).trunc_subsecs(0);
        let once = call(
            Method::POST,
            &s(""),
            None,
            Some(json!({"name": "once", "at": at.to_rfc3339(), "job_type": "noop"})),
        )
        .await;
        assert_eq!(once.0, StatusCode::CREATED, "{:?}", once.1);
        let after = call(
            Method::POST,
            &s(""),
            None,
            Some(json!({"name": "later", "after": "10m", "job_type": "noop", "paused": true})),
        )
        .await;
        assert_eq!(after.0, StatusCode::CREATED, "{:?}", after.1);
        assert!(
            after.1["at"].is_string() && after.1["after"].is_null(),
            "after is stored as its instant: {:?}",
            after.1
        );
        assert_eq!(after.1["paused"], true);

        // Replace: GET, edit, PUT back (read-only fields are accepted).
        let mut edited = got.1.clone();
        edited["cron"] = json!("0 30 4 * * *");
        let put = call(Method::PUT, &s("/nightly"), None, Some(edited)).await;
        assert_eq!(put.0, StatusCode::OK, "{:?}", put.1);
        assert_eq!(put.1["cron"], "0 30 4 * * *");
        assert_error(
            &call(
                Method::PUT,
                &s("/nightly"),
                None,
                Some(json!({"name": "renamed", "every": "1s", "job_type": "noop"})),
            )
            .await,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("name"),
        );
        assert_error(
            &call(
                Method::PUT,
                &s("/ghost"),
                None,
                Some(json!({"every": "1s", "job_type": "noop"})),
            )
            .await,
            StatusCode::NOT_FOUND,
            "not_found",
            None,
        );
        assert_error(
            &call(
                Method::PUT,
                &s("/nightly"),
                None,
                Some(json!({"cron": "bad", "job_type": "noop"})),
            )
            .await,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("cron"),
        );
        assert_eq!(env.schedule("nightly").await.cron.as_deref(), Some("0 30 4 * * *"));

        // Pause, resume, preview.
        let paused = call(Method::POST, &s("/nightly/pause"), None, None).await;
        assert_eq!(
            (paused.0, &paused.1["paused"]),
            (StatusCode::OK, &json!(true))
        );
        assert!(
            env.paused("nightly").await
        );
        let resumed = call(Method::POST, &s("/nightly/resume"), None, None).await;
        assert_eq!(resumed.1["paused"], false);
        assert_error(
            &call(Method::POST, &s("/ghost/pause"), None, None).await,
            StatusCode::NOT_FOUND,
            "not_found",
            None,
        );
        let preview = call(Method::GET, &s("/nightly/preview?count=3"), None, None).await;
        assert_eq!(preview.0, StatusCode::OK);
        let next: Vec<DateTime<Utc>> = serde_json::from_value(preview.1["next"].clone()).unwrap();
        assert_eq!(next.len(), 3);
        assert_eq!(next[1] - next[0], chrono::Duration::days(1));
        assert!(
            next.iter()
                .all(|t| t.format("%H:%M:%S").to_string() == "20:30:00"),
            "04:30 Shanghai is 20:30 UTC: {next:?}"
        );
        assert_error(
            &call(Method::GET, &s("/nightly/preview?count=0"), None, None).await,
            StatusCode::BAD_REQUEST,
            "bad_request",
            Some("count"),
        );
        assert_error(
            &call(Method::GET, &s("/nightly/preview?n=3"), None, None).await,
            StatusCode::BAD_REQUEST,
            "bad_request",
            Some("n"),
        );

        // Delete: runs stay, the name is free again.
        let gone = call(Method::DELETE, &s("/nightly"), None, None).await;
        assert_eq!(gone.0, StatusCode::NO_CONTENT);
        assert_error(
            &call(Method::GET, &s("/nightly"), None, None).await,
            StatusCode::NOT_FOUND,
            "not_found",
            None,
        );
        assert_error(
            &call(Method::DELETE, &s("/nightly"), None, None).await,
            StatusCode::NOT_FOUND,
            "not_found",
            None,
        );
        assert_error(
            &call(Method::GET, &s("/has%20space"), None, None).await,
            StatusCode::BAD_REQUEST,
            "bad_request",
            Some("name"),
        );

        // Routes that do not exist answer in the same shape.
        assert_error(
            &call(Method::GET, &api.url("/v2/nothing"), None, None).await,
            StatusCode::NOT_FOUND,
            "not_found",
            None,
        );
        assert_error(
            &call(Method::PATCH, &s("/once"), None, None).await,
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            None,
        );
        drop(api);
        env.teardown(&[]).await;
    }
}

belfry_testkit::both_backends! {
    async fn schedule_list_pages_by_name(env: TestEnv) {
        let api = open_api(&env).await;
        for i in 0..5 {
            let got = call(
                Method::POST,
                &api.url("/v1/schedules"),
                None,
                Some(json!({"name": format!("s{i}"), "every": "1h", "job_type": "noop"})),
            )
            .await;
            assert_eq!(got.0, StatusCode::CREATED);
        }
        let mut names = Vec::new();
        let mut cursor: Option<String> = None;
        let mut pages = 0;
        loop {
            let q = cursor
                .as_ref()
                .map(|c| format!("&cursor={c}"))
                .unwrap_or_default();
            let page = call(
                Method::GET,
                &api.url(&format!("/v1/schedules?limit=2{q}")),
                None,
                None,
            )
            .await;
            assert_eq!(page.0, StatusCode::OK);
            pages += 1;
            for s in page.1["schedules"].as_array().unwrap() {
                names.push(s["name"].as_str().unwrap().to_owned());
            }
            match page.1["next_cursor"].as_str() {
                Some(c) => cursor = Some(c.to_owned()),
                None => break,
            }
        }
        assert_eq!(names, ["s0", "s1", "s2", "s3", "s4"]);
        assert_eq!(pages, 3);
        assert_error(
            &call(Method::GET, &api.url("/v1/schedules?limit=501"), None, None).await,
            StatusCode::BAD_REQUEST,
            "bad_request",
            Some("limit"),
        );
        drop(api);
        env.teardown(&[]).await;
    }
}

fn run_at(name: &str, at: DateTime<Utc>, job_type: &str) -> NewRun {
    NewRun {
        id: uuid::Uuid::now_v7(),
        job_name: name.into(),
        run_key: belfry_protocol::run_key(name, at).unwrap(),
        job_type: job_type.into(),
        payload: json!({"n": 1}),
        scheduled_at: at,
        claimed_by: "sched-x".into(),
        trace_id: Some("0af7651916cd43dd8448eb211c80319c".into()),
        traceparent: None,
        options: JobOptions::default(),
        next_dispatch_at: at,
    }
}

belfry_testkit::both_backends! {
    async fn runs_list_filters_paginates_and_shows_detail(env: TestEnv) {
        let api = open_api(&env).await;
        let t0 = Utc::now().trunc_subsecs(0) - chrono::Duration::hours(1);
        let mut ids = Vec::new();
        for i in 0..7 {
            let (name, ty) = if i % 2 == 0 {
                ("even", "noop")
            } else {
                ("odd", "http")
            };
            let run = run_at(name, t0 + chrono::Duration::seconds(i), ty);
            assert!(env.ledger.claim(&run).await.unwrap());
            ids.push(run.id);
        }
        // Three more at one instant: pages must split them by id, not skip one.
        let same = t0 + chrono::Duration::seconds(10);
        for name in ["tie-a", "tie-b", "tie-c"] {
            let run = run_at(name, same, "noop");
            assert!(env.ledger.claim(&run).await.unwrap());
        }
        // One finished run with an attempt log.
        let entry = AttemptEntry {
            attempt: 1,
            worker: "w-1".into(),
            started_at: Utc::now(),
            finished_at: Utc::now(),
            outcome: "failed".into(),
            error: Some("boom: <b>not html</b>".into()),
            log_lines: None,
            result: None,
        };
        let msg = env.ledger.run(ids[6]).await.unwrap().unwrap().to_message();
        env.ledger
            .begin_attempt(&msg, "w-1", Duration::from_secs(60))
            .await
            .unwrap();
        assert!(env
            .ledger
            .end_attempt(
                ids[6],
                RunStatus::Failed,
                &entry,
                entry.error.as_deref(),
                None
            )
            .await
            .unwrap());

        let runs = |q: &str| {
            let url = api.url(&format!("/v1/runs{q}"));
            async move { call(Method::GET, &url, None, None).await }
        };
        // All, newest first, in pages of 3 that neither skip nor repeat.
        let mut seen = Vec::new();
        let mut q = "?limit=3".to_owned();
        loop {
            let page = runs(&q).await;
            assert_eq!(page.0, StatusCode::OK, "{:?}", page.1);
            let batch = page.1["runs"].as_array().unwrap();
            assert!(batch.len() <= 3);
            seen.extend(batch.iter().map(|r| r["id"].as_str().unwrap().to_owned()));
            match page.1["next_cursor"].as_str() {
                Some(c) => q = format!("?limit=3&cursor={c}"),
                None => break,
            }
        }
        assert_eq!(seen.len(), 10, "{seen:?}");
        let unique: std::collections::HashSet<&String> = seen.iter().collect();
        assert_eq!(unique.len(), 10, "a run repeated across pages");
        // The three tied runs come first (newest instant), then the rest in order.
        let expected: Vec<String> = ids.iter().rev().map(|id| id.to_string()).collect();
        assert_eq!(seen[3..], expected[..]);

        let odd = runs("?schedule=odd").await;
        assert_eq!(odd.1["runs"].as_array().unwrap().len(), 3);
        let http = runs("?job_type=http&limit=2").await;
        assert_eq!(http.1["runs"].as_array().unwrap().len(), 2);
        assert!(http.1["next_cursor"].is_string());
        let failed = runs("?status=failed,dead").await;
        assert_eq!(failed.1["runs"].as_array().unwrap().len(), 1);
        assert_eq!(failed.1["runs"][0]["last_error"], "boom: <b>not html</b>");
        let window = runs(&format!(
            "?from={}&to={}",
            (t0 + chrono::Duration::seconds(2)).format("%Y-%m-%dT%H:%M:%SZ"),
            (t0 + chrono::Duration::seconds(4)).format("%Y-%m-%dT%H:%M:%SZ")
        ))
        .await;
        assert_eq!(
            window.1["runs"].as_array().unwrap().len(),
            2,
            "[from, to) holds seconds 2 and 3"
        );

        // Bad queries: each names its parameter.
        for (query, field) in [
            ("?status=lost", "status"),
            ("?from=yesterday", "from"),
            ("?cursor=nonsense", "cursor"),
            ("?limit=0", "limit"),
            ("?to=", "to"),
            ("?job_type=a%00b", "job_type"),
            ("?sort=asc", "sort"),
        ] {
            assert_error(&runs(query).await, StatusCode::BAD_REQUEST, "bad_request", Some(field));
        }

        let detail = call(
            Method::GET,
            &api.url(&format!("/v1/runs/{}", ids[6])),
            None,
            None,
        )
        .await;
        assert_eq!(detail.0, StatusCode::OK);
        assert_eq!(detail.1["status"], "failed");
        assert_eq!(detail.1["attempts"], 1);
        assert_eq!(detail.1["worker"], "w-1");
        assert_eq!(detail.1["claimed_by"], "sched-x");
        assert_eq!(detail.1["origin"], "schedule");
        assert_eq!(detail.1["trace_id"], "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(detail.1["attempt_log"][0]["error"], "boom: <b>not html</b>");
        assert_eq!(detail.1["payload"], json!({"n": 1}));
        assert!(detail.1["started_at"].is_string() && detail.1["finished_at"].is_string());
        assert_error(
            &call(Method::GET, &api.url("/v1/runs/not-a-uuid"), None, None).await,
            StatusCode::BAD_REQUEST,
            "bad_request",
            Some("id"),
        );
        assert_error(
            &call(
                Method::GET,
                &api.url(&format!("/v1/runs/{}", uuid::Uuid::now_v7())),
                None,
                None,
            )
            .await,
            StatusCode::NOT_FOUND,
            "not_found",
            None,
        );
        drop(api);
        env.teardown(&[]).await;
    }
}

belfry_testkit::both_backends! {
    async fn tokens_separate_readers_from_admins_and_the_open_api_stays_on_loopback(env: TestEnv) {
        let (r, api, admin, read) = guarded_api(&env, "auth-replica").await;
        let list = api.url("/v1/schedules");
        let body = json!({"name": "guarded", "every": "1h", "job_type": "noop"});
        // No token, a wrong one, an empty one.
        for token in [None, Some("wrong-token-0123456789"), Some("")] {
            assert_error(
                &call(Method::GET, &list, token, None).await,
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                None,
            );
        }
        assert_eq!(
            call(Method::GET, &list, Some(read), None).await.0,
            StatusCode::OK
        );
        assert_error(
            &call(Method::POST, &list, Some(read), Some(body.clone())).await,
            StatusCode::FORBIDDEN,
            "forbidden",
            None,
        );
        assert_eq!(
            call(Method::POST, &list, Some(admin), Some(body)).await.0,
            StatusCode::CREATED
        );
        assert_error(
            &call(
                Method::POST,
                &api.url("/v1/schedules/guarded/pause"),
                Some(read),
                None,
            )
            .await,
            StatusCode::FORBIDDEN,
            "forbidden",
            None,
        );
        // Probes and the description need no token.
        assert_eq!(
            call(Method::GET, &api.url("/healthz"), None, None).await.0,
            StatusCode::OK
        );
        assert_eq!(
            call(Method::GET, &api.url("/openapi.json"), None, None)
                .await
                .0,
            StatusCode::OK
        );
        // An open API refuses to listen beyond loopback.
        let open = belfry_server::api::serve(
            "0.0.0.0:0",
            belfry_server::api::ApiState::new(r, Tokens::default()),
            tokio_util::sync::CancellationToken::new(),
        )
        .await;
        let e = open
            .expect_err("open API on 0.0.0.0 must be refused")
            .to_string();
        assert!(e.contains("BELFRY_API_ADMIN_TOKENS"), "{e}");
        drop(api);
        env.teardown(&[]).await;
    }
}

belfry_testkit::both_backends! {
    async fn trigger_respects_overlap_unless_forced(env: TestEnv) {
        // A queue with no consumer: runs stay unfinished.
        env.declare_default_group(&["noop"]).await;
        let api = open_api(&env).await;
        let s = |p: &str| api.url(&format!("/v1/schedules{p}"));
        let created = call(Method::POST, &s(""), None,
            Some(json!({"name": "exclusive", "every": "1h", "job_type": "noop", "overlap": "forbid", "paused": true}))).await;
        assert_eq!(created.0, StatusCode::CREATED);
        let first = call(Method::POST, &s("/exclusive/trigger"), None, None).await;
        assert_eq!(first.0, StatusCode::ACCEPTED, "{:?}", first.1);
        assert_eq!(first.1["outcome"], "dispatched");
        assert!(
            first.1["run_key"]
                .as_str()
                .unwrap()
                .starts_with("exclusive@manual-"),
            "{:?}",
            first.1
        );
        assert!(first.1["trace_id"].is_string());
        assert_error(
            &call(
                Method::POST,
                &s("/exclusive/trigger"),
                None,
                Some(json!({})),
            )
            .await,
            StatusCode::CONFLICT,
            "conflict",
            None,
        );
        let forced = call(
            Method::POST,
            &s("/exclusive/trigger"),
            None,
            Some(json!({"force": true})),
        )
        .await;
        assert_eq!(forced.0, StatusCode::ACCEPTED, "{:?}", forced.1);
        assert_ne!(forced.1["run_id"], first.1["run_id"]);
        assert_error(
            &call(
                Method::POST,
                &s("/exclusive/trigger"),
                None,
                Some(json!({"force": "yes"})),
            )
            .await,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("force"),
        );
        assert_error(
            &call(Method::POST, &s("/ghost/trigger"), None, None).await,
            StatusCode::NOT_FOUND,
            "not_found",
            None,
        );
        let run = call(
            Method::GET,
            &api.url(&format!("/v1/runs/{}", first.1["run_id"].as_str().unwrap())),
            None,
            None,
        )
        .await;
        assert_eq!(run.1["origin"], "manual");
        assert!(run.1["claimed_by"].as_str().unwrap().starts_with("manual:"));
        // Manual runs are not fires: misfire recovery does not count from them.
        let last = env
            .ledger
            .last_fires(&["exclusive".to_owned()])
            .await
            .unwrap();
        assert!(last.is_empty(), "{last:?}");
        drop(api);
        env.teardown(&["default"]).await;
    }
}

belfry_testkit::both_backends! {
    async fn backfill_fires_each_missing_instant_once(env: TestEnv) {
        env.declare_default_group(&["noop"]).await;
        let (r, api) = TestApi::of_replica(&env, "bf", Tokens::default()).await;
        let s = |p: &str| api.url(&format!("/v1/schedules{p}"));
        assert_eq!(
            call(
                Method::POST,
                &s(""),
                None,
                Some(json!({"name": "tick", "every": "1s", "job_type": "noop", "paused": true}))
            )
            .await
            .0,
            StatusCode::CREATED
        );
        let from = Utc::now().trunc_subsecs(0) - chrono::Duration::seconds(60);
        let to = from + chrono::Duration::seconds(10);
        // Two of the ten instants already ran.
        let tick = belfry_tests::every("tick", "1s", "noop");
        for k in [2, 5] {
            r.fire(&tick, from + chrono::Duration::seconds(k)).await;
        }
        let range = json!({"from": from.to_rfc3339(), "to": to.to_rfc3339()});
        let first = call(
            Method::POST,
            &s("/tick/backfill"),
            None,
            Some(range.clone()),
        )
        .await;
        assert_eq!(first.0, StatusCode::OK, "{:?}", first.1);
        assert_eq!(first.1["instants"], 10);
        assert_eq!(
            first.1["counts"]["dispatched"], 8,
            "{:?}",
            first.1["counts"]
        );
        assert_eq!(first.1["counts"]["already_ran"], 2);
        let again = call(Method::POST, &s("/tick/backfill"), None, Some(range)).await;
        assert_eq!(
            again.1["counts"]["already_ran"], 10,
            "{:?}",
            again.1["counts"]
        );
        let runs = env.ledger.runs_of("tick", 100).await.unwrap();
        let instants: Vec<DateTime<Utc>> = runs.iter().map(|r| r.scheduled_at).collect();
        let expected: Vec<DateTime<Utc>> = (0..10)
            .map(|k| from + chrono::Duration::seconds(k))
            .collect();
        assert_eq!(
            instants, expected,
            "each instant of [from, to) exactly once"
        );

        let bad = |body: Value, field: &'static str| {
            let url = s("/tick/backfill");
            async move {
                assert_error(
                    &call(Method::POST, &url, None, Some(body)).await,
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid",
                    Some(field),
                );
            }
        };
        bad(
            json!({"from": to.to_rfc3339(), "to": from.to_rfc3339()}),
            "to",
        )
        .await;
        bad(json!({"from": from.to_rfc3339(), "to": (Utc::now() + chrono::Duration::hours(1)).to_rfc3339()}), "to").await;
        bad(
            json!({"from": (from - chrono::Duration::days(1)).to_rfc3339(), "to": from.to_rfc3339()}),
            "to",
        )
        .await;
        bad(
            json!({"from": "last tuesday", "to": to.to_rfc3339()}),
            "from",
        )
        .await;
        bad(json!({"from": from.to_rfc3339()}), "to").await;
        bad(
            json!({"from": from.to_rfc3339(), "to": to.to_rfc3339(), "dry_run": true}),
            "dry_run",
        )
        .await;
        // A missing schedule is a 404 whatever the range says (the schedule
        // is looked up before the range is read).
        assert_error(
            &call(
                Method::POST,
                &s("/no-such-schedule/backfill"),
                None,
                Some(json!({"from": "last tuesday", "to": to.to_rfc3339()})),
            )
            .await,
            StatusCode::NOT_FOUND,
            "not_found",
            None,
        );
        drop(api);
        env.teardown(&["default"]).await;
    }
}

belfry_testkit::both_backends! {
    async fn jobs_enqueue_with_idempotency_and_validation(env: TestEnv) {
        env.declare_default_group(&["noop"]).await;
        let api = open_api(&env).await;
        let jobs = api.url("/v1/jobs");
        let made = call(
            Method::POST,
            &jobs,
            None,
            Some(json!({"job_type": "noop", "payload": {"a": 1}})),
        )
        .await;
        assert_eq!(made.0, StatusCode::CREATED, "{:?}", made.1);
        assert_eq!(made.1["created"], true);
        assert_eq!(made.1["status"], "dispatched");
        let keyed = json!({"job_type": "noop", "name": "invoice", "key": "2026-07", "delay": "1h", "retry": {"max_attempts": 2}, "timeout": "5s"});
        let once = call(Method::POST, &jobs, None, Some(keyed.clone())).await;
        assert_eq!(once.0, StatusCode::CREATED, "{:?}", once.1);
        assert_eq!(once.1["run_key"], "invoice@2026-07");
        assert_eq!(
            once.1["status"], "claimed",
            "a delayed job waits in the outbox"
        );
        let twice = call(Method::POST, &jobs, None, Some(keyed)).await;
        assert_eq!(
            (twice.0, &twice.1["created"]),
            (StatusCode::OK, &json!(false))
        );
        assert_eq!(twice.1["run_id"], once.1["run_id"]);
        let run = enqueued_run(&env, &once.1).await;
        assert_eq!(run.options["retry"]["max_attempts"], 2);
        // A concurrency limit is carried by the run (and so its message).
        let limited = call(
            Method::POST,
            &jobs,
            None,
            Some(json!({"job_type": "noop", "delay": "1h", "payload": {"tenant": "acme"},
                        "concurrency": 2, "concurrency_key": "{payload.tenant}",
                        "rate_limit": "50/s", "rate_limit_key": "{payload.tenant}",
                        "priority": "high"})),
        )
        .await;
        assert_eq!(limited.0, StatusCode::CREATED, "{:?}", limited.1);
        let run = enqueued_run(&env, &limited.1).await;
        assert_eq!(
            (&run.options["concurrency"], &run.options["concurrency_key"]),
            (&json!(2), &json!("{payload.tenant}"))
        );
        assert_eq!(
            (&run.options["rate_limit"], &run.options["rate_limit_key"]),
            (&json!({"starts": 50, "per_ms": 1000}), &json!("{payload.tenant}"))
        );
        assert_eq!(run.options["priority"], "high");
        for (body, field) in [
            (json!({"payload": 1}), "job_type"),
            (json!({"job_type": "no such"}), "job_type"),
            (json!({"job_type": "noop", "name": "a:b"}), "name"),
            (json!({"job_type": "noop", "key": "has space"}), "key"),
            (
                json!({"job_type": "noop", "key": "2026-07-26T03:00:00Z"}),
                "key",
            ),
            (
                json!({"job_type": "noop", "at": "2026-07-26T03:00:00Z", "delay": "1m"}),
                "delay",
            ),
            (json!({"job_type": "noop", "delay": "soonish"}), "delay"),
            (json!({"job_type": "noop", "at": "tomorrow"}), "at"),
            (json!({"job_type": "noop", "timeout": "0s"}), "timeout"),
            (
                json!({"job_type": "noop", "retry": {"multiplier": 0.5}}),
                "retry.multiplier",
            ),
            (json!({"job_type": "noop", "payload": "\u{0}"}), "payload"),
            (json!({"job_type": "noop", "priority": 1}), "priority"),
            (json!({"job_type": "noop", "priority": "asap"}), "priority"),
            (json!({"job_type": "noop", "concurrency": 0}), "concurrency"),
            (json!({"job_type": "noop", "concurrency": "two"}), "concurrency"),
            (
                json!({"job_type": "noop", "concurrency": 2, "concurrency_key": "{payload.x"}),
                "concurrency_key",
            ),
            (json!({"job_type": "noop", "rate_limit": "50/fortnight"}), "rate_limit"),
            (json!({"job_type": "noop", "rate_limit": 50}), "rate_limit"),
            (
                json!({"job_type": "noop", "rate_limit": "5/s", "rate_limit_key": "{payload.}"}),
                "rate_limit_key",
            ),
        ] {
            assert_error(
                &call(Method::POST, &jobs, None, Some(body)).await,
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid",
                Some(field),
            );
        }
        drop(api);
        env.teardown(&["default"]).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_report_services_and_every_documented_route_exists() {
    let env = belfry_testkit::service_env!();
    let api = open_api(&env).await;
    let health = call(Method::GET, &api.url("/healthz"), None, None).await;
    assert_eq!(
        (health.0, &health.1["status"]),
        (StatusCode::OK, &json!("ok"))
    );
    let ready = call(Method::GET, &api.url("/readyz"), None, None).await;
    assert_eq!(ready.0, StatusCode::OK, "{:?}", ready.1);
    // The node of each service too (passwords masked).
    let nodes = json!({
        "postgres": env.ledger.node().unwrap(),
        "rabbitmq": belfry_runtime::masked(&belfry_testkit::amqp_url()),
        "redis": belfry_runtime::masked(&belfry_testkit::redis_url()),
    });
    assert_eq!(
        ready.1,
        json!({"status": "ready", "instance": "api-replica", "mode": "distributed", "postgres": "up", "rabbitmq": "up", "redis": "up", "nodes": nodes})
    );
    // Redis down: still ready (claims stay exact through Postgres), degraded.
    let no_redis = Arc::new(replica(&env, "no-redis", Some(DEAD_REDIS_URL)).await);
    let degraded_api = TestApi::serve(no_redis, Tokens::default()).await;
    let degraded = call(Method::GET, &degraded_api.url("/readyz"), None, None).await;
    assert_eq!(
        (degraded.0, &degraded.1["status"], &degraded.1["redis"]),
        (StatusCode::OK, &json!("degraded"), &json!("down"))
    );

    // The served document is generated from the code and is the committed
    // one (regenerate with `cargo run -p belfry-server --bin belfry-openapi
    // > server/openapi.json`), and each path it lists is routed (a missing
    // route would answer the fallback's 404 or a 405).
    let served = reqwest::get(api.url("/openapi.json"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let committed = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../server/openapi.json"
    ))
    .unwrap();
    assert!(
        committed == belfry_server::api::doc::document(),
        "server/openapi.json differs from the document the code generates; regenerate it"
    );
    assert!(
        served == committed,
        "the served /openapi.json differs from server/openapi.json"
    );
    let doc: Value = serde_json::from_str(&committed).unwrap();
    let mut operations = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        let concrete = path
            .replace("{name}", "probe")
            .replace("{id}", &uuid::Uuid::nil().to_string());
        for method in ["get", "post", "put", "delete"] {
            if item.get(method).is_none() {
                continue;
            }
            operations += 1;
            let got = call(
                method.to_uppercase().parse().unwrap(),
                &api.url(&concrete),
                None,
                None,
            )
            .await;
            assert_ne!(got.0, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
            assert!(
                !(got.0 == StatusCode::NOT_FOUND
                    && got.1["message"]
                        .as_str()
                        .unwrap_or("")
                        .starts_with("no such path")),
                "{method} {path} is documented but not routed"
            );
            assert!(
                got.0.as_u16() < 500
                    || got.0 == StatusCode::SERVICE_UNAVAILABLE && path == "/readyz",
                "{method} {path}: {:?}",
                got
            );
        }
    }
    assert_eq!(operations, 21, "documented operations");
    drop((api, degraded_api));
    env.teardown(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_respects_overlap_retention_and_marks_its_runs() {
    let env = belfry_testkit::service_env!("noop");
    let r = Arc::new(replica(&env, "bf2", Some(&redis_url())).await);
    let state = belfry_server::api::ApiState::new(r, Tokens::default())
        .with_retention(Some(Duration::from_secs(3600)));
    let api = TestApi::serve_state(state).await;
    let s = |p: &str| api.url(&format!("/v1/schedules{p}"));
    let created = call(
        Method::POST,
        &s(""),
        None,
        Some(json!({"name": "solo", "every": "1s", "job_type": "noop", "overlap": "forbid", "paused": true})),
    )
    .await;
    assert_eq!(created.0, StatusCode::CREATED);
    let from = Utc::now().trunc_subsecs(0) - chrono::Duration::seconds(30);
    let range = |force: bool| json!({"from": from.to_rfc3339(), "to": (from + chrono::Duration::seconds(5)).to_rfc3339(), "force": force});
    // Five instants of a schedule that forbids overlap: refused without force.
    assert_error(
        &call(Method::POST, &s("/solo/backfill"), None, Some(range(false))).await,
        StatusCode::CONFLICT,
        "conflict",
        None,
    );
    assert!(
        env.ledger.runs_of("solo", 10).await.unwrap().is_empty(),
        "a refused backfill wrote runs"
    );
    let forced = call(Method::POST, &s("/solo/backfill"), None, Some(range(true))).await;
    assert_eq!(forced.0, StatusCode::OK, "{:?}", forced.1);
    assert_eq!(forced.1["counts"]["dispatched"], 5, "{:?}", forced.1);
    let runs = env.ledger.runs_of("solo", 10).await.unwrap();
    assert!(
        runs.iter()
            .all(|r| r.claimed_by.as_deref() == Some("backfill:bf2")),
        "{runs:?}"
    );
    let detail = call(
        Method::GET,
        &api.url(&format!("/v1/runs/{}", runs[0].id)),
        None,
        None,
    )
    .await;
    assert_eq!(detail.1["origin"], "backfill");
    // Backfills are not fires of the timetable: recovery does not count
    // from them.
    assert!(env
        .ledger
        .last_fires(&["solo".to_owned()])
        .await
        .unwrap()
        .is_empty());
    // Older than the retention: refused (those runs may have been pruned).
    let old = Utc::now() - chrono::Duration::hours(2);
    assert_error(
        &call(
            Method::POST,
            &s("/solo/backfill"),
            None,
            Some(json!({"from": old.to_rfc3339(), "to": (old + chrono::Duration::seconds(1)).to_rfc3339()})),
        )
        .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid",
        Some("from"),
    );
    // A refused manual trigger leaves nothing behind.
    assert_error(
        &call(Method::POST, &s("/solo/trigger"), None, None).await,
        StatusCode::CONFLICT,
        "conflict",
        None,
    );
    let skipped: i64 = sqlx::query_scalar("SELECT count(*) FROM skipped_fires")
        .fetch_one(env.ledger.pg_pool().expect("a Postgres ledger"))
        .await
        .unwrap();
    assert_eq!(skipped, 0);
    drop(api);
    env.teardown(&["default"]).await;
}

belfry_testkit::both_backends! {
    async fn browsers_from_other_sites_are_refused_and_paths_are_checked(env: TestEnv) {
        let api = open_api(&env).await;
        let client = reqwest::Client::new();
        let body = json!({"name": "csrf", "every": "1h", "job_type": "noop"});
        let create = || client.post(api.url("/v1/schedules")).json(&body);
        for (what, refused) in [
            // A page elsewhere posting to the open API on loopback.
            ("cross origin", create().header("origin", "http://evil.example")),
            ("cross site", create().header("sec-fetch-site", "cross-site")),
            // DNS rebinding: the open API answers only loopback host names.
            ("rebound", client.get(api.url("/v1/schedules")).header("host", "evil.example")),
        ] {
            let answer = refused.send().await.unwrap();
            assert_eq!(answer.status(), StatusCode::FORBIDDEN, "{what}");
        }
        assert!(
            env.ledger.schedules().await.unwrap().is_empty(),
            "a refused request stored something"
        );
        // Same origin is fine.
        let same = create().header("origin", api.base.clone()).send().await.unwrap();
        assert_eq!(same.status(), StatusCode::CREATED);
        // A path that is not valid UTF-8 after decoding: JSON 400.
        assert_error(
            &call(Method::GET, &api.url("/v1/schedules/%FF"), None, None).await,
            StatusCode::BAD_REQUEST,
            "bad_request",
            None,
        );
        drop(api);
        env.teardown(&[]).await;
    }
}

belfry_testkit::both_backends! {
    async fn a_fired_one_shot_can_still_be_edited_and_heads_and_schemes_are_lenient(env: TestEnv) {
        let (_, api, admin, read) = guarded_api(&env, "edit-replica").await;
        // A one-shot whose instant has passed, stored as the file sync would.
        let past = (Utc::now() - chrono::Duration::hours(1))
            .trunc_subsecs(0)
            .to_rfc3339();
        let spec: belfry_protocol::ScheduleSpec =
            serde_json::from_value(json!({"name": "once", "at": past, "job_type": "noop"})).unwrap();
        let row = belfry_scheduler::Schedule::storable_row(&spec, Utc::now(), false).unwrap();
        env.ledger.upsert_schedule(&row).await.unwrap();
        let url = api.url("/v1/schedules/once");
        let edited = call(
            Method::PUT,
            &url,
            Some(admin),
            Some(json!({"at": past, "job_type": "noop", "payload": {"v": 2}})),
        )
        .await;
        assert_eq!(edited.0, StatusCode::OK, "{:?}", edited.1);
        assert_eq!(edited.1["payload"], json!({"v": 2}));
        let moved = (Utc::now() - chrono::Duration::minutes(5))
            .trunc_subsecs(0)
            .to_rfc3339();
        assert_error(
            &call(
                Method::PUT,
                &url,
                Some(admin),
                Some(json!({"at": moved, "job_type": "noop"})),
            )
            .await,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("at"),
        );
        // HEAD is a read; the scheme name is case-insensitive.
        let head = reqwest::Client::new()
            .head(&url)
            .bearer_auth(read)
            .send()
            .await
            .unwrap();
        assert_eq!(head.status(), StatusCode::OK);
        for scheme in ["bearer", "BEARER"] {
            let got = reqwest::Client::new()
                .get(&url)
                .header("authorization", format!("{scheme} {read}"))
                .send()
                .await
                .unwrap();
            assert_eq!(got.status(), StatusCode::OK, "{scheme}");
        }
        drop(api);
        env.teardown(&[]).await;
    }
}
