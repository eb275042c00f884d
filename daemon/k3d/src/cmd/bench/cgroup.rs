//! A cgroup v1 memory group for one benchmark child (`k3d bench --cgroup`): created under the
//! bench process's own memory cgroup with `memory.limit_in_bytes` set, joined by the child
//! itself before it allocates anything (so every page it touches is charged), read for its
//! peak and failure count when the child has exited, then removed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};

/// Where the cgroup v1 memory controller is mounted on every distribution that has one.
const V1_MEMORY_ROOT: &str = "/sys/fs/cgroup/memory";

/// Checks up front that groups can be made: root, and a cgroup v1 memory controller.
pub fn check_available() -> anyhow::Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("--cgroup needs root (it creates memory cgroups and drops the page cache)");
    }
    if !Path::new(V1_MEMORY_ROOT)
        .join("memory.limit_in_bytes")
        .exists()
    {
        bail!(
            "--cgroup needs the cgroup v1 memory controller at {V1_MEMORY_ROOT} \
             (memory.limit_in_bytes not found; a cgroup v2-only system has none)"
        );
    }
    Ok(())
}

/// This process's memory cgroup directory (the `memory` line of /proc/self/cgroup).
fn own_group() -> anyhow::Result<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/cgroup").context("reading /proc/self/cgroup")?;
    // Lines are "id:controllers:path"; the path may itself contain ':'.
    let rel = text
        .lines()
        .filter_map(|l| l.split_once(':').and_then(|(_, rest)| rest.split_once(':')))
        .find(|(controllers, _)| controllers.split(',').any(|c| c == "memory"))
        .map(|(_, path)| path.trim_start_matches('/').to_string())
        .ok_or_else(|| anyhow!("/proc/self/cgroup has no cgroup v1 memory line"))?;
    Ok(Path::new(V1_MEMORY_ROOT).join(rel))
}

/// A memory group that is removed when dropped.
pub struct MemoryGroup {
    dir: PathBuf,
}

impl MemoryGroup {
    /// Creates `name` with a hard limit of `limit` bytes and no swap beyond it.
    pub fn create(name: &str, limit: u64) -> anyhow::Result<Self> {
        let dir = own_group()?.join(name);
        std::fs::create_dir(&dir).with_context(|| format!("creating cgroup {}", dir.display()))?;
        let group = MemoryGroup { dir };
        group.write("memory.limit_in_bytes", &limit.to_string())?;
        // Where the swap controller is enabled, memory+swap gets the same cap: no escape to swap.
        let memsw = group.dir.join("memory.memsw.limit_in_bytes");
        if memsw.exists() {
            group.write("memory.memsw.limit_in_bytes", &limit.to_string())?;
        }
        Ok(group)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn write(&self, file: &str, value: &str) -> anyhow::Result<()> {
        let path = self.dir.join(file);
        std::fs::write(&path, value)
            .with_context(|| format!("writing {value} to {}", path.display()))
    }

    fn read_u64(&self, file: &str) -> anyhow::Result<u64> {
        let path = self.dir.join(file);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        text.trim()
            .parse()
            .with_context(|| format!("{}: not a number: {text:?}", path.display()))
    }

    /// Peak charge (RSS and page cache) since creation.
    pub fn max_usage(&self) -> anyhow::Result<u64> {
        self.read_u64("memory.max_usage_in_bytes")
    }

    /// Times an allocation hit the limit.
    pub fn failcnt(&self) -> anyhow::Result<u64> {
        self.read_u64("memory.failcnt")
    }
}

impl Drop for MemoryGroup {
    /// The child has exited; its charges drain asynchronously, so `rmdir` may need a moment.
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!(
            "k3d bench: warning: could not remove cgroup {}",
            self.dir.display()
        );
    }
}

/// Moves the calling process into the group at `dir` (the child's first act).
pub fn join(dir: &Path) -> anyhow::Result<()> {
    let procs = dir.join("cgroup.procs");
    std::fs::write(&procs, std::process::id().to_string())
        .with_context(|| format!("joining {}", procs.display()))
}

/// Writes back dirty pages and drops the page cache, so every budget starts cold.
pub fn drop_page_cache() -> anyhow::Result<()> {
    nix::unistd::sync();
    std::fs::write("/proc/sys/vm/drop_caches", "3").context("writing /proc/sys/vm/drop_caches")
}
