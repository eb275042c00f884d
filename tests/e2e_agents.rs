//! The real coding agents against a real daemon (issue 34 point 8): Claude Code (`claude -p`),
//! Codex CLI (`codex exec`), aider (`aider --message`) and opencode (`opencode run`), as
//! `tests/install_agents.sh` installs
//! them (pinned, under target/), each run non-interactively with the recipe of
//! `docs/agents.md` — read from that file, so the documentation is what is tested — against
//! `k3d serve` on the trained fixture over loopback HTTP.
//!
//! Each agent talks to the daemon through a recording relay (`agents_tap.rs`), the independent
//! record of what was asked and answered: every request must be answered 2xx and whole (an
//! agent that gave up on a stream leaves an incomplete answer), the daemon's log must hold no
//! 4xx/5xx line, the agent must exit 0, and what it printed must contain the text the daemon
//! answered (non-empty). Claude Code's second turn (`--continue`) must reuse at least 90 % of
//! the first turn's prompt (issue 34 point 5), in the usage it was sent and in the daemon's log.
//! A second *session* of Claude Code or Codex — no `--continue`, another question — shares only
//! its prelude with the first and must reuse at least 95 % of its prompt, also when the daemon
//! was restarted between them (issue 42 point 5: kept states outlive the daemon).

#[path = "e2e_support.rs"]
mod support;
#[path = "agents_tap.rs"]
mod tap;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use support::*;
use tap::{Exchange, Tap};

/// The model id the trained fixture is served as (its directory's name).
const MODEL: &str = "model";
/// The key the recipes' `KEY` stands for (the daemon has no keys: any string is accepted).
const KEY: &str = "k3-agents-test";
/// What the recipes' placeholders are replaced with.
const RECIPE_URL: &str = "http://127.0.0.1:8080";
const RECIPE_MODEL: &str = "Kimi-K3";
/// How long one agent run may take: Claude Code's first request is ~40,000 prompt ids, a
/// prefill of ~3 min on two free cores and of ~28 min on a heavily shared machine.
const AGENT_LIMIT: Duration = Duration::from_secs(30 * 60);
/// The share of the first turn's prompt a continued turn must reuse (issue 34, "Done when").
const REUSED_AT_LEAST: f64 = 0.9;

/// The share of a new session's prompt that must be reused from an earlier session's prelude
/// (issue 42, "Done when").
const SESSION_REUSED_AT_LEAST: f64 = 0.95;

/// The same for Claude Code, whose conversation carries thousands of tokens after the
/// question that no new session can share (see
/// `separate_claude_code_sessions_reuse_the_prelude_even_after_a_restart`). Measured: a second
/// session reused 33,533 of 39,845 prompt tokens (84.2 %, its whole prelude; 0 before issue
/// 42); asserted with a margin for those tokens, whose count varies with the machine (working
/// directory, agent list).
const CLAUDE_SESSION_REUSED_AT_LEAST: f64 = 0.80;

/// One daemon at a time: each agent turn is a long prefill on the machine's two cores.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// An installed agent's executable; a missing one fails the test, naming the installer.
fn agent(relative: &str) -> PathBuf {
    let path = root().join("target").join(relative);
    assert!(
        path.exists(),
        "{} is missing: the agent tests need the real agents; run ./tests/run.sh (its \
         tests/install_agents.sh installs them under target/)",
        path.display()
    );
    path
}

/// The code blocks of `docs/agents.md`'s section `## TITLE`, in order: (language, text).
fn recipe(title: &str) -> Vec<(String, String)> {
    let doc = std::fs::read_to_string(root().join("docs/agents.md")).expect("docs/agents.md");
    let heading = format!("## {title}\n");
    let at = doc
        .find(&heading)
        .unwrap_or_else(|| panic!("docs/agents.md has no section {heading:?}"));
    let section = &doc[at + heading.len()..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    let mut blocks = Vec::new();
    let mut lines = section.lines();
    while let Some(line) = lines.next() {
        if let Some(lang) = line.strip_prefix("```") {
            let body: Vec<&str> = lines
                .by_ref()
                .take_while(|l| !l.starts_with("```"))
                .collect();
            blocks.push((lang.trim().to_string(), body.join("\n") + "\n"));
        }
    }
    blocks
}

/// The `n`th block of `lang` in a recipe.
fn block(blocks: &[(String, String)], lang: &str, n: usize) -> String {
    blocks
        .iter()
        .filter(|(l, _)| l == lang)
        .nth(n)
        .unwrap_or_else(|| panic!("the recipe has no {lang} block #{n}: {blocks:?}"))
        .1
        .clone()
}

/// A recipe's text with its placeholders pointed at this test's relay and model.
fn placed(text: &str, url: &str) -> String {
    text.replace(RECIPE_URL, url).replace(RECIPE_MODEL, MODEL)
}

/// A shell command line of the recipes (`NAME=value …` assignments, then a command with
/// arguments, `\` continuations, double-quoted words) as (assignments, argv); a word that
/// is exactly `KEY` is the key.
fn command_line(text: &str) -> (Vec<(String, String)>, Vec<String>) {
    let joined = text.replace("\\\n", " ");
    let mut words = Vec::new();
    let (mut word, mut quoted, mut any) = (String::new(), false, false);
    for c in joined.chars() {
        match c {
            '"' => (quoted, any) = (!quoted, true),
            c if c.is_whitespace() && !quoted => {
                if any {
                    words.push(std::mem::take(&mut word));
                }
                any = false;
            }
            c => {
                word.push(c);
                any = true;
            }
        }
    }
    if any {
        words.push(word);
    }
    let key = |w: String| if w == "KEY" { KEY.to_string() } else { w };
    let mut env = Vec::new();
    let mut words = words.into_iter().peekable();
    while let Some(w) = words.next_if(|w| {
        w.split_once('=').is_some_and(|(n, _)| {
            !n.is_empty() && n.chars().all(|c| c.is_ascii_uppercase() || c == '_')
        })
    }) {
        let (n, v) = w.split_once('=').expect("an assignment");
        env.push((n.to_string(), key(v.to_string())));
    }
    (env, words.map(key).collect())
}

/// The trained fixture served over loopback HTTP, behind a recording relay.
struct Served {
    daemon: Daemon,
    tap: Tap,
    /// Scratch: the daemon's socket, the agents' home and project directories.
    dir: tempfile::TempDir,
}

/// The recipe's daemon (docs/agents.md) on the trained fixture: HTTP on loopback, no keys,
/// default budget; both cores, as a user's machine would give it. Its sessions (and kept
/// prefix states) live beside its socket, so a restart finds them.
fn start_daemon(dir: &Path) -> Daemon {
    let model = root().join("tests/fixtures/trained/model");
    Daemon::start(
        &model,
        &dir.join("k3d.sock"),
        &["--http", "127.0.0.1:0", "--threads", "2"],
    )
}

fn serve(name: &str) -> Served {
    let dir = scratch(name);
    let daemon = start_daemon(dir.path());
    let tap = Tap::start(&daemon.tcp_url());
    for sub in ["home", "work"] {
        std::fs::create_dir_all(dir.path().join(sub)).expect("scratch dirs");
    }
    Served { daemon, tap, dir }
}

impl Served {
    /// Stops the daemon as systemd does (SIGTERM: it finishes writing what it keeps, then
    /// exits 0) and starts it again on the same session directory, behind a new relay.
    fn restart(&mut self) {
        self.daemon.signal(libc::SIGTERM);
        let status = self.daemon.wait(Duration::from_secs(300));
        assert!(
            status.success(),
            "k3d exited {status} at SIGTERM:\n{}",
            self.daemon.log_text()
        );
        eprintln!("the daemon before its restart:\n{}", self.daemon.log_text());
        self.daemon = start_daemon(self.dir.path());
        self.tap = Tap::start(&self.daemon.tcp_url());
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    fn work(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    /// `argv` with `env`, in the project directory, under a fresh home and nothing of this
    /// process's environment but `PATH` (no user settings or keys leak in).
    fn command(&self, argv: &[String], env: &[(String, String)]) -> Command {
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .current_dir(self.work())
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.home())
            .env("LANG", "C.UTF-8")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null());
        cmd
    }

    /// The recipe's first `lang` block, pointed at this test's relay and model, written to `to`
    /// (its directory made).
    fn recipe_file(&self, blocks: &[(String, String)], lang: &str, to: &Path) {
        if let Some(dir) = to.parent() {
            std::fs::create_dir_all(dir).expect("the config's directory");
        }
        std::fs::write(to, placed(&block(blocks, lang, 0), &self.tap.url))
            .unwrap_or_else(|e| panic!("write {}: {e}", to.display()));
    }

    /// The recipe's `n`th shell command pointed at this test's relay and model, as
    /// (assignments, argv): checked to start with `program`'s words, which it runs as the
    /// installed `executable`.
    fn recipe_command(
        &self,
        blocks: &[(String, String)],
        n: usize,
        program: &[&str],
        executable: &Path,
    ) -> (Vec<(String, String)>, Vec<String>) {
        let (env, mut argv) = command_line(&placed(&block(blocks, "sh", n), &self.tap.url));
        assert!(
            argv.starts_with(&program.iter().map(|w| w.to_string()).collect::<Vec<_>>()),
            "the recipe runs {}: {argv:?}",
            program.join(" ")
        );
        argv[0] = executable.display().to_string();
        (env, argv)
    }

    /// Runs an agent to its end (killed past [`AGENT_LIMIT`]); fails the test unless it exits
    /// 0, quoting what it printed and the daemon's log.
    fn run(&self, what: &str, mut cmd: Command) -> Output {
        let out_path = self.dir.path().join("agent.out");
        let err_path = self.dir.path().join("agent.err");
        let mut child = cmd
            .stdout(std::fs::File::create(&out_path).expect("agent stdout"))
            .stderr(std::fs::File::create(&err_path).expect("agent stderr"))
            .spawn()
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait for the agent") {
                break status;
            }
            if started.elapsed() > AGENT_LIMIT {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{what} did not finish within {AGENT_LIMIT:?}\nstdout:\n{}\nstderr:\n{}\n\
                     daemon log:\n{}",
                    text(&std::fs::read(&out_path).unwrap_or_default()),
                    text(&std::fs::read(&err_path).unwrap_or_default()),
                    self.daemon.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        let out = Output {
            status,
            stdout: std::fs::read(&out_path).unwrap_or_default(),
            stderr: std::fs::read(&err_path).unwrap_or_default(),
        };
        eprintln!(
            "{what}: {status} after {:.0} s\nstdout:\n{}\nstderr:\n{}",
            started.elapsed().as_secs_f64(),
            text(&out.stdout),
            text(&out.stderr)
        );
        assert!(
            out.status.success(),
            "{what} failed ({status})\nstdout:\n{}\nstderr:\n{}\ndaemon log:\n{}",
            text(&out.stdout),
            text(&out.stderr),
            self.daemon.log_text()
        );
        out
    }

    /// Every request relayed so far, each checked answered 2xx and whole, with none of the
    /// daemon's error lines in its log; the ones on a generating route.
    fn all_answered(&self) -> Vec<Exchange> {
        let exchanges = self.tap.exchanges();
        assert!(!exchanges.is_empty(), "the agent sent no request");
        for e in &exchanges {
            assert!(
                e.status.is_some_and(|s| (200..300).contains(&s)) && e.complete,
                "{} {} answered {:?} (whole: {}):\n{}\ndaemon log:\n{}",
                e.method,
                e.path,
                e.status,
                e.complete,
                text(&e.response_body),
                self.daemon.log_text()
            );
        }
        let log = self.daemon.log_text();
        let errors: Vec<&str> = log
            .lines()
            .filter(|l| {
                (l.contains("HTTP 4") || l.contains("HTTP 5")) && l.contains(" on ")
                    || l.contains("HTTP error answers were not logged")
            })
            .collect();
        assert!(
            errors.is_empty(),
            "error answers in the daemon's log: {errors:#?}"
        );
        exchanges.into_iter().filter(Exchange::generates).collect()
    }

    /// The last generated answer's text, checked non-empty and shown by the agent as `shown`
    /// says.
    fn printed_the_answer(&self, what: &str, out: &Output, shown: Shown) -> String {
        let generated = self.all_answered();
        let last = generated
            .last()
            .unwrap_or_else(|| panic!("{what} sent no request to a generating route"));
        let answer = last.answer_text();
        let answer = answer.trim();
        assert!(
            !answer.is_empty(),
            "the daemon's answer to {what} has no text: {}",
            text(&last.response_body)
        );
        let printed = text(&out.stdout);
        let ok = match shown {
            Shown::Alone => printed.trim() == answer,
            Shown::After(marker) => printed
                .rfind(marker)
                .is_some_and(|at| printed[at + marker.len()..].contains(answer)),
            Shown::JsonField(field) => serde_json::from_str::<serde_json::Value>(&printed)
                .is_ok_and(|v| v[field].as_str().map(str::trim) == Some(answer)),
        };
        assert!(
            ok,
            "{what} did not print the daemon's answer {answer:?} ({shown:?}); it printed:\n{printed}"
        );
        answer.to_string()
    }
}

/// How an agent shows the model's answer on its standard output.
#[derive(Debug, Clone, Copy)]
enum Shown {
    /// The answer and nothing else (`claude -p`, `codex exec`: the rest goes to stderr).
    Alone,
    /// After the last line holding this marker, which follows the reasoning it shows first
    /// (aider's `ANSWER`).
    After(&'static str),
    /// As this field of the one JSON object it prints (`claude -p --output-format json`).
    JsonField(&'static str),
}

/// A Messages answer's final usage: (input_tokens, cache_read_input_tokens).
fn messages_usage(e: &Exchange) -> (u64, u64) {
    let usage = e
        .events()
        .into_iter()
        .rev()
        .find(|ev| ev["type"] == "message_delta")
        .map(|ev| ev["usage"].clone())
        .unwrap_or_else(|| e.json()["usage"].clone());
    let count = |f: &str| {
        usage[f]
            .as_u64()
            .unwrap_or_else(|| panic!("no {f} in {usage}"))
    };
    (count("input_tokens"), count("cache_read_input_tokens"))
}

/// The reused counts of the daemon's `answered` lines for `prompt` tokens, in order.
fn reused_in_log(log: &str, prompt: u64) -> Vec<u64> {
    let needle = format!(", {prompt} prompt tokens (");
    log.lines()
        .filter(|l| l.contains(" answered on ") && l.contains(&needle))
        .filter_map(|l| {
            let rest = &l[l.find(&needle)? + needle.len()..];
            rest.split(' ').next()?.parse().ok()
        })
        .collect()
}

#[test]
fn claude_code_answers_and_its_continued_turn_reuses_the_first() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let claude = agent("agents-npm/node_modules/.bin/claude");
    let served = serve("agents-claude");
    let blocks = recipe("Claude Code");
    let (env, _) = command_line(&placed(&block(&blocks, "sh", 0), &served.tap.url));
    let (_, first) = served.recipe_command(&blocks, 1, &["claude", "-p"], &claude);
    let out = served.run("claude -p", served.command(&first, &env));
    let answer = served.printed_the_answer("claude -p", &out, Shown::Alone);
    let turn_one = served.all_answered();
    let one = turn_one.last().expect("a generated answer");
    assert!(one.path.starts_with("/v1/messages"), "{}", one.path);
    let (input, cached) = messages_usage(one);
    let prompt_one = input + cached;
    assert!(
        prompt_one > 10_000,
        "not Claude Code's prompt: {prompt_one} tokens"
    );
    eprintln!("claude -p: {prompt_one} prompt tokens, answered {answer:?}");

    // A second turn continuing the first, its usage printed as JSON.
    let (_, second) = served.recipe_command(&blocks, 2, &["claude", "-p", "--continue"], &claude);
    let out = served.run("claude -p --continue", served.command(&second, &env));
    served.printed_the_answer("claude -p --continue", &out, Shown::JsonField("result"));
    let turns = served.all_answered();
    assert!(turns.len() > turn_one.len(), "the second turn sent nothing");
    let two = turns.last().expect("a generated answer");
    let (input, cached) = messages_usage(two);
    let reply: serde_json::Value = serde_json::from_slice(&out.stdout).expect("its JSON");
    assert_eq!(
        reply["usage"]["cache_read_input_tokens"].as_u64(),
        Some(cached),
        "Claude Code reports the reuse the daemon sent: {reply}"
    );
    let wanted = (prompt_one as f64 * REUSED_AT_LEAST).ceil() as u64;
    assert!(
        cached >= wanted,
        "the continued turn reused {cached} of the first turn's {prompt_one} prompt tokens \
         (< {REUSED_AT_LEAST}):\n{}",
        served.daemon.log_text()
    );
    assert_eq!(
        reused_in_log(&served.daemon.log_text(), input + cached).last(),
        Some(&cached),
        "the daemon's log tells the same reuse:\n{}",
        served.daemon.log_text()
    );
    eprintln!(
        "claude -p --continue: {} prompt tokens, {cached} reused ({:.1} % of turn 1)",
        input + cached,
        100.0 * cached as f64 / prompt_one as f64
    );
}

#[test]
fn codex_exec_answers() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let codex = agent("agents-npm/node_modules/.bin/codex");
    let served = serve("agents-codex");
    let blocks = recipe("Codex CLI");
    served.recipe_file(&blocks, "toml", &served.home().join(".codex/config.toml"));
    let (env, argv) = served.recipe_command(&blocks, 0, &["codex", "exec"], &codex);
    let out = served.run("codex exec", served.command(&argv, &env));
    let answer = served.printed_the_answer("codex exec", &out, Shown::Alone);
    eprintln!("codex exec answered {answer:?}");
}

#[test]
fn aider_answers() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let aider = agent("venv-aider/bin/aider");
    let served = serve("agents-aider");
    let blocks = recipe("aider");
    served.recipe_file(
        &blocks,
        "json",
        &served.work().join(".aider.model.metadata.json"),
    );
    let (env, argv) = served.recipe_command(&blocks, 1, &["aider"], &aider);
    assert!(argv.contains(&"--message".to_string()), "{argv:?}");
    let out = served.run("aider --message", served.command(&argv, &env));
    let answer = served.printed_the_answer("aider --message", &out, Shown::After("ANSWER"));
    eprintln!("aider answered {answer:?}");
}

#[test]
fn opencode_run_answers() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let opencode = agent("agents-npm/node_modules/.bin/opencode");
    let served = serve("agents-opencode");
    let blocks = recipe("opencode");
    served.recipe_file(&blocks, "json", &served.work().join("opencode.json"));
    let (env, argv) = served.recipe_command(&blocks, 0, &["opencode", "run"], &opencode);
    let out = served.run("opencode run", served.command(&argv, &env));
    // Two requests go at once (the session's title, then the turn with its tools) and may end
    // in either order: the turn's answer is the one printed.
    let generated = served.all_answered();
    let turn = generated
        .iter()
        .rev()
        .find(|e| {
            e.request_json()["tools"]
                .as_array()
                .is_some_and(|t| !t.is_empty())
        })
        .unwrap_or_else(|| {
            let paths: Vec<&String> = generated.iter().map(|e| &e.path).collect();
            panic!("opencode sent no request with its tools: {paths:?}")
        });
    let answer = turn.answer_text();
    assert!(
        !answer.trim().is_empty(),
        "the daemon's answer to opencode's turn has no text: {}",
        text(&turn.response_body)
    );
    assert_eq!(
        text(&out.stdout).trim(),
        answer.trim(),
        "opencode run prints the daemon's answer to its turn"
    );
    eprintln!("opencode run answered {answer:?}");
}

/// What the round-trip tests ask the agents to read: only running the tool gives it.
const ROUND_TRIP_FILE: &str = "round-trip.txt";
const ROUND_TRIP_TEXT: &str = "k3-round-trip-7c41";

/// The requests after the first that carry a tool's result holding [`ROUND_TRIP_TEXT`] back
/// to the model (`tool_result` blocks on Messages, `function_call_output` items on Responses).
fn tool_results(generated: &[Exchange]) -> Vec<&Exchange> {
    generated
        .iter()
        .filter(|e| {
            let body = e.request_json();
            let carried = |items: &serde_json::Value, kind: &str| {
                items.as_array().into_iter().flatten().any(|item| {
                    let parts = item["content"].as_array().cloned().unwrap_or_default();
                    (item["type"] == kind && item.to_string().contains(ROUND_TRIP_TEXT))
                        || parts
                            .iter()
                            .any(|p| p["type"] == kind && p.to_string().contains(ROUND_TRIP_TEXT))
                })
            };
            carried(&body["messages"], "tool_result")
                || carried(&body["input"], "function_call_output")
        })
        .collect()
}

/// One tool round trip: the model asks for a tool, the agent runs it, its result goes back to
/// the daemon and is answered, and the agent prints that answer.
fn round_trip(served: &Served, what: &str, cmd: Command) {
    // Both agents print only the final answer on stdout.
    std::fs::write(served.work().join(ROUND_TRIP_FILE), ROUND_TRIP_TEXT).expect("the file");
    let out = served.run(what, cmd);
    let generated = served.all_answered();
    let results = tool_results(&generated);
    assert!(
        !results.is_empty(),
        "{what}: no request carried the tool's result back (the model called no tool, or the \
         agent did not run it); requests: {:?}",
        generated.iter().map(|e| &e.path).collect::<Vec<_>>()
    );
    served.printed_the_answer(what, &out, Shown::Alone);
}

#[test]
#[ignore = "needs the conversational retrain of the trained fixture (issue 34.7): the committed \
            model never calls a tool, so this fails on it; run with --ignored once it lands"]
fn claude_code_completes_a_tool_round_trip() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let claude = agent("agents-npm/node_modules/.bin/claude");
    let served = serve("agents-claude-tool");
    let blocks = recipe("Claude Code");
    let (env, _) = command_line(&placed(&block(&blocks, "sh", 0), &served.tap.url));
    let (_, mut argv) = served.recipe_command(&blocks, 1, &["claude", "-p"], &claude);
    // Reading a file of the working directory needs no permission in `-p` mode.
    *argv.last_mut().expect("a prompt") =
        format!("Read the file {ROUND_TRIP_FILE} and tell me what it says.");
    round_trip(&served, "claude -p (tool)", served.command(&argv, &env));
}

#[test]
#[ignore = "needs the conversational retrain of the trained fixture (issue 34.7): the committed \
            model never calls a tool, so this fails on it; run with --ignored once it lands"]
fn codex_exec_completes_a_tool_round_trip() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let codex = agent("agents-npm/node_modules/.bin/codex");
    let served = serve("agents-codex-tool");
    let blocks = recipe("Codex CLI");
    served.recipe_file(&blocks, "toml", &served.home().join(".codex/config.toml"));
    let (env, mut argv) = served.recipe_command(&blocks, 0, &["codex", "exec"], &codex);
    *argv.last_mut().expect("a prompt") =
        format!("Run `cat {ROUND_TRIP_FILE}` and tell me what it says.");
    round_trip(&served, "codex exec (tool)", served.command(&argv, &env));
}

/// The last generated exchange's prompt and reused tokens (Messages or Responses usage).
fn last_usage(served: &Served) -> (u64, u64) {
    let generated = served.all_answered();
    let last = generated.last().expect("a generated answer");
    if last.path.starts_with("/v1/messages") {
        let (input, cached) = messages_usage(last);
        return (input + cached, cached);
    }
    let usage = last
        .events()
        .into_iter()
        .rev()
        .find(|ev| ev["type"] == "response.completed")
        .map(|ev| ev["response"]["usage"].clone())
        .unwrap_or_else(|| last.json()["usage"].clone());
    let count = |v: &serde_json::Value| {
        v.as_u64()
            .unwrap_or_else(|| panic!("no token count in the usage {usage}"))
    };
    (
        count(&usage["input_tokens"]),
        count(&usage["input_tokens_details"]["cached_tokens"]),
    )
}

/// Checks that a new session reused at least `at_least` of its prompt.
fn reused_its_prelude(served: &Served, what: &str, at_least: f64) {
    let (prompt, reused) = last_usage(served);
    let share = reused as f64 / prompt as f64;
    eprintln!(
        "{what}: {prompt} prompt tokens, {reused} reused ({:.1} %)",
        100.0 * share
    );
    assert!(
        share >= at_least,
        "{what} reused {reused} of its {prompt} prompt tokens (< {at_least}):\n{}",
        served.daemon.log_text()
    );
}

/// Runs an agent's recipe command `argv` (with `env`) with `question` for its prompt (its last
/// word); checks that it printed the daemon's answer.
fn ask(
    served: &Served,
    agent: &str,
    env: &[(String, String)],
    mut argv: Vec<String>,
    question: &str,
) {
    *argv.last_mut().expect("a prompt") = question.to_string();
    let what = format!("{agent} {question:?}");
    let out = served.run(&what, served.command(&argv, env));
    served.printed_the_answer(&what, &out, Shown::Alone);
}

/// The recipe's blocks (language, text).
type Blocks = [(String, String)];

/// Three new sessions of an agent (installed at `installed`, its recipe `## TITLE` of
/// docs/agents.md) that share its prelude: `session` runs one with a question (given the
/// recipe, the executable and the question), `configure` writes the agent's configuration for
/// the relay (at the start and after the restart, which changes the relay's URL). Two
/// sessions, a daemon restart, the third: each after the first must reuse at least
/// [`SESSION_REUSED_AT_LEAST`] of its prompt, the third from the state the first daemon wrote
/// to disk.
fn sessions_reuse_the_prelude(
    installed: &str,
    title: &str,
    at_least: f64,
    session: impl Fn(&Served, &Blocks, &Path, &str),
    configure: impl Fn(&Served, &Blocks),
) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let executable = agent(installed);
    let blocks = recipe(title);
    let mut served = serve("agents-sessions");
    configure(&served, &blocks);
    let run = |served: &Served, question: &str| session(served, &blocks, &executable, question);
    run(&served, "Say hello");
    let (first, _) = last_usage(&served);
    assert!(first > 10_000, "not {title}'s prompt: {first} tokens");
    run(&served, "Say goodbye");
    reused_its_prelude(&served, &format!("a second {title} session"), at_least);
    served.restart();
    configure(&served, &blocks);
    run(&served, "Say thanks");
    reused_its_prelude(
        &served,
        &format!("a {title} session after a restart"),
        at_least,
    );
    let log = served.daemon.log_text();
    assert!(
        log.contains("from a kept state on disk"),
        "the state came from the disk:\n{log}"
    );
}

/// Issue 42 point 5: separate `claude -p` sessions (no `--continue`, another question each)
/// share only Claude Code's prelude — its tools, effort and system prompt, ~37,000 tokens — and
/// each after the first prefills at most its own conversation, also after the daemon restarted
/// between them (the prelude's state came from the disk). Claude Code's conversation is more
/// than the question: it sends system messages (its agent types, reminders) *after* the user's
/// question (`shared/agent-requests/claude-code-system-mid.json`), and a causal model's state
/// after them depends on the question, so no exact engine can reuse them: measured, the
/// prelude is 84 % of the prompt. The bound is [`CLAUDE_SESSION_REUSED_AT_LEAST`].
#[test]
fn separate_claude_code_sessions_reuse_the_prelude_even_after_a_restart() {
    let session = |served: &Served, blocks: &Blocks, claude: &Path, question: &str| {
        // The relay's URL goes into each run's environment.
        let (env, _) = command_line(&placed(&block(blocks, "sh", 0), &served.tap.url));
        let (_, argv) = served.recipe_command(blocks, 1, &["claude", "-p"], claude);
        ask(served, "claude -p", &env, argv, question);
    };
    sessions_reuse_the_prelude(
        "agents-npm/node_modules/.bin/claude",
        "Claude Code",
        CLAUDE_SESSION_REUSED_AT_LEAST,
        session,
        |_, _| {},
    );
}

/// Issue 42 point 5: the same for `codex exec` runs (each a new thread of Codex).
#[test]
fn separate_codex_exec_runs_reuse_the_prelude_even_after_a_restart() {
    let run = |served: &Served, blocks: &Blocks, codex: &Path, question: &str| {
        let (env, argv) = served.recipe_command(blocks, 0, &["codex", "exec"], codex);
        ask(served, "codex exec", &env, argv, question);
    };
    // The provider's URL is the relay's.
    let configure = |served: &Served, blocks: &Blocks| {
        served.recipe_file(blocks, "toml", &served.home().join(".codex/config.toml"))
    };
    sessions_reuse_the_prelude(
        "agents-npm/node_modules/.bin/codex",
        "Codex CLI",
        SESSION_REUSED_AT_LEAST,
        run,
        configure,
    );
}
