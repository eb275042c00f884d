//! `k3 chat`: an interactive conversation. The line editor (rustyline) gives history on the
//! arrow keys; a line ending in `\` continues on the next line. Each turn sends the whole
//! conversation (the daemon re-renders it with the chat template, spec §8). Ctrl-C while the
//! reply streams cancels that reply; at the prompt it clears the line; Ctrl-D or /exit quits.
//!
//! The conversation lives in a daemon session, so a turn prefills only what is new since the
//! last one. Without `--session NAME` the session gets a fresh unique name and is removed when
//! the chat ends or `/reset` starts a new one — unless `/save` kept it; a named session is
//! always kept (`k3 sessions rm NAME` removes it).
//!
//! The daemon keeps token states, not messages, so the client keeps the messages of every kept
//! session in `$XDG_STATE_HOME/k3/chats/NAME.json` (the `/save FILE` format), rewritten after
//! each turn: `k3 chat --session NAME` shows them and goes on, and its first turn extends what
//! the daemon holds, so only the new message is prefilled. Typed lines are kept for the arrow
//! keys in `$XDG_STATE_HOME/k3/chat_history`.

use crate::connect::{self, SocketPath};
use crate::failure::{Code, Failure};
use crate::run::Options;
use crate::stream::{self, Format, Reasoning, Show};
use etcetera::BaseStrategy;
use k3proto::v1 as pb;
use k3proto::v1::engine_client::EngineClient;
use rustyline::DefaultEditor;
use rustyline::error::ReadlineError;
use std::path::{Path, PathBuf};
use tokio::signal::unix::Signal;
use tonic::transport::Channel;

#[derive(clap::Args)]
pub struct Args {
    /// Answer without the thinking channel.
    #[arg(long)]
    no_think: bool,
    /// How much to think.
    #[arg(long, value_parser = ["low", "high", "max"], default_value = "max")]
    effort: String,
    /// Do not show the reasoning at all (by default it is shown after a [thinking] label,
    /// dimmed on a terminal).
    #[arg(long)]
    hide_reasoning: bool,
    /// A system message to start the conversation with.
    #[arg(long)]
    system: Option<String>,
    /// Keep the conversation in this daemon session (kept after the chat ends); if it was
    /// used before, the conversation continues where it stopped.
    #[arg(long)]
    session: Option<String>,
    #[command(flatten)]
    options: Options,
}

const HELP: &str = "Type a message and press Enter (end a line with \\ to continue it). \
Commands: /reset (forget this conversation and start a new one), /save (keep this \
conversation to continue later with --session), /save PATH (write the conversation as JSON: \
a path with a `/` or ending in .json, such as ./talk.json), \
/load FILE (continue a conversation written by /save FILE), /exit.";

/// The daemon session holding the conversation's state.
struct ChatSession {
    name: String,
    /// Made up by this chat, not given with --session: removed at the end unless saved.
    temporary: bool,
    saved: bool,
}

/// Six random letters and digits (30 bits) for a temporary session's name, `chat-k7qm2x`:
/// short enough to type after `/save` (issue 46.5: 32 hex digits were not), not guessable
/// (issue 35 point 9: `chat-SECS-PID-N` was), and names are per user, so only the user's own
/// sessions could collide. The alphabet leaves out l, o, 0 and 1, which read alike. From the
/// kernel's random source; without one, from the standard library's per-process random hash
/// keys.
fn short_random_name() -> String {
    const ALPHABET: &[u8; 32] = b"abcdefghijkmnpqrstuvwxyz23456789";
    use std::io::Read;
    let mut bytes = [0u8; 16];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    if read.is_err() {
        use std::hash::{BuildHasher, Hasher};
        for half in bytes.chunks_mut(8) {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(std::process::id().into());
            half.copy_from_slice(&h.finish().to_le_bytes());
        }
    }
    let letters: String = bytes[..6]
        .iter()
        .map(|b| char::from(ALPHABET[usize::from(b % 32)]))
        .collect();
    format!("chat-{letters}")
}

impl ChatSession {
    fn new(given: Option<&str>) -> ChatSession {
        match given {
            Some(name) => ChatSession {
                name: name.to_string(),
                temporary: false,
                saved: true,
            },
            None => ChatSession {
                name: short_random_name(),
                temporary: true,
                saved: false,
            },
        }
    }

    /// Where the conversation's messages are kept, if it is kept.
    fn transcript_path(&self) -> Option<PathBuf> {
        if !self.saved {
            return None;
        }
        Some(state_dir()?.join("chats").join(file_name(&self.name)))
    }

    /// Rewrites the kept transcript (after every turn; a failure is reported, not fatal).
    fn keep(&self, conversation: &[pb::ChatMessage]) {
        if let Some(path) = self.transcript_path()
            && let Err(e) = write_transcript(&path, conversation)
        {
            eprintln!(
                "k3: cannot keep the conversation in {}: {e}",
                path.display()
            );
        }
    }

    /// Removes a temporary session nobody saved (best effort: the chat is ending anyway).
    fn discard(&self, rt: &tokio::runtime::Runtime, client: &mut EngineClient<Channel>) {
        if self.temporary && !self.saved {
            let name = self.name.clone();
            let _ = rt.block_on(client.delete_session(pb::DeleteSessionRequest { name }));
        }
    }
}

pub fn run(socket: &SocketPath, args: Args) -> Result<(), Failure> {
    let rt = crate::runtime()?;
    let mut client = rt.block_on(connect::connect(socket))?;
    let mut interrupts = rt.block_on(async { stream::interrupts() })?;
    let mut editor = DefaultEditor::new()
        .map_err(|e| Failure::new(Code::Other, format!("starting the line editor: {e}")))?;
    let history = state_dir().map(|d| d.join("chat_history"));
    if let Some(path) = &history {
        // Absent on first use; a damaged file only costs the recall.
        let _ = editor.load_history(path);
    }
    let mut session = ChatSession::new(args.session.as_deref());
    let result = converse(
        &rt,
        &mut client,
        &mut editor,
        &mut interrupts,
        &args,
        &mut session,
    );
    session.discard(&rt, &mut client);
    if let Some(path) = &history
        && let Err(e) = save_history(&mut editor, path)
    {
        eprintln!(
            "k3: cannot keep the input history in {}: {e}",
            path.display()
        );
    }
    result
}

/// `$XDG_STATE_HOME/k3` (default `~/.local/state/k3`); None without a home directory.
fn state_dir() -> Option<PathBuf> {
    etcetera::base_strategy::Xdg::new()
        .ok()?
        .state_dir()
        .map(|d| d.join("k3"))
}

fn save_history(editor: &mut DefaultEditor, path: &Path) -> Result<(), String> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    }
    editor.save_history(path).map_err(|e| e.to_string())
}

/// A session name as a file name: bytes other than letters, digits, `-` and `_` (and so `/`
/// and a leading `.`) written as `%XX`.
fn file_name(session: &str) -> String {
    let mut name: String = session
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    name.push_str(".json");
    name
}

fn converse(
    rt: &tokio::runtime::Runtime,
    client: &mut EngineClient<Channel>,
    editor: &mut DefaultEditor,
    interrupts: &mut Signal,
    args: &Args,
    session: &mut ChatSession,
) -> Result<(), Failure> {
    let mut conversation = initial(args);
    let show = Show {
        format: Format::Text,
        reasoning: if args.hide_reasoning {
            Reasoning::Hide
        } else {
            Reasoning::Show
        },
        stats: false,
    };
    eprintln!("{HELP}");
    if let Some(path) = session.transcript_path().filter(|p| p.exists()) {
        match read_transcript(&path) {
            Ok(saved) => {
                eprintln!(
                    "(continuing session {}: {} earlier messages; /reset starts afresh)",
                    session.name,
                    saved.len()
                );
                if args.system.is_some() {
                    eprintln!("(--system is not applied: the conversation already has its start)");
                }
                show_history(&saved, args.hide_reasoning);
                conversation = saved;
            }
            Err(e) => eprintln!("k3: not continuing session {}: {e}", session.name),
        }
    }
    loop {
        let Some(input) = read_message(editor)? else {
            return Ok(());
        };
        let trimmed = input.trim();
        if trimmed.is_empty() {
            continue;
        }
        let _ = editor.add_history_entry(input.as_str());
        match trimmed
            .split_once(' ')
            .map_or((trimmed, ""), |(c, rest)| (c, rest.trim()))
        {
            ("/exit" | "/quit", _) => return Ok(()),
            ("/reset", _) => {
                conversation = initial(args);
                session.discard(rt, client);
                *session = ChatSession::new(args.session.as_deref());
                session.keep(&conversation);
                eprintln!(
                    "(new conversation: the messages so far are forgotten, and the next reply \
                     will not see them)"
                );
                continue;
            }
            ("/save", "") => {
                let name = session.name.clone();
                match rt.block_on(client.save_session(pb::SaveSessionRequest { name })) {
                    Ok(reply) => {
                        session.saved = true;
                        session.keep(&conversation);
                        eprintln!(
                            "(session {} saved to {}; continue it with `k3 chat --session {}`)",
                            session.name,
                            reply.into_inner().path,
                            session.name
                        );
                    }
                    Err(status) => eprintln!("k3: {}", Failure::from(status).message),
                }
                continue;
            }
            // A bare word is a session name the user wants, which a running chat cannot
            // take (sessions are not renamed): say what to do instead of writing a file
            // named like it in the working directory.
            ("/save", word) if !word.contains('/') && !word.ends_with(".json") => {
                eprintln!(
                    "k3: /save {word}: this chat's session is {}; /save keeps it under that \
                     name, and `k3 chat --session {word}` starts one named {word}. To write \
                     the conversation as JSON, give a path: /save ./{word}.json",
                    session.name
                );
                continue;
            }
            ("/save", path) => {
                match write_transcript(Path::new(path), &conversation) {
                    Ok(()) => eprintln!("(saved {} messages to {path})", conversation.len()),
                    Err(e) => eprintln!("k3: cannot write {path}: {e}"),
                }
                continue;
            }
            ("/load", "") => {
                eprintln!("/load needs a file: /load FILE (written by /save FILE)");
                continue;
            }
            ("/load", path) => {
                match read_transcript(Path::new(path)) {
                    Ok(loaded) => {
                        show_history(&loaded, args.hide_reasoning);
                        eprintln!("(loaded {} messages from {path}; go on)", loaded.len());
                        conversation = loaded;
                        session.keep(&conversation);
                    }
                    Err(e) => eprintln!("k3: {e}"),
                }
                continue;
            }
            ("/help", _) => {
                eprintln!("{HELP}");
                continue;
            }
            (cmd, _) if cmd.starts_with('/') => {
                eprintln!("unknown command {cmd}; {HELP}");
                continue;
            }
            _ => {}
        }
        conversation.push(pb::ChatMessage {
            role: pb::Role::User.into(),
            content: input,
            ..Default::default()
        });
        let request = pb::ChatRequest {
            messages: conversation.clone(),
            thinking: if args.no_think {
                pb::Thinking::Off
            } else {
                pb::Thinking::On
            }
            .into(),
            effort: effort(&args.effort).into(),
            options: Some(args.options.to_wire()),
            session: session.name.clone(),
            ..Default::default()
        };
        let reply = rt.block_on(async {
            let events = client.chat(request).await?.into_inner();
            stream::show(client, events, &show, interrupts).await
        });
        match reply {
            Ok(outcome) => {
                // A cancelled reply stays in the conversation as far as it got.
                conversation.push(pb::ChatMessage {
                    role: pb::Role::Assistant.into(),
                    content: outcome.response,
                    reasoning: outcome.reasoning,
                    ..Default::default()
                });
                session.keep(&conversation);
            }
            Err(f) if matches!(f.code, Code::NotRunning | Code::Permission) => return Err(f),
            Err(f) => {
                // The daemon refused or failed this turn: say why and let the user go on.
                conversation.pop();
                eprintln!("k3: {}", f.message);
            }
        }
    }
}

/// One message, possibly over several lines; None at end of input.
fn read_message(editor: &mut DefaultEditor) -> Result<Option<String>, Failure> {
    let mut message = String::new();
    let mut prompt = "you> ";
    loop {
        match editor.readline(prompt) {
            Ok(line) => match line.strip_suffix('\\') {
                Some(head) => {
                    message.push_str(head);
                    message.push('\n');
                    prompt = "...> ";
                }
                None => {
                    message.push_str(&line);
                    return Ok(Some(message));
                }
            },
            // Ctrl-C at the prompt abandons what was typed, like a shell.
            Err(ReadlineError::Interrupted) => {
                message.clear();
                prompt = "you> ";
            }
            Err(ReadlineError::Eof) => return Ok(None),
            Err(e) => return Err(Failure::new(Code::Other, format!("reading input: {e}"))),
        }
    }
}

fn initial(args: &Args) -> Vec<pb::ChatMessage> {
    args.system
        .iter()
        .map(|s| pb::ChatMessage {
            role: pb::Role::System.into(),
            content: s.clone(),
            ..Default::default()
        })
        .collect()
}

fn effort(name: &str) -> pb::Effort {
    match name {
        "low" => pb::Effort::Low,
        "high" => pb::Effort::High,
        _ => pb::Effort::Max,
    }
}

/// One message of a transcript file (`/save FILE`, the kept sessions): roles by name.
#[derive(serde::Serialize, serde::Deserialize)]
struct TranscriptMessage {
    role: String,
    content: String,
    #[serde(default)]
    reasoning: String,
}

fn write_transcript(path: &Path, conversation: &[pb::ChatMessage]) -> Result<(), String> {
    let messages: Vec<TranscriptMessage> = conversation
        .iter()
        .map(|m| TranscriptMessage {
            role: pb::Role::try_from(m.role)
                .map(|r| r.as_str_name().trim_start_matches("ROLE_").to_lowercase())
                .unwrap_or_else(|_| "unknown".into()),
            content: m.content.clone(),
            reasoning: m.reasoning.clone(),
        })
        .collect();
    let text = serde_json::to_string(&messages).map_err(|e| e.to_string())?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    }
    std::fs::write(path, format!("{text}\n")).map_err(|e| e.to_string())
}

fn read_transcript(path: &Path) -> Result<Vec<pb::ChatMessage>, String> {
    let shown = path.display();
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    let messages: Vec<TranscriptMessage> = serde_json::from_str(&text)
        .map_err(|e| format!("{shown} is not a conversation written by /save FILE: {e}"))?;
    messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            let role = pb::Role::from_str_name(&format!("ROLE_{}", m.role.to_uppercase()))
                .ok_or_else(|| format!("{shown}: message {i} has an unknown role {:?}", m.role))?;
            Ok(pb::ChatMessage {
                role: role.into(),
                content: m.content,
                reasoning: m.reasoning,
                ..Default::default()
            })
        })
        .collect()
}

/// The earlier messages of a continued conversation, as they looked when typed and answered.
fn show_history(conversation: &[pb::ChatMessage], hide_reasoning: bool) {
    let mut text = String::new();
    for m in conversation {
        match pb::Role::try_from(m.role) {
            Ok(pb::Role::User) => text.push_str(&format!("you> {}\n", m.content)),
            Ok(pb::Role::System) => text.push_str(&format!("(system: {})\n", m.content)),
            _ => {
                if !hide_reasoning && !m.reasoning.is_empty() {
                    text.push_str(&format!(
                        "{}{}{}",
                        stream::THINKING_LABEL,
                        m.reasoning,
                        stream::ANSWER_LABEL
                    ));
                }
                text.push_str(&m.content);
                if !m.content.ends_with('\n') {
                    text.push('\n');
                }
            }
        }
    }
    let _ = crate::print(&text);
}

#[cfg(test)]
mod tests {
    use super::short_random_name;

    #[test]
    fn a_temporary_session_name_is_short_typeable_and_differs_each_time() {
        let names: Vec<String> = (0..64).map(|_| short_random_name()).collect();
        for name in &names {
            let letters = name.strip_prefix("chat-").expect("chat- prefix");
            assert_eq!(letters.len(), 6, "{name}");
            assert!(
                letters.chars().all(
                    |c| c.is_ascii_lowercase() && !"lo".contains(c) || ('2'..='9').contains(&c)
                ),
                "{name}"
            );
        }
        let distinct: std::collections::BTreeSet<&String> = names.iter().collect();
        assert!(distinct.len() > 60, "{names:?}");
    }
}
