//! The repository explains itself (issue 32): no source file so long a reader cannot hold it
//! (900 lines before its `#[cfg(test)]` module; the store's `mod.rs` 600), and every file or
//! folder the docs and README name exists, and every route `k3d` serves has a row in
//! docs/http.md (issue 44.4). Each check is also run on a made-up text, so a checker that could
//! never fail would be caught.

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

/// `text` with the insides of its comments and of its string and char literals blanked (each
/// byte a space, newlines kept), so brackets, attributes and calls are found only in code.
/// Byte offsets are the text's own. Knows `//`, nested `/* */`, `"…"` with escapes, raw strings
/// (`r#"…"#`, with or without a `b`/`c` prefix), `'x'` and `'\n'`, and lifetimes (`'a`), which
/// are code.
fn code_only(text: &str) -> Vec<u8> {
    let b = text.as_bytes();
    let mut out = b.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut out[from.min(b.len())..to.min(b.len())] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    let mut i = 0;
    while i < b.len() {
        let starts_word = i == 0 || !is_ident(b[i - 1]);
        // `r"…"` and `br"…"`: the `r` starts a word, or follows a `b`/`c` that does.
        let raw_prefix = b[i] == b'r'
            && (starts_word
                || matches!(b[i - 1], b'b' | b'c') && (i < 2 || !is_ident(b[i - 2])));
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                let end = b[i..].iter().position(|&c| c == b'\n').map_or(b.len(), |n| i + n);
                blank(&mut out, i, end);
                i = end;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let (mut depth, mut j) = (0, i);
                while j < b.len() {
                    if b[j..].starts_with(b"/*") {
                        depth += 1;
                        j += 2;
                    } else if b[j..].starts_with(b"*/") {
                        depth -= 1;
                        j += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        j += 1;
                    }
                }
                blank(&mut out, i, j);
                i = j;
            }
            b'"' => {
                let mut j = i + 1;
                while j < b.len() && b[j] != b'"' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                blank(&mut out, i + 1, j);
                i = j + 1;
            }
            b'r' if raw_prefix => {
                let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
                if b.get(i + 1 + hashes) != Some(&b'"') {
                    i += 1; // an identifier (`r#type` too)
                    continue;
                }
                let start = i + 2 + hashes;
                let mut close = vec![b'"'];
                close.extend(std::iter::repeat_n(b'#', hashes));
                let end = find(&b[start..], &close).map_or(b.len(), |n| start + n);
                blank(&mut out, start, end);
                i = end + close.len();
            }
            b'\'' if b.get(i + 1) == Some(&b'\\') => {
                // `'\n'`, `'\''`, `'\u{1F600}'`: the escaped character is at least one byte.
                let end = b[i + 3..]
                    .iter()
                    .position(|&c| c == b'\'')
                    .map_or(b.len(), |n| i + 3 + n);
                blank(&mut out, i + 1, end);
                i = end + 1;
            }
            b'\'' => {
                let width = text[i + 1..].chars().next().map_or(1, char::len_utf8);
                if b.get(i + 1 + width) == Some(&b'\'') {
                    blank(&mut out, i + 1, i + 1 + width);
                    i += 2 + width;
                } else {
                    i += 1; // a lifetime or a label
                }
            }
            _ => i += 1,
        }
    }
    out
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn skip_space(code: &[u8], mut i: usize) -> usize {
    while code.get(i).is_some_and(u8::is_ascii_whitespace) {
        i += 1;
    }
    i
}

/// The index of the bracket that closes the one at `open` in `code` ([`code_only`]), or the
/// code's length when it is never closed.
fn closing(code: &[u8], open: usize) -> usize {
    let mut depth = 0usize;
    for (i, &c) in code.iter().enumerate().skip(open) {
        match c {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
    }
    code.len()
}

/// The routes a Rust source serves, as `METHOD PATH`: each axum `.route("PATH", …)` call, with
/// the method routers at the top level of its second argument — `get(…)`, `post(…)`, chained
/// (`get(…).post(…)`) or path-qualified (`routing::get(…)`). A `.route(` whose path is not a
/// string literal is returned as an error, so a route cannot slip past the docs unread.
fn routes(source: &str) -> Result<Vec<String>, String> {
    const METHODS: [&str; 8] = [
        "get", "post", "put", "delete", "patch", "head", "options", "any",
    ];
    let code = code_only(source);
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = find(&code[from..], b".route(").map(|n| from + n) {
        from = at + 1;
        let open = at + ".route".len();
        let quote = skip_space(&code, open + 1);
        match code.get(quote) {
            // `shape.route()`: a method of that name, not a route.
            Some(b')') => continue,
            Some(b'"') => {}
            _ => {
                let line = source[..at].lines().count();
                return Err(format!(
                    "line {line}: a .route( whose path is not a string literal; write route \
                     paths literally so this test can hold the docs to them"
                ));
            }
        }
        let Some(length) = code[quote + 1..].iter().position(|&c| c == b'"') else {
            return Err("an unterminated route path".to_string());
        };
        let path = &source[quote + 1..quote + 1 + length];
        let end = closing(&code, open);
        let mut depth = 0usize;
        let mut i = quote + length + 2;
        while i < end {
            match code[i] {
                b'(' | b'[' | b'{' => depth += 1,
                b')' | b']' | b'}' => depth = depth.saturating_sub(1),
                c if depth == 0 && is_ident(c) && !is_ident(code[i - 1]) => {
                    let word_end = code[i..]
                        .iter()
                        .position(|&c| !is_ident(c))
                        .map_or(code.len(), |n| i + n);
                    let word = &source[i..word_end];
                    if code.get(word_end) == Some(&b'(') && METHODS.contains(&word) {
                        found.push(format!("{} {path}", word.to_uppercase()));
                    }
                    i = word_end;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
    }
    Ok(found)
}

/// The routes `k3d` serves: those of every source file of the daemon (`daemon/k3d/src/`).
fn served_routes(all: &BTreeSet<String>) -> BTreeSet<String> {
    let mut served = BTreeSet::new();
    for file in all
        .iter()
        .filter(|p| p.starts_with("daemon/k3d/src/") && p.ends_with(".rs"))
    {
        let text = std::fs::read_to_string(root().join(file)).expect("read source");
        served.extend(routes(&text).unwrap_or_else(|e| panic!("{file}: {e}")));
    }
    served
}

/// The routes a Markdown route table lists: the first code span of each row (`| \`GET /x\` |`).
fn tabled_routes(markdown: &str) -> BTreeSet<String> {
    markdown
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_string)
        .collect()
}

#[test]
fn routes_are_read_from_router_source() {
    let source = r#"
        Router::new()
            .route("/a", post(|State(app): State<Arc<App>>, r| go(app, r, ")")))
            // .route("/commented", get(x))
            .route("/b/{id}", axum::routing::get(b).post(c))
            .route("/c", get(|| async { "post(" }));
        submit(shape.route(), body);
    "#;
    assert_eq!(
        routes(source).expect("literal paths"),
        ["POST /a", "GET /b/{id}", "POST /b/{id}", "GET /c"]
    );
    assert!(routes(r#"x.route(PATH, get(y))"#).is_err());
    let table = "| endpoint | what |\n|---|---|\n| `POST /a` | a |\nSee `GET /b`.\n";
    assert_eq!(tabled_routes(table), BTreeSet::from(["POST /a".to_string()]));
}

/// Every route `k3d` serves has a row in docs/http.md's route table (issue 44.4:
/// `POST /v1/responses`, what Codex speaks, had none).
#[test]
fn every_route_k3d_serves_is_in_the_http_docs() {
    let served = served_routes(&repository());
    // The routes known when this test was written: the extraction must find at least these,
    // so a router the reader no longer understands fails here instead of passing with none.
    let known = [
        "POST /v1/chat/completions",
        "POST /v1/completions",
        "POST /v1/messages",
        "POST /v1/messages/count_tokens",
        "POST /v1/responses",
        "GET /v1/models",
        "GET /v1/models/{id}",
        "GET /health",
        "GET /metrics",
    ];
    let unread: Vec<&str> = known
        .into_iter()
        .filter(|r| !served.contains(*r))
        .collect();
    assert!(
        unread.is_empty(),
        "the router in daemon/k3d/src/ was not read as expected: {unread:?} not found among \
         {served:?}"
    );
    let docs = std::fs::read_to_string(root().join("docs/http.md")).expect("docs/http.md");
    let tabled = tabled_routes(&docs);
    let missing: Vec<&String> = served.difference(&tabled).collect();
    assert!(
        missing.is_empty(),
        "routes k3d serves without a row in docs/http.md's route table: {missing:?}"
    );
}
