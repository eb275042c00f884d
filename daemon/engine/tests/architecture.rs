//! The engine library must not depend on the RPC stack, and inside it no module reaches above
//! its floor (kernels and checkpoint at the bottom, then plan, store, model, engine and the
//! serve core; the tokenizer beside them below the model). The data flow is
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

/// The library's data flow, bottom up: a module may use those before it, never one after it.
/// The kernels know nothing of where their operands come from; reading and checking a
/// checkpoint knows nothing of what is made of it; the memory plan is computed from the
/// checkpoint alone, before anything is read; where weight bytes live knows nothing of the
/// forward pass over them; the forward pass knows nothing of generations, sampling or serving;
/// generation knows nothing of the serve core built on it.
const FLOW: [&str; 7] = [
    "kernels",
    "checkpoint",
    "plan",
    "store",
    "model",
    "engine",
    "serve",
];

/// Modules beside the flow, with the first module of it they may not reach: text in and out
/// knows nothing of the model it is for; sessions keep model states but know nothing of the
/// generations or the serve core that use them.
const BESIDE: [(&str, &str); 2] = [("tokenizer", "store"), ("session", "engine")];

/// Each module's floor: (the files under `src/<module>`, the `crate::` paths they must not use).
fn floors() -> Vec<(&'static str, Vec<String>)> {
    let above = |first: usize| {
        FLOW[first..]
            .iter()
            .map(|m| format!("crate::{m}"))
            .collect()
    };
    let mut out: Vec<_> = (0..FLOW.len() - 1)
        .map(|i| (FLOW[i], above(i + 1)))
        .collect();
    for (module, first) in BESIDE {
        let at = FLOW.iter().position(|m| *m == first).expect("in the flow");
        out.push((module, above(at)));
    }
    out
}

/// Lines of `text` (a source file) that use one of `forbidden` (`crate::x` paths, in `use`
/// statements or inline), comments excluded.
fn floor_breaches(text: &str, forbidden: &[&str]) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let compact: String = code.split_whitespace().collect::<Vec<_>>().join(" ");
        // `use crate::{model::X, ..}` names the module inside braces.
        let braced = |path: &str| {
            let module = path.trim_start_matches("crate::");
            compact.contains("crate::{")
                && compact
                    .split("crate::{")
                    .nth(1)
                    .is_some_and(|rest| rest.split([',', '{', ' ']).any(|p| p.starts_with(module)))
        };
        if forbidden.iter().any(|path| {
            compact.contains(&format!("{path}::"))
                || compact.contains(&format!("{path};"))
                || braced(path)
        }) {
            out.push((n + 1, line.trim().to_string()));
        }
    }
    out
}

#[test]
fn the_library_floors_hold() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut offences = Vec::new();
    for (module, forbidden) in floors() {
        let forbidden: Vec<&str> = forbidden.iter().map(String::as_str).collect();
        let mut files = Vec::new();
        rust_files(&src.join(module), &mut files);
        assert!(!files.is_empty(), "no sources under src/{module}");
        for file in &files {
            let text = std::fs::read_to_string(file).expect("read source");
            for (n, line) in floor_breaches(&text, &forbidden) {
                offences.push(format!("{}:{n}: {line}", file.display()));
            }
        }
    }
    // Nothing in the library but the serve core itself uses the serve core: it is for
    // transports (the k3d crate), which sit above the library.
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let serve = src.join("serve");
    for file in files.iter().filter(|f| !f.starts_with(&serve)) {
        let text = std::fs::read_to_string(file).expect("read source");
        for (n, line) in floor_breaches(&text, &["crate::serve"]) {
            offences.push(format!("{}:{n}: {line}", file.display()));
        }
    }
    assert!(
        offences.is_empty(),
        "modules reach above their floor:\n{}",
        offences.join("\n")
    );
}

/// The check itself fails on a broken floor, in each form an import can take.
#[test]
fn a_broken_floor_is_found() {
    let forbidden = &["crate::model"];
    for breach in [
        "use crate::model::State;",
        "use crate::model;",
        "use crate::{checkpoint::Checkpoint, model::Model};",
        "    let s = crate::model::State::new();",
    ] {
        let text = format!("//! a store file\n{breach}\nfn f() {{}}\n");
        assert_eq!(
            floor_breaches(&text, forbidden),
            vec![(2, breach.trim().to_string())],
            "{breach}"
        );
    }
    for fine in [
        "use crate::checkpoint::Checkpoint;",
        "// use crate::model::State; (a comment)",
        "use crate::modelling::X;",
    ] {
        assert!(floor_breaches(fine, forbidden).is_empty(), "{fine}");
    }
}
