//! JSON text valid against a compiled schema, byte by byte (RFC 8259 with the limits
//! `docs/decoding.md` gives): the frames of a value, an object, an array, a string, a number and
//! a literal. A frame only lets a byte through when some completion of the text so far is
//! still valid, so a matcher never reaches a state without an allowed continuation.
//!
//! Surface form: whitespace (space, tab, newline, carriage return) is allowed where JSON
//! allows it, at most a [`Ws`] limit of bytes in a row — [`PRETTY`] in a JSON response (room to
//! indent), [`SPACED`] in a tool call's argument values (the template's own form has one space
//! after `,` and `:`) — so a model cannot pad forever; strings
//! are valid UTF-8 with the escapes `\" \\ \/ \b \f \n \r \t \uXXXX` (no surrogate code
//! points: they cannot form valid UTF-8 alone); numbers are JSON numbers of bounded length.
//! Enum and const values are written in their canonical (compact) JSON text; object keys as
//! declared, each at most once, the required ones all present.

use super::Grammar;
use super::matcher::{Frame, Outcome, Sym};
use super::schema::{
    BOUNDED_FRAC_DIGITS, BOUNDED_INT_DIGITS, Bounds, NANO, Node, NodeId, Object, Types,
};

/// Whitespace bytes in a row at one place of a JSON response (a newline and indentation).
pub const PRETTY: u8 = 32;
/// ... and of a tool call's argument value (spec §8.2 writes them with `", "` and `": "`).
pub const SPACED: u8 = 1;

/// Whitespace taken at the current place, and the most allowed in a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ws {
    used: u8,
    max: u8,
}

impl Ws {
    pub fn new(max: u8) -> Ws {
        Ws { used: 0, max }
    }

    /// One more whitespace byte, if the limit allows it.
    fn take(self) -> Option<Ws> {
        (self.used < self.max).then_some(Ws {
            used: self.used + 1,
            max: self.max,
        })
    }

    /// The next place (a new run of whitespace may start).
    fn reset(self) -> Ws {
        Ws::new(self.max)
    }
}
/// Digits of an unbounded number's integer part, fraction and exponent.
const MAX_INT_DIGITS: u8 = 20;
const MAX_FRAC_DIGITS: u8 = 20;
const MAX_EXP_DIGITS: u8 = 3;

#[derive(Debug, Clone, PartialEq)]
pub enum JsonFrame {
    /// Before a value of `node`, restricted to `types`; `ws` whitespace bytes taken so far.
    Value {
        node: NodeId,
        types: Types,
        ws: Ws,
    },
    /// Inside the canonical text of enum value `alt` of `node`, `at` bytes matched.
    Literal {
        node: NodeId,
        alt: u16,
        at: u16,
    },
    /// Inside `true`, `false` or `null`.
    Word {
        word: &'static [u8],
        at: u8,
    },
    /// Inside a string (after its opening quote).
    Str {
        min: u32,
        max: Option<u32>,
        scan: Scan,
    },
    Num {
        integer: bool,
        bounds: Option<Bounds>,
        num: Num,
    },
    Obj(Box<Obj>),
    Arr {
        node: NodeId,
        stage: ArrStage,
        count: u32,
        ws: Ws,
    },
    /// Optional whitespace after a value, then the symbol goes to the frame below.
    Tail {
        ws: Ws,
    },
}

/// A frame of the matcher's stack.
pub fn frame(f: JsonFrame) -> Frame {
    Frame::Json(f)
}

/// A value of `node` of the types `types`, with whitespace runs of at most `max_ws`.
pub fn value(node: NodeId, types: Types, max_ws: u8) -> Frame {
    frame(JsonFrame::Value {
        node,
        types,
        ws: Ws::new(max_ws),
    })
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

pub fn step(g: &Grammar, f: JsonFrame, sym: Sym) -> Vec<Outcome> {
    let Sym::Byte(b) = sym else {
        // A control id ends JSON text: only a value already complete may pass it on.
        return match f {
            JsonFrame::Tail { .. } => Outcome::pass([]),
            JsonFrame::Num {
                integer,
                bounds,
                num,
            } if num.can_end(integer, bounds) => Outcome::pass([]),
            _ => Vec::new(),
        };
    };
    match f {
        JsonFrame::Value { node, types, ws } => {
            if is_ws(b) {
                return match ws.take() {
                    Some(ws) => Outcome::consume([frame(JsonFrame::Value { node, types, ws })]),
                    None => Vec::new(),
                };
            }
            start_value(g, node, types, ws.max, b)
        }
        JsonFrame::Literal { node, alt, at } => {
            let Node::Enum { json, .. } = &g.nodes[node] else {
                return Vec::new();
            };
            let text = &json[alt as usize];
            if text.get(at as usize) != Some(&b) {
                return Vec::new();
            }
            if at as usize + 1 == text.len() {
                Outcome::consume([])
            } else {
                Outcome::consume([frame(JsonFrame::Literal {
                    node,
                    alt,
                    at: at + 1,
                })])
            }
        }
        JsonFrame::Word { word, at } => {
            if word.get(at as usize) != Some(&b) {
                return Vec::new();
            }
            if at as usize + 1 == word.len() {
                Outcome::consume([])
            } else {
                Outcome::consume([frame(JsonFrame::Word { word, at: at + 1 })])
            }
        }
        JsonFrame::Str { min, max, scan } => {
            if b == b'"' && scan.is_neutral() {
                return if scan.chars >= min {
                    Outcome::consume([])
                } else {
                    Vec::new()
                };
            }
            match scan.step(b, true, max) {
                Some(scan) => Outcome::consume([frame(JsonFrame::Str { min, max, scan })]),
                None => Vec::new(),
            }
        }
        JsonFrame::Num {
            integer,
            bounds,
            num,
        } => match num.step(b, integer, bounds) {
            Some(num) => Outcome::consume([frame(JsonFrame::Num {
                integer,
                bounds,
                num,
            })]),
            // Not part of the number: it ends here if it may, and the byte goes on.
            None if num.can_end(integer, bounds) => Outcome::pass([]),
            None => Vec::new(),
        },
        JsonFrame::Obj(o) => object_step(g, *o, b),
        JsonFrame::Arr {
            node,
            stage,
            count,
            ws,
        } => array_step(g, node, stage, count, ws, b),
        JsonFrame::Tail { ws } if is_ws(b) => match ws.take() {
            Some(ws) => Outcome::consume([frame(JsonFrame::Tail { ws })]),
            None => Vec::new(),
        },
        JsonFrame::Tail { .. } => Outcome::pass([]),
    }
}

/// The first byte of a value of `node` restricted to `types`: which kinds of value it can
/// start (each alternative a thread of its own).
fn start_value(g: &Grammar, node: NodeId, types: Types, max_ws: u8, b: u8) -> Vec<Outcome> {
    let mut out = Vec::new();
    start_into(g, node, types, max_ws, b, &mut out, 0);
    out
}

fn start_into(
    g: &Grammar,
    node: NodeId,
    types: Types,
    max_ws: u8,
    b: u8,
    out: &mut Vec<Outcome>,
    depth: u8,
) {
    // A union of unions nests only as deep as the schema's references; a cycle of pure
    // unions (`{"$ref": "#"}` alone) describes nothing and is cut here.
    if depth > 32 {
        return;
    }
    let start = |f: JsonFrame| Outcome::Pass(vec![frame(f)]);
    match &g.nodes[node] {
        Node::Union(ids) => {
            for &id in ids {
                start_into(g, id, types, max_ws, b, out, depth + 1);
            }
        }
        Node::Any => {
            for t in [
                Types::NULL,
                Types::BOOLEAN,
                Types::NUMBER,
                Types::STRING,
                Types::ARRAY,
                Types::OBJECT,
            ] {
                if types.has(t) {
                    start_into(
                        g,
                        g.any[t.0.trailing_zeros() as usize],
                        t,
                        max_ws,
                        b,
                        out,
                        depth + 1,
                    );
                }
            }
        }
        Node::Null if types.has(Types::NULL) && b == b'n' => out.push(start(JsonFrame::Word {
            word: b"null",
            at: 0,
        })),
        Node::Boolean if types.has(Types::BOOLEAN) && (b == b't' || b == b'f') => {
            let word: &'static [u8] = if b == b't' { b"true" } else { b"false" };
            out.push(start(JsonFrame::Word { word, at: 0 }))
        }
        Node::Number { integer, bounds }
            if types.has(Types::NUMBER) && (b == b'-' || b.is_ascii_digit()) =>
        {
            out.push(start(JsonFrame::Num {
                integer: *integer,
                bounds: *bounds,
                num: Num::default(),
            }))
        }
        Node::String {
            min_chars,
            max_chars,
        } if types.has(Types::STRING) && b == b'"' => {
            out.push(Outcome::Consume(vec![frame(JsonFrame::Str {
                min: *min_chars,
                max: *max_chars,
                scan: Scan::default(),
            })]))
        }
        Node::Enum { json, .. } => {
            for (alt, text) in json.iter().enumerate() {
                let t = literal_type(text);
                if types.has(t) && text.first() == Some(&b) {
                    out.push(start(JsonFrame::Literal {
                        node,
                        alt: alt as u16,
                        at: 0,
                    }));
                }
            }
        }
        Node::Array { .. } if types.has(Types::ARRAY) && b == b'[' => {
            out.push(Outcome::Consume(vec![frame(JsonFrame::Arr {
                node,
                stage: ArrStage::Open,
                count: 0,
                ws: Ws::new(max_ws),
            })]))
        }
        Node::Object(_) if types.has(Types::OBJECT) && b == b'{' => out.push(Outcome::Consume(
            vec![frame(JsonFrame::Obj(Box::new(Obj {
                node,
                stage: ObjStage::Open,
                used: 0,
                free: Vec::new(),
                ws: Ws::new(max_ws),
            })))],
        )),
        _ => {}
    }
}

/// The JSON type of a canonical value text.
fn literal_type(text: &[u8]) -> Types {
    match text.first() {
        Some(b'n') => Types::NULL,
        Some(b't' | b'f') => Types::BOOLEAN,
        Some(b'"') => Types::STRING,
        Some(b'[') => Types::ARRAY,
        Some(b'{') => Types::OBJECT,
        _ => Types::NUMBER,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArrStage {
    /// After `[`.
    Open,
    /// After an item.
    Item,
}

fn array_step(
    g: &Grammar,
    node: NodeId,
    stage: ArrStage,
    count: u32,
    ws: Ws,
    b: u8,
) -> Vec<Outcome> {
    let Node::Array {
        items,
        min_items,
        max_items,
    } = &g.nodes[node]
    else {
        return Vec::new();
    };
    let arr = |stage, count, ws| {
        frame(JsonFrame::Arr {
            node,
            stage,
            count,
            ws,
        })
    };
    if is_ws(b) {
        return match ws.take() {
            Some(ws) => Outcome::consume([arr(stage, count, ws)]),
            None => Vec::new(),
        };
    }
    let room = max_items.is_none_or(|m| count < m);
    let item = || value(*items, Types::ALL, ws.max);
    match (stage, b) {
        (_, b']') if count >= *min_items => Outcome::consume([]),
        (ArrStage::Item, b',') if room => {
            Outcome::consume([arr(ArrStage::Item, count + 1, ws.reset()), item()])
        }
        (ArrStage::Open, _) if room => {
            Outcome::pass([arr(ArrStage::Item, count + 1, ws.reset()), item()])
        }
        _ => Vec::new(),
    }
}

/// An object being written.
#[derive(Debug, Clone, PartialEq)]
pub struct Obj {
    node: NodeId,
    stage: ObjStage,
    /// Declared properties written (bit i: `properties[i]`).
    used: u128,
    /// Undeclared keys written (their JSON text, quotes excluded).
    free: Vec<Vec<u8>>,
    ws: Ws,
}

#[derive(Debug, Clone, PartialEq)]
enum ObjStage {
    /// After `{`.
    Open,
    /// Inside declared key `prop`'s text, `at` bytes matched.
    Key { prop: u16, at: u16 },
    /// Inside an undeclared key (after its opening quote).
    FreeKey { text: Vec<u8>, scan: Scan },
    /// After a key: `:` is due; `prop` is the declared property, `None` an undeclared key.
    Colon { prop: Option<u16> },
    /// After a value.
    Value,
    /// After `,`: a key is due.
    Comma,
}

fn object_step(g: &Grammar, mut o: Obj, b: u8) -> Vec<Outcome> {
    let Node::Object(spec) = &g.nodes[o.node] else {
        return Vec::new();
    };
    let ws_ok = matches!(
        o.stage,
        ObjStage::Open | ObjStage::Colon { .. } | ObjStage::Value | ObjStage::Comma
    );
    if ws_ok && is_ws(b) {
        return match o.ws.take() {
            Some(ws) => {
                o.ws = ws;
                Outcome::consume([frame(JsonFrame::Obj(Box::new(o)))])
            }
            None => Vec::new(),
        };
    }
    let complete = spec.required & !o.used == 0;
    match std::mem::replace(&mut o.stage, ObjStage::Value) {
        ObjStage::Open if b == b'}' && complete => Outcome::consume([]),
        ObjStage::Open | ObjStage::Comma if b == b'"' => key_start(spec, o),
        ObjStage::Value if b == b'}' && complete => Outcome::consume([]),
        ObjStage::Value if b == b',' && more_keys(spec, &o) => {
            o.stage = ObjStage::Comma;
            o.ws = o.ws.reset();
            Outcome::consume([frame(JsonFrame::Obj(Box::new(o)))])
        }
        ObjStage::Key { prop, at } => {
            let key = &spec.properties[prop as usize].json_key;
            if key.get(at as usize) != Some(&b) {
                return Vec::new();
            }
            o.stage = if at as usize + 1 == key.len() {
                ObjStage::Colon { prop: Some(prop) }
            } else {
                ObjStage::Key { prop, at: at + 1 }
            };
            o.ws = o.ws.reset();
            Outcome::consume([frame(JsonFrame::Obj(Box::new(o)))])
        }
        ObjStage::FreeKey { mut text, scan } => {
            if b == b'"' && scan.is_neutral() {
                // A key the schema declares (it would need that schema) or one written before
                // (a repeated key) is not a free key.
                let key: Option<String> = serde_json::from_slice(&quote(&text)).ok();
                let Some(key) = key else {
                    return Vec::new();
                };
                if spec.properties.iter().any(|p| p.name == key) || o.free.contains(&text) {
                    return Vec::new();
                }
                o.free.push(text);
                o.stage = ObjStage::Colon { prop: None };
                o.ws = o.ws.reset();
                return Outcome::consume([frame(JsonFrame::Obj(Box::new(o)))]);
            }
            match scan.step(b, true, None) {
                Some(scan) => {
                    text.push(b);
                    o.stage = ObjStage::FreeKey { text, scan };
                    Outcome::consume([frame(JsonFrame::Obj(Box::new(o)))])
                }
                None => Vec::new(),
            }
        }
        ObjStage::Colon { prop } if b == b':' => {
            let node = match prop {
                Some(p) => {
                    o.used |= 1 << p;
                    spec.properties[p as usize].node
                }
                None => match spec.additional {
                    Some(node) => node,
                    None => return Vec::new(),
                },
            };
            o.stage = ObjStage::Value;
            o.ws = o.ws.reset();
            let max_ws = o.ws.max;
            Outcome::consume([
                frame(JsonFrame::Obj(Box::new(o))),
                value(node, Types::ALL, max_ws),
            ])
        }
        _ => Vec::new(),
    }
}

/// After `"` where a key is due: one thread per declared key not yet written, and one for an
/// undeclared key when the schema allows them.
fn key_start(spec: &Object, o: Obj) -> Vec<Outcome> {
    let mut out = Vec::new();
    for (i, _) in spec.properties.iter().enumerate() {
        if o.used & (1 << i) == 0 {
            let mut k = o.clone();
            // The key text starts with the quote just read.
            k.stage = ObjStage::Key {
                prop: i as u16,
                at: 1,
            };
            k.ws = k.ws.reset();
            out.push(Outcome::Consume(vec![frame(JsonFrame::Obj(Box::new(k)))]));
        }
    }
    if spec.additional.is_some() {
        let mut k = o;
        k.stage = ObjStage::FreeKey {
            text: Vec::new(),
            scan: Scan::default(),
        };
        k.ws = k.ws.reset();
        out.push(Outcome::Consume(vec![frame(JsonFrame::Obj(Box::new(k)))]));
    }
    out
}

/// Whether another key may follow (a `,` must not lead to an object that cannot go on).
fn more_keys(spec: &Object, o: &Obj) -> bool {
    spec.additional.is_some() || (0..spec.properties.len()).any(|i| o.used & (1 << i) == 0)
}

fn quote(text: &[u8]) -> Vec<u8> {
    let mut q = Vec::with_capacity(text.len() + 2);
    q.push(b'"');
    q.extend_from_slice(text);
    q.push(b'"');
    q
}

/// The state of string text: an escape in progress, a UTF-8 sequence in progress, and the
/// characters (code points) so far. Shared by JSON strings (escapes, no raw control
/// characters) and the template's raw `string` arguments (any UTF-8 text).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Scan {
    escape: Escape,
    /// Continuation bytes still due, and the range the next one must fall in.
    need: u8,
    lo: u8,
    hi: u8,
    pub chars: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Escape {
    #[default]
    None,
    /// After `\`.
    Backslash,
    /// After `\u` and `digits` hex digits of `value`.
    Hex { digits: u8, value: u16 },
}

impl Scan {
    /// At a character boundary: no escape or UTF-8 sequence open.
    pub fn is_neutral(&self) -> bool {
        self.escape == Escape::None && self.need == 0
    }

    /// The scan after byte `b` of string text (`json`: inside a JSON string, where `"` is
    /// handled by the caller), or `None` if `b` cannot come next; `max` caps the characters.
    pub fn step(mut self, b: u8, json: bool, max: Option<u32>) -> Option<Scan> {
        if self.need > 0 {
            if !(self.lo..=self.hi).contains(&b) {
                return None;
            }
            self.need -= 1;
            (self.lo, self.hi) = (0x80, 0xBF);
            return Some(self);
        }
        let room = max.is_none_or(|m| self.chars < m);
        match self.escape {
            Escape::Backslash => {
                match b {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => {
                        self.escape = Escape::None;
                        self.chars += 1;
                    }
                    b'u' => {
                        self.escape = Escape::Hex {
                            digits: 0,
                            value: 0,
                        }
                    }
                    _ => return None,
                }
                return Some(self);
            }
            Escape::Hex { digits, value } => {
                let d = (b as char).to_digit(16)? as u16;
                let value = value << 4 | d;
                if digits == 3 {
                    // No surrogates: alone they are not a character.
                    if (0xD800..=0xDFFF).contains(&value) {
                        return None;
                    }
                    self.escape = Escape::None;
                    self.chars += 1;
                } else {
                    self.escape = Escape::Hex {
                        digits: digits + 1,
                        value,
                    };
                }
                return Some(self);
            }
            Escape::None => {}
        }
        if !room {
            return None;
        }
        match b {
            b'\\' if json => {
                self.escape = Escape::Backslash;
                return Some(self);
            }
            0..=0x1F if json => return None,
            0..=0x7F => {}
            0xC2..=0xDF => (self.need, self.lo, self.hi) = (1, 0x80, 0xBF),
            0xE0 => (self.need, self.lo, self.hi) = (2, 0xA0, 0xBF),
            0xE1..=0xEC | 0xEE..=0xEF => (self.need, self.lo, self.hi) = (2, 0x80, 0xBF),
            0xED => (self.need, self.lo, self.hi) = (2, 0x80, 0x9F),
            0xF0 => (self.need, self.lo, self.hi) = (3, 0x90, 0xBF),
            0xF1..=0xF3 => (self.need, self.lo, self.hi) = (3, 0x80, 0xBF),
            0xF4 => (self.need, self.lo, self.hi) = (3, 0x80, 0x8F),
            _ => return None,
        }
        self.chars += 1;
        Some(self)
    }
}

/// A number being written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Num {
    part: Part,
    negative: bool,
    int_digits: u8,
    frac_digits: u8,
    exp_digits: u8,
    /// The integer part's value and the fraction's digits as an integer (bounded numbers).
    int: i128,
    frac: i128,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Part {
    #[default]
    Start,
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    E,
    ExpSign,
    Exp,
}

impl Num {
    fn step(mut self, b: u8, integer: bool, bounds: Option<Bounds>) -> Option<Num> {
        let bounded = bounds.is_some();
        let (max_int, max_frac) = if bounded {
            (BOUNDED_INT_DIGITS as u8, BOUNDED_FRAC_DIGITS as u8)
        } else {
            (MAX_INT_DIGITS, MAX_FRAC_DIGITS)
        };
        let digit = b.is_ascii_digit();
        let d = (b.wrapping_sub(b'0')) as i128;
        self.part = match (self.part, b) {
            (Part::Start, b'-') => {
                self.negative = true;
                Part::Minus
            }
            (Part::Start | Part::Minus, b'0') => {
                self.int_digits = 1;
                Part::Zero
            }
            (Part::Start | Part::Minus, _) if digit => {
                self.int_digits = 1;
                self.int = d;
                Part::Int
            }
            (Part::Int, _) if digit && self.int_digits < max_int => {
                self.int_digits += 1;
                self.int = self.int * 10 + d;
                Part::Int
            }
            (Part::Zero | Part::Int, b'.') if !integer => Part::Dot,
            (Part::Dot | Part::Frac, _) if digit && self.frac_digits < max_frac => {
                self.frac_digits += 1;
                self.frac = self.frac * 10 + d;
                Part::Frac
            }
            (Part::Zero | Part::Int | Part::Frac, b'e' | b'E') if !integer && !bounded => Part::E,
            (Part::E, b'+' | b'-') => Part::ExpSign,
            (Part::E | Part::ExpSign | Part::Exp, _)
                if digit && self.exp_digits < MAX_EXP_DIGITS =>
            {
                self.exp_digits += 1;
                Part::Exp
            }
            _ => return None,
        };
        match bounds {
            Some(bounds) if !self.reachable(integer, bounds) => None,
            _ => Some(self),
        }
    }

    /// The number may end here (a complete JSON number within the bounds).
    fn can_end(&self, integer: bool, bounds: Option<Bounds>) -> bool {
        let complete = matches!(self.part, Part::Zero | Part::Int | Part::Frac | Part::Exp);
        complete
            && bounds.is_none_or(|b| {
                let v = self.magnitude_low();
                let v = if self.negative { -v } else { v };
                b.min.is_none_or(|m| v >= m)
                    && b.max.is_none_or(|m| v <= m)
                    && (!integer || v % NANO == 0)
            })
    }

    /// The value written so far in nano units, without its sign (the low end of what it can
    /// still become).
    fn magnitude_low(&self) -> i128 {
        self.int * NANO + self.frac * 10i128.pow(BOUNDED_FRAC_DIGITS - self.frac_digits as u32)
    }

    /// Whether some completion of this prefix lies within `bounds` (nano units; the prefix's
    /// possible magnitudes are ranges, one per count of integer digits still to come).
    fn reachable(&self, integer: bool, bounds: Bounds) -> bool {
        let (lo, hi) = (
            bounds.min.unwrap_or(i128::MIN),
            bounds.max.unwrap_or(i128::MAX),
        );
        let meets = |a: i128, b: i128| {
            // Magnitudes [a, b] signed, against [lo, hi].
            let (a, b) = if self.negative { (-b, -a) } else { (a, b) };
            a <= hi && b >= lo
        };
        let frac_unit = |digits: u8| 10i128.pow(BOUNDED_FRAC_DIGITS - digits as u32);
        // The fraction's largest completion below the next step of its last digit.
        let below = |unit: i128| if integer { 0 } else { unit - 1 };
        match self.part {
            Part::Start | Part::Minus => meets(0, i128::MAX / 4),
            Part::Zero => meets(0, below(NANO)),
            Part::Dot => meets(self.int * NANO, self.int * NANO + NANO - 1),
            Part::Frac => {
                let low = self.magnitude_low();
                meets(low, low + below(frac_unit(self.frac_digits)))
            }
            Part::Int => {
                // j more integer digits: [int·10^j, (int+1)·10^j − 1] (+ any fraction).
                let room = BOUNDED_INT_DIGITS as u8 - self.int_digits;
                (0..=room as u32).any(|j| {
                    let scale = 10i128.pow(j);
                    let a = self.int * scale * NANO;
                    let b = ((self.int + 1) * scale - 1) * NANO + below(NANO);
                    meets(a, b)
                })
            }
            Part::E | Part::ExpSign | Part::Exp => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan_all(text: &[u8], json: bool, max: Option<u32>) -> Option<Scan> {
        text.iter()
            .try_fold(Scan::default(), |s, &b| s.step(b, json, max))
    }

    #[test]
    fn scans_accept_utf8_and_escapes_and_count_code_points() {
        let s = scan_all("né 😀".as_bytes(), true, None).unwrap();
        assert!(s.is_neutral());
        assert_eq!(s.chars, 4);
        // An escape is one character; \u with 4 hex digits, no surrogate.
        let s = scan_all(br#"a\n\u00e9\""#, true, None).unwrap();
        assert_eq!((s.chars, s.is_neutral()), (4, true));
        assert!(scan_all(br"\ud83d", true, None).is_none());
        assert!(scan_all(br"\x", true, None).is_none());
        // Half a character is not neutral; a bad continuation, an overlong form and a raw
        // control character in JSON are refused.
        assert!(
            !scan_all(&"é".as_bytes()[..1], true, None)
                .unwrap()
                .is_neutral()
        );
        assert!(scan_all(&[0xC3, 0x41], true, None).is_none());
        assert!(scan_all(&[0xC0, 0x80], true, None).is_none());
        assert!(scan_all(&[0xED, 0xA0, 0x80], true, None).is_none());
        assert!(scan_all(b"a\nb", true, None).is_none());
        // Raw text takes control characters and backslashes as they are.
        assert_eq!(scan_all(b"a\nb\\", false, None).unwrap().chars, 4);
        // The cap counts characters, not bytes.
        assert!(scan_all("éé".as_bytes(), true, Some(2)).is_some());
        assert!(scan_all("ééé".as_bytes(), true, Some(2)).is_none());
    }

    fn num(text: &str, integer: bool, bounds: Option<Bounds>) -> Option<Num> {
        text.bytes()
            .try_fold(Num::default(), |n, b| n.step(b, integer, bounds))
    }

    fn ends(text: &str, integer: bool, bounds: Option<Bounds>) -> bool {
        num(text, integer, bounds).is_some_and(|n| n.can_end(integer, bounds))
    }

    #[test]
    fn numbers_follow_json_and_the_bounds() {
        for ok in ["0", "-0", "12", "-3.25", "1e5", "2E-3", "0.5e+10"] {
            assert!(ends(ok, false, None), "{ok}");
        }
        for bad in ["01", "-", "1.", ".5", "1e", "+1", "1.2.3"] {
            assert!(!ends(bad, false, None), "{bad}");
        }
        assert!(!ends("1.5", true, None) && ends("15", true, None));
        let b = |min: i128, max: i128| {
            Some(Bounds {
                min: Some(min * NANO),
                max: Some(max * NANO),
            })
        };
        // [0, 100]: a minus sign only for -0, no third digit past 100, 100 itself ends.
        assert!(ends("-0", true, b(0, 100)) && num("-1", true, b(0, 100)).is_none());
        assert!(ends("100", true, b(0, 100)));
        assert!(num("101", true, b(0, 100)).is_none());
        assert!(num("1000", true, b(0, 100)).is_none());
        assert!(ends("7", true, b(0, 100)));
        // [10, 20]: "3" cannot grow into the range (30 > 20), "1" can (10..19), "2" only as 20.
        assert!(num("3", true, b(10, 20)).is_none());
        assert!(num("1", true, b(10, 20)).is_some() && !ends("1", true, b(10, 20)));
        assert!(ends("20", true, b(10, 20)) && num("21", true, b(10, 20)).is_none());
        // Negative ranges.
        assert!(ends("-5", true, b(-10, -1)) && num("0", true, b(-10, -1)).is_none());
        // A fraction: exclusive minimum 0 of a number is 1e-9.
        let positive = Some(Bounds {
            min: Some(1),
            max: None,
        });
        assert!(ends("0.5", false, positive));
        assert!(!ends("0", false, positive) && num("0", false, positive).is_some());
        assert!(num("0.000000000", false, positive).is_none());
        assert!(
            num("1e3", false, positive).is_none(),
            "no exponent when bounded"
        );
    }
}
