//! The docs are tests (issue 46.1). Every command block of README.md and docs/*.md carries a
//! marker on the line before its fence, and this file holds each marker to its word:
//!
//! * `<!-- run -->`: executed here, as written, with `bash -euo pipefail` from the repository's
//!   root, against `k3d serve` on the trained fixture (`tests/fixtures/trained/model`) with its
//!   HTTP API on `127.0.0.1:8080` — in a network namespace of its own (`unshare --net`), so the
//!   address the docs name is this test's whatever else runs on the machine — `k3` and `k3d` on
//!   `PATH`, `K3_SOCKET` at the daemon and `K3_BIN_DIR` at the built binaries (which
//!   `packaging/demo.sh` then uses instead of building). A block passes when it exits 0, prints
//!   something, prints no error object, and the daemon logged no 4xx/5xx answer for it.
//! * `<!-- runs: PATH [what of it] -->`: executed by the test file PATH, which must exist and
//!   read the doc.
//! * `<!-- test-command -->`: README's test command, which `.ci/run` runs.
//! * `<!-- illustrative: WHY -->`: shown, not run; WHY must be said (a placeholder path, a real
//!   machine, an interactive program).
//!
//! Every fenced block must name its language, so a command cannot hide in an unlabelled one.
//!
//! And the defaults the docs name are the binary's: every `[default: …]` the docs or
//! `packaging/k3d.toml` give for a flag is that flag's `k3d serve --help` default, word for word;
//! every key of `packaging/k3d.toml` whose flag has a default states it; and the synopsis rows
//! of docs/reference.md list exactly the long flags of their command's `--help`.

#[path = "e2e_support.rs"]
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::{bin, subcommands};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// README.md and every docs/*.md, by their path from the root.
fn documents() -> Vec<String> {
    let mut docs = vec!["README.md".to_string()];
    let mut more: Vec<String> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    more.sort();
    docs.extend(more);
    docs
}

const COMMAND_LANGUAGES: [&str; 5] = ["sh", "bash", "shell", "console", "zsh"];

#[derive(Debug, Clone, PartialEq, Eq)]
enum Marker {
    Run,
    RunsIn(String),
    TestCommand,
    Illustrative,
}

/// A fenced block: where it starts (1-based line of its fence), its language, its text and the
/// marker on the line before it.
#[derive(Debug)]
struct Block {
    line: usize,
    language: String,
    text: String,
    marker: Result<Marker, String>,
}

fn marker(line: &str) -> Result<Marker, String> {
    let l = line.trim();
    let Some(inner) = l
        .strip_prefix("<!--")
        .and_then(|r| r.strip_suffix("-->"))
        .map(str::trim)
    else {
        return Err(format!("no marker (the line before is {l:?})"));
    };
    if inner == "run" {
        Ok(Marker::Run)
    } else if inner == "test-command" {
        Ok(Marker::TestCommand)
    } else if let Some(path) = inner.strip_prefix("runs:") {
        // The file, then what of the block it runs, if not all.
        let path = path.split_whitespace().next().unwrap_or("");
        Ok(Marker::RunsIn(path.to_string()))
    } else if let Some(why) = inner.strip_prefix("illustrative:") {
        if why.trim().len() < 8 {
            Err(format!("{l:?} does not say why the block is illustrative"))
        } else {
            Ok(Marker::Illustrative)
        }
    } else {
        Err(format!("{l:?} is not a marker this test knows"))
    }
}

fn blocks(markdown: &str) -> Vec<Block> {
    let lines: Vec<&str> = markdown.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(language) = lines[i].trim_start().strip_prefix("```") else {
            i += 1;
            continue;
        };
        let indent = lines[i].len() - lines[i].trim_start().len();
        let before = lines[..i]
            .iter()
            .rev()
            .find(|l| !l.trim().is_empty())
            .copied()
            .unwrap_or("");
        let mut body = Vec::new();
        let mut j = i + 1;
        while j < lines.len() && !lines[j].trim_start().starts_with("```") {
            body.push(lines[j].get(indent..).unwrap_or(lines[j].trim_start()));
            j += 1;
        }
        out.push(Block {
            line: i + 1,
            language: language.trim().to_string(),
            text: body.join("\n") + "\n",
            marker: marker(before),
        });
        i = j + 1;
    }
    out
}

#[test]
fn blocks_and_markers_are_read() {
    let text = "a\n\n<!-- run -->\n```sh\necho hi\n```\n\n   <!-- illustrative: a real machine -->\n   ```sh\n   k3d x\n   ```\n```text\nout\n```\n";
    let b = blocks(text);
    assert_eq!(b.len(), 3);
    assert_eq!((b[0].line, b[0].marker.clone()), (4, Ok(Marker::Run)));
    assert_eq!(b[0].text, "echo hi\n");
    assert_eq!(b[1].marker, Ok(Marker::Illustrative));
    assert_eq!(b[1].text, "k3d x\n");
    assert!(b[2].marker.is_err());
    assert!(marker("<!-- illustrative: -->").is_err());
    assert!(marker("<!-- runn -->").is_err());
}

#[test]
fn every_command_block_is_run_or_marked_illustrative() {
    let mut wrong = Vec::new();
    let mut run = 0;
    for doc in documents() {
        let text = std::fs::read_to_string(root().join(&doc)).expect("read doc");
        for b in blocks(&text) {
            let at = format!("{doc}:{}", b.line);
            if b.language.is_empty() {
                wrong.push(format!("{at}: a fence without a language"));
                continue;
            }
            if !COMMAND_LANGUAGES.contains(&b.language.as_str()) {
                continue;
            }
            match b.marker {
                Err(e) => wrong.push(format!("{at}: {e}")),
                Ok(Marker::RunsIn(path)) => {
                    let named = std::fs::read_to_string(root().join(&path)).unwrap_or_default();
                    if !named.contains(&doc) {
                        wrong.push(format!("{at}: {path} does not exist or never reads {doc}"));
                    }
                }
                Ok(Marker::TestCommand) if doc != "README.md" => {
                    wrong.push(format!("{at}: only README.md has the test command"));
                }
                Ok(Marker::Run) => run += 1,
                Ok(_) => {}
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "command blocks without an honest marker:\n{}",
        wrong.join("\n")
    );
    assert!(
        run >= 4,
        "the README's demo and HTTP examples are run ({run} blocks)"
    );
}

/// A process that holds a fresh network namespace (only its own loopback) for the test.
struct Namespace(Child);

impl Namespace {
    fn new() -> Namespace {
        let child = Command::new("unshare")
            .args(["--net", "sh", "-c", "ip link set lo up && exec sleep 3600"])
            .stdin(Stdio::null())
            .spawn()
            .expect("unshare (util-linux) runs: the docs' examples need a network of their own");
        let ns = Namespace(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        // Up once `ip` has run and `sleep` holds the namespace.
        while std::fs::read_link(format!("/proc/{}/exe", ns.0.id()))
            .map_or(true, |exe| !exe.to_string_lossy().contains("sleep"))
        {
            assert!(
                Instant::now() < deadline,
                "unshare --net did not start (run the tests as root: README)"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        ns
    }

    /// `PROGRAM ARGS` inside the namespace.
    fn command(&self, program: &Path) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/proc/{}/ns/net", self.0.id()))
            .arg("--")
            .arg(program);
        c
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The daemon the docs' examples talk to, in `ns`: the trained fixture, HTTP on
/// 127.0.0.1:8080 as the docs say.
struct Served {
    daemon: Child,
    socket: PathBuf,
    log: PathBuf,
}

impl Served {
    fn start(ns: &Namespace, dir: &Path) -> Served {
        let socket = dir.join("k3d.sock");
        let log = dir.join("k3d.log");
        let daemon = ns
            .command(&bin("k3d"))
            .arg("serve")
            .arg("--model")
            .arg(root().join("tests/fixtures/trained/model"))
            .arg("--socket")
            .arg(&socket)
            .arg("--session-dir")
            .arg(dir.join("sessions"))
            .args(["--http", "127.0.0.1:8080", "--threads", "1"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("daemon log"))
            .spawn()
            .expect("k3d serve");
        let served = Served {
            daemon,
            socket,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !served
            .log_text()
            .contains("HTTP API on http://127.0.0.1:8080")
        {
            assert!(
                Instant::now() < deadline,
                "k3d serve did not listen on 127.0.0.1:8080 within 60 s:\n{}",
                served.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        served
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
    }
}

#[test]
fn the_blocks_marked_run_succeed_as_written_against_the_trained_fixture() {
    let ns = Namespace::new();
    let dir = support::scratch("docs");
    let served = Served::start(&ns, dir.path());
    let bins = bin("k3d").parent().expect("a bin dir").to_path_buf();
    let path = format!(
        "{}:{}",
        bins.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut failed = Vec::new();
    let mut ran = 0;
    for doc in documents() {
        let text = std::fs::read_to_string(root().join(&doc)).expect("read doc");
        for b in blocks(&text) {
            if b.marker != Ok(Marker::Run) {
                continue;
            }
            ran += 1;
            let logged = served.log_text().len();
            let out = ns
                .command(Path::new("bash"))
                .args(["-euo", "pipefail", "-c", &b.text])
                .current_dir(root())
                .env("PATH", &path)
                .env("K3_SOCKET", &served.socket)
                .env("K3_BIN_DIR", &bins)
                .env("TMPDIR", dir.path())
                .stdin(Stdio::null())
                .output()
                .expect("bash runs");
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            let log = served.log_text();
            let refusals: Vec<&str> = log[logged..]
                .lines()
                .filter(|l| l.contains(" HTTP 4") || l.contains(" HTTP 5"))
                .collect();
            let mut why = Vec::new();
            if !out.status.success() {
                why.push(format!("exited {}", out.status));
            }
            if stdout.trim().is_empty() {
                why.push("printed nothing".to_string());
            }
            // An error object (`"error": {…}`, Anthropic's `"type": "error"`, an SSE `error`
            // event), not `k3_malformed`'s `"error": "…"` string.
            let compact: String = stdout.chars().filter(|c| !c.is_whitespace()).collect();
            if ["\"error\":{", "\"type\":\"error\"", "event:error"]
                .iter()
                .any(|e| compact.contains(e))
            {
                why.push("printed an error object".to_string());
            }
            if !refusals.is_empty() {
                why.push(format!("the daemon refused it: {refusals:?}"));
            }
            if !why.is_empty() {
                failed.push(format!(
                    "{doc}:{} {}:\n{}\n--- stdout:\n{stdout}\n--- stderr:\n{stderr}",
                    b.line,
                    why.join("; "),
                    b.text
                ));
            }
        }
    }
    assert!(ran >= 4, "{ran} blocks run");
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}

/// `--help`'s long flags of `k3d ARGS` and the default each states (`[default: X]`, or
/// `(default: X)` in the description), in order.
fn help_flags(binary: &str, args: &[&str]) -> BTreeMap<String, Option<String>> {
    let out = Command::new(bin(binary))
        .args(args)
        .arg("--help")
        .env("COLUMNS", "100")
        .output()
        .expect("--help runs");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).expect("UTF-8 help");
    let mut flags = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let t = line.trim_start();
        let flag = if t.starts_with("--") {
            Some(t)
        } else if t.starts_with('-') && t.get(2..4) == Some(", ") {
            t.get(4..)
        } else {
            None
        };
        if let Some(f) = flag.filter(|f| f.starts_with("--")) {
            let name = f.split([' ', '=']).next().unwrap_or(f).to_string();
            flags.insert(name.clone(), None);
            current = Some(name);
        } else if let Some(name) = &current
            && let Some(default) = stated_default(t)
        {
            flags.insert(name.clone(), Some(default));
        }
    }
    flags.remove("--help");
    flags.remove("--version");
    flags
}

/// The subcommands `BINARY SUB --help` lists under `Commands:` (not `help`).
fn subcommands_of(binary: &str, sub: &str) -> Vec<String> {
    let out = Command::new(bin(binary))
        .args([sub, "--help"])
        .output()
        .expect("--help runs");
    subcommands(&String::from_utf8_lossy(&out.stdout))
}

/// The default a text states: `[default: X]` or `(default: X)`.
fn stated_default(text: &str) -> Option<String> {
    for (open, close) in [("[default: ", ']'), ("(default: ", ')')] {
        if let Some(at) = text.find(open) {
            let rest = &text[at + open.len()..];
            // Up to the bracket that closes this one.
            let mut depth = 0;
            for (i, c) in rest.char_indices() {
                match c {
                    '[' | '(' => depth += 1,
                    c if c == close && depth == 0 => return Some(rest[..i].to_string()),
                    ']' | ')' => depth -= 1,
                    _ => {}
                }
            }
        }
    }
    None
}

#[test]
fn defaults_are_read_from_help_text() {
    assert_eq!(
        stated_default("Requests (each) [default: half of --max-queue, at least 1]"),
        Some("half of --max-queue, at least 1".into())
    );
    assert_eq!(
        stated_default("threads (default: all cores)"),
        Some("all cores".into())
    );
    assert_eq!(stated_default("no default here"), None);
}

/// The text of the docs a reader sees, without the generated part of docs/reference.md.
fn prose(doc: &str) -> String {
    let text = std::fs::read_to_string(root().join(doc)).expect("read doc");
    match text.split_once("<!-- generated from the binaries' --help below this line") {
        Some((head, _)) => head.to_string(),
        None => text,
    }
}

#[test]
fn every_default_the_docs_and_the_shipped_config_name_is_the_binarys() {
    let serve = help_flags("k3d", &["serve"]);
    let mut wrong = Vec::new();
    let mut checked = 0;
    // 1. Any "`--flag` … [default: X]" in the docs' prose: X is --help's.
    let mut docs: Vec<String> = documents();
    docs.push("packaging/k3d.toml".into());
    for doc in &docs {
        let text = prose(doc);
        // Paragraphs, their lines joined: a flag and its default may sit on two lines.
        let paragraphs: Vec<String> = text
            .split("\n\n")
            .map(|p| {
                p.lines()
                    .map(|l| l.trim().trim_start_matches('#').trim())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        for (n, paragraph) in paragraphs.iter().enumerate() {
            for (at, _) in paragraph.match_indices("[default: ") {
                let Some(stated) = stated_default(&paragraph[at..]) else {
                    continue;
                };
                // The flag is the nearest `--name` before the bracket.
                let before = &paragraph[..at];
                let flag = before
                    .rfind("--")
                    .map(|i| {
                        before[i..]
                            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                            .next()
                            .unwrap_or("")
                            .to_string()
                    })
                    .filter(|f| serve.contains_key(f));
                let Some(flag) = flag else {
                    continue;
                };
                if serve[&flag].as_deref() != Some(stated.as_str()) {
                    wrong.push(format!(
                        "{doc}, paragraph {}: {flag} [default: {stated}], but `k3d serve --help` \
                     says {:?}",
                        n + 1,
                        serve[&flag]
                    ));
                }
                checked += 1;
            }
        }
    }
    assert!(checked >= 4, "{checked} stated defaults checked");
    // 2. packaging/k3d.toml: each key whose flag has a default states it, word for word, in
    // the comment paragraph above the key.
    let toml = std::fs::read_to_string(root().join("packaging/k3d.toml")).expect("k3d.toml");
    let mut paragraph: Vec<&str> = Vec::new();
    let mut keys = BTreeSet::new();
    for line in toml.lines() {
        let t = line.trim_start_matches('#').trim();
        let key = t
            .split_once(" = ")
            .map(|(k, _)| k)
            .filter(|k| !k.is_empty() && k.chars().all(|c| c.is_ascii_lowercase() || c == '_'));
        match key {
            Some(key) => {
                let flag = format!("--{}", key.replace('_', "-"));
                keys.insert(key.to_string());
                if let Some(Some(default)) = serve.get(&flag) {
                    let said = paragraph.join(" ");
                    if !said.contains(&format!("[default: {default}]")) {
                        wrong.push(format!(
                            "packaging/k3d.toml: {key} does not say [default: {default}] \
                             (`k3d serve --help` for {flag})"
                        ));
                    }
                }
                paragraph.clear();
            }
            None if line.trim().is_empty() => paragraph.clear(),
            None => paragraph.push(t),
        }
    }
    assert!(keys.contains("max_queued_per_uid"), "{keys:?}");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_reference_synopsis_lists_each_commands_flags() {
    let text = prose("docs/reference.md");
    let mut wrong = Vec::new();
    let mut rows = 0;
    for line in text.lines() {
        let Some(synopsis) = line
            .strip_prefix("| `")
            .and_then(|r| r.split_once("` |"))
            .map(|(s, _)| s)
        else {
            continue;
        };
        let words: Vec<&str> = synopsis.split_whitespace().collect();
        let (binary, sub) = match words.as_slice() {
            [b @ ("k3d" | "k3"), s, ..] if s.chars().all(|c| c.is_ascii_lowercase()) => (*b, *s),
            _ => continue,
        };
        rows += 1;
        // Options every subcommand shares (`k3 --socket`) are the binary's, not the row's; a
        // row for a group (`k3 sessions list … | rm …`) lists its subcommands' flags.
        let global = help_flags(binary, &[]);
        let mut help = help_flags(binary, &[sub]);
        for nested in subcommands_of(binary, sub) {
            help.extend(help_flags(binary, &[sub, &nested]));
        }
        help.retain(|flag, _| !global.contains_key(flag));
        let named: BTreeSet<String> = synopsis
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .filter(|w| w.starts_with("--") && w.len() > 2)
            .map(str::to_string)
            .collect();
        for flag in help.keys() {
            if !named.contains(flag) {
                wrong.push(format!("`{binary} {sub}` row lacks {flag}"));
            }
        }
        for flag in &named {
            if !help.contains_key(flag) {
                wrong.push(format!(
                    "`{binary} {sub}` row names {flag}, which --help lacks"
                ));
            }
        }
    }
    assert!(rows >= 8, "{rows} synopsis rows read");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
