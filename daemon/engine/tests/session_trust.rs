//! The session directory is not trusted blindly (issue #19 item 7): a directory another user
//! may write into is refused, planted symlinks are never followed, a file's `owner` field is
//! believed only when the daemon's uid owns the file, temp files a crash left are removed at
//! start, a FIFO never blocks, and `delete` removes the files the daemon refuses to load.
//!
//! Needs root (as the whole suite does, see README): files owned by another uid are made with
//! `chown`.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use k3_engine::session::{
    FileError, FileHeader, SessionDir, SessionStore, SessionStoreError, file,
};

const FP: &str = "fingerprint-a";
/// The uid of a user who plants files (any uid but the daemon's).
const ATTACKER: u32 = 12345;
const VICTIM: u32 = 1000;

fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "session_trust needs root to make files another uid owns (run the suite as root)"
    );
}

fn header(name: &str, fingerprint: &str, owner: Option<u32>) -> FileHeader {
    FileHeader {
        fingerprint: fingerprint.into(),
        name: name.into(),
        owner,
        tokens: 0,
        state_bytes: 0,
    }
}

/// Writes a session file with no snapshots (the format is the same) through the real writer.
/// A session file of the model `fingerprint`, bound as the store binds its own (the model and
/// the numerics contract, `kept::state_key`).
fn write_session(dir: &Path, name: &str, fingerprint: &str, owner: Option<u32>) {
    let d = SessionDir::open(dir).expect("session dir");
    let bound = k3_engine::session::kept::state_key(fingerprint);
    file::save(&d, &header(name, &bound, owner), &[]).expect("save");
}

fn open(dir: &Path) -> (SessionStore, Vec<FileError>) {
    SessionStore::open(dir, FP, u64::MAX).expect("open store")
}

#[test]
fn a_directory_others_may_write_or_another_uid_owns_is_refused() {
    require_root();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("sessions");
    open(&dir);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = SessionStore::open(&dir, FP, 0).err().expect("refused");
    assert!(matches!(e, SessionStoreError::Dir { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains(&dir.display().to_string()) && text.contains("0777"),
        "{text}"
    );
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::chown(&dir, Some(ATTACKER), None).unwrap();
    let text = SessionStore::open(&dir, FP, 0)
        .err()
        .expect("refused")
        .to_string();
    assert!(text.contains(&format!("owned by uid {ATTACKER}")), "{text}");
}

#[test]
fn planted_temp_symlinks_are_never_written_through() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("sessions");
    let victim = tmp.path().join("root-owned-file");
    std::fs::write(&victim, b"precious").unwrap();
    open(&dir);
    // Planted before the daemon starts: removed at start (the link, not its target).
    std::os::unix::fs::symlink(&victim, dir.join(".a.k3s.tmp")).unwrap();
    let (mut store, skipped) = open(&dir);
    assert!(skipped.is_empty(), "{skipped:?}");
    assert!(std::fs::symlink_metadata(dir.join(".a.k3s.tmp")).is_err());
    // Planted while it runs: the save replaces the link and never writes the target.
    std::os::unix::fs::symlink(&victim, dir.join(".1000@a.k3s.tmp")).unwrap();
    let a = store.reserve("a", Some(VICTIM), 1).unwrap();
    assert!(store.finish(&a, Vec::new()).is_empty());
    store.save("a", Some(VICTIM)).unwrap();
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    let saved = file::path_of(&dir, Some(VICTIM), "a");
    let bound = k3_engine::session::kept::state_key(FP);
    let (_, snaps) = file::load(&saved, &bound).expect("the saved file loads");
    assert!(snaps.is_empty());
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, ["1000@a.k3s"], "no temp file or link left");
}

#[test]
fn crash_leftover_temp_files_are_removed_at_start() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("sessions");
    write_session(&dir, "kept", FP, Some(VICTIM));
    std::fs::write(dir.join(".kept.k3s.tmp"), b"half a save").unwrap();
    std::fs::write(dir.join(".other.k3s.tmp"), b"half a save").unwrap();
    // Not a temp name: left alone.
    std::fs::write(dir.join("notes.txt"), b"mine").unwrap();
    let (store, skipped) = open(&dir);
    assert!(skipped.is_empty(), "{skipped:?}");
    assert_eq!(store.len(), 1);
    assert!(!dir.join(".kept.k3s.tmp").exists() && !dir.join(".other.k3s.tmp").exists());
    assert!(dir.join("notes.txt").exists() && dir.join("1000@kept.k3s").exists());
}

#[test]
fn a_symlinked_session_file_is_not_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("sessions");
    let elsewhere = tmp.path().join("elsewhere");
    write_session(&elsewhere, "s", FP, Some(VICTIM));
    open(&dir);
    let (there, here) = (
        file::path_of(&elsewhere, Some(VICTIM), "s"),
        file::path_of(&dir, Some(VICTIM), "s"),
    );
    std::os::unix::fs::symlink(&there, &here).unwrap();
    let (mut store, skipped) = open(&dir);
    assert_eq!(skipped.len(), 1);
    assert!(
        skipped[0]
            .to_string()
            .contains("a symbolic link, not followed"),
        "{}",
        skipped[0]
    );
    assert!(matches!(
        store.reserve("s", Some(VICTIM), 1),
        Err(SessionStoreError::File(FileError::Io { .. }))
    ));
    // Its owner cannot be known without following it: root only may remove it, and removing
    // it removes the link.
    assert!(matches!(
        store.delete("s", Some(VICTIM)),
        Err(SessionStoreError::PermissionDenied { owner: None, .. })
    ));
    store.delete("1000/s", Some(0)).unwrap();
    assert!(std::fs::symlink_metadata(&here).is_err());
    assert!(there.exists());
}

#[test]
fn an_owner_field_is_believed_only_in_the_daemons_own_files() {
    require_root();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("sessions");
    // A file the attacker forged for the victim's uid (placed while the directory was open to
    // them, say), owned by the attacker.
    write_session(&dir, "forged", FP, Some(VICTIM));
    let forged = file::path_of(&dir, Some(VICTIM), "forged");
    std::os::unix::fs::chown(&forged, Some(ATTACKER), None).unwrap();
    let (mut store, skipped) = open(&dir);
    assert_eq!(store.len(), 0);
    assert!(
        matches!(
            &skipped[..],
            [FileError::Untrusted {
                file_uid: ATTACKER,
                daemon_uid: 0,
                ..
            }]
        ),
        "{skipped:?}"
    );
    match store.reserve("forged", Some(VICTIM), 1) {
        Err(SessionStoreError::File(FileError::Untrusted { .. })) => {}
        other => panic!("the forged file was used: {other:?}"),
    }
    assert!(store.list(Some(VICTIM)).is_empty());
    // Neither the named victim nor the attacker (naming the victim's session) may remove it;
    // root may.
    assert!(matches!(
        store.delete("forged", Some(VICTIM)),
        Err(SessionStoreError::PermissionDenied { owner: None, .. })
    ));
    assert!(matches!(
        store.delete("1000/forged", Some(ATTACKER)),
        Err(SessionStoreError::PermissionDenied {
            owner: Some(VICTIM),
            ..
        })
    ));
    store.delete("1000/forged", Some(0)).unwrap();
    assert!(!forged.exists());
}

#[test]
fn files_the_daemon_will_not_load_can_be_removed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("sessions");
    // Another model's session (every session after a model upgrade): its owner may remove it.
    write_session(&dir, "old-model", "fingerprint-b", Some(VICTIM));
    // A damaged one: no readable owner, so root only.
    let damaged = file::path_of(&dir, Some(VICTIM), "damaged");
    std::fs::write(&damaged, b"not a session file").unwrap();
    let (mut store, skipped) = open(&dir);
    assert_eq!((store.len(), skipped.len()), (0, 2));
    assert!(matches!(
        store.reserve("old-model", Some(VICTIM), 1),
        Err(SessionStoreError::File(FileError::Fingerprint { .. }))
    ));
    assert!(matches!(
        store.delete("1000/old-model", Some(ATTACKER)),
        Err(SessionStoreError::PermissionDenied {
            owner: Some(VICTIM),
            ..
        })
    ));
    store.delete("old-model", Some(VICTIM)).unwrap();
    assert!(!file::path_of(&dir, Some(VICTIM), "old-model").exists());
    let e = store.delete("damaged", Some(VICTIM)).unwrap_err();
    assert!(e.to_string().contains("only root may act on it"), "{e}");
    store.delete("1000/damaged", Some(0)).unwrap();
    assert!(!damaged.exists());
    assert!(matches!(
        store.delete("1000/damaged", Some(0)),
        Err(SessionStoreError::NotFound(_))
    ));
}

#[test]
fn a_fifo_session_file_never_blocks() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("sessions");
    open(&dir);
    let fifo = file::path_of(&dir, Some(VICTIM), "pipe");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let started = Instant::now();
    let (mut store, skipped) = open(&dir);
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(skipped.len(), 1);
    assert!(
        skipped[0]
            .to_string()
            .contains("a FIFO, not a regular file"),
        "{}",
        skipped[0]
    );
    assert!(store.reserve("pipe", Some(VICTIM), 1).is_err());
    store.delete("1000/pipe", Some(0)).unwrap();
    assert!(std::fs::symlink_metadata(&fifo).is_err());
}
