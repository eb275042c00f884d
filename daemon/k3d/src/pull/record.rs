//! `DIR/.k3d-pull.json`: which repository and commit `DIR` holds (resolved once, so a re-run
//! never mixes two revisions) and which files were checked, with the size and mtime they had
//! then (a re-run skips them unchanged, and re-hashes one that changed). Written atomically
//! (a temporary file renamed over it) after every checked file.

use super::error::PullError;
use k3_engine::checkpoint::verify::Stamp;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub const NAME: &str = ".k3d-pull.json";

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Checked {
    pub stamp: Stamp,
    pub sha256: String,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Record {
    pub repo: String,
    /// The revision the user named when the commit was resolved.
    pub revision: String,
    pub commit: String,
    pub endpoint: String,
    pub files: BTreeMap<String, Checked>,
}

pub fn path(dir: &Path) -> PathBuf {
    dir.join(NAME)
}

impl Record {
    /// The record in `dir`, if there is one; one that cannot be read is an error naming it.
    pub fn load(dir: &Path) -> Result<Option<Record>, PullError> {
        let path = path(dir);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(PullError::Io { path, error }),
        };
        serde_json::from_str(&text).map(Some).map_err(|e| {
            PullError::Usage(format!(
                "{}: not a pull record ({e}); delete it to start the pull over",
                path.display()
            ))
        })
    }

    /// Whether `name` was checked and is unchanged since (same size and mtime).
    pub fn unchanged(&self, dir: &Path, name: &str) -> bool {
        self.files
            .get(name)
            .is_some_and(|c| Stamp::of(&dir.join(name)).ok() == Some(c.stamp))
    }

    pub fn save(&self, dir: &Path) -> Result<(), PullError> {
        let path = path(dir);
        let tmp = dir.join(format!("{NAME}.tmp"));
        let text = serde_json::to_string_pretty(self).expect("a record serializes");
        std::fs::write(&tmp, text).map_err(|e| PullError::write(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| PullError::write(&path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_change_detection() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.json"), b"{}").unwrap();
        let mut r = Record {
            repo: "o/n".into(),
            revision: "main".into(),
            commit: "c".repeat(40),
            endpoint: "http://h".into(),
            files: BTreeMap::new(),
        };
        r.files.insert(
            "a.json".into(),
            Checked {
                stamp: Stamp::of(&dir.path().join("a.json")).unwrap(),
                sha256: "0".repeat(64),
            },
        );
        r.save(dir.path()).unwrap();
        let back = Record::load(dir.path()).unwrap().unwrap();
        assert_eq!(back, r);
        assert!(back.unchanged(dir.path(), "a.json"));
        std::fs::write(dir.path().join("a.json"), b"{ }").unwrap();
        assert!(!back.unchanged(dir.path(), "a.json"));
        assert!(!back.unchanged(dir.path(), "b.json"));
        std::fs::write(path(dir.path()), b"nonsense").unwrap();
        assert!(Record::load(dir.path()).is_err());
    }
}
