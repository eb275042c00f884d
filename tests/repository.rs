//! The repository explains itself (issue 32): no source file so long a reader cannot hold it
//! (900 lines before its `#[cfg(test)]` module; the store's `mod.rs` 600), and every file or
//! folder the docs and README name exists. Each check is also run on a made-up text, so a
//! checker that could never fail would be caught.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lives in the workspace")
        .to_path_buf()
}

/// Every file and folder of the repository, relative to its root, build output and VCS excluded.
fn tree(dir: &Path, rel: &str, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).expect("read dir") {
        let entry = entry.expect("dir entry");
        let name = entry.file_name().to_string_lossy().into_owned();
        if matches!(
            name.as_str(),
            "target" | ".git" | "node_modules" | "__pycache__"
        ) {
            continue;
        }
        let path = if rel.is_empty() {
            name.clone()
        } else {
            format!("{rel}/{name}")
        };
        let is_dir = entry.file_type().expect("file type").is_dir();
        if is_dir {
            out.insert(format!("{path}/"));
            tree(&entry.path(), &path, out);
        } else {
            out.insert(path);
        }
    }
}

fn repository() -> BTreeSet<String> {
    let mut all = BTreeSet::new();
    tree(&root(), "", &mut all);
    all
}

/// Lines before the file's first `#[cfg(test)]` (all of them if it has none).
fn lines_before_tests(text: &str) -> usize {
    text.lines()
        .position(|l| l.trim_start().starts_with("#[cfg(test)]"))
        .unwrap_or_else(|| text.lines().count())
}

/// The Rust sources of every crate of the workspace (`src/` folders; tests, examples and
/// benchmarks are not the product's code).
fn sources(all: &BTreeSet<String>) -> Vec<String> {
    all.iter()
        .filter(|p| p.ends_with(".rs") && (p.starts_with("src/") || p.contains("/src/")))
        .filter(|p| !p.starts_with("fuzz/libfuzzer/"))
        .cloned()
        .collect()
}

const MAX_LINES: usize = 900;
const MAX_STORE_MOD_LINES: usize = 600;

#[test]
fn no_source_file_is_over_900_lines_before_its_tests() {
    assert_eq!(lines_before_tests("a\nb\n#[cfg(test)]\nmod tests {}\n"), 2);
    assert_eq!(lines_before_tests("a\nb\nc\n"), 3);
    let all = repository();
    let files = sources(&all);
    assert!(
        files.iter().any(|f| f == "daemon/engine/src/lib.rs"),
        "the walk found the engine's sources"
    );
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let text = std::fs::read_to_string(root().join(f)).expect("read source");
            let n = lines_before_tests(&text);
            (n > MAX_LINES).then(|| format!("{f}: {n} lines"))
        })
        .collect();
    assert!(
        long.is_empty(),
        "over {MAX_LINES} lines before #[cfg(test)] — split by concern:\n{}",
        long.join("\n")
    );
    let store = std::fs::read_to_string(root().join("daemon/engine/src/store/mod.rs"))
        .expect("store/mod.rs");
    let n = lines_before_tests(&store);
    assert!(
        n <= MAX_STORE_MOD_LINES,
        "daemon/engine/src/store/mod.rs has {n} lines before its tests (at most {MAX_STORE_MOD_LINES})"
    );
}

/// The file and folder names a Markdown text mentions: inline code spans and link targets
/// that look like a path in this repository (a known extension or a `folder/`), not URLs,
/// runtime paths (`/run/...`, `~/...`), HTTP routes, placeholders or globs.
fn named_paths(markdown: &str) -> Vec<(usize, String)> {
    const EXTENSIONS: [&str; 7] = [".rs", ".md", ".proto", ".sh", ".py", ".toml", ".lua"];
    let mut found = Vec::new();
    let mut fenced = false;
    for (n, line) in markdown.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut candidates = Vec::new();
        for (i, span) in line.split('`').enumerate() {
            if i % 2 == 1 {
                candidates.push(span.to_string());
            }
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = after.find(')').unwrap_or(after.len());
            candidates.push(after[..end].split('#').next().unwrap_or("").to_string());
            rest = &after[end..];
        }
        for c in candidates {
            // `file.rs:120` and `file.rs::item` name the file.
            let c = c.split("::").next().unwrap_or("");
            let c = c.split(':').next().unwrap_or("").trim();
            let odd = |ch: char| " *{}<>$|=,()[]@\"'".contains(ch) || ch.is_uppercase();
            if c.is_empty()
                || c.starts_with('/')
                || c.starts_with('~')
                || c.starts_with('.') && !c.starts_with("./") && !c.starts_with(".ci")
                || c.contains("://")
                || c.chars().any(odd)
            {
                continue;
            }
            let pathlike = EXTENSIONS.iter().any(|e| c.ends_with(e))
                || (c.ends_with('/') && c.len() > 1 && !c.starts_with("v1/"));
            if pathlike {
                found.push((n + 1, c.to_string()));
            }
        }
    }
    found
}

/// Whether `name`, written in `doc`, names something in the repository: relative to the
/// document or the root, or the tail of a path (`serve/mod.rs` for the engine's).
fn exists(all: &BTreeSet<String>, doc: &str, name: &str) -> bool {
    let name = name.trim_start_matches("./");
    let doc_dir = Path::new(doc).parent().unwrap_or(Path::new(""));
    let relative = doc_dir.join(name);
    let relative = relative.to_string_lossy();
    let candidates = [name.to_string(), relative.to_string()];
    let resolved = |c: &str| {
        let normal = normalise(c);
        all.contains(&normal) || all.contains(&format!("{}/", normal.trim_end_matches('/')))
    };
    if candidates.iter().any(|c| resolved(c)) {
        return true;
    }
    let tail = format!("/{name}");
    let tail_dir = format!("/{}/", name.trim_end_matches('/'));
    all.iter()
        .any(|p| p.ends_with(&tail) || p.ends_with(&tail_dir))
}

/// `a/../b` → `b`.
fn normalise(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            ".." => {
                parts.pop();
            }
            "." => {}
            p => parts.push(p),
        }
    }
    parts.join("/")
}

fn documents(all: &BTreeSet<String>) -> Vec<String> {
    all.iter()
        .filter(|p| p.as_str() == "README.md" || (p.starts_with("docs/") && p.ends_with(".md")))
        .cloned()
        .collect()
}

#[test]
fn every_path_named_in_the_docs_exists() {
    let all = repository();
    // The checker on a made-up page: a real file, a real folder, a missing one, a route.
    let page = "See `serve/mod.rs`, [core](../daemon/engine/src/serve/mod.rs), `http/`, \
                `server/chat.rs` and `/v1/models`.";
    let missing: Vec<String> = named_paths(page)
        .into_iter()
        .filter(|(_, p)| !exists(&all, "docs/page.md", p))
        .map(|(_, p)| p)
        .collect();
    assert_eq!(missing, ["server/chat.rs"]);

    let docs = documents(&all);
    assert!(docs.len() > 3, "found the docs: {docs:?}");
    let mut broken = Vec::new();
    for doc in &docs {
        let text = std::fs::read_to_string(root().join(doc)).expect("read doc");
        for (line, name) in named_paths(&text) {
            if !exists(&all, doc, &name) {
                broken.push(format!("{doc}:{line}: {name}"));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "the docs name files or folders that do not exist:\n{}",
        broken.join("\n")
    );
}
