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
        command = service.get("command") or []
        if not any(str(c).startswith("belfry") for c in command):
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
# and compose's hosts (the machine's own, as the tests use them).
LOCAL_URLS = {
    "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/{database}",
    "REDIS_URL": "redis://127.0.0.1:6379/",
    "AMQP_URL": "amqp://guest:guest@127.0.0.1:5672/%2f",
}


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


def deployment_runs(directory, tmp):
    """What each Deployment's containers would run, outside a container:
    (where, argv, env, files to write, readiness URL path and port, grace
    period in seconds). Values come from the manifests themselves: command
    and args, env (a fieldRef is the pod's name), envFrom of the overlays'
    Secrets, ConfigMap volumes written under `tmp` with paths in the env
    rewritten to them."""
    secrets, maps = secret_literals(directory), config_maps(directory)
    runs = []
    for path, doc in manifest_docs(directory):
        if doc.get("kind") != "Deployment":
            continue
        pod = doc["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for c in pod["containers"]:
            where = f"{shown(path)} {doc['metadata']['name']}/{c['name']}"
            env, files, mounts = {}, {}, {}
            for m in c.get("volumeMounts", []):
                cm = volumes.get(m["name"], {}).get("configMap")
                if cm:
                    local = pathlib.Path(tmp) / doc["metadata"]["name"] / m["name"]
                    mounts[m["mountPath"]] = str(local)
                    for key, text in maps.get(cm["name"], {}).items():
                        files[local / key] = text
            for ref in c.get("envFrom", []):
                env.update(secrets.get(ref.get("secretRef", {}).get("name"), {}))
            for e in c.get("env", []):
                if "value" in e:
                    value = str(e["value"])
                    for mount, local in mounts.items():
                        if value.startswith(mount.rstrip("/") + "/"):
                            value = local + value[len(mount.rstrip("/")):]
                    env[e["name"]] = value
                elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
                    env[e["name"]] = f"{doc['metadata']['name']}-deploy-check"
            ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
            probe = (c.get("readinessProbe") or c.get("livenessProbe") or {}).get("httpGet")
            if probe:
                ready = (probe["path"], ports.get(probe["port"], probe["port"]))
            else:
                ready = ("/metrics", ports.get("metrics"))
            argv = list(c.get("command", [])) + list(c.get("args", []))
            grace = pod.get("terminationGracePeriodSeconds", 30)
            runs.append((where, argv, env, files, ready, grace))
    return runs


def compose_runs(compose):
    """The same for docker-compose.yml's belfry services (no probe: the
    metrics endpoint, published in the container on BELFRY_METRICS_ADDR)."""
    runs = []
    for name, service in compose.get("services", {}).items():
        command = [str(c) for c in service.get("command") or []]
        if not command or not command[0].startswith("belfry"):
            continue
        env = {k: str(v) for k, v in (service.get("environment") or {}).items()}
        port = int(env.get("BELFRY_METRICS_ADDR", "0.0.0.0:9464").rsplit(":", 1)[1])
        runs.append((f"docker-compose.yml {name}", command, env, {}, ("/metrics", port), 30))
    return runs


def http_status(port, path):
    import urllib.request
    import urllib.error
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def run_one(where, argv, env, files, ready, grace, bin_dir, database):
    """Starts one command line with its environment (the service URLs
    pointed at this machine's, a namespace of its own), waits until its
    probe answers 200, sends SIGTERM and expects exit code 0 within the
    pod's grace period. Returns the problem, or None."""
    import os
    import signal
    import subprocess
    import time
    import uuid
    if not argv:
        return f"{where}: no command (the image has no entrypoint: the manifest must name the binary)"
    binary = pathlib.Path(bin_dir) / argv[0]
    if not binary.is_file():
        return f"{where}: command {argv[0]!r} is not a belfry binary (no {shown(binary)})"
    path, port = ready
    if port is None:
        return f"{where}: no probe and no metrics port to tell that it started"
    if http_status(port, path) is not None:
        return f"{where}: port {port} is already taken on this machine; cannot run the command line"
    for file, text in files.items():
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(text)
    full = dict(os.environ)
    full.update(env)
    for name, url in LOCAL_URLS.items():
        full[name] = url.format(database=database)
    full["BELFRY_NAMESPACE"] = "t" + uuid.uuid4().hex
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([str(binary)] + argv[1:], env=full, stdout=log, stderr=subprocess.STDOUT)

    def tail():
        log.seek(0)
        return log.read().decode(errors="replace")[-1500:]
    try:
        deadline = time.monotonic() + 60
        while http_status(port, path) != 200:
            if proc.poll() is not None:
                return f"{where}: exited with {proc.returncode} before {path} answered 200:\n{tail()}"
            if time.monotonic() > deadline:
                return f"{where}: {path} on port {port} did not answer 200 within 60 s:\n{tail()}"
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            return f"{where}: still running {grace} s (the pod's grace period) after SIGTERM"
        if code != 0:
            return f"{where}: exit code {code} after SIGTERM:\n{tail()}"
        return None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def image_runtime(dockerfile):
    """The Dockerfile's last stage, as a container built from it starts:
    (binaries copied in from the build stage, its ENV with each path the
    stage COPYs from the repository pointed at that repository file)."""
    stage = dockerfile.split("\nFROM ")[-1]
    binaries, copied, env = set(), {}, {}
    for line in stage.splitlines():
        words = line.split()
        if not words:
            continue
        if words[0] == "COPY" and words[1].startswith("--from="):
            binaries.update(pathlib.Path(w).name for w in words[2:-1])
        elif words[0] == "COPY":
            copied[words[-1]] = str(ROOT / words[1])
        elif words[0] == "ENV":
            for pair in words[1:]:
                key, value = pair.split("=", 1)
                env[key] = copied.get(value, value)
    return binaries, env


def run_commands(deploy, compose, bin_dir, dockerfile):
    """--run: every command line of the manifests and compose, run in the
    image's environment (its ENV, then the container's own)."""
    import subprocess
    import uuid
    binaries, image_env = image_runtime(dockerfile)
    database = "belfry_deploycheck_" + uuid.uuid4().hex
    psql = ["psql", "-h", "127.0.0.1", "-U", "postgres", "-qc"]
    subprocess.run(psql + [f"CREATE DATABASE {database}"], check=True)
    problems, count = [], 0
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for where, argv, env, files, ready, grace in deployment_runs(deploy, tmp) + compose_runs(compose):
                count += 1
                if argv and argv[0] not in binaries:
                    problem = f"{where}: the image has no {argv[0]!r} (the Dockerfile copies {sorted(binaries)})"
                else:
                    problem = run_one(where, argv, {**image_env, **env}, files, ready, grace, bin_dir, database)
                print(f"deploy-check --run: {where}: {'ok' if problem is None else 'FAILED'}")
                if problem:
                    problems.append(problem)
    finally:
        subprocess.run(psql + [f"DROP DATABASE IF EXISTS {database} WITH (FORCE)"])
    return problems, count


def main():
    read = names_read()
    deploy = ROOT / "deploy" / "kubernetes"
    if "--run" in sys.argv:
        bin_dir = sys.argv[sys.argv.index("--run") + 1]
        compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
        dockerfile = (ROOT / "Dockerfile").read_text()
        # Self-test first: a misspelt binary and a value the worker refuses
        # must be reported.
        with tempfile.TemporaryDirectory() as tmp:
            copy = pathlib.Path(tmp) / "kubernetes"
            shutil.copytree(deploy, copy)
            for name, old, new in [("scheduler.yaml", '["belfry-scheduler"]', '["belfry-schedular"]'),
                                   ("worker.yaml", 'value: "32"', 'value: "lots"')]:
                path = copy / "base" / name
                assert old in path.read_text(), f"self-test: {old} not in {name}"
                path.write_text(path.read_text().replace(old, new, 1))
            broken, _ = run_commands(copy, {}, bin_dir, dockerfile)
        if len(broken) != 2:
            print(f"deploy-check --run self-test: a broken command line was NOT reported ({broken})", file=sys.stderr)
            return 1
        print("deploy-check --run self-test: a misspelt binary and a refused value are reported:",
              "; ".join(b.splitlines()[0] for b in broken))
        problems, count = run_commands(deploy, compose, bin_dir, dockerfile)
        for p in problems:
            print(f"deploy-check: {p}", file=sys.stderr)
        print(f"deploy-check --run: {count - len(problems)} of {count} command lines started, "
              f"became ready and stopped cleanly on SIGTERM")
        return 1 if problems else 0
    if "--self-test" in sys.argv:
        with tempfile.TemporaryDirectory() as tmp:
            copy = pathlib.Path(tmp) / "kubernetes"
            shutil.copytree(deploy, copy)
            path = copy / "base" / "worker.yaml"
            path.write_text(path.read_text().replace(
                "name: BELFRY_WORKER_GROUP", "name: BELFRY_WORKERS_GROUP", 1))
            problems = check_env(manifest_env(copy), read)
            keda = copy / "autoscaling" / "keda-worker-default.yaml"
            keda.write_text(keda.read_text().replace("maxReplicaCount:", "maxReplicas:", 1))
            custom, _ = check_schemas(copy)
            hpa = copy / "autoscaling" / "hpa-worker-default.yaml"
            hpa.write_text(hpa.read_text().replace("name: belfry_jobs_in_flight", "name: belfry_job_in_flight", 1))
            metrics = check_metrics(copy, metrics_exported())
        if not any("BELFRY_WORKERS_GROUP" in p for p in problems):
            print("deploy-check self-test: a misspelt variable in a manifest was NOT reported", file=sys.stderr)
            return 1
        print("deploy-check self-test: a misspelt variable in a manifest is reported:", problems[0])
        if not any("maxReplicas: unknown field" in p for p in custom):
            print(f"deploy-check self-test: a misspelt ScaledObject field was NOT reported ({custom})",
                  file=sys.stderr)
            return 1
        print("deploy-check self-test: a misspelt ScaledObject field is reported:",
              next(p for p in custom if "maxReplicas" in p))
        if not any("belfry_job_in_flight" in p for p in metrics):
            print(f"deploy-check self-test: a misspelt metric was NOT reported ({metrics})", file=sys.stderr)
            return 1
        print("deploy-check self-test: a misspelt metric is reported:", metrics[0])
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
