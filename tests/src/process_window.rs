//! Real `belfry-scheduler` and `belfry-worker` processes running
//! every-second schedules through an infrastructure fault (a RabbitMQ node
//! killed, a Redis or Postgres failover), and the table such a test ends
//! with: the fault suite's columns that apply without its probe.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use belfry_testkit::{eventually, service_command, temp_schedule_file, terminate, Reaper, TestEnv};
use chrono::{DateTime, Utc};

use crate::fault::fleet::bin_dir;
use crate::fire_window::{rows, wait_every_run_ended};

/// One process of the fleet: its binary and instance name.
#[derive(Debug, Clone, Copy)]
pub struct Process {
    /// `belfry-scheduler` or `belfry-worker`.
    pub bin: &'static str,
    /// Its `BELFRY_INSTANCE` (and log file name).
    pub instance: &'static str,
}

/// Processes on `env` with every-second schedules `{prefix}-00`, ….
pub struct ProcessFleet {
    names: Vec<String>,
    instances: Vec<Process>,
    processes: Reaper,
    dir: PathBuf,
    schedule_file: PathBuf,
    api_ports: HashMap<&'static str, u16>,
}

/// What a window of fires came to.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct WindowTable {
    /// Schedules × whole seconds of the window.
    pub fires_expected: usize,
    /// Rows whose fire instant is inside the window.
    pub rows_in_window: usize,
    /// Rows beyond the first for one (schedule, instant): must be 0.
    pub duplicates: usize,
    /// Expected fires without a row: must be 0.
    pub lost: usize,
    /// Rows not `succeeded`, `failed` or `dead`: must be 0.
    pub not_terminal: usize,
    /// Rows `failed` or `dead`.
    pub failed_or_dead: usize,
    /// Rows that took more than one attempt (a re-run: at-least-once
    /// execution across the fault).
    pub rerun: usize,
}

impl WindowTable {
    /// Whether nothing was lost, doubled or left unfinished.
    pub fn holds(&self) -> bool {
        self.duplicates == 0 && self.lost == 0 && self.not_terminal == 0 && self.failed_or_dead == 0
    }
}

impl std::fmt::Display for WindowTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "| fires expected | rows in window | duplicates | lost | not terminal | failed/dead | re-run |")?;
        writeln!(f, "| --- | --- | --- | --- | --- | --- | --- |")?;
        write!(
            f,
            "| {} | {} | {} | {} | {} | {} | {} |",
            self.fires_expected,
            self.rows_in_window,
            self.duplicates,
            self.lost,
            self.not_terminal,
            self.failed_or_dead,
            self.rerun
        )
    }
}

/// A port for a process to listen on: below the kernel's ephemeral range
/// (a port found with `bind(0)` and released may be handed to an outgoing
/// connection before the process binds it), distinct within this test
/// binary (a counter), and free now.
///
/// # Panics
///
/// When no port of the range is free.
fn listen_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    // Spread over the range by process id, so two test binaries at once
    // rarely start at the same port.
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 20_000 + u16::try_from(std::process::id() % 500).unwrap_or(0) * 20;
    for _ in 0..2_000 {
        let offset = NEXT.fetch_add(1, Ordering::Relaxed) % 12_000;
        let port = 20_000 + (base - 20_000 + offset) % 12_000;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in 20000-32000");
}

impl ProcessFleet {
    /// Starts `processes` on `env` with `schedules` every-second `noop`
    /// schedules and `extra` environment on top of `env`'s, then waits until
    /// every schedule has a succeeded run. Schedulers get an API port each
    /// (see [`ProcessFleet::readyz_node`]).
    ///
    /// # Panics
    ///
    /// When a process cannot start or the first runs do not succeed within
    /// 30 s.
    pub async fn start(
        env: &TestEnv,
        prefix: &str,
        schedules: usize,
        processes: &[Process],
        extra: &[(&str, String)],
    ) -> Self {
        let names: Vec<String> = (0..schedules).map(|i| format!("{prefix}-{i:02}")).collect();
        let text: String = names
            .iter()
            .map(|n| {
                format!("[[schedule]]\nname = \"{n}\"\nevery = \"1s\"\njob_type = \"noop\"\n\n")
            })
            .collect();
        let schedule_file = temp_schedule_file(&text);
        let dir =
            std::env::temp_dir().join(format!("belfry-{prefix}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let mut fleet = Self {
            names,
            instances: processes.to_vec(),
            processes: Reaper(Vec::new()),
            dir,
            schedule_file,
            api_ports: HashMap::new(),
        };
        for p in processes {
            let mut command = service_command(
                &bin_dir().join(p.bin).display().to_string(),
                env,
                p.instance,
            );
            if p.bin == "belfry-scheduler" {
                let port = listen_port();
                fleet.api_ports.insert(p.instance, port);
                command.env("BELFRY_API_ADDR", format!("127.0.0.1:{port}"));
            }
            let log = std::fs::File::create(fleet.log_path(p.instance))
                .unwrap_or_else(|e| panic!("log: {e}"));
            let err = log.try_clone().unwrap_or_else(|e| panic!("log: {e}"));
            let child = command
                .env("BELFRY_SCHEDULES", &fleet.schedule_file)
                .env("RUST_LOG", "info")
                .envs(extra.iter().map(|(k, v)| (*k, v.as_str())))
                .stdout(log)
                .stderr(err)
                .spawn()
                .unwrap_or_else(|e| panic!("{}: {e}", p.bin));
            fleet.processes.0.push(child);
        }
        eventually(
            "the first fires to run",
            Duration::from_secs(30),
            || async {
                let done = rows(env)
                    .await
                    .iter()
                    .filter(|r| r.2 == "succeeded")
                    .count();
                (done >= schedules).then_some(())
            },
        )
        .await;
        fleet
    }

    fn log_path(&self, instance: &str) -> PathBuf {
        self.dir.join(format!("{instance}.log"))
    }

    /// The log of `instance` so far.
    pub fn log(&self, instance: &str) -> String {
        std::fs::read_to_string(self.log_path(instance)).unwrap_or_default()
    }

    /// The node of `service` that scheduler `instance`'s `/readyz` names.
    pub async fn readyz_node(&self, instance: &str, service: &str) -> Option<String> {
        let port = self.api_ports.get(instance)?;
        let body: serde_json::Value = reqwest::get(format!("http://127.0.0.1:{port}/readyz"))
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        body["nodes"][service].as_str().map(str::to_owned)
    }

    /// Stops the schedulers (SIGTERM), waits until every run ended, stops
    /// the workers, and reads the window from `start` to `end` (whole
    /// seconds, both included).
    ///
    /// # Panics
    ///
    /// When a process does not exit 0 on SIGTERM or a run does not end
    /// within 60 s (the logs' tails are in the message).
    pub async fn finish(
        mut self,
        env: &TestEnv,
        start: DateTime<Utc>,
        end: DateTime<Utc>,
    ) -> WindowTable {
        // Schedulers first, so no fire is claimed after the workers stop;
        // the rest stay in the reaper (killed if an assertion fails).
        let schedulers: Vec<usize> = (0..self.instances.len())
            .filter(|i| self.instances[*i].bin == "belfry-scheduler")
            .collect();
        for i in schedulers.into_iter().rev() {
            let child = self.processes.0.remove(i);
            let p = self.instances.remove(i);
            assert!(
                terminate(child).await.success(),
                "{} did not stop cleanly:\n{}",
                p.instance,
                self.log(p.instance)
            );
        }
        wait_every_run_ended(env, Duration::from_secs(60)).await;
        while let (Some(child), Some(p)) = (self.processes.0.pop(), self.instances.pop()) {
            assert!(
                terminate(child).await.success(),
                "{} did not stop cleanly:\n{}",
                p.instance,
                self.log(p.instance)
            );
        }
        let rows = rows(env).await;
        let (from, to) = (start.timestamp(), end.timestamp());
        let mut table = WindowTable {
            fires_expected: self.names.len() * usize::try_from(to - from + 1).unwrap_or(0),
            ..WindowTable::default()
        };
        let mut seen: HashMap<(&str, i64), usize> = HashMap::new();
        for r in &rows {
            if !matches!(r.2.as_str(), "succeeded" | "failed" | "dead") {
                table.not_terminal += 1;
            }
            if matches!(r.2.as_str(), "failed" | "dead") {
                table.failed_or_dead += 1;
            }
            if r.3 > 1 {
                table.rerun += 1;
            }
            let t = r.1.timestamp();
            if (from..=to).contains(&t) && self.names.contains(&r.0) {
                table.rows_in_window += 1;
                *seen.entry((r.0.as_str(), t)).or_default() += 1;
            }
        }
        table.duplicates = seen.values().map(|n| n - 1).sum();
        table.lost = self
            .names
            .iter()
            .map(|n| {
                (from..=to)
                    .filter(|t| !seen.contains_key(&(n.as_str(), *t)))
                    .count()
            })
            .sum();
        println!("{table}");
        table
    }
}

impl Drop for ProcessFleet {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.schedule_file);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
