//! Constrained decoding and the thinking budget (issue 34 points 4 and 6): a guide
//! ([`crate::engine::guide`]) for a chat reply that masks the ids which would break it.
//!
//! * **The thinking budget** (spec §8.4): after `budget` ids in the think channel the only
//!   allowed id is `<|close|>`, then `think <|sep|> <|open|> response <|sep|>` (the template's
//!   own close of the channel), and the model answers. Before the budget nothing is masked.
//! * **Tool calls that parse** (`tool_choice` `required` or a named function): after the
//!   thinking, an empty response and a tools block of one or more calls (exactly one when
//!   parallel calls are off) of the allowed tools, each call's arguments valid against its
//!   tool's parameter schema, in the template's argument form or one `json` block (spec §8.2).
//! * **JSON output** (`response_format` `json_object` / `json_schema`): the response is JSON
//!   text valid against the schema (any object for `json_object`); with tools declared and
//!   `tool_choice` `auto` the model may instead call tools.
//!
//! Exact: the guide only removes ids; greedy takes the best allowed id, sampling draws among
//! them (`docs/decoding.md`). A reply without a constraint and without a budget gets no guide
//! at all, so it is decided exactly as before.
//!
//! Modules: [`schema`] compiles JSON schemas (the subset real clients send, everything else
//! refused by name); [`matcher`] runs threads of frames over the reply's symbols; [`json`] and
//! [`reply_grammar`] are the frames; [`vocab`] turns a matcher state into the set of allowed ids.

pub mod json;
pub mod matcher;
pub mod reply_grammar;
pub mod schema;
pub mod vocab;

use std::sync::Arc;

use crate::engine::guide::{Allowed, Guide, Guiding, IdSet};
use crate::tokenizer::chat::{Conversation, ResponseFormat, ToolChoice};
use matcher::{Ctl, Thread};
use schema::{Node, NodeId, Object, Schema, SchemaError, Types};
pub use vocab::Vocab;

/// What a reply's content must be, after its thinking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Anything (only the thinking budget applies).
    Free,
    /// JSON valid against this schema node.
    Json(NodeId),
    /// One or more tool calls.
    Tools,
    /// JSON valid against the node, or tool calls instead.
    JsonOrTools(NodeId),
}

/// A tool the reply may call.
#[derive(Debug, Clone)]
pub struct ToolSpec {
    pub name: String,
    /// `call tool="NAME" index="` (the name attribute-escaped, spec §8.1).
    pub call_tag: Vec<u8>,
    /// The arguments' schema: an object node.
    pub root: NodeId,
    /// Per property of `root`: `argument key="K" type="` (the key attribute-escaped).
    pub argument_tags: Vec<Vec<u8>>,
}

/// A reply's grammar: shared by the matchers of every generation of one request.
#[derive(Debug)]
pub struct Grammar {
    pub nodes: Vec<Node>,
    /// Per JSON type (bit index of [`Types`]): a node for any value of that type.
    pub any: [NodeId; 6],
    pub mode: Mode,
    /// The reply opens in the think channel.
    pub thinking: bool,
    /// Most ids in the think channel.
    pub budget: Option<usize>,
    pub tools: Vec<ToolSpec>,
    /// Most calls in the tools block (`Some(1)` with parallel calls off).
    pub max_calls: Option<u16>,
    vocab: Arc<Vocab>,
}

/// Why a request's constraint cannot be built: the schema and the path in it at fault, in
/// words every API shares (each transport names its own field with [`ConstraintError::field`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConstraintError {
    #[error("{place} at {error}")]
    Schema {
        place: SchemaPlace,
        error: SchemaError,
    },
    #[error("tool_choice names the function {0:?}, which is not in `tools`")]
    UnknownFunction(String),
    #[error("{place}: the arguments must be an object schema (`\"type\": \"object\"`)")]
    NotAnObject { place: SchemaPlace },
}

/// Which schema of a request a [`ConstraintError`] is about.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaPlace {
    #[error("the parameters schema of tools[{index}] (`{name}`)")]
    Tool { index: usize, name: String },
    #[error("the response format's schema")]
    ResponseFormat,
}

impl ConstraintError {
    /// The request field at fault, named alike by OpenAI and Anthropic.
    pub fn field(&self) -> &'static str {
        match self {
            ConstraintError::Schema {
                place: SchemaPlace::ResponseFormat,
                ..
            } => "response_format",
            ConstraintError::Schema { .. } | ConstraintError::NotAnObject { .. } => "tools",
            ConstraintError::UnknownFunction(_) => "tool_choice",
        }
    }
}

impl Grammar {
    /// The JSON types of `node`'s values.
    pub fn types(&self, node: NodeId) -> Types {
        schema::types(&self.nodes, node)
    }

    /// The fewest ids a reply that must call a tool ([`Mode::Tools`]) takes from its start
    /// to its end id, `None` in the other modes: a lower bound — every control symbol is an id
    /// of its own, every run of text between them at least one, an argument's value maybe
    /// none — so a `max_tokens` below it holds no call (issue 45.4: a forced call was cut off
    /// by `length` without a word of it). The form: the thinking's close and tail if the
    /// reply opens in it, an empty response, the tools block with one call of the cheapest
    /// allowed tool (its required arguments, tagged or as one `json` block), the end.
    pub fn least_call_ids(&self) -> Option<usize> {
        use reply_grammar::{Lit, least_ids};
        if self.mode != Mode::Tools {
            return None;
        }
        let think = if self.thinking {
            1 + least_ids(self, Lit::ThinkTail)
        } else {
            0
        };
        let call = (0..self.tools.len())
            .map(|tool| {
                let tool = tool as u16;
                let required = match &self.nodes[self.tools[tool as usize].root] {
                    Node::Object(o) => o.required.count_ones() as usize,
                    _ => 0,
                };
                // `<|open|>`, tag, value, end: per required argument, or one `json` block
                // (`<|open|>`, tag, at least one id of JSON, end).
                let tagged: usize = match &self.nodes[self.tools[tool as usize].root] {
                    Node::Object(o) => (0..o.properties.len())
                        .filter(|&i| o.required & (1 << i) != 0)
                        .map(|prop| {
                            let tag = Lit::ArgumentTag {
                                tool,
                                prop: prop as u16,
                                ty: Types::STRING,
                            };
                            1 + least_ids(self, tag) + least_ids(self, Lit::ArgumentEnd)
                        })
                        .sum(),
                    _ => 0,
                };
                let block = 1 + least_ids(self, Lit::JsonTag) + 1 + least_ids(self, Lit::JsonEnd);
                let arguments = if required == 0 { 0 } else { tagged.min(block) };
                1 + least_ids(self, Lit::CallTag { tool, index: 1 })
                    + arguments
                    + 1
                    + least_ids(self, Lit::CallEnd)
            })
            .min()?;
        Some(
            think
                + 1
                + least_ids(self, Lit::ToolsOpen)
                + call
                + 1
                + least_ids(self, Lit::ToolsEnd)
                + 1,
        )
    }
}

/// What a chat reply must satisfy, from its conversation.
#[derive(Debug, Clone, Copy)]
pub struct ReplyRules {
    /// The generation prompt opened the think channel.
    pub thinking: bool,
    /// Most ids in the think channel (`None`: unbounded).
    pub budget: Option<usize>,
}

/// The guide of a chat reply, or `None` when nothing constrains it (no tool or format
/// constraint, and no budget that applies): such a reply is decided exactly as without this
/// module.
pub fn guide(
    vocab: &Arc<Vocab>,
    conversation: &Conversation,
    rules: ReplyRules,
) -> Result<Option<Arc<ReplyGuide>>, ConstraintError> {
    let mut schema = Schema::default();
    let any = any_nodes(&mut schema);
    let forced = match &conversation.tool_choice {
        ToolChoice::Required => Some(None),
        ToolChoice::Function(name) => Some(Some(name.as_str())),
        ToolChoice::Auto | ToolChoice::None => None,
    };
    let format = match &conversation.response_format {
        ResponseFormat::Text => None,
        ResponseFormat::JsonObject => Some(any[5]),
        ResponseFormat::JsonSchema(s) => {
            Some(schema.add(s).map_err(|error| ConstraintError::Schema {
                place: SchemaPlace::ResponseFormat,
                error,
            })?)
        }
    };
    let tools_offered =
        !conversation.tools.is_empty() && conversation.tool_choice != ToolChoice::None;
    let mode = match (forced, format) {
        (Some(_), _) => Mode::Tools,
        (None, Some(root)) if tools_offered => Mode::JsonOrTools(root),
        (None, Some(root)) => Mode::Json(root),
        (None, None) => Mode::Free,
    };
    let budget = rules.budget.filter(|_| rules.thinking);
    if mode == Mode::Free && budget.is_none() {
        return Ok(None);
    }
    let mut tools = Vec::new();
    if matches!(mode, Mode::Tools | Mode::JsonOrTools(_)) {
        if let Some(Some(name)) = forced
            && !conversation.tools.iter().any(|t| t.name == name)
        {
            return Err(ConstraintError::UnknownFunction(name.to_owned()));
        }
        for (i, tool) in conversation.tools.iter().enumerate() {
            if forced.flatten().is_some_and(|name| name != tool.name) {
                continue;
            }
            let place = || SchemaPlace::Tool {
                index: i,
                name: tool.name.clone(),
            };
            let root = match &tool.parameters {
                None => any[5],
                Some(p) => schema.add(p).map_err(|error| ConstraintError::Schema {
                    place: place(),
                    error,
                })?,
            };
            let root = object_root(&schema.nodes, root, any[5])
                .ok_or_else(|| ConstraintError::NotAnObject { place: place() })?;
            tools.push(tool_spec(&schema.nodes, &tool.name, root));
        }
    }
    let grammar = Grammar {
        nodes: schema.nodes,
        any,
        mode,
        thinking: rules.thinking,
        budget,
        tools,
        max_calls: (!conversation.parallel_tool_calls).then_some(1),
        vocab: Arc::clone(vocab),
    };
    Ok(Some(Arc::new(ReplyGuide(Arc::new(grammar)))))
}

/// The nodes "any value of type t", in the bit order of [`Types`]: null, boolean, number,
/// string, array (of anything), object (anything under any key).
fn any_nodes(schema: &mut Schema) -> [NodeId; 6] {
    let anything = schema.push(Node::Any);
    [
        schema.push(Node::Null),
        schema.push(Node::Boolean),
        schema.push(Node::Number {
            integer: false,
            bounds: None,
        }),
        schema.push(Node::String {
            min_chars: 0,
            max_chars: None,
        }),
        schema.push(Node::Array {
            items: anything,
            min_items: 0,
            max_items: None,
        }),
        schema.push(Node::Object(Object {
            properties: Vec::new(),
            required: 0,
            additional: Some(anything),
        })),
    ]
}

/// The object node a tool's parameters describe: through references (a union of one), and
/// `{}` (any value) as any object.
fn object_root(nodes: &[Node], mut node: NodeId, any_object: NodeId) -> Option<NodeId> {
    for _ in 0..32 {
        match &nodes[node] {
            Node::Object(_) => return Some(node),
            Node::Any => return Some(any_object),
            Node::Union(ids) if ids.len() == 1 => node = ids[0],
            _ => return None,
        }
    }
    None
}

/// The tags a call of `name` writes (spec §8.1: attribute values escaped, `&` first).
fn tool_spec(nodes: &[Node], name: &str, root: NodeId) -> ToolSpec {
    let escape = |v: &str| v.replace('&', "&amp;").replace('"', "&quot;");
    let keys: Vec<String> = match &nodes[root] {
        Node::Object(o) => o.properties.iter().map(|p| p.name.clone()).collect(),
        _ => Vec::new(),
    };
    ToolSpec {
        name: name.to_owned(),
        call_tag: format!("call tool=\"{}\" index=\"", escape(name)).into_bytes(),
        root,
        argument_tags: keys
            .iter()
            .map(|k| format!("argument key=\"{}\" type=\"", escape(k)).into_bytes())
            .collect(),
    }
}

/// The guide of one request's chat reply.
#[derive(Debug)]
pub struct ReplyGuide(Arc<Grammar>);

impl ReplyGuide {
    pub fn grammar(&self) -> &Grammar {
        &self.0
    }

    /// A matcher at the start of the reply.
    pub fn matcher(&self) -> Matcher {
        let first = if self.0.thinking {
            reply_grammar::ReplyFrame::Think
        } else if self.0.mode == Mode::Free {
            reply_grammar::ReplyFrame::Free
        } else {
            reply_grammar::ReplyFrame::Content
        };
        Matcher {
            grammar: Arc::clone(&self.0),
            threads: vec![vec![reply_grammar::frame(first)]],
            think_ids: 0,
            mask: IdSet::new(self.0.vocab.size()),
            cached: None,
        }
    }
}

impl Guide for ReplyGuide {
    fn start(&self) -> Box<dyn Guiding> {
        Box::new(self.matcher())
    }
}

/// One generation's position in its reply's grammar.
pub struct Matcher {
    grammar: Arc<Grammar>,
    threads: Vec<Thread>,
    /// Ids read in the think channel.
    think_ids: usize,
    mask: IdSet,
    /// What [`Guiding::allowed`] answered at this position (the mask holds an `Only`).
    cached: Option<Cached>,
}

#[derive(Debug, Clone, Copy)]
enum Cached {
    Any,
    Forced(u32),
    Only,
}

impl Matcher {
    fn in_think(&self) -> bool {
        matches!(
            self.threads.as_slice(),
            [t] if t.last() == Some(&reply_grammar::frame(reply_grammar::ReplyFrame::Think))
        )
    }

    fn unconstrained(&self) -> bool {
        self.threads
            .iter()
            .all(|t| t.last() == Some(&reply_grammar::frame(reply_grammar::ReplyFrame::Free)))
            && !self.threads.is_empty()
    }

    fn compute(&mut self) -> Cached {
        let g = &self.grammar;
        if self.unconstrained() {
            return Cached::Any;
        }
        if self.in_think() {
            if g.budget.is_some_and(|b| self.think_ids >= b) {
                return Cached::Forced(g.vocab.control(Ctl::Close));
            }
            if g.mode == Mode::Free {
                return Cached::Any;
            }
            self.mask.clear();
            self.mask.union_with(g.vocab.text());
            self.mask.insert(g.vocab.control(Ctl::Close));
            return Cached::Only;
        }
        let vocab = Arc::clone(&g.vocab);
        vocab.allowed(g, &self.threads, &mut self.mask);
        match self.mask.single() {
            Some(id) => Cached::Forced(id),
            None => Cached::Only,
        }
    }

    /// Whether `id` could be read next: its symbols tried on every thread (the definition
    /// the allowed sets must agree with; [`Guiding::allowed`] computes them faster).
    pub fn would_take(&self, id: u32) -> bool {
        let vocab = &self.grammar.vocab;
        // Added ids other than the controls are never constrained output.
        if !vocab.text().contains(id) && !vocab.is_control(id) {
            return false;
        }
        let syms = vocab.symbols(id);
        !matcher::advance_all(&self.grammar, &self.threads, &syms).is_empty()
    }

    /// The threads still alive (for tests: none means the ids read broke the grammar).
    pub fn is_alive(&self) -> bool {
        !self.threads.is_empty()
    }

    /// The reply has ended (its end id was read).
    pub fn is_finished(&self) -> bool {
        self.threads.iter().any(Vec::is_empty)
    }
}

impl Guiding for Matcher {
    fn allowed(&mut self) -> Allowed<'_> {
        let cached = match self.cached {
            Some(c) => c,
            None => {
                let c = self.compute();
                self.cached = Some(c);
                c
            }
        };
        match cached {
            Cached::Any => Allowed::Any,
            Cached::Forced(id) => Allowed::Forced(id),
            Cached::Only => Allowed::Only(&self.mask),
        }
    }

    fn accept(&mut self, id: u32) {
        let thinking = self.in_think();
        let syms = self.grammar.vocab.symbols(id);
        self.threads = matcher::advance_all(&self.grammar, &self.threads, &syms);
        if thinking {
            self.think_ids += 1;
        }
        self.cached = None;
    }
}
