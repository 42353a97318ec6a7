#!/usr/bin/env python3
"""The soak driver behind scripts/soak (RELIABILITY.md, "Soak").

    python3 scripts/soak.py DURATION        # normally through scripts/soak

Runs 3 belfry-scheduler replicas and 2 belfry-worker processes on their own
database, namespace and ports under a steady mixed load of every-second
schedules, injects a fault every few minutes, samples every process and
service every few seconds, and at the end prints a table and a verdict,
writes a CSV, a PNG (one subplot per series) and a Markdown summary to
target/soak/, and exits 1 when a check fails.

Standard library only, except matplotlib for the PNG (scripts/soak installs
it into target/soak-venv); Postgres is read through the `psql` CLI and
RabbitMQ through `rabbitmqctl` (the management plugin is not assumed).

Environment (defaults in brackets):

  BELFRY_SOAK_SCHEDULES        every-second schedules = fires/s [500]
  BELFRY_SOAK_SAMPLE           sampling interval [10s]
  BELFRY_SOAK_FAULT_EVERY      one fault per this interval; "off": none
                               [60s for runs up to 10m, else 5m]
  BELFRY_SOAK_SERVICE_FAULTS   1: restarts of Postgres, Redis, RabbitMQ too
                               (scripts/service-bounce; they are shared) [0]
  BELFRY_SOAK_SEED             seed of the fault order and moments [random]
  BELFRY_SOAK_RETENTION        BELFRY_RETENTION of the replicas, so pruning
                               runs and job_runs stays bounded
                               [1m for runs up to 10m, else 10m]
  BELFRY_SOAK_KEEP             1: keep database, queues, exchanges, keys [0]
  BELFRY_SOAK_BIN_DIR          where the release binaries are [target/release]
  BELFRY_SOAK_COMMIT           names prebuilt binaries' source in the report
                               (scripts/soak fills in git's when it built them)
  BELFRY_SOAK_OUT              output directory [target/soak]
  BELFRY_SOAK_RUST_LOG         RUST_LOG of the processes [warn]
  BELFRY_SOAK_VACUUM           VACUUM (ANALYZE) the soak's tables this often,
                               standing in for autovacuum; "auto": only when
                               the server runs with autovacuum = off (this
                               CI machine does: conf.d/90-ci.conf); "off"
                               [auto, every 60s]

Thresholds (a check fails beyond them):

  BELFRY_SOAK_MAX_RSS_SLOPE    MiB/min over the second half, per process [1.0]
  BELFRY_SOAK_MIN_RSS_GROWTH   ... and only if the fitted growth over the
                               fitted span is at least this many MiB [4]
  BELFRY_SOAK_MAX_FD_SLOPE     descriptors/min over the second half [0.5]
  BELFRY_SOAK_MIN_FD_GROWTH    ... and a fitted growth of at least [3]
  BELFRY_SOAK_LATENESS_RATIO   last-quarter p99 may be at most this times
                               the second-quarter p99 ... [2.0]
  BELFRY_SOAK_LATENESS_SLACK   ... plus this many seconds [0.25]
  BELFRY_SOAK_MIN_RATE         fires recorded per window / expected, median
                               over the second half, at least [0.99]
  BELFRY_SOAK_STALE_AFTER      a non-terminal row older than this counts as
                               stale in the samples [120s]
  BELFRY_SOAK_MAX_OPEN_AGE     no row may stay non-terminal longer [300s]
  BELFRY_SOAK_DRAIN            after the load, rows must all be terminal
                               within [180s]
"""

import csv
import datetime
import math
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TERMINAL = ("succeeded", "failed", "dead")
OPEN_SQL = "('claimed', 'dispatched', 'running', 'retrying')"
CLK_TCK = os.sysconf("SC_CLK_TCK")
SCHEDULERS = ["s1", "s2", "s3"]
WORKERS = ["w1", "w2"]
# kill -9 targets: s3 and w2 only, so s1, s2 and w1 run uninterrupted from
# start to end and their memory and descriptor series are one incarnation
# each (they still live through every fault: peers dying, redeliveries,
# stopped peers, service restarts). SIGSTOP may hit any process.
KILL_SCHEDULER = "s3"
KILL_WORKER = "w2"
WARMUP_AFTER_START = 60.0  # samples this soon after a (re)start are not fitted


def log(msg):
    stamp = datetime.datetime.now().strftime("%H:%M:%S")
    print(f"soak {stamp}: {msg}", flush=True)


def parse_duration(text):
    """'90s', '3m', '2h', '1h 30m', '500ms' -> seconds (float)."""
    s = text.strip().replace(" ", "")
    if not s:
        raise ValueError("empty duration")
    total = 0.0
    pos = 0
    for m in re.finditer(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", s):
        if m.start() != pos:
            raise ValueError(f"invalid duration {text!r}")
        n = float(m.group(1))
        total += n * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
        pos = m.end()
    if pos != len(s):
        raise ValueError(f"invalid duration {text!r} (use e.g. 90s, 3m, 2h, 1h30m)")
    return total


def env_str(name, default):
    v = os.environ.get(name, "").strip()
    return v if v else default


def env_parsed(name, default, parse):
    """The variable `name` read with `parse`, `default` when unset; exits
    with a line naming the variable when its value does not parse."""
    v = os.environ.get(name, "").strip()
    if not v:
        return default
    try:
        return parse(v)
    except ValueError as e:
        sys.exit(f"soak: {name}={v!r}: {e}")


def env_float(name, default):
    return env_parsed(name, default, float)


def env_duration(name, default):
    return env_parsed(name, default, parse_duration)


def free_port():
    # Below the kernel's ephemeral range (32768-60999 here): a port taken
    # with bind(0) and released is one the kernel may hand to any outgoing
    # connection before the process that is to listen on it starts (seen:
    # a scheduler refused "Address already in use" for the whole run).
    for _ in range(200):
        # Its own generator: the run's seed drives the faults only.
        port = random.SystemRandom().randint(20000, 32000)
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
            return port
        except OSError:
            continue
        finally:
            s.close()
    raise RuntimeError("no free port in 20000-32000")


def fmt_dur(seconds):
    seconds = int(round(seconds))
    if seconds % 3600 == 0 and seconds >= 3600:
        return f"{seconds // 3600}h"
    if seconds % 60 == 0 and seconds >= 60:
        return f"{seconds // 60}m"
    return f"{seconds}s"


# ---------------------------------------------------------------- config


class Config:
    def __init__(self, duration_arg):
        self.label = re.sub(r"[^0-9A-Za-z]", "", duration_arg)
        self.duration = parse_duration(duration_arg)
        if self.duration < 30:
            sys.exit("soak: DURATION must be at least 30s")
        short = self.duration <= 600
        self.schedules = int(env_float("BELFRY_SOAK_SCHEDULES", 500))
        self.sample = env_duration("BELFRY_SOAK_SAMPLE", 10.0)
        fe = env_str("BELFRY_SOAK_FAULT_EVERY", "60s" if short else "5m")
        self.fault_every = None if fe in ("off", "0", "0s") else parse_duration(fe)
        self.service_faults = env_str("BELFRY_SOAK_SERVICE_FAULTS", "0") == "1"
        self.seed = int(env_float("BELFRY_SOAK_SEED", random.randrange(1 << 40)))
        self.retention = env_str("BELFRY_SOAK_RETENTION", "1m" if short else "10m")
        self.keep = env_str("BELFRY_SOAK_KEEP", "0") == "1"
        self.bin_dir = env_str("BELFRY_SOAK_BIN_DIR", os.path.join(ROOT, "target", "release"))
        self.out = env_str("BELFRY_SOAK_OUT", os.path.join(ROOT, "target", "soak"))
        self.rust_log = env_str("BELFRY_SOAK_RUST_LOG", "warn")
        self.max_rss_slope = env_float("BELFRY_SOAK_MAX_RSS_SLOPE", 1.0)
        self.min_rss_growth = env_float("BELFRY_SOAK_MIN_RSS_GROWTH", 4.0)
        self.max_fd_slope = env_float("BELFRY_SOAK_MAX_FD_SLOPE", 0.5)
        self.min_fd_growth = env_float("BELFRY_SOAK_MIN_FD_GROWTH", 3.0)
        self.lateness_ratio = env_float("BELFRY_SOAK_LATENESS_RATIO", 2.0)
        self.lateness_slack = env_float("BELFRY_SOAK_LATENESS_SLACK", 0.25)
        self.min_rate = env_float("BELFRY_SOAK_MIN_RATE", 0.99)
        self.stale_after = env_duration("BELFRY_SOAK_STALE_AFTER", 120.0)
        self.max_open_age = env_duration("BELFRY_SOAK_MAX_OPEN_AGE", 300.0)
        self.drain = env_duration("BELFRY_SOAK_DRAIN", 180.0)
        vac = env_str("BELFRY_SOAK_VACUUM", "auto")
        self.vacuum_mode = vac
        self.vacuum_every = None if vac in ("off", "auto") else parse_duration(vac)
        tag = uuid.uuid4().hex[:10]
        self.db = f"belfry_soak_{tag}"
        self.namespace = f"soak{tag}"


# ---------------------------------------------------------------- load


def schedule_text(n):
    """n every-second schedules; per 100: 60 noop, 25 sleep (50-300 ms),
    8 http to a closed port retried in the worker (3 attempts, 200 ms) then
    dead, 4 the same with a 12 s back-off (past BELFRY_RETRY_REQUEUE_AFTER,
    so the retry goes through the ledger and a replica's reconciler) then
    dead after 2 attempts, 3 http with an invalid method: failed at once."""
    out = []
    kinds = {}
    for i in range(n):
        k = i % 100
        base = f'[[schedule]]\nname = "soak-{i:05d}"\nevery = "1s"\nmisfire = "catch_up"\n'
        if k < 60:
            kind = "noop"
            body = 'job_type = "noop"\n'
        elif k < 85:
            kind = "sleep"
            body = f'job_type = "sleep"\npayload = {{ duration_ms = {50 + (i * 37) % 251} }}\n'
        elif k < 93:
            kind = "retry-dead"
            body = (
                'job_type = "http"\npayload = { url = "http://127.0.0.1:1/soak", timeout_ms = 2000 }\n'
                'retry = { max_attempts = 3, initial_delay = "200ms", max_delay = "1s" }\n'
            )
        elif k < 97:
            kind = "deferred-dead"
            body = (
                'job_type = "http"\npayload = { url = "http://127.0.0.1:1/soak", timeout_ms = 2000 }\n'
                'retry = { max_attempts = 2, initial_delay = "12s", jitter = false }\n'
            )
        else:
            kind = "failed"
            body = 'job_type = "http"\npayload = { url = "http://127.0.0.1:1/soak", method = "NOT A METHOD" }\n'
        kinds[kind] = kinds.get(kind, 0) + 1
        out.append(base + body)
    return "\n".join(out), kinds


# ---------------------------------------------------------------- shell helpers


def run(cmd, timeout=20, check=False):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except OSError as e:
        if check:
            raise RuntimeError(f"{cmd[0]}: {e}") from e
        return None
    except subprocess.TimeoutExpired:
        if check:
            raise RuntimeError(f"{' '.join(cmd)}: timed out after {timeout}s")
        return None
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr.strip()}")
    return p


def psql(db, sql, timeout=15, check=False):
    """Runs sql; returns the rows (lists of strings) or None on failure."""
    p = run(
        ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", db, "-X", "-q", "-A", "-t",
         "-F", "\t", "-v", "ON_ERROR_STOP=1", "-c", sql],
        timeout=timeout, check=check,
    )
    if p is None or p.returncode != 0:
        return None
    return [line.split("\t") for line in p.stdout.splitlines() if line != ""]


def psql_retry(db, sql, within=90):
    """psql, retried for `within` seconds (a service restart, ours or another
    run's, may be in progress); raises RuntimeError when it never worked."""
    deadline = time.monotonic() + within
    while True:
        res = psql(db, sql)
        if res is not None:
            return res
        if time.monotonic() > deadline:
            raise RuntimeError(f"psql kept failing for {within}s: {sql}")
        time.sleep(2)


def rabbit_queues(namespace):
    """{queue: (ready, unacked, consumers)} for the namespace, or None."""
    p = run(["rabbitmqctl", "list_queues", "-q", "-p", "/", "name", "messages_ready",
             "messages_unacknowledged", "consumers"], timeout=10)
    if p is None or p.returncode != 0:
        return None
    out = {}
    for line in p.stdout.splitlines():
        parts = line.split("\t")
        if len(parts) == 4 and parts[0].startswith(namespace + "."):
            try:
                out[parts[0]] = (int(parts[1]), int(parts[2]), int(parts[3]))
            except ValueError:
                pass
    return out


def proc_stats(pid):
    """(rss MiB, open fds, cpu ticks, threads) of pid, or None."""
    try:
        rss = threads = None
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) / 1024.0
                elif line.startswith("Threads:"):
                    threads = int(line.split()[1])
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12])  # utime, stime
        return rss, fds, ticks, threads
    except (OSError, ValueError, IndexError):
        return None


SERVICE_COMMS = {"postgres": "postgres", "beam.smp": "rabbitmq", "redis-server": "redis"}


def service_ticks():
    """{service: {pid: cpu ticks}} of the machine's Postgres, RabbitMQ and
    Redis processes (all their databases and vhosts, not only the soak's)."""
    out = {v: {} for v in SERVICE_COMMS.values()}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                text = f.read()
        except OSError:
            continue
        comm = text[text.find("(") + 1:text.rfind(")")]
        service = SERVICE_COMMS.get(comm)
        if service:
            fields = text.rsplit(")", 1)[1].split()
            out[service][pid] = int(fields[11]) + int(fields[12])
    return out


def host_cpu():
    with open("/proc/stat") as f:
        parts = [int(x) for x in f.readline().split()[1:]]
    idle = parts[3] + parts[4]
    return sum(parts), idle


# ---------------------------------------------------------------- processes


class Member:
    def __init__(self, role, name, log_path, extra_env):
        self.role = role
        self.name = name
        self.log_path = log_path
        self.extra_env = extra_env
        self.popen = None
        self.started = 0.0
        self.busy = False  # a fault is handling it: exits are expected
        self.stopped = False  # SIGSTOPped right now
        self.incarnations = 0


class Fleet:
    def __init__(self, cfg, run_dir, bin_dir, common_env):
        self.cfg = cfg
        self.run_dir = run_dir
        self.bin_dir = bin_dir
        self.common = common_env
        self.members = {}
        self.lock = threading.RLock()
        self.unexpected_exits = []
        self.unclean_stops = []

    def add(self, role, name, extra_env):
        m = Member(role, name, os.path.join(self.run_dir, f"{name}.log"), extra_env)
        self.members[name] = m
        self.spawn(m)

    def spawn(self, m):
        env = dict(os.environ)
        for k in list(env):
            if k.startswith("BELFRY_") or k in ("DATABASE_URL", "REDIS_URL", "AMQP_URL", "RUST_LOG"):
                del env[k]
        env.update(self.common)
        env.update(m.extra_env)
        env["BELFRY_INSTANCE"] = m.name
        binary = os.path.join(self.bin_dir, f"belfry-{m.role}")
        logf = open(m.log_path, "ab")
        m.popen = subprocess.Popen([binary], env=env, stdin=subprocess.DEVNULL, stdout=logf,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        logf.close()
        m.started = time.monotonic()
        m.incarnations += 1

    def pid(self, name):
        m = self.members[name]
        return m.popen.pid if m.popen and m.popen.poll() is None else None

    def check_alive(self, t):
        """Records and restarts members that exited on their own."""
        with self.lock:
            for m in self.members.values():
                if m.busy or m.popen is None:
                    continue
                rc = m.popen.poll()
                if rc is not None:
                    self.unexpected_exits.append(f"t+{t:.0f}s {m.name} exited on its own: {rc}")
                    log(f"{m.name} exited on its own ({rc}); restarting it")
                    self.spawn(m)

    def kill9(self, name):
        m = self.members[name]
        if m.popen and m.popen.poll() is None:
            m.popen.send_signal(signal.SIGKILL)
            m.popen.wait()

    def stop(self, name, deadline=30.0):
        """SIGTERM; must exit 0 within deadline."""
        m = self.members[name]
        with self.lock:
            m.busy = True
        p = m.popen
        if p is None or p.poll() is not None:
            self.unclean_stops.append(f"{name}: not running when it was to be stopped")
            return
        # A process gets a moment after exec before it is signalled (a
        # signal before main installs its handlers says nothing about belfry).
        young = 1.0 - (time.monotonic() - m.started)
        if young > 0:
            time.sleep(young)
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(timeout=deadline)
            if rc != 0:
                self.unclean_stops.append(f"{name}: SIGTERM ended with exit {rc}")
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGKILL)
            p.wait()
            self.unclean_stops.append(f"{name}: still running {deadline:.0f}s after SIGTERM")

    def kill_all(self):
        for m in self.members.values():
            if m.popen and m.popen.poll() is None:
                try:
                    os.kill(m.popen.pid, signal.SIGCONT)
                except OSError:
                    pass
                m.popen.send_signal(signal.SIGKILL)
                m.popen.wait()


# ---------------------------------------------------------------- faults


class Faults(threading.Thread):
    def __init__(self, cfg, fleet, t0):
        super().__init__(daemon=True)
        self.cfg = cfg
        self.fleet = fleet
        self.t0 = t0
        self.rng = random.Random(cfg.seed)
        self.done = []  # (t, took, what)
        self.stop_event = threading.Event()
        self.error = None
        kinds = ["kill-scheduler", "kill-worker", "stop-worker", "stop-scheduler"]
        if cfg.service_faults:
            kinds += ["bounce-postgres", "bounce-redis", "bounce-rabbitmq"]
        self.kinds = kinds
        self.plan = []
        if cfg.fault_every:
            k = 0
            order = []
            while True:
                slot_start = k * cfg.fault_every
                at = slot_start + self.rng.uniform(0.25, 0.75) * cfg.fault_every
                if at > cfg.duration - 25:
                    break
                if not order:
                    order = kinds[:]
                    self.rng.shuffle(order)
                kind = order.pop()
                if kind.startswith("bounce-") and at > 0.5 * cfg.duration:
                    # A service restart costs a backlog the machine takes
                    # a while to drain; in the last part of the run it would
                    # be measured as drift by the last-quarter checks. The
                    # restarts stay in the first half, whose recovery the
                    # open-row and drain checks still judge.
                    kind = self.rng.choice(kinds[:4])
                self.plan.append((at, kind))
                k += 1

    def now(self):
        return time.monotonic() - self.t0

    def run(self):
        try:
            for at, kind in self.plan:
                if self.stop_event.wait(max(0.0, at - self.now())):
                    return
                began = self.now()
                what = self.inject(kind)
                took = self.now() - began
                self.done.append((began, took, what))
                log(f"fault t+{began:.0f}s ({took:.1f}s): {what}")
        except Exception as e:  # noqa: BLE001 - reported as a failure
            self.error = f"{type(e).__name__}: {e}"
            log(f"fault injection failed: {self.error}")

    def inject(self, kind):
        f = self.fleet
        if kind in ("kill-scheduler", "kill-worker"):
            name = KILL_SCHEDULER if kind == "kill-scheduler" else KILL_WORKER
            m = f.members[name]
            with f.lock:
                m.busy = True
            f.kill9(name)
            down = self.rng.uniform(1.0, 3.0)
            time.sleep(down)
            with f.lock:
                f.spawn(m)
                m.busy = False
            return f"kill -9 {name}, restarted after {down:.1f}s"
        if kind in ("stop-worker", "stop-scheduler"):
            names = WORKERS if kind == "stop-worker" else SCHEDULERS
            name = self.rng.choice(names)
            m = f.members[name]
            pid = f.pid(name)
            if pid is None:
                return f"SIGSTOP skipped: {name} not running"
            secs = self.rng.uniform(5.0, 20.0) if kind == "stop-worker" else self.rng.uniform(5.0, 15.0)
            with f.lock:
                m.stopped = True
            os.kill(pid, signal.SIGSTOP)
            time.sleep(secs)
            os.kill(pid, signal.SIGCONT)
            with f.lock:
                m.stopped = False
            return f"SIGSTOP {name} for {secs:.1f}s, SIGCONT"
        if kind.startswith("bounce-"):
            service = kind.split("-", 1)[1]
            other = run(["pgrep", "-f", "scripts/service-bounce"])
            if other is not None and other.returncode == 0:
                return f"{service} restart skipped: another scripts/service-bounce is running"
            p = run([os.path.join(ROOT, "scripts", "service-bounce"), service, "3"], timeout=180)
            if p is None or p.returncode != 0:
                raise RuntimeError(f"service-bounce {service} failed: {p.stderr if p else 'timeout'}")
            return f"{service} restarted (down 3 s)"
        raise ValueError(kind)


# ---------------------------------------------------------------- sampling


SAMPLE_SQL = """
WITH w AS (
  SELECT extract(epoch FROM coalesce(least(dispatched_at, started_at), now()) - scheduled_at) AS fire_late,
         extract(epoch FROM coalesce(started_at, now()) - scheduled_at) AS start_late
  FROM job_runs
  WHERE scheduled_at >= to_timestamp({lo}) AND scheduled_at < to_timestamp({hi})
)
SELECT
  (SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()),
  (SELECT count(*) FROM job_runs WHERE status IN {open}),
  (SELECT count(*) FROM job_runs WHERE status IN {open} AND scheduled_at < now() - interval '{stale} seconds'),
  (SELECT coalesce(extract(epoch FROM now() - min(scheduled_at)), 0) FROM job_runs WHERE status IN {open}),
  (SELECT count(*) FROM w),
  (SELECT coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY fire_late), 0) FROM w),
  (SELECT coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY start_late), 0) FROM w),
  (SELECT coalesce(n_live_tup, 0) FROM pg_stat_user_tables WHERE relname = 'job_runs'),
  (SELECT coalesce(n_dead_tup, 0) FROM pg_stat_user_tables WHERE relname = 'job_runs'),
  (SELECT pg_total_relation_size('job_runs') / 1048576.0)
"""

ROLE_FIELDS = ["rss_mib", "fds", "cpu_pct", "threads", "pid"]


class Vacuum(threading.Thread):
    """VACUUM (ANALYZE) of the soak's tables every `every` seconds: what
    autovacuum does on a normally configured server. job_runs is updated
    four or five times per run and pruned by retention; without vacuum its
    dead tuples pile up and every statement on it slows down."""

    def __init__(self, db, every):
        super().__init__(daemon=True)
        self.db = db
        self.every = every
        self.stop_event = threading.Event()
        self.last_took = None
        self.runs = 0
        self.failures = 0

    def run(self):
        while not self.stop_event.wait(self.every):
            began = time.monotonic()
            ok = True
            for table in ("job_runs", "skipped_fires", "schedules"):
                if psql(self.db, f"VACUUM (ANALYZE) {table}", timeout=600) is None:
                    ok = False
            self.last_took = time.monotonic() - began
            self.runs += 1
            self.failures += 0 if ok else 1


class Sampler:
    def __init__(self, cfg, fleet, t0, wall0):
        self.cfg = cfg
        self.fleet = fleet
        self.t0 = t0
        self.wall0 = wall0
        self.rows = []
        self.prev_ticks = {}
        self.prev_host = host_cpu()
        self.prev_services = service_ticks()
        self.prev_time = time.monotonic()
        self.dead_lettered = 0
        self.names = SCHEDULERS + WORKERS
        self.max_open_age_seen = (0.0, 0.0)
        self.vacuum = None
        self.scrape_failures = {n: 0 for n in self.names}

    def columns(self):
        cols = ["t_s", "wall"]
        for n in self.names:
            cols += [f"{n}_{f}" for f in ROLE_FIELDS]
        cols += ["host_cpu_pct", "postgres_cpu_pct", "rabbitmq_cpu_pct", "redis_cpu_pct", "pg_conns", "queue_ready", "queue_unacked", "consumers",
                 "dead_letter_ready", "dead_lettered_total", "open_rows", "stale_rows",
                 "oldest_open_s", "fires_per_s", "fire_late_p99_s", "start_late_p99_s",
                 "job_runs_rows", "job_runs_mib", "job_runs_dead_tuples", "vacuum_s", "sample_ms"]
        return cols

    def take(self):
        began = time.monotonic()
        t = began - self.t0
        now_wall = time.time()
        row = {"t_s": round(t, 1), "wall": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
        dt = began - self.prev_time
        for n in self.names:
            pid = self.fleet.pid(n)
            st = proc_stats(pid) if pid else None
            if st is None:
                for f in ROLE_FIELDS:
                    row[f"{n}_{f}"] = ""
                continue
            rss, fds, ticks, threads = st
            prev = self.prev_ticks.get(n)
            cpu = ""
            if prev and prev[0] == pid and dt > 0:
                cpu = round(100.0 * (ticks - prev[1]) / CLK_TCK / dt, 1)
            self.prev_ticks[n] = (pid, ticks)
            row[f"{n}_rss_mib"] = round(rss, 2)
            row[f"{n}_fds"] = fds
            row[f"{n}_cpu_pct"] = cpu
            row[f"{n}_threads"] = threads
            row[f"{n}_pid"] = pid
        total, idle = host_cpu()
        pt, pi = self.prev_host
        row["host_cpu_pct"] = round(100.0 * (1 - (idle - pi) / max(1, total - pt)), 1)
        self.prev_host = (total, idle)
        services = service_ticks()
        for service, pids in services.items():
            before = self.prev_services.get(service, {})
            ticks = sum(t - before.get(pid, 0) for pid, t in pids.items())
            row[f"{service}_cpu_pct"] = round(100.0 * ticks / CLK_TCK / dt, 1) if dt > 0 else ""
        self.prev_services = services
        self.prev_time = began

        # Fires of one whole-second window, far enough back that they are
        # normally claimed and started; rows not yet dispatched or started
        # count with their lateness so far (a lower bound), never dropped.
        # Fire lateness ends at the broker's confirm, but dispatched_at is
        # overwritten when a deferred retry is republished (12 s later here),
        # so it ends at least(dispatched_at, started_at): the first attempt
        # cannot start before the first confirm.
        hi = math.floor(now_wall) - 10
        lo = hi - int(round(self.cfg.sample))
        sql = SAMPLE_SQL.format(lo=lo, hi=hi, open=OPEN_SQL, stale=int(self.cfg.stale_after))
        res = psql(self.cfg.db, sql, timeout=8)
        keys = ["pg_conns", "open_rows", "stale_rows", "oldest_open_s", "fires_per_s",
                "fire_late_p99_s", "start_late_p99_s", "job_runs_rows", "job_runs_dead_tuples", "job_runs_mib"]
        if res and len(res[0]) == len(keys):
            vals = res[0]
            for k, v in zip(keys, vals):
                row[k] = float(v) if v != "" else ""
            row["pg_conns"] = int(row["pg_conns"])
            row["open_rows"] = int(row["open_rows"])
            row["stale_rows"] = int(row["stale_rows"])
            row["fires_per_s"] = round(row["fires_per_s"] / (hi - lo), 1)
            row["oldest_open_s"] = round(row["oldest_open_s"], 1)
            row["fire_late_p99_s"] = round(row["fire_late_p99_s"], 4)
            row["start_late_p99_s"] = round(row["start_late_p99_s"], 4)
            row["job_runs_rows"] = int(row["job_runs_rows"])
            row["job_runs_dead_tuples"] = int(row["job_runs_dead_tuples"])
            row["job_runs_mib"] = round(row["job_runs_mib"], 1)
            if row["oldest_open_s"] > self.max_open_age_seen[0]:
                self.max_open_age_seen = (row["oldest_open_s"], t)
        else:
            for k in keys:
                row[k] = ""
        q = rabbit_queues(self.cfg.namespace)
        jobs_q = f"{self.cfg.namespace}.jobs.default"
        dlq = f"{self.cfg.namespace}.dead-letter"
        if q is not None and jobs_q in q:
            row["queue_ready"], row["queue_unacked"], row["consumers"] = q[jobs_q]
            ready = q.get(dlq, (0, 0, 0))[0]
            row["dead_letter_ready"] = ready
            # Nobody consumes the dead-letter queue here; drain it like an
            # operator would, so hours of dead runs do not pile up in the
            # shared broker. Its depth before each purge is recorded.
            if ready >= 20000:
                pr = run(["rabbitmqctl", "purge_queue", "-q", "-p", "/", dlq], timeout=10)
                if pr is not None and pr.returncode == 0:
                    self.dead_lettered += ready
        else:
            for k in ("queue_ready", "queue_unacked", "consumers", "dead_letter_ready"):
                row[k] = ""
        row["dead_lettered_total"] = self.dead_lettered
        # Scrape every running process's /metrics, as Prometheus would.
        for n in self.names:
            m = self.fleet.members[n]
            if m.stopped or self.fleet.pid(n) is None:
                continue
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{m.extra_env['BELFRY_METRICS_ADDR'].rsplit(':', 1)[1]}/metrics", timeout=2) as r:
                    r.read()
            except OSError:
                self.scrape_failures[n] += 1
        row["vacuum_s"] = round(self.vacuum.last_took, 2) if self.vacuum and self.vacuum.last_took is not None else ""
        row["sample_ms"] = round((time.monotonic() - began) * 1000)
        self.rows.append(row)
        return row


# ---------------------------------------------------------------- analysis


def num(v):
    return v if isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v)) else None


def series(rows, key):
    return [(r["t_s"], num(r.get(key))) for r in rows if num(r.get(key)) is not None]


def slope_fixed_effects(points):
    """Least-squares slope (per second) shared by every segment, each segment
    (a process incarnation) with its own intercept. points: [(seg, t, y)].
    Returns (slope, span_seconds, n) or (None, 0, n)."""
    segs = {}
    for seg, t, y in points:
        segs.setdefault(seg, []).append((t, y))
    sxy = sxx = 0.0
    n = 0
    span = 0.0
    for pts in segs.values():
        if len(pts) < 2:
            continue
        mt = sum(p[0] for p in pts) / len(pts)
        my = sum(p[1] for p in pts) / len(pts)
        for t, y in pts:
            sxy += (t - mt) * (y - my)
            sxx += (t - mt) ** 2
        n += len(pts)
        span += pts[-1][0] - pts[0][0]
    if sxx == 0 or n < 3:
        return None, 0.0, n
    return sxy / sxx, span, n


def fit_process(rows, name, field, starts, half):
    """Slope over the second half of a process's series, per incarnation,
    leaving out the first WARMUP_AFTER_START seconds after each start."""
    pts = []
    for r in rows:
        v = num(r.get(f"{name}_{field}"))
        pid = r.get(f"{name}_pid")
        if v is None or not pid or r["t_s"] < half:
            continue
        st = starts.get((name, pid))
        if st is not None and r["t_s"] - st < WARMUP_AFTER_START:
            continue
        pts.append((pid, r["t_s"], v))
    return slope_fixed_effects(pts)


def fit_series(rows, key, half):
    pts = [(0, t, v) for t, v in series(rows, key) if t >= half]
    return slope_fixed_effects(pts)


def stats_of(values):
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return min(vals), statistics.median(vals), max(vals)


def fmt(v, digits=2):
    if v is None:
        return "-"
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer() and (abs(v) >= 100 or digits == 0)):
        return f"{int(v)}"
    return f"{v:.{digits}f}"


class Verdict:
    def __init__(self):
        self.lines = []

    def check(self, ok, what):
        self.lines.append(("PASS" if ok else "FAIL", what))

    def info(self, what):
        self.lines.append(("info", what))

    @property
    def passed(self):
        return all(s != "FAIL" for s, _ in self.lines)


def analyse(cfg, rows, starts, faults, fleet, drained, drain_info, extras):
    """Returns (table_md, verdict)."""
    half = cfg.duration / 2
    q2 = (cfg.duration / 4, cfg.duration / 2)
    q4 = (cfg.duration * 3 / 4, cfg.duration + 1)
    table = []
    table.append("| series | min | median | max | slope, 2nd half (/min) |")
    table.append("| --- | ---: | ---: | ---: | ---: |")
    v = Verdict()

    def row_of(label, values, slope, digits=2):
        s = stats_of(values)
        if s is None:
            table.append(f"| {label} | - | - | - | - |")
            return
        sl = "-" if slope is None else f"{slope * 60:+.3f}"
        table.append(f"| {label} | {fmt(s[0], digits)} | {fmt(s[1], digits)} | {fmt(s[2], digits)} | {sl} |")

    for field, label, max_slope, min_growth, unit in (
        ("rss_mib", "RSS MiB", cfg.max_rss_slope, cfg.min_rss_growth, "MiB"),
        ("fds", "open fds", cfg.max_fd_slope, cfg.min_fd_growth, "fds"),
    ):
        for n in SCHEDULERS + WORKERS:
            slope, span, npts = fit_process(rows, n, field, starts, half)
            row_of(f"{n} {label}", [num(r.get(f"{n}_{field}")) for r in rows], slope,
                   2 if field == "rss_mib" else 0)
            if slope is None:
                # s1, s2 and w1 are never killed: they always have the whole
                # second half. A killed process may have restarted too late.
                if n in (KILL_SCHEDULER, KILL_WORKER):
                    v.info(f"{n} {label}: not fitted: {npts} sample(s) of the second half "
                           f"more than {WARMUP_AFTER_START:.0f} s after a (re)start")
                else:
                    v.check(False, f"{n} {label}: too few samples in the second half to fit ({npts})")
                continue
            per_min = slope * 60
            growth = slope * span
            bad = per_min > max_slope and growth >= min_growth
            v.check(not bad, f"{n} {label}: slope {per_min:+.3f} {unit}/min over the second half "
                             f"(fitted growth {growth:+.1f} {unit} over {span / 60:.1f} min of "
                             f"{fleet.members[n].incarnations} incarnation(s)); fails above "
                             f"{max_slope} {unit}/min with ≥ {min_growth} {unit} growth")
    for n in SCHEDULERS + WORKERS:
        row_of(f"{n} CPU %", [num(r.get(f"{n}_cpu_pct")) for r in rows], None, 1)
    for n in SCHEDULERS + WORKERS:
        slope, _, _ = fit_process(rows, n, "threads", starts, half)
        row_of(f"{n} threads", [num(r.get(f"{n}_threads")) for r in rows], slope, 0)
    for key, label, digits in (
        ("host_cpu_pct", "host CPU % (2 cores = 100)", 1),
        ("postgres_cpu_pct", "Postgres CPU % (of one core)", 1),
        ("rabbitmq_cpu_pct", "RabbitMQ CPU % (of one core)", 1),
        ("redis_cpu_pct", "Redis CPU % (of one core)", 1),
        ("pg_conns", "Postgres connections", 0),
        ("queue_ready", "queue ready", 0),
        ("queue_unacked", "queue unacked", 0),
        ("dead_letter_ready", "dead-letter depth (purged each sample)", 0),
        ("open_rows", "rows not terminal", 0),
        ("stale_rows", f"rows not terminal > {fmt_dur(cfg.stale_after)} old", 0),
        ("oldest_open_s", "oldest non-terminal row (s)", 1),
        ("fires_per_s", "fires recorded /s", 1),
        ("fire_late_p99_s", "fire lateness p99 (s)", 3),
        ("start_late_p99_s", "start lateness p99 (s)", 3),
        ("job_runs_rows", "job_runs rows (estimate)", 0),
        ("job_runs_dead_tuples", "job_runs dead tuples (estimate)", 0),
        ("job_runs_mib", "job_runs MiB", 1),
        ("vacuum_s", "VACUUM (ANALYZE) took (s)", 2),
        ("sample_ms", "sampling took (ms)", 0),
    ):
        slope, _, _ = fit_series(rows, key, half)
        row_of(label, [x for _, x in series(rows, key)], slope, digits)

    # Lateness drift: the median of the per-sample p99s of the last quarter
    # against that of the second quarter (medians, so the spike of one fault
    # does not decide; a drift moves the median).
    for key, label in (("fire_late_p99_s", "fire lateness p99 (scheduled → broker confirm)"),
                       ("start_late_p99_s", "start lateness p99 (scheduled → first attempt began)")):
        a = [x for t, x in series(rows, key) if q2[0] <= t < q2[1]]
        b = [x for t, x in series(rows, key) if q4[0] <= t < q4[1]]
        if not a or not b:
            v.check(False, f"{label}: no samples in the second or last quarter")
            continue
        ma, mb = statistics.median(a), statistics.median(b)
        limit = cfg.lateness_ratio * ma + cfg.lateness_slack
        v.check(mb <= limit, f"{label}: last quarter {mb * 1000:.0f} ms vs second quarter "
                             f"{ma * 1000:.0f} ms (medians of per-sample p99s); fails above "
                             f"{cfg.lateness_ratio} × second + {cfg.lateness_slack * 1000:.0f} ms = {limit * 1000:.0f} ms")
    rates = [x for t, x in series(rows, "fires_per_s") if t >= half]
    if rates:
        med = statistics.median(rates)
        v.check(med >= cfg.min_rate * cfg.schedules,
                f"fires recorded: median {med:.1f}/s over the second half, expected "
                f"{cfg.schedules}/s (fails below {cfg.min_rate:.0%})")
    else:
        v.check(False, "fires recorded: no samples")
    age, at = extras["max_open_age"]
    v.check(age <= cfg.max_open_age,
            f"oldest non-terminal row: at most {age:.0f} s old (t+{at:.0f}s); fails above {cfg.max_open_age:.0f} s")
    v.check(drained, f"after the load: {drain_info}")
    v.check(not fleet.unexpected_exits,
            f"processes that exited on their own: {len(fleet.unexpected_exits)}"
            + "".join(f"\n        {e}" for e in fleet.unexpected_exits))
    v.check(not fleet.unclean_stops,
            f"graceful stops (SIGTERM) not exiting 0 within 30 s: {len(fleet.unclean_stops)}"
            + "".join(f"\n        {e}" for e in fleet.unclean_stops))
    if extras.get("fault_error"):
        v.check(False, f"fault injection: {extras['fault_error']}")
    v.check(len(rows) >= 4, f"samples taken: {len(rows)}")
    v.info(extras["vacuum_note"])
    v.info("/metrics scrapes that failed (process running, not stopped): "
           + ", ".join(f"{n} {c}" for n, c in extras["scrape_failures"].items()))
    return "\n".join(table), v


# ---------------------------------------------------------------- plot


def plot(cfg, rows, faults, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = SCHEDULERS + WORKERS
    panels = [
        ("RSS (MiB)", [(f"{n}_rss_mib", n) for n in names]),
        ("open file descriptors", [(f"{n}_fds", n) for n in names]),
        ("CPU (% of one core)", [(f"{n}_cpu_pct", n) for n in names]
         + [("postgres_cpu_pct", "postgres"), ("rabbitmq_cpu_pct", "rabbitmq"), ("redis_cpu_pct", "redis"),
            ("host_cpu_pct", "host (% of both cores)")]),
        ("threads", [(f"{n}_threads", n) for n in names]),
        ("Postgres connections", [("pg_conns", "soak database")]),
        ("RabbitMQ jobs queue", [("queue_ready", "ready"), ("queue_unacked", "unacked")]),
        ("job_runs not terminal", [("open_rows", "all"), ("stale_rows", f"> {fmt_dur(cfg.stale_after)} old")]),
        ("oldest non-terminal row (s)", [("oldest_open_s", "age")]),
        ("fires recorded per second", [("fires_per_s", "recorded")]),
        ("lateness p99 (s)", [("fire_late_p99_s", "scheduled → confirmed"), ("start_late_p99_s", "scheduled → started")]),
        ("job_runs", [("job_runs_mib", "MiB"), ("job_runs_rows", "live rows / 10,000"),
                      ("job_runs_dead_tuples", "dead tuples / 10,000")]),
    ]
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 2.3 * len(panels)), sharex=True)
    for ax, (label, keys) in zip(axes, panels):
        for key, name in keys:
            pts = series(rows, key)
            if key in ("job_runs_rows", "job_runs_dead_tuples"):
                pts = [(t, y / 10000) for t, y in pts]
            if pts:
                ax.plot([p[0] / 60 for p in pts], [p[1] for p in pts], label=name, linewidth=1)
        for t, _, what in faults:
            ax.axvline(t / 60, color="grey", alpha=0.35, linewidth=0.8)
        ax.axvline(cfg.duration / 120, color="black", alpha=0.5, linestyle="--", linewidth=0.8)
        ax.set_ylabel(label, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if len(keys) > 1:
            ax.legend(fontsize=6, loc="upper left", ncol=min(6, len(keys)))
    axes[-1].set_xlabel("minutes (grey: faults; dashed: start of the fitted second half)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.99))
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ---------------------------------------------------------------- logs


LEVEL_RE = re.compile(r"\b(WARN|ERROR)\b")
NOISE_RE = re.compile(r"\x1b\[[0-9;]*m|\d{4}-\d\d-\d\dT[\d:.]+Z|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|\b\d+(\.\d+)?(ms|s)?\b")


def log_summary(run_dir, names):
    out = []
    for n in names:
        path = os.path.join(run_dir, f"{n}.log")
        counts = {"WARN": 0, "ERROR": 0}
        kinds = {}
        panics = 0
        try:
            with open(path, errors="replace") as f:
                for line in f:
                    if "panicked" in line:
                        panics += 1
                    m = LEVEL_RE.search(line)
                    if not m:
                        continue
                    counts[m.group(1)] += 1
                    key = NOISE_RE.sub("#", line[m.start():]).strip()[:150]
                    kinds[key] = kinds.get(key, 0) + 1
        except OSError:
            continue
        out.append((n, counts, panics, sorted(kinds.items(), key=lambda kv: -kv[1])[:4]))
    return out


# ---------------------------------------------------------------- main


def main():
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(2 if len(sys.argv) != 2 else 0)
    try:
        cfg = Config(sys.argv[1])
    except ValueError as e:
        print(f"soak: {e}", file=sys.stderr)
        sys.exit(2)
    for tool in ("psql", "rabbitmqctl", "redis-cli"):
        if shutil.which(tool) is None:
            print(f"soak: `{tool}` not found: the soak reads the services through the local "
                  "psql, rabbitmqctl and redis-cli", file=sys.stderr)
            sys.exit(2)
    os.makedirs(cfg.out, exist_ok=True)
    run_dir = os.path.join(cfg.out, f"run-{cfg.label}")
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    # Copy the binaries: a rebuild during a long run must not change what a
    # restarted process runs.
    bin_dir = os.path.join(run_dir, "bin")
    os.makedirs(bin_dir)
    for b in ("belfry-scheduler", "belfry-worker"):
        src = os.path.join(cfg.bin_dir, b)
        if not os.path.exists(src):
            sys.exit(f"soak: {src} not found (scripts/soak builds it; or set BELFRY_SOAK_BIN_DIR)")
        shutil.copy2(src, bin_dir)
    if os.environ.get("BELFRY_SOAK_BUILT") == "1":
        commit = run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"])
        commit = commit.stdout.strip() if commit and commit.returncode == 0 else "unknown"
        dirty = run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"])
        if dirty and dirty.stdout.strip():
            commit += " + uncommitted changes"
    else:
        # Binaries built elsewhere: say so (BELFRY_SOAK_COMMIT names their source).
        commit = env_str("BELFRY_SOAK_COMMIT", "prebuilt")

    text, kinds = schedule_text(cfg.schedules)
    sched_file = os.path.join(run_dir, "schedules.toml")
    with open(sched_file, "w") as f:
        f.write(text)

    log(f"{fmt_dur(cfg.duration)} at {cfg.schedules} fires/s "
        f"({', '.join(f'{v} {k}' for k, v in kinds.items())}), sample every {fmt_dur(cfg.sample)}, "
        f"fault every {fmt_dur(cfg.fault_every) if cfg.fault_every else 'never'}"
        f"{' (service restarts included)' if cfg.service_faults else ''}, seed {cfg.seed}")
    log(f"database {cfg.db}, namespace {cfg.namespace}, binaries from {cfg.bin_dir} "
        f"(commit {commit}), logs in {run_dir}")

    psql("postgres", f"CREATE DATABASE {cfg.db}", check=True)
    autovacuum = (psql("postgres", "SHOW autovacuum") or [["?"]])[0][0]
    vacuum_every = cfg.vacuum_every
    if cfg.vacuum_mode == "auto" and autovacuum != "on":
        vacuum_every = 60.0
    vacuum_note = (f"server autovacuum = {autovacuum}; the soak runs VACUUM (ANALYZE) on its tables every "
                   f"{fmt_dur(vacuum_every)}" if vacuum_every else f"server autovacuum = {autovacuum}; no extra VACUUM")
    log(vacuum_note)
    vacuum = Vacuum(cfg.db, vacuum_every) if vacuum_every else None
    if vacuum:
        vacuum.start()
    common = {
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{cfg.db}",
        "REDIS_URL": "redis://127.0.0.1:6379/",
        "AMQP_URL": "amqp://guest:guest@127.0.0.1:5672/%2f",
        "BELFRY_NAMESPACE": cfg.namespace,
        "RUST_LOG": cfg.rust_log,
        "BELFRY_SHUTDOWN_TIMEOUT": "10s",
        # A process restarted while a service is down (a bounce of ours, or
        # another run's on this shared machine) waits for it, as one under a
        # supervisor would be restarted until it comes up.
        "BELFRY_START_TIMEOUT": "180s",
    }
    fleet = Fleet(cfg, run_dir, bin_dir, common)
    faults = None
    sampler = None
    interrupted = [None]

    def on_signal(signum, _frame):
        interrupted[0] = signal.Signals(signum).name
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    rows = []
    result = 1
    try:
        for n in WORKERS:
            fleet.add("worker", n, {
                "BELFRY_METRICS_ADDR": f"127.0.0.1:{free_port()}",
                "BELFRY_WORKER_GROUP": "default",
                "BELFRY_CONCURRENCY": "64",
                "BELFRY_PREFETCH": "64",
                "BELFRY_JOB_TIMEOUT": "10s",
            })
        jobs_q = f"{cfg.namespace}.jobs.default"
        deadline = time.monotonic() + 60
        while True:
            q = rabbit_queues(cfg.namespace)
            if q and q.get(jobs_q, (0, 0, 0))[2] >= len(WORKERS):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the workers did not consume {jobs_q} within 60 s; see {run_dir}")
            fleet.check_alive(0)
            time.sleep(0.5)
        for n in SCHEDULERS:
            fleet.add("scheduler", n, {
                "BELFRY_METRICS_ADDR": f"127.0.0.1:{free_port()}",
                "BELFRY_API_ADDR": f"127.0.0.1:{free_port()}",
                "BELFRY_SCHEDULES": sched_file,
                "BELFRY_RETENTION": cfg.retention,
                "BELFRY_RETENTION_INTERVAL": "1m",
            })
        deadline = time.monotonic() + 90
        while True:
            r = psql(cfg.db, "SELECT count(DISTINCT claimed_by), count(*) FROM job_runs")
            if r and int(r[0][0]) >= len(SCHEDULERS) and int(r[0][1]) >= 3 * cfg.schedules:
                break
            if time.monotonic() > deadline:
                if r and int(r[0][1]) >= 3 * cfg.schedules:
                    log(f"only {r[0][0]} of the replicas won a fire during the warm-up; going on")
                    break
                raise RuntimeError(f"the replicas did not fire within 90 s; see {run_dir}")
            fleet.check_alive(0)
            time.sleep(0.5)
        # A little warm-up, then the measured run starts.
        time.sleep(5)
        t0 = time.monotonic()
        wall0 = time.time()
        starts = {}
        log("load is on; measuring")
        faults = Faults(cfg, fleet, t0)
        sampler = Sampler(cfg, fleet, t0, wall0)
        sampler.vacuum = vacuum
        faults.start()
        k = 1
        last_log = 0.0
        while True:
            target = t0 + k * cfg.sample
            if target - t0 > cfg.duration + 0.01:
                break
            time.sleep(max(0.0, target - time.monotonic()))
            fleet.check_alive(time.monotonic() - t0)
            row = sampler.take()
            for n in SCHEDULERS + WORKERS:
                pid = row.get(f"{n}_pid")
                if pid and (n, pid) not in starts:
                    st = fleet.members[n].started - t0
                    starts[(n, pid)] = st
            if row["t_s"] - last_log >= max(60.0, cfg.sample) or k == 1:
                last_log = row["t_s"]
                rss = " ".join(f"{n}={row.get(f'{n}_rss_mib', '')}" for n in SCHEDULERS + WORKERS)
                log(f"t+{row['t_s']:.0f}s fires/s={row.get('fires_per_s')} p99 fire={row.get('fire_late_p99_s')}s "
                    f"start={row.get('start_late_p99_s')}s open={row.get('open_rows')} "
                    f"ready={row.get('queue_ready')} unacked={row.get('queue_unacked')} "
                    f"pg={row.get('pg_conns')} cpu={row.get('host_cpu_pct')}% rss[MiB] {rss}")
            k += 1
        faults.stop_event.set()
        faults.join(timeout=120)
        rows = sampler.rows
        end_t = time.monotonic() - t0

        # Drain: pause every schedule (the replicas stop firing within
        # moments, notified by the table), wait until every row is terminal
        # with the replicas still running (deferred retries need their
        # reconciler), then stop the schedulers, then the workers.
        log("load off: pausing every schedule, waiting for every row to finish")
        psql_retry(cfg.db, "UPDATE schedules SET paused = true")
        drain_start = time.monotonic()
        open_rows = None
        while time.monotonic() - drain_start < cfg.drain:
            r = psql(cfg.db, f"SELECT count(*) FROM job_runs WHERE status IN {OPEN_SQL}")
            open_rows = int(r[0][0]) if r else None
            if open_rows == 0:
                break
            fleet.check_alive(time.monotonic() - t0)
            time.sleep(1)
        drain_took = time.monotonic() - drain_start
        for n in SCHEDULERS:
            fleet.stop(n)
        r = psql_retry(cfg.db, f"SELECT count(*) FROM job_runs WHERE status IN {OPEN_SQL}")
        open_after_schedulers = int(r[0][0])
        for n in WORKERS:
            fleet.stop(n)
        r = psql_retry(cfg.db, "SELECT status, count(*) FROM job_runs GROUP BY status ORDER BY status")
        statuses = {s: int(c) for s, c in r}
        open_left = sum(c for s, c in statuses.items() if s not in TERMINAL)
        leftovers = psql(cfg.db, f"SELECT job_name, run_key, status, attempts, coalesce(last_error, '') "
                                 f"FROM job_runs WHERE status IN {OPEN_SQL} ORDER BY scheduled_at LIMIT 10") or []
        drained = open_rows == 0 and open_after_schedulers == 0 and open_left == 0
        drain_info = (f"every row terminal {drain_took:.0f} s after the load stopped"
                      if drained else
                      f"{open_left} row(s) not terminal after {cfg.drain:.0f} s of drain and the graceful stops"
                      + "".join(f"\n        {' '.join(x)}" for x in leftovers))

        title = (f"belfry soak {fmt_dur(cfg.duration)}, {cfg.schedules} fires/s, commit {commit}, "
                 f"{datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M')} UTC")
        table, verdict = analyse(cfg, rows, starts, faults.done, fleet, drained, drain_info,
                                 {"max_open_age": sampler.max_open_age_seen, "fault_error": faults.error,
                                  "vacuum_note": vacuum_note, "scrape_failures": sampler.scrape_failures})

        csv_path = os.path.join(cfg.out, f"soak-{cfg.label}.csv")
        with open(csv_path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=sampler.columns(), extrasaction="ignore")
            w.writeheader()
            for row in rows:
                w.writerow(row)
        png_path = os.path.join(cfg.out, f"soak-{cfg.label}.png")
        try:
            plot(cfg, rows, faults.done, png_path, title)
        except ImportError:
            png_path = "(matplotlib not installed: no plot; scripts/soak installs it)"

        logs = log_summary(run_dir, SCHEDULERS + WORKERS)
        lines = []
        lines.append(f"## {title}")
        lines.append("")
        lines.append(f"measured {end_t:.0f} s; {len(rows)} samples every {fmt_dur(cfg.sample)}; "
                     f"load {cfg.schedules} schedules every 1 s ({', '.join(f'{v} {k}' for k, v in kinds.items())}); "
                     f"seed {cfg.seed}; retention {cfg.retention}; {vacuum_note}")
        lines.append("")
        lines.append(table)
        lines.append("")
        lines.append(f"Faults ({len(faults.done)}):")
        lines.append("")
        for t, took, what in faults.done:
            lines.append(f"- t+{t:.0f}s ({took:.1f}s): {what}")
        lines.append("")
        lines.append("Rows left in job_runs at the end (after retention "
                     f"{cfg.retention}): " + ", ".join(f"{s} {c}" for s, c in statuses.items())
                     + f"; dead-lettered messages purged: {sampler.dead_lettered}")
        lines.append("")
        lines.append("Log lines (RUST_LOG=" + cfg.rust_log + "):")
        lines.append("")
        for n, counts, panics, top in logs:
            lines.append(f"- {n}: {counts['WARN']} WARN, {counts['ERROR']} ERROR, {panics} panics")
            for msg, c in top:
                lines.append(f"    - {c} × `{msg}`")
        lines.append("")
        lines.append("Verdict:")
        lines.append("")
        for status, what in verdict.lines:
            lines.append(f"    {status} {what}")
        lines.append("")
        lines.append(f"soak: {'PASS' if verdict.passed else 'FAIL'}")
        report = "\n".join(lines)
        print()
        print(report)
        md_path = os.path.join(cfg.out, f"soak-{cfg.label}.md")
        with open(md_path, "w") as f:
            f.write(report + "\n")
        print(f"\nsamples: {csv_path}\nplot:    {png_path}\nreport:  {md_path}\nlogs:    {run_dir}")
        result = 0 if verdict.passed else 1
    except KeyboardInterrupt:
        log(f"interrupted ({interrupted[0] or 'SIGINT'}): stopping everything, no verdict")
        result = 130
    except RuntimeError as e:
        log(f"error: {e}")
        result = 1
    finally:
        if faults is not None:
            faults.stop_event.set()
        if vacuum is not None:
            vacuum.stop_event.set()
        fleet.kill_all()
        cleanup(cfg)
    sys.exit(result)


def cleanup(cfg):
    if cfg.keep:
        log(f"BELFRY_SOAK_KEEP=1: kept database {cfg.db}, namespace {cfg.namespace}")
        return
    psql("postgres", f"DROP DATABASE IF EXISTS {cfg.db} WITH (FORCE)")
    q = rabbit_queues(cfg.namespace) or {}
    for name in q:
        run(["rabbitmqctl", "delete_queue", "-q", "-p", "/", name], timeout=20)
    p = run(["rabbitmqctl", "list_exchanges", "-q", "-p", "/", "name"], timeout=20)
    for name in (p.stdout.split() if p and p.returncode == 0 else []):
        if name.startswith(cfg.namespace + "."):
            run(["rabbitmqctl", "eval",
                 f'rabbit_exchange:delete(rabbit_misc:r(<<"/">>, exchange, <<"{name}">>), false, <<"belfry-soak">>).'],
                timeout=20)
    p = run(["redis-cli", "-p", "6379", "--scan", "--pattern", f"{cfg.namespace}:*"], timeout=60)
    keys = p.stdout.split() if p and p.returncode == 0 else []
    for i in range(0, len(keys), 500):
        run(["redis-cli", "-p", "6379", "del", *keys[i:i + 500]], timeout=30)
    log(f"removed database {cfg.db}, {len(q)} queue(s), the namespace's exchanges and {len(keys)} Redis key(s)")


if __name__ == "__main__":
    main()
