//! Real service processes for the benchmarks that run them: this build's
//! release binaries, found beside `belfry-bench`, and a guard that kills
//! them when a benchmark ends (or fails half-way).

use std::process::Child;

/// Named child processes, killed and reaped when dropped.
pub(crate) struct Processes(pub(crate) Vec<(String, Child)>);

impl Drop for Processes {
    fn drop(&mut self) {
        for (_, child) in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The path of binary `name` built beside this benchmark.
///
/// # Errors
///
/// When it is missing (with the build command that makes it).
pub(crate) fn release_binary(name: &str) -> anyhow::Result<std::path::PathBuf> {
    let exe = std::env::current_exe()?;
    let bin = exe
        .parent()
        .map(|d| d.join(name))
        .ok_or_else(|| anyhow::anyhow!("no directory for {}", exe.display()))?;
    anyhow::ensure!(
        bin.exists(),
        "{} is missing: cargo build --release -p belfry-server -p belfry-worker -p belfry-bench",
        bin.display()
    );
    Ok(bin)
}
