//! A weight read failing under a running daemon (issue 4 "failures are loud", engine-lessons
//! §8.2), end to end: `k3d serve` on `small` at a budget that streams trunk layers every token.
//! A shard truncated under it fails the next request with a status naming the file and the
//! offset, the daemon stays up, and once the bytes are back the same request succeeds with the
//! same ids. A shard *replaced* (a new file renamed over the path) changes nothing: the daemon
//! reads the file it opened and validated at load, never a path re-resolved mid-run.

#[path = "e2e_support.rs"]
mod support;

use k3proto::v1::engine_client::EngineClient;
use std::io::Read;
use std::path::{Path, PathBuf};
use support::*;
use tonic::transport::Channel;

/// `small` at 0.09 GiB with one request at a time (one planned state) pins only layer 0's
/// trunk; layer 7's trunk (all in this shard) streams through the ring on every token.
const STREAMED_SHARD: &str = "model-00008-of-000009.safetensors";

/// A `small` checkpoint in a scratch directory removed when the test ends (each `small` is
/// 0.33 GB). Declared before the daemon, the directory is dropped after the daemon has stopped.
fn small_model(name: &str) -> (PathBuf, tempfile::TempDir) {
    let root = scratch(name);
    let dir = synth_model("small", &root.path().join("small"));
    (dir, root)
}

/// The shard's safetensors header length (8-byte prefix + JSON): everything after it is tensor
/// data the engine reads on demand.
fn header_len(path: &Path) -> u64 {
    let mut prefix = [0u8; 8];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut prefix))
        .expect("read shard header length");
    8 + u64::from_le_bytes(prefix)
}

/// A daemon streaming `model`'s experts from disk, and a client once it is ready.
async fn streaming_daemon(model: &Path, name: &str) -> (Daemon, EngineClient<Channel>) {
    let socket = model
        .parent()
        .expect("scratch")
        .join(format!("{name}.sock"));
    let d = Daemon::start(model, &socket, &["--ram-gb", "0.09", "--max-active", "1"]);
    let mut c = client(&d.socket).await;
    wait_ready(&mut c).await;
    (d, c)
}

#[tokio::test]
async fn a_truncated_shard_fails_the_request_loudly_and_the_daemon_recovers() {
    let (model, _scratch) = small_model("read-fail-truncate");
    let (d, mut c) = streaming_daemon(&model, "truncate").await;
    let good = generate(&mut c, ids_request(prompt(0), 4)).await;
    assert!(good.error.is_none(), "before the truncation: {good:?}");
    assert_eq!(good.ids.len(), 4);

    let shard = model.join(STREAMED_SHARD);
    let original = std::fs::read(&shard).expect("read shard");
    // In place (same inode, so the daemon's open descriptor sees it): keep only the header.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&shard)
        .and_then(|f| f.set_len(header_len(&shard)))
        .expect("truncate shard");
    let failed = generate(&mut c, ids_request(prompt(0), 4)).await;
    let status = failed
        .error
        .unwrap_or_else(|| panic!("a request after the truncation fails: {:?}", failed.ids));
    let message = status.message();
    assert!(
        message.contains(&shard.display().to_string()),
        "the status names the file: {status:?}"
    );
    assert!(
        message.contains("offset"),
        "the status names the offset: {status:?}"
    );
    assert!(
        failed.done.is_none(),
        "no Done event presents the partial output as valid: {:?}",
        failed.events
    );

    // Restored in place: the daemon, still up, serves the same request again.
    std::fs::write(&shard, &original).expect("restore shard");
    let again = generate(&mut c, ids_request(prompt(0), 4)).await;
    assert!(again.error.is_none(), "after restoring: {again:?}");
    assert_eq!(again.ids, good.ids, "same ids as before the failure");
    assert!(
        d.log_text().contains(&shard.display().to_string()),
        "the daemon logged the failing file:\n{}",
        d.log_text()
    );
}

#[tokio::test]
async fn a_shard_replaced_by_rename_is_not_read_the_opened_file_is() {
    let (model, _scratch) = small_model("read-fail-replace");
    let (_d, mut c) = streaming_daemon(&model, "replace").await;
    let good = generate(&mut c, ids_request(prompt(1), 4)).await;
    assert!(good.error.is_none(), "before the replacement: {good:?}");

    // A different file of the same size (all zero tensor data) renamed over the shard.
    let shard = model.join(STREAMED_SHARD);
    let mut bytes = std::fs::read(&shard).expect("read shard");
    let data = usize::try_from(header_len(&shard)).expect("header length");
    bytes[data..].fill(0);
    let other = model.join("replacement.tmp");
    std::fs::write(&other, &bytes).expect("write replacement");
    std::fs::rename(&other, &shard).expect("rename over the shard");
    let after = generate(&mut c, ids_request(prompt(1), 4)).await;
    assert!(after.error.is_none(), "after the replacement: {after:?}");
    assert_eq!(
        after.ids, good.ids,
        "the daemon keeps reading the file it validated at load"
    );
}
