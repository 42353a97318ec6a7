"""Checks the deployment files against the binaries (issue 24).

* Every environment variable the Kubernetes manifests (deploy/kubernetes)
  and docker-compose.yml set for a belfry process is one the binaries read:
  a name in a string literal of their crates' sources (the settings code and
  its documented tables), so a misspelt or retired name fails here instead
  of being silently ignored in production.
* docker-compose.yml agrees with the README: the services the README
  starts exist, the services' ports are the ones belfry's defaults and
  tests use, and every `service_healthy` dependency has a healthcheck.
* Every Kubernetes object of the base and the autoscaling files validates
  against the Kubernetes OpenAPI schemas (kubernetes-validate, pinned in
  scripts/deploy-check); the custom resources (KEDA's ScaledObject and
  TriggerAuthentication, the Prometheus Operator's ServiceMonitor) against
  the types of the kubernetes-models packages (npm, pinned), unknown
  fields included (scripts/deploy_check_crds.mjs).

* Every belfry metric the files name (the HPA's, prometheus-adapter's
  rule) is one the binaries export.

`--self-test` shows the checks can fail: a manifest naming a variable
belfry does not read, a misspelt ScaledObject field and a misspelt metric
must be reported.

`--run BIN_DIR` runs every command line of the manifests' Deployments and
of compose's belfry services outside containers, with the binaries in
BIN_DIR (each must be one the Dockerfile's runtime stage copies in), the
image's ENV (paths it COPYs pointed at the repository's files) under the
manifests' own environment (the Secrets' service URLs pointed at this
machine's services): each must answer its probe (the readiness
probe, else the metrics endpoint) and exit 0 on SIGTERM within its pod's
grace period. Its self-test first: a misspelt binary and a value the
worker refuses must be reported.
"""

import pathlib
import re
import shutil
import sys
import tempfile

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
# The crates the binaries are built from (tests, benches and the testkit
# read variables of their own and are left out).
CRATES = ["runtime", "scheduler", "server", "worker", "alert", "ledger", "broker",
          "dispatch", "embedded", "cli", "protocol", "api-types"]
NAME = re.compile(r'"((?:BELFRY|OTEL)_[A-Z0-9_]+|DATABASE_URL|REDIS_URL|AMQP_URL|RUST_LOG)"')
KUBERNETES_VERSION = "1.31.0"
# Kinds no Kubernetes schema covers (custom resources), checked against
# the kubernetes-models packages (scripts/deploy_check_crds.mjs).
CUSTOM_KINDS = {"ScaledObject", "TriggerAuthentication", "ServiceMonitor"}
NODE_DIR = ROOT / "target" / "deploy-check-node"


def literals(pattern):
    """Every string literal of the binaries' sources that `pattern` matches."""
    found = set()
    for crate in CRATES:
        for path in (ROOT / crate / "src").rglob("*.rs"):
            found.update(pattern.findall(path.read_text()))
    return found


def names_read():
    """Every variable name the binaries' sources spell out."""
    return literals(NAME)


METRIC = re.compile(r'"(belfry_[a-z0-9_]+)"')
# Suffixes the exposition adds to a metric's registered name.
METRIC_SUFFIX = re.compile(r"_(total|bucket|sum|count|created)$")


def metrics_exported():
    """Every metric name the binaries' sources register."""
    return literals(METRIC)


def check_metrics(directory, exported):
    """Every belfry metric the deployment files name (the HPA's metric, the
    adapter's rule) is one the binaries export."""
    problems = []
    for path in sorted(directory.rglob("*.yaml")):
        for name in sorted(set(re.findall(r"\bbelfry_[a-z0-9_]+\b", path.read_text()))):
            if name not in exported and METRIC_SUFFIX.sub("", name) not in exported:
                problems.append(f"{shown(path)}: metric {name} is not exported by any belfry binary")
    return problems


def shown(path):
    """`path` relative to the repository when it is inside it."""
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def manifest_docs(directory):
    """(path, document) of every Kubernetes object under `directory`."""
    for path in sorted(directory.rglob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                yield path, doc


def manifest_env(directory):
    """(where, name) of every variable the manifests and the overlays'
    Secrets set."""
    out = []
    for path, doc in manifest_docs(directory):
        spec = doc.get("spec", {}).get("template", {}).get("spec", {})
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            for e in c.get("env", []):
                out.append((f"{shown(path)} {doc['metadata']['name']}/{c['name']}", e["name"]))
    for path in sorted(directory.rglob("kustomization.yaml")):
        k = yaml.safe_load(path.read_text()) or {}
        for gen in k.get("secretGenerator", []) + k.get("configMapGenerator", []):
            for literal in gen.get("literals", []):
                out.append((f"{shown(path)} {gen['name']}", literal.split("=", 1)[0]))
    return out


def compose_env(compose):
    """(where, name) of every variable compose sets for a belfry process."""
    out = []
    for name, service in compose.get("services", {}).items():
        if not is_belfry(service):
            continue
        for var in (service.get("environment") or {}):
            out.append((f"docker-compose.yml {name}", var))
    return out


def check_env(named, read):
    return [f"{where}: {var} is not read by any belfry binary" for where, var in named if var not in read]


def check_compose(compose, readme):
    problems = []
    services = compose.get("services", {})
    for cmd in re.findall(r"docker compose up -d ([a-z0-9 ]+)", readme):
        for s in cmd.split():
            if s not in services:
                problems.append(f"README starts compose service {s}, which docker-compose.yml does not have")
    expected = {"postgres": "5432", "redis": "6379", "rabbitmq": "5672"}
    for s, port in expected.items():
        ports = [str(p) for p in services.get(s, {}).get("ports", [])]
        if not any(p.endswith(f":{port}") and p.split(":")[-2] == port for p in ports):
            problems.append(f"compose service {s} does not publish {port} (the port belfry's defaults and tests use): {ports}")
    for name, service in services.items():
        for dep, how in (service.get("depends_on") or {}).items():
            if isinstance(how, dict) and how.get("condition") == "service_healthy" \
                    and "healthcheck" not in services.get(dep, {}):
                problems.append(f"compose service {name} waits for {dep} to be healthy, but {dep} has no healthcheck")
    return problems


def check_custom(custom):
    """KEDA's and the Prometheus Operator's kinds, checked by
    scripts/deploy_check_crds.mjs with the kubernetes-models packages that
    scripts/deploy-check installed into NODE_DIR: types, required fields
    and unknown fields."""
    import json
    import subprocess
    script = NODE_DIR / "deploy_check_crds.mjs"
    shutil.copyfile(ROOT / "scripts" / "deploy_check_crds.mjs", script)
    items = [{"where": where, "doc": doc} for where, doc in custom]
    p = subprocess.run(["node", str(script)], input=json.dumps(items), text=True,
                       capture_output=True, cwd=NODE_DIR)
    if p.returncode not in (0, 1) or (p.returncode == 1 and not p.stderr.strip()):
        return [f"the custom-resource check could not run (exit {p.returncode}): {p.stderr.strip()}"]
    return [line for line in p.stderr.splitlines() if line.strip()]


def check_schemas(directory):
    import kubernetes_validate  # installed by scripts/deploy-check
    problems, custom = [], []
    for path, doc in manifest_docs(directory):
        where = f"{shown(path)} {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        if doc.get("kind") in CUSTOM_KINDS:
            custom.append((where, doc))
            continue
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            problems.append(f"{where}: {e.message} at {'.'.join(str(p) for p in e.path)}")
    return problems + check_custom(custom), [where for where, _ in custom]


# --run: the services the processes are pointed at instead of the Secrets'
# and compose's hosts: the machine's own, from the variables the testkit
# reads (BELFRY_TEST_*), with the same defaults.
def local_urls():
    import os
    admin = os.environ.get("BELFRY_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    return admin, {
        "DATABASE_URL": admin.rsplit("/", 1)[0] + "/{database}",
        "REDIS_URL": os.environ.get("BELFRY_TEST_REDIS_URL", "redis://127.0.0.1:6379/"),
        "AMQP_URL": os.environ.get("BELFRY_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f"),
    }


# The addresses a process binds; --run moves each to a free loopback port
# (a port of this machine may be taken, and 0.0.0.0 would expose the API
# with the example tokens) and probes the moved port.
ADDRESS_VARS = ("BELFRY_API_ADDR", "BELFRY_METRICS_ADDR")
# What a process's environment starts from: a container's is empty but for
# what the image and the manifest set (the caller's BELFRY_*, RUST_LOG or
# OTEL_* must not leak in).
BASE_ENV = ("PATH", "HOME", "TMPDIR")


def secret_literals(directory):
    """{Secret name: {key: value}} of the overlays' secretGenerators."""
    out = {}
    for path in sorted(directory.rglob("kustomization.yaml")):
        k = yaml.safe_load(path.read_text()) or {}
        for gen in k.get("secretGenerator", []):
            out[gen["name"]] = dict(lit.split("=", 1) for lit in gen.get("literals", []))
    return out


def config_maps(directory):
    """{ConfigMap name: data} of the manifests."""
    return {doc["metadata"]["name"]: doc.get("data", {})
            for _, doc in manifest_docs(directory) if doc.get("kind") == "ConfigMap"}


class Run:
    """One command line to run: where it is written, argv, its environment
    (the container's), files to write first, the probe (path, port or port
    name), the ports by name, and the grace period after SIGTERM."""

    def __init__(self, where, argv, env, files, probe, ports, grace, problems=()):
        self.where, self.argv, self.env, self.files = where, argv, env, files
        self.probe, self.ports, self.grace = probe, ports, grace
        self.problems = list(problems)


def deployment_runs(directory, tmp):
    """What each Deployment's containers would run, outside a container.
    Values come from the manifests themselves: command and args, env (a
    fieldRef is the pod's name), envFrom of the overlays' Secrets, ConfigMap
    volumes written under `tmp` with paths in the env rewritten to them. A
    reference to a Secret no overlay generates is reported (the pod would
    not start)."""
    secrets, maps = secret_literals(directory), config_maps(directory)
    runs = []
    for path, doc in manifest_docs(directory):
        if doc.get("kind") != "Deployment":
            continue
        pod = doc["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for c in pod["containers"]:
            where = f"{shown(path)} {doc['metadata']['name']}/{c['name']}"
            env, files, mounts, problems = {}, {}, {}, []
            for m in c.get("volumeMounts", []):
                cm = volumes.get(m["name"], {}).get("configMap")
                if cm:
                    local = pathlib.Path(tmp) / doc["metadata"]["name"] / m["name"]
                    mounts[m["mountPath"].rstrip("/")] = str(local)
                    for key, text in maps.get(cm["name"], {}).items():
                        files[local / key] = text
            for ref in c.get("envFrom", []):
                name = (ref.get("secretRef") or {}).get("name")
                if name in secrets:
                    env.update(secrets[name])
                elif not (ref.get("secretRef") or ref.get("configMapRef") or {}).get("optional"):
                    problems.append(f"{where}: envFrom {ref} names nothing the overlays generate")
            for e in c.get("env", []):
                if "value" in e:
                    value = str(e["value"])
                    for mount, local in mounts.items():
                        if value.startswith(mount + "/"):
                            value = local + value[len(mount):]
                    env[e["name"]] = value
                elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
                    env[e["name"]] = f"{doc['metadata']['name']}-deploy-check"
                else:
                    problems.append(f"{where}: {e['name']} comes from {e.get('valueFrom')}, which --run cannot resolve")
            ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
            http = (c.get("readinessProbe") or c.get("livenessProbe") or {}).get("httpGet")
            probe = (http.get("path", "/"), http["port"]) if http else ("/metrics", "metrics")
            if not c.get("command"):
                problems.append(f"{where}: no command (the image has no entrypoint: the manifest must name the binary)")
            argv = list(c.get("command", [])) + list(c.get("args", []))
            runs.append(Run(where, argv, env, files, probe, ports,
                            pod.get("terminationGracePeriodSeconds", 30), problems))
    return runs


def compose_runs(compose):
    """The same for docker-compose.yml's belfry services: no probe, so the
    metrics endpoint (BELFRY_METRICS_ADDR must be set); the grace period is
    compose's `stop_grace_period` (Docker's default: 10 s)."""
    runs = []
    for name, service in compose.get("services", {}).items():
        if not is_belfry(service):
            continue
        command = [str(c) for c in service["command"]]
        env = {k: str(v) for k, v in (service.get("environment") or {}).items()}
        problems = [] if "BELFRY_METRICS_ADDR" in env else \
            [f"docker-compose.yml {name}: no BELFRY_METRICS_ADDR, so nothing tells that it started"]
        ports = {"metrics": int(env.get("BELFRY_METRICS_ADDR", ":0").rsplit(":", 1)[1])}
        grace = duration_seconds(str(service.get("stop_grace_period", "10s")))
        runs.append(Run(f"docker-compose.yml {name}", command, env, {}, ("/metrics", "metrics"),
                        ports, grace, problems))
    return runs


def duration_seconds(text):
    """Seconds of a compose duration (`45s`, `1m30s`, `2m`)."""
    total = 0.0
    for number, unit in re.findall(r"([0-9.]+)(ms|s|m|h)", text):
        total += float(number) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]
    return total


def is_belfry(service):
    """Whether a compose service runs a belfry binary."""
    command = service.get("command") or []
    return bool(command) and str(command[0]).startswith("belfry")


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_status(port, path):
    """The status of GET path on the loopback port, or None (nothing, or not
    HTTP, answers)."""
    import http.client
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (OSError, http.client.HTTPException):
        return None


def run_one(run, bin_dir, database, urls):
    """Starts one command line with its environment (the service URLs
    pointed at this machine's, a namespace of its own, its listen addresses
    moved to free loopback ports), waits until its probe answers 200, sends
    SIGTERM and expects exit code 0 within the grace period. Returns the
    problem, or None."""
    import os
    import signal
    import subprocess
    import time
    import uuid
    binary = pathlib.Path(bin_dir) / run.argv[0]
    if not binary.is_file():
        return f"{run.where}: command {run.argv[0]!r} is not a belfry binary (no {shown(binary)})"
    env = {k: os.environ[k] for k in BASE_ENV if k in os.environ}
    env.update(run.env)
    for name, url in urls.items():
        env[name] = url.format(database=database)
    env["BELFRY_NAMESPACE"] = "t" + uuid.uuid4().hex
    # The probe's port, found by number or name, follows its address.
    path, port = run.probe
    port = run.ports.get(port, port)
    for var in ADDRESS_VARS:
        if var in env and env[var].strip():
            old = int(env[var].rsplit(":", 1)[1])
            new = free_port()
            env[var] = f"127.0.0.1:{new}"
            if old == port:
                port = new
    if not isinstance(port, int) or port in run.ports.values():
        return f"{run.where}: its probe's port {run.probe[1]!r} is not one it listens on ({', '.join(ADDRESS_VARS)})"
    for file, text in run.files.items():
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(text)
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([str(binary)] + run.argv[1:], env=env, stdout=log, stderr=subprocess.STDOUT)

    def tail():
        log.seek(0)
        return log.read().decode(errors="replace")[-1500:]
    try:
        deadline = time.monotonic() + 60
        while http_status(port, path) != 200:
            if proc.poll() is not None:
                return f"{run.where}: exited with {proc.returncode} before {path} answered 200:\n{tail()}"
            if time.monotonic() > deadline:
                return f"{run.where}: {path} did not answer 200 within 60 s:\n{tail()}"
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=run.grace)
        except subprocess.TimeoutExpired:
            return f"{run.where}: still running {run.grace} s (its grace period) after SIGTERM"
        if code != 0:
            return f"{run.where}: exit code {code} after SIGTERM:\n{tail()}"
        return None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def image_runtime(dockerfile):
    """The Dockerfile's last stage, as a container built from it starts:
    (binaries copied in from the build stage, its ENV with each path the
    stage COPYs from the repository pointed at that repository file)."""
    stage = dockerfile.replace("\\\n", " ").split("\nFROM ")[-1]
    binaries, copied, env = set(), {}, {}
    for line in stage.splitlines():
        words = line.split()
        if not words:
            continue
        flags = [w for w in words[1:] if w.startswith("--")]
        args = [w for w in words[1:] if not w.startswith("--")]
        if words[0] == "COPY" and any(f.startswith("--from=") for f in flags):
            binaries.update(pathlib.Path(w).name for w in args[:-1])
        elif words[0] == "COPY":
            copied[args[-1]] = str(ROOT / args[0])
        elif words[0] == "ENV":
            pairs = [a.split("=", 1) for a in args] if "=" in args[0] else [(args[0], " ".join(args[1:]))]
            for key, value in pairs:
                env[key] = copied.get(value, value)
    return binaries, env


def run_commands(deploy, compose, bin_dir, dockerfile):
    """--run: every command line of the manifests and compose, run in the
    image's environment (its ENV, then the container's own)."""
    import subprocess
    import uuid
    binaries, image_env = image_runtime(dockerfile)
    admin, urls = local_urls()
    database = "belfry_deploycheck_" + uuid.uuid4().hex
    psql = ["psql", "-w", "-q", admin, "-c"]
    try:
        subprocess.run(psql + [f"CREATE DATABASE {database}"], check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        return [f"cannot create a database for the command lines with psql at {admin}: {e}"], 0
    problems, count = [], 0
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for run in deployment_runs(deploy, tmp) + compose_runs(compose):
                count += 1
                if run.problems:
                    problem = "; ".join(run.problems)
                elif run.argv[0] not in binaries:
                    problem = f"{run.where}: the image has no {run.argv[0]!r} (the Dockerfile copies {sorted(binaries)})"
                else:
                    run.env = {**image_env, **run.env}
                    problem = run_one(run, bin_dir, database, urls)
                print(f"deploy-check --run: {run.where}: {'ok' if problem is None else 'FAILED'}")
                if problem:
                    problems.append(problem)
    finally:
        subprocess.run(psql + [f"DROP DATABASE IF EXISTS {database} WITH (FORCE)"])
    return problems, count


def self_test(deploy, edits, check, expected):
    """Runs `check` on a copy of `deploy` with `edits` ((file under deploy,
    text, replacement) each) and returns an error when any `expected`
    text is missing from its problems, else None (the problems printed)."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = pathlib.Path(tmp) / "kubernetes"
        shutil.copytree(deploy, copy)
        for name, old, new in edits:
            path = copy / name
            assert old in path.read_text(), f"self-test: {old!r} is not in {name}"
            path.write_text(path.read_text().replace(old, new, 1))
        problems = check(copy)
    missing = [e for e in expected if not any(e in p for p in problems)]
    if missing:
        return f"not reported: {missing} (problems: {problems})"
    for e in expected:
        print("deploy-check self-test: reported as expected:",
              next(p for p in problems if e in p).splitlines()[0])
    return None


def main():
    read = names_read()
    deploy = ROOT / "deploy" / "kubernetes"
    if "--run" in sys.argv:
        bin_dir = sys.argv[sys.argv.index("--run") + 1]
        compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
        dockerfile = (ROOT / "Dockerfile").read_text()
        # Self-test first: a misspelt binary and a value the worker refuses
        # must be reported, each for its own reason.
        failed = self_test(
            deploy,
            [("base/scheduler.yaml", '["belfry-scheduler"]', '["belfry-schedular"]'),
             ("base/worker.yaml", 'value: "32"', 'value: "lots"')],
            lambda copy: run_commands(copy, {}, bin_dir, dockerfile)[0],
            ["the image has no 'belfry-schedular'", "BELFRY_CONCURRENCY"])
        if failed:
            print(f"deploy-check --run self-test: {failed}", file=sys.stderr)
            return 1
        problems, count = run_commands(deploy, compose, bin_dir, dockerfile)
        for p in problems:
            print(f"deploy-check: {p}", file=sys.stderr)
        print(f"deploy-check --run: {count - len(problems)} of {count} command lines started, "
              f"became ready and stopped cleanly on SIGTERM")
        return 1 if problems else 0
    if "--self-test" in sys.argv:
        checks = [
            ([("base/worker.yaml", "name: BELFRY_WORKER_GROUP", "name: BELFRY_WORKERS_GROUP")],
             lambda copy: check_env(manifest_env(copy), read), ["BELFRY_WORKERS_GROUP"]),
            ([("autoscaling/keda-worker-default.yaml", "maxReplicaCount:", "maxReplicas:"),
              ("monitoring/servicemonitor.yaml", "matchLabels:", "matchLabel:")],
             lambda copy: check_schemas(copy)[0],
             ["maxReplicas: unknown field", "selector.matchLabel: unknown field"]),
            ([("autoscaling/hpa-worker-default.yaml", "name: belfry_jobs_in_flight", "name: belfry_job_in_flight")],
             lambda copy: check_metrics(copy, metrics_exported()), ["belfry_job_in_flight"]),
        ]
        for edits, check, expected in checks:
            failed = self_test(deploy, edits, check, expected)
            if failed:
                print(f"deploy-check self-test: {failed}", file=sys.stderr)
                return 1
        return 0
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    readme = (ROOT / "README.md").read_text()
    named = manifest_env(deploy) + compose_env(compose)
    problems = check_env(named, read) + check_compose(compose, readme) \
        + check_metrics(deploy, metrics_exported())
    schema_problems, custom = check_schemas(deploy)
    problems += schema_problems
    for p in problems:
        print(f"deploy-check: {p}", file=sys.stderr)
    objects = sum(1 for _ in manifest_docs(deploy))
    print(f"deploy-check: {len(named)} variables named by the manifests and compose, all read by the binaries"
          if not problems else f"deploy-check: {len(problems)} problem(s)")
    print(f"deploy-check: {objects - len(custom)} objects checked against Kubernetes {KUBERNETES_VERSION}, "
          f"{len(custom)} custom resources against KEDA's and the Prometheus Operator's types: {', '.join(custom)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
