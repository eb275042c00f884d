//! libFuzzer driver for every k3 fuzz target. The target is chosen by `K3_FUZZ_TARGET` (one of
//! `k3_fuzz::TARGETS`); the bodies live in the `k3-fuzz` crate, where `cargo test` runs them
//! over the committed corpora.
#![no_main]

use std::sync::OnceLock;

fn target() -> k3_fuzz::Target {
    static TARGET: OnceLock<k3_fuzz::Target> = OnceLock::new();
    *TARGET.get_or_init(|| {
        let name = std::env::var("K3_FUZZ_TARGET").unwrap_or_default();
        match k3_fuzz::target(&name) {
            Some(body) => body,
            None => {
                let names: Vec<&str> = k3_fuzz::TARGETS.iter().map(|(n, _)| *n).collect();
                eprintln!("K3_FUZZ_TARGET={name:?}: set it to one of {}", names.join(", "));
                std::process::exit(2);
            }
        }
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| target()(data));
