//! The OpenAPI document of the API, generated from the handlers'
//! `#[utoipa::path]` annotations and the schemas of `belfry-api-types`.
//!
//! `server/openapi.json` is this document as committed, so that clients
//! and reviewers can read it without running anything. Regenerate it after
//! changing a handler or an API type:
//!
//! ```text
//! cargo run -p belfry-server --bin belfry-openapi > server/openapi.json
//! ```
//!
//! A unit test fails while the committed file differs from [`document`],
//! and an end-to-end test checks that the served document is the committed
//! one and that every operation in it is routed.

use std::sync::LazyLock;

use utoipa::openapi::link::LinkBuilder;
use utoipa::openapi::path::{HttpMethod, Operation};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
use utoipa::{Modify, OpenApi};

use belfry_api_types::ErrorBody;

use super::{alerts, health, input, jobs, run_logs, runs, schedules};

/// The API's description, from the handlers and the API types.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "belfry API",
        version = "1",
        description = "Schedules, runs, manual triggers, backfills and ad-hoc jobs of a belfry cluster. Served by every belfry-scheduler replica on BELFRY_API_ADDR. Errors are always the Error object; 400 malformed request, 401/403 auth, 404 missing, 409 conflicts with current state, 413 body too large, 422 a field breaks the rules (field names it), 503 a service is unreachable."
    ),
    paths(
        health::healthz,
        health::readyz,
        health::openapi,
        schedules::list,
        schedules::create,
        schedules::get_one,
        schedules::replace,
        schedules::delete,
        schedules::pause,
        schedules::resume,
        schedules::trigger,
        schedules::backfill,
        schedules::preview,
        runs::list,
        runs::get_one,
        runs::cancel,
        run_logs::page,
        run_logs::stream,
        jobs::enqueue,
        alerts::list,
        alerts::test,
    ),
    components(schemas(ErrorBody)),
    security(("bearer" = [])),
    modifiers(&Conventions),
)]
pub struct ApiDoc;

/// What every `/v1/` operation shares, added here once instead of on each
/// handler: the bearer scheme, the error answers any request may get, and
/// the links from a created schedule to each operation on it.
struct Conventions;

impl Modify for Conventions {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "BELFRY_API_ADMIN_TOKENS (changes) or BELFRY_API_READ_TOKENS (GET only); \
                         none configured: open, loopback only",
                    ))
                    .build(),
            ),
        );
        link_created_schedule(doc);
        let max_body = format!("Body over {} MiB", input::MAX_BODY_BYTES / (1024 * 1024));
        for (path, item) in doc.paths.paths.iter_mut() {
            if !path.starts_with("/v1/") {
                continue;
            }
            for (method, op) in [
                (HttpMethod::Get, &mut item.get),
                (HttpMethod::Post, &mut item.post),
                (HttpMethod::Put, &mut item.put),
                (HttpMethod::Delete, &mut item.delete),
            ] {
                let Some(op) = op else { continue };
                error(
                    op,
                    "400",
                    "Malformed request (JSON syntax, query parameter, cursor)",
                );
                error(op, "401", "No token or an unknown token");
                error(
                    op,
                    "403",
                    "Read-only token asking for a change, a cross-site request, or (API without \
                     tokens) a Host that is not loopback",
                );
                error(op, "503", "Postgres or RabbitMQ unreachable; retry");
                if method != HttpMethod::Get {
                    error(op, "413", &max_body);
                }
            }
        }
    }
}

/// Links the `201` of `createSchedule` to every operation on
/// `/v1/schedules/{name}`, its `name` taken from the answer.
fn link_created_schedule(doc: &mut utoipa::openapi::OpenApi) {
    let targets: Vec<String> = doc
        .paths
        .paths
        .iter()
        .filter(|(path, _)| path.starts_with("/v1/schedules/{name}"))
        .flat_map(|(_, item)| [&item.get, &item.put, &item.post, &item.delete])
        .filter_map(|op| op.as_ref()?.operation_id.clone())
        .collect();
    let created = doc
        .paths
        .paths
        .get_mut("/v1/schedules")
        .and_then(|item| item.post.as_mut())
        .and_then(|op| op.responses.responses.get_mut("201"));
    let Some(RefOr::T(created)) = created else {
        return;
    };
    for id in targets {
        let mut name = id.clone();
        if let Some(first) = name.get_mut(..1) {
            first.make_ascii_uppercase();
        }
        created.links.insert(
            name,
            LinkBuilder::new()
                .operation_id(id)
                .parameter("name", "$response.body#/name")
                .build()
                .into(),
        );
    }
}

/// Documents the error answer `status` of `op` (unless the handler did).
fn error(op: &mut Operation, status: &str, description: &str) {
    op.responses
        .responses
        .entry(status.to_owned())
        .or_insert_with(|| {
            ResponseBuilder::new()
                .description(description)
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("Error")))
                        .build(),
                )
                .into()
        });
}

/// The document as served at `/openapi.json` and committed as
/// `server/openapi.json` (pretty JSON, ending in a newline).
pub fn document() -> &'static str {
    static DOCUMENT: LazyLock<String> = LazyLock::new(|| {
        let json = ApiDoc::openapi()
            .to_pretty_json()
            .unwrap_or_else(|e| format!("{{\"error\": \"the document did not serialize: {e}\"}}"));
        // utoipa 5 writes a link's `operationId` as `operation_id` (fixed in
        // utoipa 6); in this document only links carry that key.
        format!(
            "{}\n",
            json.replace("\"operation_id\":", "\"operationId\":")
        )
    });
    &DOCUMENT
}

#[cfg(test)]
mod tests {
    /// The committed `server/openapi.json` is what the code generates; on a
    /// difference, regenerate it (see the module docs) and review the diff.
    #[test]
    fn the_committed_document_is_the_generated_one() {
        let committed = include_str!("../../openapi.json");
        assert!(
            committed == super::document(),
            "server/openapi.json is stale: run \
             `cargo run -p belfry-server --bin belfry-openapi > server/openapi.json`"
        );
    }
}
