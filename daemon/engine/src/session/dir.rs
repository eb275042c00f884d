//! The session directory, used only when it is the daemon's own (issue #19 item 7).
//!
//! A directory another user may write into lets that user plant files the daemon then trusts:
//! a `.NAME.k3s.tmp` symlink that a root daemon follows and overwrites a file through, or a
//! session file whose `owner` field names a victim's uid. So:
//! * [`SessionDir::open`] refuses a directory not owned by the daemon's effective uid, or
//!   writable by its group or others (checked on the opened descriptor, so nothing can swap the
//!   directory between the check and its use);
//! * every file operation is relative to that descriptor and never follows a symlink: reads
//!   open with `O_NOFOLLOW` (and `O_NONBLOCK`, so a FIFO is refused instead of blocking), temp
//!   files are created with `O_CREAT | O_EXCL | O_NOFOLLOW`, renames and removals act on the
//!   entry itself;
//! * [`SessionDir::open_file`] returns the file's owner, so callers trust what a file says about
//!   itself only when the daemon's uid owns it.

use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, openat, renameat};
use nix::sys::stat::{Mode, fstatat};
use nix::unistd::{UnlinkatFlags, unlinkat};

/// An opened session directory the daemon owns (see the module docs).
#[derive(Debug)]
pub struct SessionDir {
    path: PathBuf,
    fd: OwnedFd,
    /// The daemon's effective uid: the owner of the directory and of every trusted file.
    uid: u32,
}

fn refused(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, why)
}

impl SessionDir {
    /// Creates `path` (mode 0700, with its missing parents) if it does not exist, opens it and
    /// refuses it unless the daemon's effective uid owns it and neither group nor others may
    /// write into it.
    pub fn open(path: &Path) -> io::Result<SessionDir> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)?;
        let fd = nix::fcntl::open(
            path,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        let meta = File::from(fd.try_clone()?).metadata()?;
        let uid = nix::unistd::geteuid().as_raw();
        if meta.uid() != uid {
            return Err(refused(format!(
                "owned by uid {}, not by the daemon's uid {uid}: its files could be planted or \
                 replaced by another user; use a directory the daemon owns",
                meta.uid()
            )));
        }
        let mode = meta.mode() & 0o7777;
        if mode & 0o022 != 0 {
            return Err(refused(format!(
                "mode {mode:04o} lets its group or others write into it: its files could be \
                 planted or replaced by another user; remove their write permission \
                 (chmod go-w)"
            )));
        }
        Ok(SessionDir {
            path: path.to_path_buf(),
            fd,
            uid,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The daemon's effective uid, which owns the directory.
    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// Opens the entry `name` for reading and returns it with its owner's uid: never follows a
    /// symlink (refused as one), never blocks (a FIFO or anything but a regular file is
    /// refused saying what it is).
    pub fn open_file(&self, name: &str) -> io::Result<(File, u32)> {
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
        let fd = openat(&self.fd, name, flags, Mode::empty()).map_err(|e| match e {
            Errno::ELOOP => {
                io::Error::new(io::ErrorKind::InvalidInput, "a symbolic link, not followed")
            }
            other => other.into(),
        })?;
        let file = crate::input_file::regular(File::from(fd))?;
        let owner = file.metadata()?.uid();
        Ok((file, owner))
    }

    /// Creates the entry `name` for writing, mode 0600, where nothing stands (`O_EXCL`, and
    /// `O_NOFOLLOW` so even a dangling symlink is not written through). An entry already
    /// there — a temp file a failed write could not remove, or something planted — is removed
    /// (the entry itself, never what a symlink points to) and the creation tried once more.
    pub fn create_new(&self, name: &str) -> io::Result<File> {
        let flags =
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let mode = Mode::from_bits_truncate(0o600);
        let fd = match openat(&self.fd, name, flags, mode) {
            Err(Errno::EEXIST) => {
                self.remove(name)?;
                openat(&self.fd, name, flags, mode)?
            }
            other => other?,
        };
        Ok(File::from(fd))
    }

    /// Renames entry `from` to `to`, replacing what `to` names (a symlink is replaced, not
    /// followed).
    pub fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        Ok(renameat(&self.fd, from, &self.fd, to)?)
    }

    /// Removes the entry `name` (a symlink itself, never its target).
    pub fn remove(&self, name: &str) -> io::Result<()> {
        Ok(unlinkat(&self.fd, name, UnlinkatFlags::NoRemoveDir)?)
    }

    /// Whether an entry `name` exists (a symlink counts, dangling or not).
    pub fn contains(&self, name: &str) -> bool {
        fstatat(&self.fd, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW).is_ok()
    }

    /// The names of the directory's entries that are UTF-8.
    pub fn names(&self) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&self.path)? {
            if let Ok(name) = entry?.file_name().into_string() {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }

    /// Bytes an unprivileged writer may still write on the directory's filesystem
    /// (`statvfs`: available blocks times the fragment size).
    pub fn available_bytes(&self) -> io::Result<u64> {
        let stats = nix::sys::statvfs::fstatvfs(&self.fd)?;
        Ok((stats.blocks_available() as u64).saturating_mul(stats.fragment_size() as u64))
    }

    /// Flushes the directory itself, so that renames and removals in it survive a crash.
    pub fn sync(&self) -> io::Result<()> {
        File::from(self.fd.try_clone()?).sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn refuses_a_directory_others_may_write() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("sessions");
        let opened = SessionDir::open(&dir).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "created private");
        drop(opened);
        for loose in [0o770, 0o707, 0o777] {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(loose)).unwrap();
            let e = SessionDir::open(&dir).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{loose:o}");
            assert!(e.to_string().contains("chmod go-w"), "{e}");
        }
        // Group-readable but not writable (the packaged StateDirectory's 0755) is fine.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        SessionDir::open(&dir).unwrap();
        // Another uid's directory: as root, one handed to another uid; otherwise `/` (root's).
        let foreign = if nix::unistd::geteuid().is_root() {
            std::os::unix::fs::chown(&dir, Some(12345), None).unwrap();
            dir
        } else {
            PathBuf::from("/")
        };
        let e = SessionDir::open(&foreign).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(e.to_string().contains("not by the daemon's uid"), "{e}");
    }

    #[test]
    fn never_follows_symlinks_nor_blocks_on_a_fifo() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = SessionDir::open(&tmp.path().join("sessions")).unwrap();
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join("link")).unwrap();
        let e = dir.open_file("link").unwrap_err();
        assert_eq!(e.to_string(), "a symbolic link, not followed");
        // Creating over the planted link replaces the link, never writes the victim.
        io::Write::write_all(&mut dir.create_new("link").unwrap(), b"new").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert!(
            !std::fs::symlink_metadata(dir.path().join("link"))
                .unwrap()
                .is_symlink()
        );
        // Removing a link removes the link only.
        std::os::unix::fs::symlink(&victim, dir.path().join("link2")).unwrap();
        assert!(dir.contains("link2"));
        dir.remove("link2").unwrap();
        assert!(!dir.contains("link2") && victim.exists());
        nix::unistd::mkfifo(&dir.path().join("fifo"), Mode::S_IRWXU).unwrap();
        let e = dir.open_file("fifo").unwrap_err();
        assert_eq!(e.to_string(), "a FIFO, not a regular file");
        let (_, owner) = dir.open_file("link").unwrap();
        assert_eq!(owner, dir.uid());
    }
}
