//! The repository explains itself (issue 32): no source file so long a reader cannot hold it
//! (900 lines besides its `#[cfg(test)]` items, wherever they sit — issue 44.5; the store's
//! `mod.rs` 600), no test file over 1,500 lines, every file or folder the docs and README name
//! exists, and every route `k3d` serves has a row in docs/http.md (issue 44.4). Each check is
//! also run on a made-up text, so a checker that could never fail would be caught.

use std::collections::{BTreeMap, BTreeSet};
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

/// The lines (0-based) of the items annotated `#[cfg(test)]` in a Rust source, wherever they
/// sit: a `mod tests { … }`, a test-only fn or impl between the product's, a `mod replay;`, a
/// field. Each runs from the doc comments and attributes above its annotation to the end of the
/// item, found by bracket matching in [`code_only`] (so braces in strings and comments do not
/// count): the brace that closes its body, else its `;`, else (a field, an arm) its `,` or the
/// bracket that closes what encloses it.
fn test_lines(text: &str) -> BTreeSet<usize> {
    let code = code_only(text);
    let lines: Vec<&str> = text.lines().collect();
    let line_of = |at: usize| code[..at].iter().filter(|&&c| c == b'\n').count();
    let mut test = BTreeSet::new();
    let mut from = 0;
    while let Some(at) = find(&code[from..], b"#[cfg(test)]").map(|n| from + n) {
        let end = item_end(&code, at);
        let mut first = line_of(at);
        while first > 0 && {
            let above = lines[first - 1].trim_start();
            above.starts_with("///") || above.starts_with("#[")
        } {
            first -= 1;
        }
        let last = line_of(end.max(at + 1) - 1).min(lines.len().saturating_sub(1));
        test.extend(first..=last);
        from = end.max(at + 1);
    }
    test
}

/// The words that begin an item (after `pub`): an annotated item ends only with its body or
/// its `;`, never at a comma of its generics (`impl<A, B>`); anything else (a field, an arm, a
/// statement) ends at its `,` too.
const ITEM_WORDS: [&str; 14] = [
    "fn",
    "mod",
    "impl",
    "struct",
    "enum",
    "trait",
    "use",
    "const",
    "static",
    "type",
    "unsafe",
    "async",
    "extern",
    "macro_rules",
];

/// The byte after the item whose attribute starts at `at`, in `code` ([`code_only`]).
fn item_end(code: &[u8], at: usize) -> usize {
    let mut i = at;
    // Its attributes, this one first.
    while code[i..].starts_with(b"#[") {
        i = skip_space(code, (closing(code, i + 1) + 1).min(code.len()));
    }
    let word_at = |i: usize| {
        let end = code[i..]
            .iter()
            .position(|&c| !is_ident(c))
            .map_or(code.len(), |n| i + n);
        (std::str::from_utf8(&code[i..end]).unwrap_or(""), end)
    };
    let mut first = i;
    if let ("pub", end) = word_at(i) {
        first = skip_space(code, end);
        if code.get(first) == Some(&b'(') {
            first = skip_space(code, (closing(code, first) + 1).min(code.len()));
        }
    }
    let item = ITEM_WORDS.contains(&word_at(first).0);
    let mut depth = 0usize;
    while i < code.len() {
        match code[i] {
            b'{' if depth == 0 => {
                let end = closing(code, i) + 1;
                // `static X: T = T { … };` ends at its `;`.
                let after = skip_space(code, end);
                return match code.get(after) {
                    Some(b';') => after + 1,
                    Some(b',') if !item => after + 1,
                    _ => end,
                };
            }
            b'(' | b'[' | b'{' => depth += 1,
            // The end of what encloses it: the annotated field or arm was its last.
            b')' | b']' | b'}' if depth == 0 => return i,
            b')' | b']' | b'}' => depth -= 1,
            b';' if depth == 0 => return i + 1,
            b',' if depth == 0 && !item => return i + 1,
            _ => {}
        }
        i += 1;
    }
    code.len()
}

/// The lines of a Rust source that are not test code ([`test_lines`]), blank lines and
/// comments included: what a reader of the product's code has to hold.
fn non_test_lines(text: &str) -> usize {
    text.lines().count() - test_lines(text).len()
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
const MAX_TEST_FILE_LINES: usize = 1_500;

#[test]
fn test_code_is_told_from_the_products() {
    // A test module at the end; none at all.
    assert_eq!(
        non_test_lines("a\nb\n#[cfg(test)]\nmod tests {\n    fn f() {}\n}\n"),
        2
    );
    assert_eq!(non_test_lines("a\nb\nc\n"), 3);
    // A test-only method between the product's, with its doc comment; the code after it counts.
    let interleaved = "impl A {\n    fn a() {}\n    /// For tests.\n    #[cfg(test)]\n    \
                       pub(crate) fn peek(&self) -> Vec<(u8, u8)> {\n        vec![]\n    }\n    \
                       fn b() {}\n}\n";
    assert_eq!(non_test_lines(interleaved), 4);
    // Braces in strings, chars and comments are not the item's.
    let braces = "#[cfg(test)]\nfn t() {\n    let s = \"}}{ \\\" }\";\n    let c = '}';\n    \
                  // }\n    let r = r#\"}\"#;\n}\nfn product<'a>(x: &'a str) {}\n";
    assert_eq!(non_test_lines(braces), 1);
    let raw = "fn a() {\n    let s = r#\"{\"#;\n}\n#[cfg(test)]\nmod tests {\n}\n";
    assert_eq!(non_test_lines(raw), 3);
    // A declared test module, a generic impl, a field.
    assert_eq!(non_test_lines("#[cfg(test)]\nmod replay;\nfn a() {}\n"), 1);
    let generic = "#[cfg(test)]\nimpl<A, B> T<A, B> for X {\n    fn f() {}\n}\nfn g() {}\n";
    assert_eq!(non_test_lines(generic), 1);
    let field = "struct S {\n    a: u8,\n    #[cfg(test)]\n    b: Vec<u8>,\n    c: u8,\n}\n";
    assert_eq!(non_test_lines(field), 4);
    // The attribute in a string is no attribute.
    assert_eq!(
        non_test_lines("const A: &str = \"#[cfg(test)]\";\nfn b() {}\n"),
        2
    );
}

/// `FILE: N lines` for each of `files` that `count` finds more than `limit` lines in.
fn longer_than(files: &[String], limit: usize, count: impl Fn(&str) -> usize) -> Vec<String> {
    files
        .iter()
        .filter_map(|f| {
            let text = std::fs::read_to_string(root().join(f))
                .unwrap_or_else(|e| panic!("cannot read {f}: {e}"));
            let n = count(&text);
            (n > limit).then(|| format!("{f}: {n} lines"))
        })
        .collect()
}

#[test]
fn no_source_file_has_over_900_lines_of_product_code() {
    let all = repository();
    let files = sources(&all);
    assert!(
        files.iter().any(|f| f == "daemon/engine/src/lib.rs"),
        "the walk found the engine's sources"
    );
    let long = longer_than(&files, MAX_LINES, non_test_lines);
    assert!(
        long.is_empty(),
        "over {MAX_LINES} lines besides #[cfg(test)] items — split by concern:\n{}",
        long.join("\n")
    );
    let store = std::fs::read_to_string(root().join("daemon/engine/src/store/mod.rs"))
        .expect("store/mod.rs");
    let n = non_test_lines(&store);
    assert!(
        n <= MAX_STORE_MOD_LINES,
        "daemon/engine/src/store/mod.rs has {n} lines besides its tests (at most {MAX_STORE_MOD_LINES})"
    );
}

/// File names any module of a crate may share with another: a folder's module (`mod.rs`),
/// its errors (`error.rs`) and the crate roots.
const SHARED_FILE_NAMES: [&str; 4] = ["mod.rs", "error.rs", "lib.rs", "main.rs"];

/// For each crate's `src/` folder, the file names two or more of its modules share
/// (besides [`SHARED_FILE_NAMES`]), each with the paths that bear it.
fn shared_names(files: &[String]) -> Vec<String> {
    let mut by_crate: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for file in files {
        let Some(at) = file.find("src/") else {
            continue;
        };
        let name = file.rsplit('/').next().unwrap_or(file).to_string();
        if SHARED_FILE_NAMES.contains(&name.as_str()) {
            continue;
        }
        by_crate
            .entry((file[..at].to_string(), name))
            .or_default()
            .push(file.clone());
    }
    by_crate
        .into_iter()
        .filter(|(_, paths)| paths.len() > 1)
        .map(|((_, name), paths)| format!("{name}: {}", paths.join(", ")))
        .collect()
}

/// Issue 44 point 3: a name says what a module is, so a reader who meets `reply.rs` or a
/// `Frame` knows which one is meant.
#[test]
fn no_two_modules_of_a_crate_share_a_file_name_and_one_type_is_called_frame() {
    let made_up = [
        "a/src/x/reply.rs",
        "a/src/y/reply.rs",
        "b/src/reply.rs",
        "a/src/z/mod.rs",
    ]
    .map(String::from);
    assert_eq!(
        shared_names(&made_up),
        ["reply.rs: a/src/x/reply.rs, a/src/y/reply.rs"]
    );
    let files = sources(&repository());
    let shared = shared_names(&files);
    assert!(
        shared.is_empty(),
        "modules of one crate share a file name — name each for what it is:\n{}",
        shared.join("\n")
    );
    let frames: Vec<&String> = files
        .iter()
        .filter(|f| {
            let text = std::fs::read_to_string(root().join(f)).unwrap_or_default();
            ["enum Frame", "struct Frame", "type Frame"]
                .iter()
                .any(|d| text.contains(&format!("{d} ")) || text.contains(&format!("{d}<")))
        })
        .collect();
    assert_eq!(frames.len(), 1, "types called Frame: {frames:?}");
}

/// The test code of the repository: the programs in every `tests/` folder (the workspace's
/// and each crate's), not the data they read (`fixtures/`).
fn test_files(all: &BTreeSet<String>) -> Vec<String> {
    const CODE: [&str; 4] = [".rs", ".py", ".sh", ".lua"];
    all.iter()
        .filter(|p| p.starts_with("tests/") || p.contains("/tests/"))
        .filter(|p| CODE.iter().any(|e| p.ends_with(e)))
        .filter(|p| !p.contains("fixtures/") && !p.starts_with("fuzz/libfuzzer/"))
        .cloned()
        .collect()
}

#[test]
fn no_test_file_is_over_1500_lines() {
    let all = repository();
    let files = test_files(&all);
    for expected in ["tests/repository.rs", "daemon/engine/tests/serve_core.rs"] {
        assert!(
            files.iter().any(|f| f == expected),
            "the walk found {expected}"
        );
    }
    let long = longer_than(&files, MAX_TEST_FILE_LINES, |text| text.lines().count());
    assert!(
        long.is_empty(),
        "test files over {MAX_TEST_FILE_LINES} lines — split by what they test:\n{}",
        long.join("\n")
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
            && (starts_word || matches!(b[i - 1], b'b' | b'c') && (i < 2 || !is_ident(b[i - 2])));
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                let end = b[i..]
                    .iter()
                    .position(|&c| c == b'\n')
                    .map_or(b.len(), |n| i + n);
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
    assert_eq!(
        tabled_routes(table),
        BTreeSet::from(["POST /a".to_string()])
    );
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
    let unread: Vec<&str> = known.into_iter().filter(|r| !served.contains(*r)).collect();
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
