//! The engine library must not depend on the RPC stack: the data flow is
//! checkpoint → store → model → engine → server → client, and the server lives in the binary.
//! This test reads the library's sources and fails on any import of tokio, tonic, prost or
//! k3proto outside `src/bin`.

use std::path::{Path, PathBuf};

const FORBIDDEN: [&str; 4] = ["tokio", "tonic", "prost", "k3proto"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n == "bin") {
                continue;
            }
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn engine_library_imports_no_rpc_crates() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(
        files.len() > 5,
        "found too few library sources under {}",
        src.display()
    );
    let mut offences = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read source");
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for krate in FORBIDDEN {
                let uses =
                    code.contains(&format!("{krate}::")) || code.contains(&format!("use {krate}"));
                if uses {
                    offences.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        offences.is_empty(),
        "engine library imports RPC crates:\n{}",
        offences.join("\n")
    );
}
