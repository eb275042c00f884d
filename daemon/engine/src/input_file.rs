//! Opening the files the engine reads as input (shards, `config.json`, tokenizer files, the
//! shard index, session files) so that a FIFO, socket or device in their place is refused
//! instead of blocking forever on `open` or `read` (issue #19 item 7).
//!
//! The file is opened with `O_NONBLOCK` (a FIFO's open would otherwise wait for a writer),
//! checked with `fstat` on the descriptor itself (no race with a rename), then switched back
//! to blocking reads for a regular file.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use nix::fcntl::{FcntlArg, OFlag, fcntl};

/// What stands at a path instead of a regular file, for the refusal message.
fn kind(file_type: std::fs::FileType) -> &'static str {
    if file_type.is_dir() {
        "a directory"
    } else if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_socket() {
        "a socket"
    } else if file_type.is_char_device() {
        "a character device"
    } else if file_type.is_block_device() {
        "a block device"
    } else {
        "not a regular file"
    }
}

/// Opens `path` for reading if it is a regular file (following symlinks, as `open` does);
/// anything else is an `InvalidInput` error saying what it is. Never blocks on the open.
pub fn open(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    regular(file)
}

/// `file`, opened with `O_NONBLOCK`, if it is a regular file (checked on the descriptor), now
/// with blocking reads; anything else is an `InvalidInput` error saying what it is.
pub(crate) fn regular(file: File) -> io::Result<File> {
    let file_type = file.metadata()?.file_type();
    if !file_type.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}, not a regular file", kind(file_type)),
        ));
    }
    let flags = OFlag::from_bits_truncate(fcntl(&file, FcntlArg::F_GETFL)?);
    fcntl(&file, FcntlArg::F_SETFL(flags - OFlag::O_NONBLOCK))?;
    Ok(file)
}

/// The whole contents of the regular file at `path` (see [`open`]).
pub fn read(path: &Path) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    io::Read::read_to_end(&mut open(path)?, &mut bytes)?;
    Ok(bytes)
}

/// The whole contents of the regular file at `path` as UTF-8 text (see [`open`]).
pub fn read_to_string(path: &Path) -> io::Result<String> {
    let mut text = String::new();
    io::Read::read_to_string(&mut open(path)?, &mut text)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path();
        let fifo = dir.join("shard.safetensors");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let err = open(&fifo).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(err.to_string(), "a FIFO, not a regular file");
        let err = read(dir).unwrap_err();
        assert_eq!(err.to_string(), "a directory, not a regular file");
        let regular = dir.join("config.json");
        std::fs::write(&regular, b"{}").unwrap();
        assert_eq!(read_to_string(&regular).unwrap(), "{}");
    }
}
