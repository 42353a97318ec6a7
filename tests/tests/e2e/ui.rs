//! The web view served by the API listener: pages render from the ledger,
//! user-supplied text is escaped, tokens work as cookies, read-only tokens
//! get no buttons and cannot act, actions do what the API does.

use belfry_server::api::Tokens;
use belfry_tests::{every, TestApi};
use chrono::{SubsecRound, Utc};
use reqwest::redirect::Policy;
use reqwest::{Method, StatusCode};

const ADMIN: &str = "ops:admin-secret-0123456789";
// Characters a cookie must carry percent-encoded.
const READ: &str = "viewer:read+secret/with=chars;0";

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(Policy::none())
        .build()
        .unwrap()
}

async fn get(url: &str, cookie: Option<&str>) -> (StatusCode, String) {
    send(Method::GET, url, cookie).await
}

/// `method` on `url` from a browser signed in with the token `cookie`
/// (when given): the answer's status and body.
async fn send(method: Method, url: &str, cookie: Option<&str>) -> (StatusCode, String) {
    let mut req = client().request(method, url);
    if let Some(c) = cookie {
        req = req.header("cookie", format!("belfry_token={c}"));
    }
    let resp = req.send().await.unwrap();
    (resp.status(), resp.text().await.unwrap())
}

/// The page at `url` (signed in with the token `cookie`), which must be
/// served (200).
async fn open_page(url: &str, cookie: Option<&str>) -> String {
    let (status, html) = get(url, cookie).await;
    assert_eq!(status, StatusCode::OK, "{url}: {html}");
    html
}

/// Posts the web view's form `action` (a path) with no fields, from a page
/// of `origin`.
async fn act_from(api: &TestApi, origin: &str, action: &str) -> reqwest::Response {
    client()
        .post(api.url(action))
        .header("origin", origin)
        .body("")
        .send()
        .await
        .unwrap()
}

/// Posts `token` to the sign-in form.
async fn sign_in(api: &TestApi, token: &str) -> reqwest::Response {
    client()
        .post(api.url("/ui/login"))
        .form(&[("token", token)])
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_render_escape_and_act() {
    let env = belfry_testkit::service_env!("noop");
    let (r, api) = TestApi::of_replica(&env, "ui-replica", Tokens::default()).await;
    // A schedule created through the API, fired twice.
    let created = client()
        .post(api.url("/v1/schedules"))
        .json(&serde_json::json!({"name": "nightly", "cron": "0 0 3 * * *", "timezone": "Asia/Shanghai", "job_type": "noop"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), StatusCode::CREATED);
    let tick = every("nightly", "1s", "noop");
    let at = Utc::now().trunc_subsecs(0);
    r.fire(&tick, at - chrono::Duration::seconds(1)).await;
    r.fire(&tick, at).await;
    // A row written by hand with markup in its name and payload.
    sqlx::query(
        "INSERT INTO schedules (name, every_ms, job_type, payload, spec) VALUES \
         ('<script>alert(1)</script>', 1000, 'noop', '\"<img src=x onerror=alert(2)>\"', NULL)",
    )
    .execute(env.ledger.pg_pool().expect("a Postgres ledger"))
    .await
    .unwrap();

    let overview = open_page(&api.url("/ui"), None).await;
    assert!(
        overview.contains("runs in flight") && overview.contains("<svg class=\"chart\""),
        "{overview}"
    );
    assert!(
        overview.contains("ui-replica"),
        "replicas seen lately: {overview}"
    );

    let list = open_page(&api.url("/ui/schedules"), None).await;
    assert!(
        list.contains("every day at 03:00 (Asia/Shanghai)"),
        "{list}"
    );
    assert!(
        list.contains("<span class=\"s-dispatched\""),
        "the strip shows the fires: {list}"
    );
    assert!(
        list.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{list}"
    );
    assert!(
        !list.contains("<script>alert"),
        "markup from a row rendered as markup"
    );

    let page = open_page(&api.url("/ui/schedules/nightly"), None).await;
    assert!(
        page.contains("action=\"/ui/schedules/nightly/pause\""),
        "admin buttons: {page}"
    );
    assert!(page.contains("nightly@"), "run history: {page}");
    let (status, _) = get(&api.url("/ui/schedules/ghost"), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Pause from the page: 303 back to it, paused in the ledger.
    let paused = act_from(&api, &api.base, "/ui/schedules/nightly/pause").await;
    assert_eq!(paused.status(), StatusCode::SEE_OTHER);
    assert!(env.paused("nightly").await);
    // Trigger and a bad backfill range: the message comes back escaped.
    let trig = client()
        .post(api.url("/ui/schedules/nightly/trigger"))
        .form(&[("force", "true")])
        .send()
        .await
        .unwrap();
    assert_eq!(trig.status(), StatusCode::SEE_OTHER);
    let to = trig.headers()["location"].to_str().unwrap().to_owned();
    assert!(to.contains("msg=triggered"), "{to}");
    // A page elsewhere posting the same form is refused.
    let forged = act_from(&api, "http://evil.example", "/ui/schedules/nightly/resume").await;
    assert_eq!(forged.status(), StatusCode::FORBIDDEN);
    assert!(env.paused("nightly").await);
    // Following a link from another site is a navigation: allowed.
    let linked = client()
        .get(api.url("/ui/schedules/nightly"))
        .header("sec-fetch-site", "cross-site")
        .header("sec-fetch-mode", "navigate")
        .send()
        .await
        .unwrap();
    assert_eq!(linked.status(), StatusCode::OK);
    // A payload with markup, shown on its run's page as text.
    let job = client()
        .post(api.url("/v1/jobs"))
        .json(&serde_json::json!({"job_type": "noop", "payload": "<img src=x onerror=alert(2)>"}))
        .send()
        .await
        .unwrap();
    let job: serde_json::Value = job.json().await.unwrap();
    let (_, shown) = get(
        &api.url(&format!("/ui/runs/{}", job["run_id"].as_str().unwrap())),
        None,
    )
    .await;
    assert!(
        shown.contains("&lt;img src=x onerror=alert(2)&gt;") && !shown.contains("<img src=x"),
        "{shown}"
    );
    // No worker serves it: it waits, and its page cancels it.
    let job_id = job["run_id"].as_str().unwrap();
    assert!(
        shown.contains(&format!("action=\"/ui/runs/{job_id}/cancel\"")),
        "the cancel button: {shown}"
    );
    let cancelled = client()
        .post(api.url(&format!("/ui/runs/{job_id}/cancel")))
        .form(&[("reason", "<i>oops</i>")])
        .send()
        .await
        .unwrap();
    assert_eq!(cancelled.status(), StatusCode::SEE_OTHER);
    let back = cancelled.headers()["location"].to_str().unwrap().to_owned();
    assert!(back.contains("msg=cancelled"), "{back}");
    let run = env
        .ledger
        .run(job_id.parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(run.status_text, "cancelled");
    let (_, shown) = get(&api.url(&back), None).await;
    assert!(
        shown.contains("s-cancelled")
            && shown.contains("cancelled by anonymous: &lt;i&gt;oops&lt;/i&gt;")
            && !shown.contains("/cancel\""),
        "{shown}"
    );
    // Cancelling it again is refused, with the reason on the page.
    let again = act_from(&api, &api.base, &format!("/ui/runs/{job_id}/cancel")).await;
    let back = again.headers()["location"].to_str().unwrap().to_owned();
    assert!(back.contains("err="), "{back}");
    let bf = client()
        .post(api.url("/ui/schedules/nightly/backfill"))
        .form(&[("from", "<b>soon</b>"), ("to", "later")])
        .send()
        .await
        .unwrap();
    let back = bf.headers()["location"].to_str().unwrap().to_owned();
    assert!(back.contains("err="), "{back}");
    let (_, shown) = get(&api.url(&back), None).await;
    assert!(
        shown.contains("&lt;b&gt;soon&lt;/b&gt;") && !shown.contains("<b>soon"),
        "{shown}"
    );

    let runs = open_page(&api.url("/ui/runs?schedule=nightly"), None).await;
    let run = env.ledger.runs_of("nightly", 1).await.unwrap().remove(0);
    assert!(runs.contains(&format!("/ui/runs/{}", run.id)), "{runs}");
    let detail = open_page(&api.url(&format!("/ui/runs/{}", run.id)), None).await;
    let trace = run.trace_id.as_deref().unwrap();
    assert!(detail.contains(trace), "trace id shown: {detail}");
    // With a trace UI configured, the id links to it.
    let linked_api = TestApi::serve_state(
        belfry_server::api::ApiState::new(r.clone(), Tokens::default())
            .with_trace_ui(Some("http://jaeger.example/trace/{trace_id}".into())),
    )
    .await;
    let (_, detail) = get(&linked_api.url(&format!("/ui/runs/{}", run.id)), None).await;
    assert!(
        detail.contains(&format!("href=\"http://jaeger.example/trace/{trace}\"")),
        "{detail}"
    );
    let (status, _) = get(&api.url("/ui/runs?status=lost"), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    drop(api);
    env.teardown(&["default"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_sign_in_as_cookies_and_readers_get_no_buttons() {
    let env = belfry_testkit::service_env!();
    let tokens = Tokens::parse(Some(ADMIN), Some(READ)).unwrap();
    let (_, api) = TestApi::of_replica(&env, "ui-auth", tokens).await;
    sqlx::query(
        "INSERT INTO schedules (name, every_ms, job_type, spec) VALUES ('s', 1000, 'noop', NULL)",
    )
    .execute(env.ledger.pg_pool().expect("a Postgres ledger"))
    .await
    .unwrap();
    let (status, _) = get(&api.url("/ui"), None).await;
    assert_eq!(
        status,
        StatusCode::SEE_OTHER,
        "no token: to the sign-in page"
    );
    let form = open_page(&api.url("/ui/login"), None).await;
    assert!(form.contains("name=\"token\""));
    let bad = sign_in(&api, "nope").await;
    assert_eq!(bad.status(), StatusCode::UNAUTHORIZED);
    let read_secret = READ.split_once(':').unwrap().1;
    let good = sign_in(&api, read_secret).await;
    assert_eq!(good.status(), StatusCode::SEE_OTHER);
    let cookie = good.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(
        cookie.contains("HttpOnly")
            && cookie.contains("SameSite=Lax")
            && cookie.contains("Path=/ui"),
        "{cookie}"
    );
    // The cookie exactly as set (percent-encoded) signs the browser in.
    let value = cookie
        .split(';')
        .next()
        .unwrap()
        .trim_start_matches("belfry_token=")
        .to_owned();
    assert!(!value.contains(';') && !value.contains('='), "{value}");
    let page = open_page(&api.url("/ui/schedules/s"), Some(&value)).await;
    assert!(page.contains("signed in as viewer"));
    assert!(!page.contains("<button>pause"), "a reader sees no buttons");
    // The cookie is for the web view only: the API takes bearer headers.
    let (status, _) = get(&api.url("/v1/schedules"), Some(&value)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = send(
        Method::POST,
        &api.url("/ui/schedules/s/pause"),
        Some(&value),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(!env.paused("s").await);
    let admin_secret = ADMIN.split_once(':').unwrap().1;
    let page = open_page(&api.url("/ui/schedules/s"), Some(admin_secret)).await;
    assert!(page.contains("<button>pause"), "an admin gets buttons");
    drop(api);
    env.teardown(&[]).await;
}
