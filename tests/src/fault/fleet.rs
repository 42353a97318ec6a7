//! The processes under test: real `belfry-scheduler` and `belfry-worker`
//! binaries, each with its own log file, that the suite kills, stops,
//! restarts and arms with failpoints.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Which binary a process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `belfry-scheduler`.
    Scheduler,
    /// `belfry-worker`.
    Worker,
}

impl Role {
    fn binary(self) -> &'static str {
        match self {
            Role::Scheduler => "belfry-scheduler",
            Role::Worker => "belfry-worker",
        }
    }
}

/// One slot of the fleet: a named process that can be replaced.
pub struct Member {
    /// Role of the process.
    pub role: Role,
    /// Instance name of its normal incarnation (`s1`, `w2`).
    pub name: String,
    child: Option<Child>,
    log: PathBuf,
    spawned: std::time::Instant,
}

/// How long a process gets after exec before the suite SIGTERMs it: a
/// signal arriving before `main` installed its handlers kills any process
/// (the default action), which says nothing about belfry.
const SETTLE: Duration = Duration::from_secs(1);

/// Every process of the suite.
pub struct Fleet {
    dir: PathBuf,
    bin_dir: PathBuf,
    common: Vec<(String, String)>,
    scheduler_env: Vec<(String, String)>,
    worker_env: Vec<(String, String)>,
    /// The schedulers, then the workers.
    pub members: Vec<Member>,
    /// Processes that exited without being told to (must stay 0).
    pub unexpected_exits: Vec<String>,
    /// Graceful stops (SIGTERM) that did not exit 0 (must stay 0).
    pub unclean_stops: Vec<String>,
}

/// Where cargo put the binaries: next to the test executable's `deps`.
///
/// # Panics
///
/// When a binary is missing; the message says how to build it.
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("current_exe: {e}"));
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| panic!("unexpected test executable path {}", exe.display()));
    for role in [Role::Scheduler, Role::Worker] {
        let bin = dir.join(role.binary());
        assert!(
            bin.exists(),
            "{} not found: build it with the failpoints features first \
             (scripts/fault-suite and scripts/test do)",
            bin.display()
        );
    }
    dir
}

impl Fleet {
    /// An empty fleet logging into `dir`; `common` goes to every process,
    /// the role's own list after it.
    pub fn new(
        dir: PathBuf,
        common: Vec<(String, String)>,
        scheduler_env: Vec<(String, String)>,
        worker_env: Vec<(String, String)>,
    ) -> Self {
        Self {
            dir,
            bin_dir: bin_dir(),
            common,
            scheduler_env,
            worker_env,
            members: Vec::new(),
            unexpected_exits: Vec::new(),
            unclean_stops: Vec::new(),
        }
    }

    /// Adds and starts a process.
    pub fn add(&mut self, role: Role, name: &str) {
        let log = self.dir.join(format!("{name}.log"));
        let mut member = Member {
            role,
            name: name.to_owned(),
            child: None,
            log,
            spawned: std::time::Instant::now(),
        };
        member.child = Some(self.spawn(&member, name, &[]));
        self.members.push(member);
    }

    /// Indices of the members with `role`.
    pub fn of(&self, role: Role) -> Vec<usize> {
        (0..self.members.len())
            .filter(|&i| self.members[i].role == role)
            .collect()
    }

    /// The member whose instance name is `name`.
    pub fn find(&self, name: &str) -> Option<usize> {
        self.members.iter().position(|m| m.name == name)
    }

    fn spawn(&self, member: &Member, instance: &str, extra: &[(&str, String)]) -> Child {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&member.log)
            .unwrap_or_else(|e| panic!("log {}: {e}", member.log.display()));
        let err = log
            .try_clone()
            .unwrap_or_else(|e| panic!("log {}: {e}", member.log.display()));
        let role_env = match member.role {
            Role::Scheduler => &self.scheduler_env,
            Role::Worker => &self.worker_env,
        };
        Command::new(self.bin_dir.join(member.role.binary()))
            .envs(self.common.iter().cloned())
            .envs(role_env.iter().cloned())
            .env("BELFRY_INSTANCE", instance)
            .envs(extra.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", member.role.binary()))
    }

    /// Records every member that exited while nobody stopped it.
    pub fn check_alive(&mut self) {
        for m in &mut self.members {
            if let Some(child) = &mut m.child {
                if let Ok(Some(status)) = child.try_wait() {
                    self.unexpected_exits
                        .push(format!("{} exited on its own: {status}", m.name));
                    m.child = None;
                }
            }
        }
    }

    /// The pid of member `i`.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].child.as_ref().map(Child::id)
    }

    /// `kill -9` member `i` and reap it.
    pub async fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            belfry_testkit::wait_exit(child).await;
        }
    }

    /// SIGTERM member `i` and wait up to `deadline` for it to exit; a
    /// non-zero exit or a missed deadline is recorded as unclean.
    pub async fn stop(&mut self, i: usize, deadline: Duration) {
        let young = SETTLE.saturating_sub(self.members[i].spawned.elapsed());
        tokio::time::sleep(young).await;
        let Some(child) = self.members[i].child.take() else {
            return;
        };
        let pid = child.id();
        signal(pid, "TERM");
        let name = self.members[i].name.clone();
        match tokio::time::timeout(deadline, belfry_testkit::wait_exit(child)).await {
            Ok(status) if status.success() => {}
            Ok(status) => self
                .unclean_stops
                .push(format!("{name}: SIGTERM ended with {status}")),
            Err(_) => {
                signal(pid, "KILL");
                self.unclean_stops
                    .push(format!("{name}: still running {deadline:?} after SIGTERM"));
            }
        }
    }

    /// Starts member `i` again (normally, under its own name).
    pub fn restart(&mut self, i: usize) {
        let name = self.members[i].name.clone();
        self.restart_as(i, &name, &[]);
    }

    /// Starts member `i` as instance `instance` with extra environment
    /// (a failpoint, a skewed clock).
    pub fn restart_as(&mut self, i: usize, instance: &str, extra: &[(&str, String)]) {
        assert!(self.members[i].child.is_none(), "member {i} still running");
        let child = self.spawn(&self.members[i], instance, extra);
        self.members[i].child = Some(child);
        self.members[i].spawned = std::time::Instant::now();
    }

    /// Waits up to `within` for member `i` to die on its own (an armed
    /// failpoint); returns whether it did.
    pub async fn wait_crash(&mut self, i: usize, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(child) = &mut self.members[i].child {
                if let Ok(Some(_)) = child.try_wait() {
                    self.members[i].child = None;
                    return true;
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The last `lines` lines of every log, for a failure message.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        for m in &self.members {
            let text = std::fs::read_to_string(&m.log).unwrap_or_default();
            let all: Vec<&str> = text.lines().collect();
            out.push_str(&format!("--- {} ({})\n", m.name, m.log.display()));
            for l in &all[all.len().saturating_sub(lines)..] {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }
}

impl Fleet {
    /// Every log line of every member that names one of `needles` (run
    /// ids), under the member's name; empty when `needles` is.
    pub fn log_lines_naming(&self, needles: &[String]) -> String {
        let mut out = String::new();
        if needles.is_empty() {
            return out;
        }
        for m in &self.members {
            let text = std::fs::read_to_string(&m.log).unwrap_or_default();
            let lines: Vec<&str> = text
                .lines()
                .filter(|l| needles.iter().any(|n| l.contains(n.as_str())))
                .collect();
            if !lines.is_empty() {
                out.push_str(&format!("--- {} on the runs named above\n", m.name));
                for l in lines {
                    out.push_str(l);
                    out.push('\n');
                }
            }
        }
        out
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        // A failed test must not leave processes behind.
        for m in &mut self.members {
            if let Some(child) = &mut m.child {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Sends `SIG{name}` to `pid`.
///
/// # Panics
///
/// When `kill` cannot be run.
pub fn signal(pid: u32, name: &str) {
    let _ = Command::new("kill")
        .args([format!("-{name}"), pid.to_string()])
        .status()
        .unwrap_or_else(|e| panic!("kill -{name} {pid}: {e}"));
}
