//! The structure of a K3 reply (spec §8.4; the grammar `tokenizer::chat::reply` reads) as
//! matcher frames: the think channel, the response channel, the tools block with its calls
//! and their arguments, the end of the message and the end id. A constrained reply is one the
//! chat reader parses without error: tags exactly as the reader wants them (`call
//! tool="NAME" index="i"`, `argument key="K" type="T"`, `json type="object"`), an argument's
//! value of its declared type (JSON for the five JSON types, raw text for `string`), each key
//! at most once.

use super::json::{self, Scan};
use super::matcher::{Ctl, Frame, Outcome, Sym};
use super::schema::{Node, NodeId, Types};
use super::{Grammar, Mode};

#[derive(Debug, Clone, PartialEq)]
pub enum ReplyFrame {
    /// The think channel: any text; `<|close|>` ends it (forced after the thinking budget).
    Think,
    /// Nothing is constrained any more (an unconstrained reply past its thinking).
    Free,
    /// The response channel has just opened.
    Content,
    /// Inside the tools block after `calls` calls.
    Tools { calls: u16 },
    /// Inside call of `tool`: arguments written (bit i: the tool's property i), how many,
    /// and whether the arguments came as one `json` block (then only the call's end is due).
    Call {
        tool: u16,
        used: u128,
        args: u16,
        json_block: bool,
    },
    /// A fixed run of symbols, `at` of them matched.
    Lit { lit: Lit, at: u16 },
    /// A raw `string` argument's text (ends at `<|close|>`).
    RawStr {
        min: u32,
        max: Option<u32>,
        scan: Scan,
    },
    /// A raw `string` argument that must be enum value `alt` of `node`.
    RawLit { node: NodeId, alt: u16, at: u16 },
    /// `<|end_of_msg|>` or `[EOS]` is due.
    EndId,
}

/// The fixed runs of a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lit {
    /// `think <|sep|> <|open|> response <|sep|>`, after the think channel's `<|close|>`.
    ThinkTail,
    /// `response <|sep|> <|open|> tools <|sep|>`, after an empty response's `<|close|>`.
    ToolsOpen,
    /// `<|close|> response <|sep|> <|close|> message <|sep|>`, after a JSON response.
    ResponseEnd,
    /// `tools <|sep|> <|close|> message <|sep|>`, after the last call's `<|close|>`.
    ToolsEnd,
    /// `call <|sep|>`, after a call's `<|close|>`.
    CallEnd,
    /// `<|close|> argument <|sep|>`.
    ArgumentEnd,
    /// `json type="object" <|sep|>`, after `<|open|>` in a call.
    JsonTag,
    /// `<|close|> json <|sep|>`.
    JsonEnd,
    /// `call tool="NAME" index="I" <|sep|>` for tool `tool` and call number `index` (from 1).
    CallTag { tool: u16, index: u16 },
    /// `argument key="K" type="T" <|sep|>` for property `prop` of tool `tool`, type `ty`.
    ArgumentTag { tool: u16, prop: u16, ty: Types },
}

pub fn frame(f: ReplyFrame) -> Frame {
    Frame::Reply(f)
}

fn lit(lit: Lit) -> Frame {
    frame(ReplyFrame::Lit { lit, at: 0 })
}

/// The symbol `at` of a fixed run, `None` past its end.
fn lit_sym(g: &Grammar, lit: Lit, at: usize) -> Option<Sym> {
    use Ctl::{Close, Open, Sep};
    let text = |parts: &[Part]| -> Option<Sym> {
        let mut at = at;
        for part in parts {
            match part {
                Part::Text(t) if at < t.len() => return Some(Sym::Byte(t[at])),
                Part::Text(t) => at -= t.len(),
                Part::Ctl(c) if at == 0 => return Some(Sym::Ctl(*c)),
                Part::Ctl(_) => at -= 1,
            }
        }
        None
    };
    match lit {
        Lit::ThinkTail => text(&[
            Part::Text(b"think"),
            Part::Ctl(Sep),
            Part::Ctl(Open),
            Part::Text(b"response"),
            Part::Ctl(Sep),
        ]),
        Lit::ToolsOpen => text(&[
            Part::Text(b"response"),
            Part::Ctl(Sep),
            Part::Ctl(Open),
            Part::Text(b"tools"),
            Part::Ctl(Sep),
        ]),
        Lit::ResponseEnd => text(&[
            Part::Ctl(Close),
            Part::Text(b"response"),
            Part::Ctl(Sep),
            Part::Ctl(Close),
            Part::Text(b"message"),
            Part::Ctl(Sep),
        ]),
        Lit::ToolsEnd => text(&[
            Part::Text(b"tools"),
            Part::Ctl(Sep),
            Part::Ctl(Close),
            Part::Text(b"message"),
            Part::Ctl(Sep),
        ]),
        Lit::CallEnd => text(&[Part::Text(b"call"), Part::Ctl(Sep)]),
        Lit::ArgumentEnd => text(&[Part::Ctl(Close), Part::Text(b"argument"), Part::Ctl(Sep)]),
        Lit::JsonTag => text(&[Part::Text(br#"json type="object""#), Part::Ctl(Sep)]),
        Lit::JsonEnd => text(&[Part::Ctl(Close), Part::Text(b"json"), Part::Ctl(Sep)]),
        Lit::CallTag { tool, index } => {
            let digits = index.to_string();
            text(&[
                Part::Text(&g.tools[tool as usize].call_tag),
                Part::Text(digits.as_bytes()),
                Part::Text(b"\""),
                Part::Ctl(Sep),
            ])
        }
        Lit::ArgumentTag { tool, prop, ty } => {
            let name = ty.names().next().map_or("", |(_, n)| n);
            text(&[
                Part::Text(&g.tools[tool as usize].argument_tags[prop as usize]),
                Part::Text(name.as_bytes()),
                Part::Text(b"\""),
                Part::Ctl(Sep),
            ])
        }
    }
}

/// The fewest ids the fixed run `lit` can take: one per control symbol, one per run of text
/// between them (an id may hold many bytes, never two runs apart of a control).
pub fn least_ids(g: &Grammar, lit: Lit) -> usize {
    let mut ids = 0;
    let mut in_text = false;
    for sym in (0..).map_while(|at| lit_sym(g, lit, at)) {
        match sym {
            Sym::Ctl(_) => {
                ids += 1;
                in_text = false;
            }
            Sym::Byte(_) if !in_text => {
                ids += 1;
                in_text = true;
            }
            Sym::Byte(_) => {}
        }
    }
    ids
}

enum Part<'a> {
    Text(&'a [u8]),
    Ctl(Ctl),
}

pub fn step(g: &Grammar, f: ReplyFrame, sym: Sym) -> Vec<Outcome> {
    match f {
        ReplyFrame::Free => Outcome::consume([frame(ReplyFrame::Free)]),
        ReplyFrame::Think => match sym {
            Sym::Byte(_) => Outcome::consume([frame(ReplyFrame::Think)]),
            Sym::Ctl(Ctl::Close) => {
                let next = match g.mode {
                    Mode::Free => ReplyFrame::Free,
                    _ => ReplyFrame::Content,
                };
                Outcome::consume([frame(next), lit(Lit::ThinkTail)])
            }
            // Unconstrained, a reply that breaks its structure is the model's to break.
            Sym::Ctl(_) if g.mode == Mode::Free => Outcome::consume([frame(ReplyFrame::Free)]),
            Sym::Ctl(_) => Vec::new(),
        },
        ReplyFrame::Content => content(g, sym),
        ReplyFrame::Tools { calls } => match sym {
            Sym::Ctl(Ctl::Open) if g.max_calls.is_none_or(|m| calls < m) => (0..g.tools.len())
                .map(|tool| {
                    Outcome::Consume(vec![
                        frame(ReplyFrame::Tools { calls: calls + 1 }),
                        frame(ReplyFrame::Call {
                            tool: tool as u16,
                            used: 0,
                            args: 0,
                            json_block: false,
                        }),
                        lit(Lit::CallTag {
                            tool: tool as u16,
                            index: calls + 1,
                        }),
                    ])
                })
                .collect(),
            Sym::Ctl(Ctl::Close) if calls >= 1 => {
                Outcome::consume([frame(ReplyFrame::EndId), lit(Lit::ToolsEnd)])
            }
            _ => Vec::new(),
        },
        ReplyFrame::Call {
            tool,
            used,
            args,
            json_block,
        } => call(g, tool, used, args, json_block, sym),
        ReplyFrame::Lit { lit: l, at } => match lit_sym(g, l, at as usize) {
            Some(expected) if expected == sym => {
                if lit_sym(g, l, at as usize + 1).is_none() {
                    Outcome::consume([])
                } else {
                    Outcome::consume([frame(ReplyFrame::Lit { lit: l, at: at + 1 })])
                }
            }
            _ => Vec::new(),
        },
        ReplyFrame::RawStr { min, max, scan } => match sym {
            Sym::Byte(b) => match scan.step(b, false, max) {
                Some(scan) => Outcome::consume([frame(ReplyFrame::RawStr { min, max, scan })]),
                None => Vec::new(),
            },
            Sym::Ctl(Ctl::Close) if scan.is_neutral() && scan.chars >= min => Outcome::pass([]),
            Sym::Ctl(_) => Vec::new(),
        },
        ReplyFrame::RawLit { node, alt, at } => {
            let Node::Enum { raw, .. } = &g.nodes[node] else {
                return Vec::new();
            };
            let Some(text) = &raw[alt as usize] else {
                return Vec::new();
            };
            match sym {
                Sym::Byte(b) if text.get(at as usize) == Some(&b) => {
                    Outcome::consume([frame(ReplyFrame::RawLit {
                        node,
                        alt,
                        at: at + 1,
                    })])
                }
                Sym::Ctl(Ctl::Close) if at as usize == text.len() => Outcome::pass([]),
                _ => Vec::new(),
            }
        }
        ReplyFrame::EndId => match sym {
            Sym::Ctl(Ctl::End) => Outcome::consume([]),
            _ => Vec::new(),
        },
    }
}

/// The response channel's first symbol.
fn content(g: &Grammar, sym: Sym) -> Vec<Outcome> {
    let tools = || {
        Outcome::Consume(vec![
            frame(ReplyFrame::Tools { calls: 0 }),
            lit(Lit::ToolsOpen),
        ])
    };
    let json = |root: NodeId| {
        Outcome::Pass(vec![
            frame(ReplyFrame::EndId),
            lit(Lit::ResponseEnd),
            json::frame(json::JsonFrame::Tail {
                ws: json::Ws::new(json::PRETTY),
            }),
            json::value(root, Types::ALL, json::PRETTY),
        ])
    };
    match (g.mode, sym) {
        (Mode::Tools, Sym::Ctl(Ctl::Close)) => vec![tools()],
        (Mode::Json(root), _) => vec![json(root)],
        (Mode::JsonOrTools(_), Sym::Ctl(Ctl::Close)) => vec![tools()],
        (Mode::JsonOrTools(root), _) => vec![json(root)],
        _ => Vec::new(),
    }
}

/// A symbol inside a call: an argument (or the one `json` block) opens, or the call ends.
fn call(g: &Grammar, tool: u16, used: u128, args: u16, json_block: bool, sym: Sym) -> Vec<Outcome> {
    let spec = &g.tools[tool as usize];
    let Node::Object(object) = &g.nodes[spec.root] else {
        return Vec::new();
    };
    match sym {
        Sym::Ctl(Ctl::Close) if json_block || object.required & !used == 0 => {
            Outcome::consume([lit(Lit::CallEnd)])
        }
        Sym::Ctl(Ctl::Open) if !json_block => {
            let mut out = Vec::new();
            for (i, property) in object.properties.iter().enumerate() {
                if used & (1 << i) != 0 {
                    continue;
                }
                let types = g.types(property.node);
                for (ty, _) in types.names() {
                    let head = [
                        frame(ReplyFrame::Call {
                            tool,
                            used: used | (1 << i),
                            args: args + 1,
                            json_block,
                        }),
                        lit(Lit::ArgumentEnd),
                    ];
                    let tag = lit(Lit::ArgumentTag {
                        tool,
                        prop: i as u16,
                        ty,
                    });
                    if ty == Types::STRING {
                        for raw in raw_values(g, property.node, 0) {
                            let mut frames = head.to_vec();
                            frames.push(frame(raw));
                            frames.push(tag.clone());
                            out.push(Outcome::Consume(frames));
                        }
                    } else {
                        let mut frames = head.to_vec();
                        frames.push(json::frame(json::JsonFrame::Tail {
                            ws: json::Ws::new(json::SPACED),
                        }));
                        frames.push(json::value(property.node, ty, json::SPACED));
                        frames.push(tag);
                        out.push(Outcome::Consume(frames));
                    }
                }
            }
            if args == 0 {
                out.push(Outcome::Consume(vec![
                    frame(ReplyFrame::Call {
                        tool,
                        used,
                        args,
                        json_block: true,
                    }),
                    lit(Lit::JsonEnd),
                    json::frame(json::JsonFrame::Tail {
                        ws: json::Ws::new(json::SPACED),
                    }),
                    json::value(spec.root, Types::OBJECT, json::SPACED),
                    lit(Lit::JsonTag),
                ]));
            }
            out
        }
        _ => Vec::new(),
    }
}

/// The raw-text frames a `string` argument of `node` may take: free text within the length
/// limits, or one of the enum's strings exactly.
fn raw_values(g: &Grammar, node: NodeId, depth: u8) -> Vec<ReplyFrame> {
    if depth > 32 {
        return Vec::new();
    }
    match &g.nodes[node] {
        Node::Any => vec![ReplyFrame::RawStr {
            min: 0,
            max: None,
            scan: Scan::default(),
        }],
        Node::String {
            min_chars,
            max_chars,
        } => vec![ReplyFrame::RawStr {
            min: *min_chars,
            max: *max_chars,
            scan: Scan::default(),
        }],
        Node::Enum { raw, .. } => raw
            .iter()
            .enumerate()
            .filter(|(_, r)| r.is_some())
            .map(|(alt, _)| ReplyFrame::RawLit {
                node,
                alt: alt as u16,
                at: 0,
            })
            .collect(),
        Node::Union(ids) => ids
            .iter()
            .flat_map(|&id| raw_values(g, id, depth + 1))
            .collect(),
        _ => Vec::new(),
    }
}
