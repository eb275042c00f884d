//! Facts about the machine that decide how a model can run on it: CPU features the kernels
//! use, cores, RAM (and the cgroup limit that may cap it), free disk, and the measured read rate
//! of the model's drive ([`read_probe`]), the machine's f64 GEMM rate ([`gemm_probe`]) and
//! memory read bandwidth ([`stream_probe`]), and this process's resident memory
//! ([`ProcessMemory`]). `k3d doctor` reports them; nothing here changes state.

pub mod gemm_probe;
pub mod read_probe;
pub mod stream_probe;

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::kernels::isa::{Isa, IsaKind};

/// A fact could not be read. Every variant names the file or path concerned.
#[derive(Debug, thiserror::Error)]
pub enum SystemError {
    #[error("reading {path}: {error}")]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{path}: no {field} line")]
    MissingField { path: PathBuf, field: &'static str },
    #[error("{path}: cannot parse {field} from {text:?}")]
    Parse {
        path: PathBuf,
        field: &'static str,
        text: String,
    },
    #[error("statvfs({path}): {error}")]
    Statvfs {
        path: PathBuf,
        error: nix::errno::Errno,
    },
}

fn read_text(path: &Path) -> Result<String, SystemError> {
    std::fs::read_to_string(path).map_err(|error| SystemError::Read {
        path: path.to_path_buf(),
        error,
    })
}

/// CPU facts.
#[derive(Debug, Clone, Serialize)]
pub struct Cpu {
    /// `model name` from /proc/cpuinfo, if present.
    pub model: Option<String>,
    /// Logical CPUs online.
    pub logical: usize,
    /// CPUs this process may use (affinity mask and cgroup quota): the default `--threads`.
    pub usable: usize,
    pub avx2: bool,
    pub fma: bool,
    pub avx512f: bool,
    /// The kernel path the engine selects (`kernels::isa::Isa::detect`).
    pub kernels: &'static str,
}

impl Cpu {
    pub fn detect() -> Cpu {
        #[cfg(target_arch = "x86_64")]
        let (avx2, fma, avx512f) = (
            std::is_x86_feature_detected!("avx2"),
            std::is_x86_feature_detected!("fma"),
            std::is_x86_feature_detected!("avx512f"),
        );
        #[cfg(not(target_arch = "x86_64"))]
        let (avx2, fma, avx512f) = (false, false, false);
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|rest| rest.split_once(':'))
            .map(|(_, v)| v.trim().to_string());
        let logical = cpuinfo
            .lines()
            .filter(|l| l.starts_with("processor"))
            .count();
        let usable = std::thread::available_parallelism().map_or(1, |n| n.get());
        let kernels: IsaKind = Isa::detect().kind();
        Cpu {
            model,
            logical: logical.max(usable),
            usable,
            avx2,
            fma,
            avx512f,
            kernels: kernels.name(),
        }
    }
}

/// A cgroup memory limit on this process.
#[derive(Debug, Clone, Serialize)]
pub struct CgroupMemory {
    /// 1 or 2.
    pub version: u8,
    /// The file the (smallest) limit was read from.
    pub limit_file: PathBuf,
    pub limit: u64,
    /// Bytes the cgroup already charges (page cache included), if readable.
    pub usage: Option<u64>,
}

/// RAM facts.
#[derive(Debug, Clone, Serialize)]
pub struct Memory {
    /// `MemTotal` of /proc/meminfo.
    pub total: u64,
    /// `MemAvailable` of /proc/meminfo.
    pub available: u64,
    pub cgroup: Option<CgroupMemory>,
}

impl Memory {
    pub fn detect() -> Result<Memory, SystemError> {
        let path = Path::new("/proc/meminfo");
        let text = read_text(path)?;
        let total = meminfo_field(path, &text, "MemTotal")?;
        let available = meminfo_field(path, &text, "MemAvailable")?;
        let cgroup = cgroup_memory(Path::new("/proc/self/cgroup"), Path::new("/sys/fs/cgroup"))
            .filter(|c| c.limit < total);
        Ok(Memory {
            total,
            available,
            cgroup,
        })
    }

    /// What a new process may still allocate: `MemAvailable`, or less if the cgroup's limit
    /// minus its usage is smaller.
    pub fn usable(&self) -> u64 {
        match &self.cgroup {
            Some(c) => self
                .available
                .min(c.limit.saturating_sub(c.usage.unwrap_or(0))),
            None => self.available,
        }
    }
}

/// This process's resident memory (engine-lessons §8.1: report the real peak RSS), from
/// `VmRSS` and `VmHWM` of /proc/self/status. The one reader of it: `Status`, `k3d run` and
/// `k3d bench` all report these figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ProcessMemory {
    /// Resident set now, in bytes.
    pub rss: u64,
    /// Largest resident set so far, in bytes.
    pub peak_rss: u64,
}

impl ProcessMemory {
    pub fn read() -> Result<ProcessMemory, SystemError> {
        Self::parse(Path::new("/proc/self/status"))
    }

    /// [`ProcessMemory::read`], or zeros where /proc cannot say (the figures are reports,
    /// never decisions).
    pub fn now() -> ProcessMemory {
        Self::read().unwrap_or_default()
    }

    fn parse(path: &Path) -> Result<ProcessMemory, SystemError> {
        let text = read_text(path)?;
        Ok(ProcessMemory {
            rss: meminfo_field(path, &text, "VmRSS")?,
            peak_rss: meminfo_field(path, &text, "VmHWM")?,
        })
    }
}

/// One `Name:   123 kB` line of /proc/meminfo (or /proc/self/status), in bytes.
fn meminfo_field(path: &Path, text: &str, field: &'static str) -> Result<u64, SystemError> {
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(field).and_then(|r| r.strip_prefix(':')))
        .ok_or_else(|| SystemError::MissingField {
            path: path.to_path_buf(),
            field,
        })?;
    let parse_err = || SystemError::Parse {
        path: path.to_path_buf(),
        field,
        text: line.trim().to_string(),
    };
    let mut words = line.split_whitespace();
    let n: u64 = words
        .next()
        .and_then(|w| w.parse().ok())
        .ok_or_else(parse_err)?;
    match words.next() {
        Some("kB") => n.checked_mul(1024).ok_or_else(parse_err),
        None => Ok(n),
        Some(_) => Err(parse_err()),
    }
}

/// The memory limit of the cgroup this process is in, from `proc_cgroup` (/proc/self/cgroup)
/// and the hierarchy mounted at `root` (/sys/fs/cgroup). Version 2: the smallest `memory.max`
/// from the process's cgroup up to the root (a parent's limit caps its children). Version 1:
/// `memory.limit_in_bytes` of the memory controller's cgroup (already hierarchical in the
/// kernel). `None` when unlimited or unreadable.
pub fn cgroup_memory(proc_cgroup: &Path, root: &Path) -> Option<CgroupMemory> {
    let text = std::fs::read_to_string(proc_cgroup).ok()?;
    let read_u64 =
        |p: &Path| -> Option<u64> { std::fs::read_to_string(p).ok()?.trim().parse().ok() };
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(rel)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let rel = rel.trim_start_matches('/');
        if id == "0" && controllers.is_empty() {
            let leaf = root.join(rel);
            let mut best: Option<(u64, PathBuf)> = None;
            let mut dir = Some(leaf.as_path());
            while let Some(d) = dir {
                if !d.starts_with(root) {
                    break;
                }
                let file = d.join("memory.max");
                if let Some(limit) = read_u64(&file)
                    && best.as_ref().is_none_or(|(b, _)| limit < *b)
                {
                    best = Some((limit, file));
                }
                dir = d.parent();
            }
            if let Some((limit, limit_file)) = best {
                return Some(CgroupMemory {
                    version: 2,
                    limit_file,
                    limit,
                    usage: read_u64(&leaf.join("memory.current")),
                });
            }
        } else if controllers.split(',').any(|c| c == "memory") {
            let dir = root.join("memory").join(rel);
            let limit_file = dir.join("memory.limit_in_bytes");
            let limit = read_u64(&limit_file)?;
            return Some(CgroupMemory {
                version: 1,
                limit_file,
                limit,
                usage: read_u64(&dir.join("memory.usage_in_bytes")),
            });
        }
    }
    None
}

/// Space on the filesystem holding a path.
#[derive(Debug, Clone, Serialize)]
pub struct Disk {
    pub path: PathBuf,
    /// Bytes an unprivileged writer may still use.
    pub free: u64,
    pub size: u64,
}

impl Disk {
    pub fn of(path: &Path) -> Result<Disk, SystemError> {
        let st = nix::sys::statvfs::statvfs(path).map_err(|error| SystemError::Statvfs {
            path: path.to_path_buf(),
            error,
        })?;
        let frag = st.fragment_size() as u64;
        Ok(Disk {
            path: path.to_path_buf(),
            free: (st.blocks_available() as u64).saturating_mul(frag),
            size: (st.blocks() as u64).saturating_mul(frag),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_fields_in_bytes() {
        let p = Path::new("meminfo");
        let text = "MemTotal:       16384 kB\nMemFree: 1 kB\nMemAvailable:    8192 kB\nHugePages_Total: 3\n";
        assert_eq!(meminfo_field(p, text, "MemTotal").unwrap(), 16384 * 1024);
        assert_eq!(meminfo_field(p, text, "MemAvailable").unwrap(), 8192 * 1024);
        assert_eq!(meminfo_field(p, text, "HugePages_Total").unwrap(), 3);
        assert!(matches!(
            meminfo_field(p, text, "SwapTotal"),
            Err(SystemError::MissingField { .. })
        ));
        assert!(matches!(
            meminfo_field(p, "MemTotal: lots kB\n", "MemTotal"),
            Err(SystemError::Parse { .. })
        ));
    }

    #[test]
    fn process_memory_is_read_from_proc_status() {
        let dir = tree(
            "status",
            &[(
                "status",
                "Name:\tk3d\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n",
            )],
        );
        let m = ProcessMemory::parse(&dir.path().join("status")).unwrap();
        assert_eq!((m.rss, m.peak_rss), (1024 * 1024, 2048 * 1024));
        assert!(matches!(
            ProcessMemory::parse(&dir.path().join("missing")),
            Err(SystemError::Read { .. })
        ));
        let live = ProcessMemory::read().unwrap();
        assert!(live.rss > 0 && live.peak_rss >= live.rss);
    }

    fn tree(label: &str, files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::Builder::new()
            .prefix(&format!("k3-cgroup-{label}-"))
            .tempdir()
            .unwrap();
        for (name, text) in files {
            let p = dir.path().join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        dir
    }

    #[test]
    fn cgroup_v2_takes_the_smallest_limit_up_the_tree() {
        let dir = tree(
            "v2",
            &[
                ("proc", "0::/a/b\n"),
                ("fs/a/memory.max", "1000\n"),
                ("fs/a/b/memory.max", "max\n"),
                ("fs/a/b/memory.current", "300\n"),
            ],
        );
        let c = cgroup_memory(&dir.path().join("proc"), &dir.path().join("fs")).unwrap();
        assert_eq!((c.version, c.limit, c.usage), (2, 1000, Some(300)));
        assert_eq!(c.limit_file, dir.path().join("fs/a/memory.max"));
    }

    #[test]
    fn cgroup_v1_memory_controller() {
        let dir = tree(
            "v1",
            &[
                ("proc", "4:cpu,cpuacct:/x\n3:memory:/svc\n"),
                ("fs/memory/svc/memory.limit_in_bytes", "2048\n"),
                ("fs/memory/svc/memory.usage_in_bytes", "10\n"),
            ],
        );
        let c = cgroup_memory(&dir.path().join("proc"), &dir.path().join("fs")).unwrap();
        assert_eq!((c.version, c.limit, c.usage), (1, 2048, Some(10)));
    }

    #[test]
    fn no_cgroup_limit() {
        let dir = tree("none", &[("proc", "0::/\n"), ("fs/memory.current", "5\n")]);
        assert!(cgroup_memory(&dir.path().join("proc"), &dir.path().join("fs")).is_none());
    }
}
