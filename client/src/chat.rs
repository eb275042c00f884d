//! `k3 chat`: an interactive conversation. The line editor (rustyline) gives history on the
//! arrow keys; a line ending in `\` continues on the next line. Each turn sends the whole
//! conversation (the daemon re-renders it with the chat template, spec §8). Ctrl-C while the
//! reply streams cancels that reply; at the prompt it clears the line; Ctrl-D or /exit quits.
//!
//! The conversation lives in a daemon session, so a turn prefills only what is new since the
//! last one. Without `--session NAME` the session gets a fresh unique name and is removed when
//! the chat ends or `/reset` starts a new one — unless `/save` kept it; a named session is
//! always kept (`k3 sessions rm NAME` removes it).

use crate::connect::{self, SocketPath};
use crate::failure::{Code, Failure};
use crate::run::Options;
use crate::stream::{self, Format, Reasoning, Show};
use k3proto::v1 as pb;
use k3proto::v1::engine_client::EngineClient;
use rustyline::DefaultEditor;
use rustyline::error::ReadlineError;
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
    /// Do not show the reasoning at all (it is dimmed by default).
    #[arg(long)]
    hide_reasoning: bool,
    /// A system message to start the conversation with.
    #[arg(long)]
    system: Option<String>,
    /// Keep the conversation's state in this daemon session (kept after the chat ends).
    #[arg(long)]
    session: Option<String>,
    #[command(flatten)]
    options: Options,
}

const HELP: &str = "Type a message and press Enter (end a line with \\ to continue it). \
Commands: /reset (new conversation), /save (keep the daemon session), /save FILE (write the \
conversation as JSON), /exit.";

/// The daemon session holding the conversation's state.
struct ChatSession {
    name: String,
    /// Made up by this chat, not given with --session: removed at the end unless saved.
    temporary: bool,
    saved: bool,
}

impl ChatSession {
    fn new(given: Option<&str>, serial: u32) -> ChatSession {
        match given {
            Some(name) => ChatSession {
                name: name.to_string(),
                temporary: false,
                saved: true,
            },
            None => {
                let secs = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                ChatSession {
                    name: format!("chat-{secs}-{}-{serial}", std::process::id()),
                    temporary: true,
                    saved: false,
                }
            }
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
    let mut session = ChatSession::new(args.session.as_deref(), 0);
    let result = converse(
        &rt,
        &mut client,
        &mut editor,
        &mut interrupts,
        &args,
        &mut session,
    );
    session.discard(&rt, &mut client);
    result
}

fn converse(
    rt: &tokio::runtime::Runtime,
    client: &mut EngineClient<Channel>,
    editor: &mut DefaultEditor,
    interrupts: &mut Signal,
    args: &Args,
    session: &mut ChatSession,
) -> Result<(), Failure> {
    let mut serial = 0;
    let mut conversation = initial(args);
    let show = Show {
        format: Format::Text,
        reasoning: if args.hide_reasoning {
            Reasoning::Hide
        } else {
            Reasoning::Dim
        },
        stats: false,
    };
    eprintln!("{HELP}");
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
                serial += 1;
                *session = ChatSession::new(args.session.as_deref(), serial);
                if !session.temporary {
                    eprintln!(
                        "(new conversation; session {} keeps only states a new prompt extends)",
                        session.name
                    );
                } else {
                    eprintln!("(new conversation)");
                }
                continue;
            }
            ("/save", "") => {
                let name = session.name.clone();
                match rt.block_on(client.save_session(pb::SaveSessionRequest { name })) {
                    Ok(reply) => {
                        session.saved = true;
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
            ("/save", path) => {
                match std::fs::write(path, transcript(&conversation)) {
                    Ok(()) => eprintln!("(saved {} messages to {path})", conversation.len()),
                    Err(e) => eprintln!("k3: cannot write {path}: {e}"),
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

fn transcript(conversation: &[pb::ChatMessage]) -> String {
    let messages: Vec<serde_json::Value> = conversation
        .iter()
        .map(|m| {
            let role = pb::Role::try_from(m.role)
                .map(|r| r.as_str_name().trim_start_matches("ROLE_").to_lowercase())
                .unwrap_or_else(|_| "unknown".into());
            serde_json::json!({"role": role, "content": m.content, "reasoning": m.reasoning})
        })
        .collect();
    format!("{}\n", serde_json::Value::Array(messages))
}
