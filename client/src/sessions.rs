//! `k3 sessions list|rm|save`: the caller's daemon sessions (root sees everyone's).

use crate::connect::{self, SocketPath};
use crate::failure::Failure;
use crate::status::size;
use k3proto::v1 as pb;

#[derive(clap::Subcommand)]
pub enum Command {
    /// Your sessions: name, owner, tokens held, state size, where it is, last use.
    List {
        /// One JSON object with a `sessions` array.
        #[arg(long)]
        json: bool,
    },
    /// Forget a session and remove its file.
    Rm { name: String },
    /// Write a session to the daemon's session directory now (it survives a restart).
    Save {
        name: String,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
}

pub async fn run(socket: &SocketPath, command: Command) -> Result<(), Failure> {
    let mut client = connect::connect(socket).await?;
    match command {
        Command::List { json } => {
            let reply = client
                .list_sessions(pb::ListSessionsRequest {})
                .await?
                .into_inner();
            if json {
                crate::print_json(&reply)?;
            } else {
                crate::print(&table(&reply.sessions))?;
            }
        }
        Command::Rm { name } => {
            client
                .delete_session(pb::DeleteSessionRequest { name: name.clone() })
                .await?;
            eprintln!("removed session {name}");
        }
        Command::Save { name, json } => {
            let reply = client
                .save_session(pb::SaveSessionRequest { name: name.clone() })
                .await?
                .into_inner();
            if json {
                crate::print_json(&reply)?;
            } else {
                let tokens = reply.session.as_ref().map_or(0, |s| s.tokens);
                // "saved" only for a write that happened (issue 45.5).
                crate::print(&if reply.written {
                    format!("saved session {name} ({tokens} tokens) to {}\n", reply.path)
                } else {
                    format!(
                        "session {name} ({tokens} tokens) was already saved in {}; nothing \
                         new to write\n",
                        reply.path
                    )
                })?;
            }
        }
    }
    Ok(())
}

fn table(sessions: &[pb::SessionInfo]) -> String {
    if sessions.is_empty() {
        return "no sessions\n".into();
    }
    let mut out = format!(
        "{:<24} {:<12} {:>9} {:>11}  {:<14} LAST USED\n",
        "NAME", "OWNER", "TOKENS", "STATE", "WHERE"
    );
    for s in sessions {
        out.push_str(&format!(
            "{:<24} {:<12} {:>9} {:>11}  {:<14} {}\n",
            s.name,
            owner(s),
            s.tokens,
            size(s.state_bytes),
            place(s),
            ago(s.last_used)
        ));
    }
    out
}

/// The owner's user name (the system's user database, getpwuid), or the uid when it has none.
fn owner(s: &pb::SessionInfo) -> String {
    s.owner_uid.map_or_else(|| "?".into(), user_name)
}

pub fn user_name(uid: u32) -> String {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map_or_else(|| uid.to_string(), |u| u.name)
}

fn place(s: &pb::SessionInfo) -> String {
    let at = match (s.in_memory, s.on_disk) {
        (true, true) => "memory+disk",
        (true, false) => "memory",
        (false, true) => "disk",
        (false, false) => "nowhere",
    };
    if s.in_use_by != 0 {
        format!("{at}, busy")
    } else {
        at.to_string()
    }
}

/// "12 s ago", "3 min ago", … from seconds since the epoch.
fn ago(when: f64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let s = (now - when).max(0.0);
    match s {
        s if s < 120.0 => format!("{s:.0} s ago"),
        s if s < 7200.0 => format!("{:.0} min ago", s / 60.0),
        s if s < 172_800.0 => format!("{:.0} h ago", s / 3600.0),
        s => format!("{:.0} days ago", s / 86_400.0),
    }
}
