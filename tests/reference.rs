//! `docs/reference.md` is the binaries' own `--help` (issue 32.5): below its marker line the
//! file is generated from `k3d` and `k3` — every subcommand, recursively — so the reference,
//! `--help` and `k3d man` / `k3 man` (all three from the same clap definitions) cannot drift.
//! This test fails when the committed file differs from what the binaries print; refresh it
//! with `K3_BLESS=1 cargo test -p k3-tests --test reference`.

#[path = "e2e_support.rs"]
mod support;

use std::path::Path;
use std::process::Command;
use support::{bin, subcommands};

const MARKER: &str = "<!-- generated from the binaries' --help below this line: \
                      K3_BLESS=1 cargo test -p k3-tests --test reference -->";

/// `BIN ARGS… --help`, at a fixed width so the text does not depend on the terminal.
fn help(binary: &Path, args: &[String]) -> String {
    let out = Command::new(binary)
        .args(args)
        .arg("--help")
        .env("COLUMNS", "100")
        .env_remove("NO_COLOR")
        .output()
        .expect("run --help");
    assert!(
        out.status.success(),
        "{} {} --help failed: {}",
        binary.display(),
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("--help is UTF-8")
}

fn sections(name: &str, binary: &Path, args: Vec<String>, out: &mut String) {
    let text = help(binary, &args);
    let title = std::iter::once(name.to_string())
        .chain(args.iter().cloned())
        .collect::<Vec<_>>()
        .join(" ");
    let depth = if args.is_empty() { "##" } else { "###" };
    out.push_str(&format!(
        "\n{depth} `{title}`\n\n```text\n{}\n```\n",
        text.trim_end()
    ));
    for sub in subcommands(&text) {
        let mut deeper = args.clone();
        deeper.push(sub);
        sections(name, binary, deeper, out);
    }
}

fn generated() -> String {
    let mut out = String::new();
    for name in ["k3d", "k3"] {
        sections(name, &bin(name), Vec::new(), &mut out);
    }
    out
}

#[test]
fn subcommands_are_read_from_a_help_text() {
    let text = "Usage: k3 <COMMAND>\n\nCommands:\n  run   Continue a prompt\n          \
                wrapped description\n  sessions  List\n  help  Print this\n\nOptions:\n  -h\n";
    assert_eq!(subcommands(text), ["run", "sessions"]);
}

#[test]
fn the_reference_is_the_binaries_help() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/reference.md");
    let committed = std::fs::read_to_string(&path).expect("docs/reference.md");
    let (head, tail) = committed
        .split_once(MARKER)
        .expect("docs/reference.md keeps its generated-section marker line");
    let now = generated();
    assert!(now.contains("## `k3d serve`") || now.contains("### `k3d serve`"));
    if std::env::var_os("K3_BLESS").is_some() {
        std::fs::write(&path, format!("{head}{MARKER}\n{now}")).expect("write reference");
        return;
    }
    let tail = tail.strip_prefix('\n').unwrap_or(tail);
    if tail != now {
        let first = tail
            .lines()
            .zip(now.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(tail.lines().count().min(now.lines().count()));
        panic!(
            "docs/reference.md differs from the binaries' --help (first at generated line {}: \
             committed {:?}, binaries {:?}); refresh it with \
             `K3_BLESS=1 cargo test -p k3-tests --test reference`",
            first + 1,
            tail.lines().nth(first),
            now.lines().nth(first)
        );
    }
}
