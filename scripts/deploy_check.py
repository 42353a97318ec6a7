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
  scripts/deploy-check); KEDA's kinds are listed as not checked.

`--self-test` shows the variable check can fail: a manifest naming a
variable belfry does not read must be reported.
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
# Kinds no Kubernetes schema covers (custom resources).
CUSTOM_KINDS = {"ScaledObject", "TriggerAuthentication", "ServiceMonitor"}


def names_read():
    """Every variable name the binaries' sources spell out."""
    read = set()
    for crate in CRATES:
        for path in (ROOT / crate / "src").rglob("*.rs"):
            read.update(NAME.findall(path.read_text()))
    return read


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


def check_schemas(directory):
    import kubernetes_validate  # installed by scripts/deploy-check
    problems, custom = [], []
    for path, doc in manifest_docs(directory):
        where = f"{shown(path)} {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        if doc.get("kind") in CUSTOM_KINDS:
            custom.append(where)
            continue
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            problems.append(f"{where}: {e.message} at {'.'.join(str(p) for p in e.path)}")
    return problems, custom


def main():
    read = names_read()
    deploy = ROOT / "deploy" / "kubernetes"
    if "--self-test" in sys.argv:
        with tempfile.TemporaryDirectory() as tmp:
            copy = pathlib.Path(tmp) / "kubernetes"
            shutil.copytree(deploy, copy)
            path = copy / "base" / "worker.yaml"
            path.write_text(path.read_text().replace(
                "name: BELFRY_WORKER_GROUP", "name: BELFRY_WORKERS_GROUP", 1))
            problems = check_env(manifest_env(copy), read)
        if not any("BELFRY_WORKERS_GROUP" in p for p in problems):
            print("deploy-check self-test: a misspelt variable in a manifest was NOT reported", file=sys.stderr)
            return 1
        print("deploy-check self-test: a misspelt variable in a manifest is reported:", problems[0])
        return 0
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    readme = (ROOT / "README.md").read_text()
    named = manifest_env(deploy) + compose_env(compose)
    problems = check_env(named, read) + check_compose(compose, readme)
    schema_problems, custom = check_schemas(deploy)
    problems += schema_problems
    for p in problems:
        print(f"deploy-check: {p}", file=sys.stderr)
    objects = sum(1 for _ in manifest_docs(deploy))
    print(f"deploy-check: {len(named)} variables named by the manifests and compose, all read by the binaries"
          if not problems else f"deploy-check: {len(problems)} problem(s)")
    print(f"deploy-check: {objects - len(custom)} objects valid against Kubernetes {KUBERNETES_VERSION}; "
          f"not checked (custom resources): {', '.join(custom) or 'none'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
