//! Error chains say each cause once (issue #19): a cause an error's message already includes
//! is not also its `source`, so the `{:#}` chain `k3d` prints (every message, then every
//! source's) never repeats it. Built from the wrappers that used to repeat their cause.

use std::error::Error;
use std::path::PathBuf;

use k3_engine::engine::EngineError;
use k3_engine::model::ModelError;
use k3_engine::plan::PlanError;
use k3_engine::session::{FileError, SessionStoreError};
use k3_engine::store::StoreError as WeightStoreError;
use k3_engine::store::direct_buffer::AllocError;
use k3_engine::store::direct_io::ReadError;
use k3_engine::store::reader::PoolError;
use k3_engine::tokenizer::TokenizerError;

/// The message and every source's message, joined as anyhow's `{:#}` joins them.
fn chain(e: &dyn Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        next = cause.source();
    }
    out
}

fn io() -> std::io::Error {
    std::io::Error::from_raw_os_error(libc::ENOENT)
}

const ENOENT: &str = "No such file or directory";

#[test]
fn every_cause_is_said_once() {
    let path = PathBuf::from("/models/k3/tiktoken.model");
    let cases: Vec<(Box<dyn Error>, &str)> = vec![
        (
            Box::new(EngineError::from(TokenizerError::Io {
                path: path.clone(),
                error: io(),
            })),
            ENOENT,
        ),
        (
            Box::new(EngineError::Io {
                path: path.clone(),
                error: io(),
            }),
            ENOENT,
        ),
        (
            Box::new(SessionStoreError::from(FileError::Io {
                path: path.clone(),
                error: io(),
            })),
            ENOENT,
        ),
        (
            Box::new(SessionStoreError::Dir {
                path: path.clone(),
                error: io(),
            }),
            ENOENT,
        ),
        (
            Box::new(EngineError::from(ModelError::from(PlanError::BadCensus(
                "no layers".into(),
            )))),
            "no layers",
        ),
        (
            Box::new(ModelError::Member {
                index: 1,
                error: Box::new(ModelError::TokenOutOfVocab {
                    id: 9,
                    index: 0,
                    vocab: 4,
                }),
            }),
            "outside the vocabulary",
        ),
        (
            Box::new(WeightStoreError::from(PoolError::Spawn {
                index: 0,
                error: io(),
            })),
            ENOENT,
        ),
        (
            Box::new(WeightStoreError::from(AllocError::OutOfMemory {
                bytes: 4096,
                reason: "mmap refused".into(),
            })),
            "mmap refused",
        ),
        (
            Box::new(WeightStoreError::from(ReadError::Open {
                path: path.clone(),
                errno: libc::ENOENT,
                error: io(),
            })),
            ENOENT,
        ),
    ];
    for (e, cause) in &cases {
        let text = chain(e.as_ref());
        assert_eq!(text.matches(cause).count(), 1, "{text}");
    }
}
