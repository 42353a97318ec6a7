#!/usr/bin/env python3
# Writes the OpenAPI document of the REST API to stdout:
#   python3 scripts/openapi-gen.py > server/openapi.json
# The Rust tests check that the served document equals the committed one and
# that every path in it is routed.
import json
NAME = {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,100}$", "description": "1 to 100 characters from A-Z a-z 0-9 . _ -"}
def ref(n): return {"$ref": f"#/components/schemas/{n}"}
def err(desc): return {"description": desc, "content": {"application/json": {"schema": ref("Error")}}}
def ok(desc, schema): return {"description": desc, "content": {"application/json": {"schema": schema}}}
STD = {"400": err("Malformed request (JSON syntax, query parameter, cursor)"),
       "401": err("No token or an unknown token"),
       "403": err("Read-only token asking for a change, a cross-site request, or (API without tokens) a Host that is not loopback"),
       "503": err("Postgres or RabbitMQ unreachable; retry")}
def responses(extra, write=False):
    r = dict(STD)
    if write:
        r["413"] = err("Body over 1 MiB")
    r.update(extra)
    return r
name_param = {"name": "name", "in": "path", "required": True, "schema": NAME, "description": "Schedule name"}
def body(schema, required=True):
    return {"required": required, "content": {"application/json": {"schema": schema}}}
nstr = {"type": "string", "nullable": True}
ndt = {"type": "string", "format": "date-time", "nullable": True}
schedule_props = {
    "name": NAME,
    "cron": {"type": "string", "description": "6 fields with seconds, or 5 (seconds = 0); macros, L W # ?"},
    "every": {"type": "string", "description": "Interval such as \"30s\", whole seconds"},
    "anchor": {"type": "string", "description": "With `every`: RFC 3339 instant intervals count from"},
    "at": {"type": "string", "description": "One-shot instant, RFC 3339"},
    "after": {"type": "string", "description": "One-shot delay from creation (stored as `at`)"},
    "timezone": {"type": "string", "description": "IANA zone for `cron`; default UTC"},
    "job_type": NAME,
    "payload": {"description": "Any JSON value, passed to the handler"},
    "retry": ref("Retry"),
    "timeout": {"type": "string", "description": "Per-attempt timeout, e.g. \"10m\""},
    "misfire": {"type": "string", "enum": ["skip", "fire_once", "catch_up"]},
    "catch_up_window": {"type": "string"},
    "catch_up_max": {"type": "integer", "minimum": 1, "maximum": 10000},
    "overlap": {"type": "string", "enum": ["allow", "forbid"]},
    "jitter": {"type": "string"},
    "paused": {"type": "boolean", "description": "In a body: sets the paused state"},
}
schedule_out = dict(schedule_props)
schedule_out["updated_at"] = dict(ndt, readOnly=True)
schedule_out["invalid"] = {"type": "string", "readOnly": True, "description": "Why a hand-edited stored definition does not fire"}
run_props = {
    "id": {"type": "string", "format": "uuid"},
    "job_name": {"type": "string"}, "run_key": {"type": "string"}, "job_type": {"type": "string"},
    "status": {"type": "string", "enum": ["claimed", "dispatched", "running", "retrying", "succeeded", "failed", "dead"]},
    "origin": {"type": "string", "enum": ["schedule", "backfill", "manual", "adhoc"]},
    "scheduled_at": {"type": "string", "format": "date-time"},
    "claimed_at": ndt, "dispatched_at": ndt, "started_at": ndt, "finished_at": ndt,
    "lateness_ms": {"type": "integer", "nullable": True},
    "attempts": {"type": "integer", "minimum": 0},
    "claimed_by": nstr, "worker": nstr, "last_error": nstr, "trace_id": nstr,
}
run_detail = dict(run_props)
run_detail["payload"] = {"description": "The run's payload"}
run_detail["options"] = {"type": "object"}
run_detail["attempt_log"] = {"type": "array", "items": ref("Attempt")}
req_run = ["id", "job_name", "run_key", "job_type", "status", "origin", "scheduled_at", "attempts"]
schedule_links = {op[0].upper() + op[1:]: {"operationId": op, "parameters": {"name": "$response.body#/name"}}
                  for op in ["getSchedule", "replaceSchedule", "deleteSchedule", "pauseSchedule", "resumeSchedule",
                             "triggerSchedule", "backfillSchedule", "previewSchedule"]}
doc = {
 "openapi": "3.0.3",
 "info": {"title": "belfry API", "version": "1",
          "description": "Schedules, runs, manual triggers, backfills and ad-hoc jobs of a belfry cluster. Served by every belfry-scheduler replica on BELFRY_API_ADDR. Errors are always the Error object; 400 malformed request, 401/403 auth, 404 missing, 409 conflicts with current state, 413 body too large, 422 a field breaks the rules (field names it), 503 a service is unreachable."},
 "security": [{"bearer": []}],
 "paths": {
  "/healthz": {"get": {"operationId": "healthz", "security": [], "summary": "Liveness",
      "responses": {"200": ok("The process serves requests", {"type": "object", "properties": {"status": {"type": "string", "enum": ["ok"]}}, "required": ["status"]})}}},
  "/readyz": {"get": {"operationId": "readyz", "security": [], "summary": "Readiness: Postgres and RabbitMQ required, Redis reported (embedded mode: its database)",
      "responses": {"200": ok("Ready (or degraded: Redis down, claims exact through Postgres)", ref("Readiness")),
                    "503": ok("Not ready: Postgres or RabbitMQ down", ref("Readiness"))}}},
  "/openapi.json": {"get": {"operationId": "openapi", "security": [], "summary": "This document",
      "responses": {"200": {"description": "OpenAPI 3 document", "content": {"application/json": {"schema": {"type": "object"}}}}}}},
  "/v1/schedules": {
    "get": {"operationId": "listSchedules", "summary": "Schedules by name, paginated",
        "parameters": [{"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 500, "default": 100}},
                       {"name": "cursor", "in": "query", "schema": NAME, "description": "next_cursor of the previous page (the last name)"}],
        "responses": responses({"200": ok("A page", ref("ScheduleList"))})},
    "post": {"operationId": "createSchedule", "summary": "Create a schedule",
        "requestBody": body(ref("ScheduleInput")),
        "responses": responses({"201": dict(ok("Created", ref("Schedule")), links=schedule_links), "409": err("Name taken"), "422": err("Invalid field")}, True)}},
  "/v1/schedules/{name}": {
    "parameters": [name_param],
    "get": {"operationId": "getSchedule", "summary": "One schedule",
        "responses": responses({"200": ok("The schedule", ref("Schedule")), "404": err("No such schedule")})},
    "put": {"operationId": "replaceSchedule", "summary": "Replace a schedule's definition",
        "requestBody": body(ref("ScheduleReplace")),
        "responses": responses({"200": ok("Replaced", ref("Schedule")), "404": err("No such schedule"), "422": err("Invalid field")}, True)},
    "delete": {"operationId": "deleteSchedule", "summary": "Delete a schedule (its runs stay)",
        "responses": responses({"204": {"description": "Deleted"}, "404": err("No such schedule")}, True)}},
  "/v1/schedules/{name}/pause": {"parameters": [name_param], "post": {"operationId": "pauseSchedule", "summary": "Stop firing until resumed",
        "responses": responses({"200": ok("Paused", ref("Schedule")), "404": err("No such schedule")}, True)}},
  "/v1/schedules/{name}/resume": {"parameters": [name_param], "post": {"operationId": "resumeSchedule", "summary": "Fire again; fires missed while paused follow the misfire policy",
        "responses": responses({"200": ok("Resumed", ref("Schedule")), "404": err("No such schedule")}, True)}},
  "/v1/schedules/{name}/trigger": {"parameters": [name_param], "post": {"operationId": "triggerSchedule", "summary": "Run now with its own run key (overlap policy applies unless forced)",
        "requestBody": body(ref("TriggerRequest"), False),
        "responses": responses({"202": dict(ok("Run created", ref("Triggered")), links={"GetRun": {"operationId": "getRun", "parameters": {"id": "$response.body#/run_id"}}}), "404": err("No such schedule"), "409": err("Overlap forbidden and previous run unfinished, or stored definition invalid"), "422": err("Invalid field")}, True)}},
  "/v1/schedules/{name}/backfill": {"parameters": [name_param], "post": {"operationId": "backfillSchedule", "summary": "Fire every instant in [from, to) through the claim path; fires that already ran are not repeated",
        "requestBody": body(ref("BackfillRequest")),
        "responses": responses({"200": ok("What happened to each instant", ref("Backfill")), "404": err("No such schedule"), "409": err("Overlap forbidden for a multi-instant backfill without force, or stored definition invalid"), "422": err("Invalid range, or older than the run retention")}, True)}},
  "/v1/schedules/{name}/preview": {"parameters": [name_param], "get": {"operationId": "previewSchedule", "summary": "Next fire instants",
        "parameters": [{"name": "count", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 100, "default": 10}}],
        "responses": responses({"200": ok("Instants", ref("Preview")), "404": err("No such schedule"), "409": err("Stored definition invalid")})}},
  "/v1/runs": {"get": {"operationId": "listRuns", "summary": "Runs, newest fire first, with filters and cursor pagination",
        "parameters": [
            {"name": "schedule", "in": "query", "schema": {"type": "string", "minLength": 1}, "description": "Job name"},
            {"name": "job_type", "in": "query", "schema": {"type": "string", "minLength": 1}},
            {"name": "status", "in": "query", "schema": {"type": "string", "pattern": "^(claimed|dispatched|running|retrying|succeeded|failed|dead)(,(claimed|dispatched|running|retrying|succeeded|failed|dead))*$"}, "description": "Comma-separated statuses"},
            {"name": "from", "in": "query", "schema": {"type": "string", "format": "date-time"}, "description": "scheduled_at >= from"},
            {"name": "to", "in": "query", "schema": {"type": "string", "format": "date-time"}, "description": "scheduled_at < to"},
            {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 500, "default": 50}},
            {"name": "cursor", "in": "query", "schema": {"type": "string", "pattern": "^-?[0-9]{1,17}\\.[0-9a-f]{32}$"}, "description": "next_cursor of the previous page, unchanged"}],
        "responses": responses({"200": ok("A page", ref("RunList"))})}},
  "/v1/runs/{id}": {"get": {"operationId": "getRun", "summary": "One run with attempts, errors, timings, replica, worker, trace id",
        "parameters": [{"name": "id", "in": "path", "required": True, "schema": {"type": "string", "format": "uuid"}}],
        "responses": responses({"200": ok("The run", ref("RunDetail")), "404": err("No such run")})}},
  "/v1/jobs": {"post": {"operationId": "enqueueJob", "summary": "Enqueue an ad-hoc job of any type",
        "requestBody": body(ref("JobRequest")),
        "responses": responses({"201": dict(ok("Created", ref("Enqueued")), links={"GetRun": {"operationId": "getRun", "parameters": {"id": "$response.body#/run_id"}}}), "200": ok("Already enqueued with this name and key", ref("Enqueued")), "422": err("Invalid field")}, True)}},
 },
 "components": {
  "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "description": "BELFRY_API_ADMIN_TOKENS (changes) or BELFRY_API_READ_TOKENS (GET only); none configured: open, loopback only"}},
  "schemas": {
   "Error": {"type": "object", "required": ["error", "message"], "properties": {
       "error": {"type": "string", "enum": ["bad_request", "unauthorized", "forbidden", "not_found", "method_not_allowed", "conflict", "payload_too_large", "invalid", "unavailable"]},
       "message": {"type": "string"}, "field": {"type": "string"}}},
   "Readiness": {"type": "object", "required": ["status", "mode", "redis"], "properties": {
       "status": {"type": "string", "enum": ["ready", "degraded", "not_ready"]}, "instance": {"type": "string"},
       "mode": {"type": "string", "enum": ["distributed", "embedded"]},
       "postgres": {"type": "string", "enum": ["up", "down"], "description": "distributed mode"},
       "rabbitmq": {"type": "string", "enum": ["up", "down"], "description": "distributed mode"},
       "database": {"type": "string", "enum": ["up", "down"], "description": "embedded mode: the SQLite file (ledger and queue)"},
       "queue": {"type": "string", "enum": ["up", "down"], "description": "embedded mode: the job queue in that file"},
       "redis": {"type": "string", "enum": ["up", "down", "disabled"]}}},
   "Retry": {"type": "object", "additionalProperties": False, "properties": {
       "max_attempts": {"type": "integer", "minimum": 1, "maximum": 1000}, "initial_delay": {"type": "string"},
       "multiplier": {"type": "number", "minimum": 1, "maximum": 100}, "max_delay": {"type": "string"}, "jitter": {"type": "boolean"}}},
   "ScheduleInput": {"type": "object", "required": ["name", "job_type"], "additionalProperties": False, "properties": schedule_props,
       "description": "A [[schedule]] table of the schedule file as JSON; exactly one of cron, every, at, after",
       "example": {"name": "nightly-report", "cron": "0 0 3 * * *", "timezone": "Asia/Shanghai", "job_type": "noop", "payload": {"report": "daily"}}},
   "ScheduleReplace": {"type": "object", "required": ["job_type"], "additionalProperties": False, "properties": dict(schedule_props, updated_at={"description": "Ignored (read-only)"}),
       "description": "As ScheduleInput; name optional but must equal the path",
       "example": {"every": "30s", "job_type": "noop"}},
   "Schedule": {"type": "object", "required": ["name", "paused"], "properties": schedule_out},
   "ScheduleList": {"type": "object", "required": ["schedules", "next_cursor"], "properties": {
       "schedules": {"type": "array", "items": ref("Schedule")}, "next_cursor": nstr}},
   "TriggerRequest": {"type": "object", "additionalProperties": False, "properties": {"force": {"type": "boolean", "default": False}}},
   "Triggered": {"type": "object", "required": ["outcome", "run_id"], "properties": {
       "outcome": {"type": "string", "enum": ["dispatched", "unroutable", "not_confirmed"]},
       "run_id": {"type": "string", "format": "uuid"}, "run_key": nstr, "status": nstr, "trace_id": nstr, "message": nstr}},
   "BackfillRequest": {"type": "object", "required": ["from", "to"], "additionalProperties": False,
       "example": {"from": "2026-07-26T00:00:00Z", "to": "2026-07-26T01:00:00Z"}, "properties": {
       "from": {"type": "string", "format": "date-time"}, "to": {"type": "string", "format": "date-time"},
       "force": {"type": "boolean", "default": False, "description": "With overlap = forbid: claim every instant anyway (they may run side by side)"}}},
   "Backfill": {"type": "object", "required": ["schedule", "from", "to", "instants", "counts", "fires"], "properties": {
       "schedule": {"type": "string"}, "from": {"type": "string", "format": "date-time"}, "to": {"type": "string", "format": "date-time"},
       "instants": {"type": "integer", "minimum": 0, "maximum": 10000},
       "counts": {"type": "object", "additionalProperties": {"type": "integer"}, "description": "dispatched, already_ran, skipped, not_confirmed, unroutable, failed"},
       "fires": {"type": "array", "items": {"type": "object", "required": ["scheduled_at", "outcome"], "properties": {
           "scheduled_at": {"type": "string", "format": "date-time"}, "outcome": {"type": "string"}}}}}},
   "Preview": {"type": "object", "required": ["schedule", "paused", "next"], "properties": {
       "schedule": {"type": "string"}, "paused": {"type": "boolean"}, "next": {"type": "array", "items": {"type": "string", "format": "date-time"}}}},
   "Run": {"type": "object", "required": req_run, "properties": run_props},
   "RunDetail": {"type": "object", "required": req_run + ["attempt_log"], "properties": run_detail},
   "Attempt": {"type": "object", "required": ["attempt", "worker", "started_at", "finished_at", "outcome"], "properties": {
       "attempt": {"type": "integer"}, "worker": {"type": "string"}, "started_at": {"type": "string", "format": "date-time"},
       "finished_at": {"type": "string", "format": "date-time"}, "outcome": {"type": "string"}, "error": {"type": "string"}}},
   "RunList": {"type": "object", "required": ["runs", "next_cursor"], "properties": {"runs": {"type": "array", "items": ref("Run")}, "next_cursor": nstr}},
   "JobRequest": {"type": "object", "required": ["job_type"], "additionalProperties": False,
       "example": {"job_type": "noop", "payload": {"customer": "c-42"}, "name": "billing", "key": "invoice-2026-07", "delay": "10m"}, "properties": {
       "job_type": NAME, "payload": {"description": "Any JSON value"}, "name": NAME,
       "key": {"type": "string", "description": "Idempotency key: the same name and key enqueue once"},
       "at": {"type": "string", "format": "date-time"}, "delay": {"type": "string", "description": "e.g. \"10m\""},
       "retry": ref("Retry"), "timeout": {"type": "string"}}},
   "Enqueued": {"type": "object", "required": ["created", "run_id", "run_key"], "properties": {
       "created": {"type": "boolean"}, "run_id": {"type": "string", "format": "uuid"}, "run_key": {"type": "string"},
       "status": nstr, "scheduled_at": {"type": "string", "format": "date-time"}, "trace_id": nstr}},
  }}}
print(json.dumps(doc, indent=2))
