//! The workspace's architecture, read from its sources. The engine library must not depend on
//! the RPC stack, and inside it no module reaches above its floor (kernels and checkpoint at
//! the bottom, then plan, store, model, engine and the serve core; the tokenizer beside them
//! below the model). The data flow is checkpoint → store → model → engine → serve core →
//! transports (the `k3d` binary crate: `grpc`, `http`) → client. In `k3d`, no two top-level
//! modules import each other, directly or round a longer cycle, and `net` (sockets, the
//! connection gate) imports neither API.

use std::collections::{BTreeMap, BTreeSet};
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
/// checkpoint knows nothing of what is made of it; the trunk pack (a compressed copy of the
/// checkpoint's trunk) knows the checkpoint and nothing of who reads it; the memory plan is computed from the
/// checkpoint alone, before anything is read; where weight bytes live knows nothing of the
/// forward pass over them; the forward pass knows nothing of generations, sampling or serving;
/// generation knows nothing of the serve core built on it.
const FLOW: [&str; 8] = [
    "kernels",
    "checkpoint",
    "pack",
    "plan",
    "store",
    "model",
    "engine",
    "serve",
];

/// Modules beside the flow, with the first module of it they may not reach: text in and out
/// knows nothing of the model it is for; sessions keep model states but know nothing of the
/// generations or the serve core that use them; constrained decoding builds the engine's
/// guides from a chat request and knows nothing of the serve core that asks for them.
const BESIDE: [(&str, &str); 3] = [
    ("tokenizer", "store"),
    ("session", "engine"),
    ("constrain", "serve"),
];

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

/// The `k3d` crate's sources.
fn k3d_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../k3d/src")
}

/// The top-level modules `crate::` paths in `text` name, comments excluded, each with the
/// first line naming it: `crate::x::..`, `crate::x;` and each item of `crate::{x::.., y}`.
fn crate_imports(text: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            // `$crate::` (a macro's) and `k3_crate::` are not this crate's paths.
            let before = rest[..at].chars().next_back();
            let after = &rest[at + "crate::".len()..];
            rest = after;
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
                continue;
            }
            let names = match after.strip_prefix('{') {
                Some(group) => top_items(group),
                None => vec![ident(after)],
            };
            for name in names.into_iter().filter(|m| !m.is_empty()) {
                out.entry(name).or_insert(n + 1);
            }
        }
    }
    out
}

/// The leading identifier of `s`.
fn ident(s: &str) -> String {
    s.trim_start()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// The first identifier of each comma-separated item of a `{..}` group (after its `{`),
/// nested groups skipped.
fn top_items(group: &str) -> Vec<String> {
    let mut items = vec![ident(group)];
    let mut depth = 0;
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => items.push(ident(&group[i + 1..])),
            _ => {}
        }
    }
    items
}

/// A crate's module graph: each top-level module (a `src/<m>.rs` or `src/<m>/` other than
/// the crate roots) and the other top-level modules it imports, with the file and line of the
/// first import.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut modules = BTreeMap::new();
    for entry in std::fs::read_dir(src).expect("read src dir") {
        let path = entry.expect("dir entry").path();
        let name = path
            .file_stem()
            .expect("a name")
            .to_string_lossy()
            .to_string();
        let mut files = Vec::new();
        if path.is_dir() {
            rust_files(&path, &mut files);
        } else if path.extension().is_some_and(|e| e == "rs") && name != "lib" && name != "main" {
            files.push(path.clone());
        } else {
            continue;
        }
        modules.insert(name, files);
    }
    let mut graph = BTreeMap::new();
    for (module, files) in &modules {
        let mut edges = BTreeMap::new();
        for file in files {
            let text = std::fs::read_to_string(file).expect("read source");
            for (target, line) in crate_imports(&text) {
                if &target != module && modules.contains_key(&target) {
                    edges
                        .entry(target)
                        .or_insert_with(|| format!("{}:{line}", file.display()));
                }
            }
        }
        graph.insert(module.clone(), edges);
    }
    graph
}

/// A cycle of `graph` (each module with the `file:line` of its import of the next), if any.
fn find_cycle(graph: &BTreeMap<String, BTreeMap<String, String>>) -> Option<Vec<String>> {
    fn visit(
        graph: &BTreeMap<String, BTreeMap<String, String>>,
        at: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|m| m == at) {
            let ring = &path[start..];
            return Some(
                ring.iter()
                    .zip(ring.iter().cycle().skip(1))
                    .map(|(m, next)| format!("{m} → {next} ({})", graph[m][next]))
                    .collect(),
            );
        }
        if !done.insert(at.to_string()) {
            return None;
        }
        path.push(at.to_string());
        for next in graph.get(at).into_iter().flat_map(BTreeMap::keys) {
            if let Some(cycle) = visit(graph, next, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|m| visit(graph, m, &mut Vec::new(), &mut done))
}

#[test]
fn the_daemons_modules_form_no_cycle() {
    let graph = module_graph(&k3d_src());
    for module in ["daemon", "grpc", "http", "net", "cmd"] {
        assert!(
            graph.contains_key(module),
            "no module {module} in k3d: {graph:?}"
        );
    }
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "k3d's modules import each other in a cycle:\n{}",
            cycle.join("\n")
        );
    }
    // What both transports share below them knows neither API nor the daemon above it.
    let net = &graph["net"];
    let above: Vec<_> = ["grpc", "http", "daemon", "cmd"]
        .iter()
        .filter_map(|m| net.get(*m).map(|at| format!("net → {m} ({at})")))
        .collect();
    assert!(
        above.is_empty(),
        "net imports above it:\n{}",
        above.join("\n")
    );
}

/// The cycle check itself finds a cycle, in each form an import can take, and only then.
#[test]
fn a_module_cycle_is_found() {
    let dir = tempfile::tempdir().expect("temp dir");
    let src = dir.path();
    let write = |path: &str, text: &str| {
        let path = src.join(path);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    };
    write("lib.rs", "pub mod a;\npub mod b;\npub mod c;\n");
    write(
        "a/mod.rs",
        "//! uses crate::c in words only\nuse crate::b::Thing;\n",
    );
    write(
        "b.rs",
        "use crate::{c::{X, Y}, other};\nmacro_rules! m { () => { $crate::a }; }\n",
    );
    write("c/inner.rs", "fn f() {}\n");
    assert!(
        find_cycle(&module_graph(src)).is_none(),
        "no cycle while c imports nothing"
    );
    write("c/inner.rs", "fn f() { let _ = crate::a::g(); }\n");
    let graph = module_graph(src);
    assert_eq!(graph["a"].keys().collect::<Vec<_>>(), ["b"]);
    assert_eq!(graph["b"].keys().collect::<Vec<_>>(), ["c"]);
    assert_eq!(graph["c"].keys().collect::<Vec<_>>(), ["a"]);
    let cycle = find_cycle(&graph).expect("a → b → c → a");
    assert_eq!(cycle.len(), 3, "{cycle:?}");
    assert!(cycle[0].starts_with("a → b ("), "{cycle:?}");
    assert!(cycle[0].ends_with("a/mod.rs:2)"), "{cycle:?}");
    write("c/inner.rs", "fn f() {}\n");
    assert!(
        find_cycle(&module_graph(src)).is_none(),
        "the cycle is gone"
    );
}

/// The kernels' files as modules (`kernels`, `kernels::matmul`, `kernels::x86`,
/// `kernels::x86::gemm`, …), each with its source up to its tests (`#[cfg(test)]`: a test
/// module's `super` is its own file).
fn kernel_modules(kernels: &Path) -> BTreeMap<String, String> {
    let mut files = Vec::new();
    rust_files(kernels, &mut files);
    files
        .into_iter()
        .map(|file| {
            let rel = file.strip_prefix(kernels).expect("under kernels");
            let mut path: Vec<String> = vec!["kernels".into()];
            path.extend(
                rel.with_extension("")
                    .iter()
                    .map(|p| p.to_string_lossy().into_owned()),
            );
            if path.last().is_some_and(|p| p == "mod") {
                path.pop();
            }
            let text = std::fs::read_to_string(&file).expect("read source");
            let code = text.split("#[cfg(test)]").next().unwrap_or("").to_string();
            (path.join("::"), code)
        })
        .collect()
}

/// The file-level import graph of the kernels: `super::`, `super::super::`,
/// `crate::kernels::` (and a macro's `$crate::kernels::`) paths and a `mod.rs`'s paths into its
/// own children, each resolved to the deepest module it names (an item of a module is an
/// import of that module). A `mod x;` declaration is not an import.
fn kernel_graph(kernels: &Path) -> BTreeMap<String, BTreeMap<String, String>> {
    let modules = kernel_modules(kernels);
    let resolve = |base: &[String], rest: &str| -> Option<String> {
        let mut at = base.to_vec();
        for segment in rest.split("::") {
            let name = ident(segment);
            let mut deeper = at.clone();
            deeper.push(name);
            if modules.contains_key(&deeper.join("::")) {
                at = deeper;
            } else {
                break;
            }
        }
        Some(at.join("::"))
    };
    let mut graph = BTreeMap::new();
    for (module, code) in &modules {
        let me: Vec<String> = module.split("::").map(String::from).collect();
        let is_dir = modules
            .keys()
            .any(|m| m.starts_with(&format!("{module}::")));
        // `super` names the parent of the module (of a directory's `mod.rs`, the directory's).
        let parent = me[..me.len() - 1].to_vec();
        let grandparent = parent[..parent.len().saturating_sub(1)].to_vec();
        let mut edges = BTreeMap::new();
        for (n, line) in code.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            let mut targets = Vec::new();
            let mut bases = vec![
                ("super::super::", grandparent.clone()),
                ("crate::kernels::", vec!["kernels".to_string()]),
            ];
            if !code.contains("super::super::") {
                bases.push(("super::", parent.clone()));
            }
            for (prefix, base) in &bases {
                let mut rest = code;
                while let Some(at) = rest.find(prefix) {
                    rest = &rest[at + prefix.len()..];
                    let items = match rest.strip_prefix('{') {
                        Some(group) => top_paths(group),
                        None => vec![rest.to_string()],
                    };
                    targets.extend(items.iter().filter_map(|item| resolve(base, item)));
                }
            }
            // A directory module's `use child::…` (any visibility).
            let statement = code.trim_start();
            let statement = statement
                .strip_prefix("pub(crate) ")
                .or_else(|| statement.strip_prefix("pub "))
                .unwrap_or(statement);
            if let Some(path) = statement.strip_prefix("use ")
                && is_dir
                && !path.starts_with("super::")
                && !path.starts_with("crate::")
            {
                targets.extend(resolve(&me, path));
            }
            for target in targets.into_iter().filter(|t| t != module) {
                edges
                    .entry(target)
                    .or_insert_with(|| format!("{module}:{}", n + 1));
            }
        }
        graph.insert(module.clone(), edges);
    }
    graph
}

/// Each comma-separated item of a `{..}` group (after its `{`) as a path, nested groups cut.
fn top_paths(group: &str) -> Vec<String> {
    let mut items = vec![String::new()];
    let mut depth = 0;
    for c in group.chars() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => items.push(String::new()),
            _ if depth == 0 => items.last_mut().expect("an item").push(c),
            _ => {}
        }
    }
    items.into_iter().map(|i| i.trim().to_string()).collect()
}

/// The graph of `graph` seen at `depth` path segments: each module merged into its ancestor
/// of that depth (`kernels::x86::gemm` → `kernels::x86` at depth 2), keeping only edges
/// between different merged modules, and only the modules under `within`.
fn merged(
    graph: &BTreeMap<String, BTreeMap<String, String>>,
    depth: usize,
    within: &str,
) -> BTreeMap<String, BTreeMap<String, String>> {
    let cut = |m: &str| m.split("::").take(depth).collect::<Vec<_>>().join("::");
    let inside = |m: &str| m == within || m.starts_with(&format!("{within}::"));
    let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for (module, edges) in graph.iter().filter(|(m, _)| inside(m)) {
        let from = cut(module);
        let entry = out.entry(from.clone()).or_default();
        for (target, at) in edges.iter().filter(|(t, _)| inside(t)) {
            let to = cut(target);
            if to != from {
                entry.entry(to).or_insert_with(|| at.clone());
            }
        }
    }
    out
}

/// Issue 41.7: the kernels form layers, no import circle: the matrix types, trees and lane
/// constants sit below the instruction-set code that uses them, and that below the matmuls.
/// Checked twice: between the kernels' modules with `x86/` as one (a path like
/// `x86::avx2::Avx2` reaches into it), and between the files of `x86/`.
#[test]
fn the_kernels_files_form_no_cycle() {
    let kernels = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/kernels");
    let graph = kernel_graph(&kernels);
    for (from, to) in [
        ("kernels::matmul", "kernels::x86"),
        ("kernels::x86::avx2", "kernels::tree"),
        ("kernels::x86::gemm", "kernels::x86::packed"),
        ("kernels::reduce", "kernels::x86"),
        ("kernels::x86", "kernels::x86::packed"),
    ] {
        assert!(
            graph.get(from).is_some_and(|e| e.contains_key(to)),
            "the graph misses {from} → {to}: {graph:?}"
        );
    }
    for (depth, within) in [(2, "kernels"), (3, "kernels::x86")] {
        if let Some(cycle) = find_cycle(&merged(&graph, depth, within)) {
            panic!(
                "the kernels import each other in a cycle:\n{}",
                cycle.join("\n")
            );
        }
    }
}
