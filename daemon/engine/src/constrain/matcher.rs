//! The matcher's machinery: the symbols a reply is made of (bytes of text ids, and the
//! template's control ids), and a nondeterministic pushdown automaton over them — a set of
//! threads, each a stack of frames ([`Frame`]: the reply's structure, [`super::reply_grammar`], and
//! JSON values, [`super::json`]). A symbol advances every thread; a thread that cannot take it
//! dies. Alternatives (which tool, which key, which branch of an `anyOf`) are threads of their
//! own until the symbols decide between them.

use super::Grammar;
use super::json;
use super::reply_grammar;

/// One symbol of a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sym {
    /// A byte of a text id.
    Byte(u8),
    /// A control id (spec §7.2): the reader's structure.
    Ctl(Ctl),
}

/// The control ids a reply's grammar uses (spec §8.4). `End` is either end-of-turn id
/// (`<|end_of_msg|>` or `[EOS]`): the reader accepts both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ctl {
    Open,
    Close,
    Sep,
    End,
}

/// A frame of a thread's stack.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    Reply(reply_grammar::ReplyFrame),
    Json(json::JsonFrame),
}

/// One thread: frames bottom first; the last is the one the next symbol goes to. An empty
/// stack has finished (the reply's end id was read) and takes nothing more.
pub type Thread = Vec<Frame>;

/// What a frame does with a symbol: the frames that replace it (bottom first; none = it is
/// done), and whether it took the symbol (`Consume`) or leaves it to the new top (`Pass`).
#[derive(Debug)]
pub enum Outcome {
    Consume(Vec<Frame>),
    Pass(Vec<Frame>),
}

impl Outcome {
    pub fn consume(frames: impl IntoIterator<Item = Frame>) -> Vec<Outcome> {
        vec![Outcome::Consume(frames.into_iter().collect())]
    }

    pub fn pass(frames: impl IntoIterator<Item = Frame>) -> Vec<Outcome> {
        vec![Outcome::Pass(frames.into_iter().collect())]
    }
}

/// Passes (epsilon moves) in a row before a thread must take the symbol: far above the
/// deepest legitimate chain (a value ending, its object ending, the argument tail …), it only
/// stops a grammar bug from recursing without end.
const MAX_PASSES: u32 = 64;

/// Every thread `threads` becomes after `sym`, without duplicates.
pub fn advance(g: &Grammar, threads: &[Thread], sym: Sym) -> Vec<Thread> {
    let mut out = Vec::new();
    for t in threads {
        feed(g, t.clone(), sym, &mut out, 0);
    }
    dedup(&mut out);
    out
}

/// [`advance`] by every symbol of `syms` in turn.
pub fn advance_all(g: &Grammar, threads: &[Thread], syms: &[Sym]) -> Vec<Thread> {
    let mut now = threads.to_vec();
    for &sym in syms {
        if now.is_empty() {
            break;
        }
        now = advance(g, &now, sym);
    }
    now
}

fn feed(g: &Grammar, mut thread: Thread, sym: Sym, out: &mut Vec<Thread>, passes: u32) {
    let Some(top) = thread.pop() else {
        return;
    };
    let outcomes = step(g, top, sym);
    let n = outcomes.len();
    for (i, outcome) in outcomes.into_iter().enumerate() {
        let mut t = if i + 1 == n {
            std::mem::take(&mut thread)
        } else {
            thread.clone()
        };
        match outcome {
            Outcome::Consume(frames) => {
                t.extend(frames);
                out.push(t);
            }
            Outcome::Pass(frames) => {
                t.extend(frames);
                if passes < MAX_PASSES {
                    feed(g, t, sym, out, passes + 1);
                }
            }
        }
    }
}

fn step(g: &Grammar, frame: Frame, sym: Sym) -> Vec<Outcome> {
    match frame {
        Frame::Reply(f) => reply_grammar::step(g, f, sym),
        Frame::Json(f) => json::step(g, f, sym),
    }
}

/// Removes repeated threads (two `anyOf` branches can describe the same continuation).
fn dedup(threads: &mut Vec<Thread>) {
    let mut i = 0;
    while i < threads.len() {
        if threads[..i].contains(&threads[i]) {
            threads.remove(i);
        } else {
            i += 1;
        }
    }
}

/// The byte symbols of `bytes`.
pub fn bytes(bytes: &[u8]) -> impl Iterator<Item = Sym> + '_ {
    bytes.iter().map(|&b| Sym::Byte(b))
}
