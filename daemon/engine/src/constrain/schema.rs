//! A JSON schema compiled into the node graph the matcher walks: the subset real clients send
//! for tool parameters and structured output (the JSON Schema 2020-12 keywords `type`,
//! `properties`, `required`, `additionalProperties`, `items`, `enum`, `const`, `anyOf`, `allOf`
//! of one schema, `$ref` to `#`, `#/$defs/…` or `#/definitions/…`, `minLength`, `maxLength`,
//! `minItems`, `maxItems`, `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum`,
//! `propertyNames` of plain strings, `uniqueItems: false`, `nullable`). Annotations
//! (`description`, `title`, `default`, `examples`, `format`, …) constrain nothing and are
//! passed over, as the standard says of annotations and unknown keywords; every other
//! assertion keyword (`pattern`, `oneOf`, `not`, `if`, `multipleOf`, `patternProperties`, …)
//! is refused with its path, never ignored (docs/decoding.md lists both).
//!
//! A schema no JSON value satisfies (a required property that `additionalProperties: false`
//! forbids, an `enum` none of whose values has the `type`, bounds that exclude each other) is
//! refused too: a constrained reply could never be valid against it.

use serde_json::{Map, Value};

/// Index of a node in [`Schema::nodes`].
pub type NodeId = usize;

/// The six JSON types, as a bit mask (the template's argument types, spec §8.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Types(pub u8);

impl Types {
    pub const NULL: Types = Types(1);
    pub const BOOLEAN: Types = Types(2);
    pub const NUMBER: Types = Types(4);
    pub const STRING: Types = Types(8);
    pub const ARRAY: Types = Types(16);
    pub const OBJECT: Types = Types(32);
    pub const ALL: Types = Types(63);
    pub const NONE: Types = Types(0);

    pub fn has(self, t: Types) -> bool {
        self.0 & t.0 != 0
    }

    pub fn union(self, t: Types) -> Types {
        Types(self.0 | t.0)
    }

    /// The template's type names (spec §8.2) of the types in the mask, in a fixed order.
    pub fn names(self) -> impl Iterator<Item = (Types, &'static str)> {
        [
            (Types::STRING, "string"),
            (Types::NUMBER, "number"),
            (Types::BOOLEAN, "boolean"),
            (Types::NULL, "null"),
            (Types::OBJECT, "object"),
            (Types::ARRAY, "array"),
        ]
        .into_iter()
        .filter(move |(t, _)| self.has(*t))
    }

    /// The type of a JSON value.
    pub fn of(v: &Value) -> Types {
        match v {
            Value::Null => Types::NULL,
            Value::Bool(_) => Types::BOOLEAN,
            Value::Number(_) => Types::NUMBER,
            Value::String(_) => Types::STRING,
            Value::Array(_) => Types::ARRAY,
            Value::Object(_) => Types::OBJECT,
        }
    }
}

/// Most properties one object schema may declare (the matcher keeps the used ones in a
/// 128-bit set).
pub const MAX_PROPERTIES: usize = 128;

/// Bounds of a number, in units of 10⁻⁹ ([`NANO`]): inclusive, after exclusive bounds are
/// turned into the nearest value inside (the matcher writes at most 9 fraction digits when a
/// number is bounded, so no value it can write lies between).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub min: Option<i128>,
    pub max: Option<i128>,
}

/// One unit of a bounded number: 10⁻⁹.
pub const NANO: i128 = 1_000_000_000;
/// A bounded number has at most this many integer digits (its nano value fits an i128 many
/// times over).
pub const BOUNDED_INT_DIGITS: u32 = 18;
/// ... and at most this many fraction digits.
pub const BOUNDED_FRAC_DIGITS: u32 = 9;

#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    /// Any JSON value.
    Any,
    Null,
    Boolean,
    Number {
        integer: bool,
        bounds: Option<Bounds>,
    },
    String {
        min_chars: u32,
        max_chars: Option<u32>,
    },
    /// One of these values: `json` is each one's canonical JSON text (compact, as serde_json
    /// writes it), `raw` a string value's own text (for the template's raw `string` arguments).
    Enum {
        json: Vec<Vec<u8>>,
        raw: Vec<Option<Vec<u8>>>,
        types: Types,
    },
    Array {
        items: NodeId,
        min_items: u32,
        max_items: Option<u32>,
    },
    Object(Object),
    /// Any of these (`anyOf`, a list of types).
    Union(Vec<NodeId>),
    /// A `$ref` not yet resolved (only while compiling).
    Ref(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Object {
    pub properties: Vec<Property>,
    /// Bit i: `properties[i]` is required.
    pub required: u128,
    /// The schema of keys not declared, or `None` when no other key is allowed.
    pub additional: Option<NodeId>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Property {
    pub name: String,
    /// The name as a JSON string literal (canonical escaping, quotes included).
    pub json_key: Vec<u8>,
    pub node: NodeId,
}

/// Compiled schemas: one arena of nodes, several schemas (a request's tools and its response
/// format) added to it, each with its root.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Schema {
    pub nodes: Vec<Node>,
}

/// Why a schema cannot constrain a reply; `path` is a JSON pointer into it (`/properties/x`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    #[error("{path}: {keyword} is not supported by k3's constrained decoding")]
    Unsupported { path: String, keyword: String },
    #[error("{path}: {reason}")]
    Invalid { path: String, reason: String },
    #[error("{path}: no JSON value satisfies the schema ({reason})")]
    Unsatisfiable { path: String, reason: String },
}

/// Keywords that assert nothing (annotations, identifiers, and the ones this compiler reads
/// through other keywords), passed over.
const ANNOTATIONS: [&str; 14] = [
    "$schema",
    "$id",
    "$comment",
    "$anchor",
    "title",
    "description",
    "default",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
    // An annotation unless a validator opts into the format-assertion vocabulary
    // (JSON Schema 2020-12 validation §7.2.1); OpenAI's and Anthropic's own schemas use it so.
    "format",
    "contentMediaType",
    "contentEncoding",
];

/// Assertion keywords that are refused (the rest of the standard's vocabulary); any other
/// unknown keyword is an annotation by the standard and passed over.
const REFUSED: [&str; 17] = [
    "pattern",
    "patternProperties",
    "oneOf",
    "not",
    "if",
    "then",
    "else",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
    "multipleOf",
    "minProperties",
    "maxProperties",
    "contains",
    "prefixItems",
    "unevaluatedProperties",
    "unevaluatedItems",
];

impl Schema {
    /// Compiles `schema` into the arena; returns its root. Errors' paths are JSON pointers
    /// into `schema`.
    pub fn add(&mut self, schema: &Value) -> Result<NodeId, SchemaError> {
        let first = self.nodes.len();
        let mut c = Compiler {
            root: schema,
            nodes: &mut self.nodes,
            refs: Vec::new(),
        };
        let root = c.node(schema, "")?;
        // Resolve references (each target compiled once, so recursive schemas become cycles).
        let mut i = first;
        while i < c.nodes.len() {
            if let Node::Ref(target) = &c.nodes[i] {
                let target = target.clone();
                let resolved = c.resolve(&target, i)?;
                c.nodes[i] = Node::Union(vec![resolved]);
            }
            i += 1;
        }
        self.check_satisfiable(root)?;
        Ok(root)
    }

    /// A node not from a schema (the matcher's "any value of one type").
    pub fn push(&mut self, node: Node) -> NodeId {
        self.nodes.push(node);
        self.nodes.len() - 1
    }
}

/// One schema compiled into its own arena (tests and single-schema callers).
pub fn compile(schema: &Value) -> Result<(Schema, NodeId), SchemaError> {
    let mut s = Schema::default();
    let root = s.add(schema)?;
    Ok((s, root))
}

struct Compiler<'a> {
    root: &'a Value,
    nodes: &'a mut Vec<Node>,
    /// `$ref` targets already compiled: (pointer, node).
    refs: Vec<(String, NodeId)>,
}

impl<'a> Compiler<'a> {
    fn push(&mut self, node: Node) -> NodeId {
        self.nodes.push(node);
        self.nodes.len() - 1
    }

    fn resolve(&mut self, target: &str, at: NodeId) -> Result<NodeId, SchemaError> {
        if let Some(&(_, id)) = self.refs.iter().find(|(t, _)| t == target) {
            return Ok(id);
        }
        let pointer = target.strip_prefix('#').unwrap_or(target);
        let value = self
            .root
            .pointer(pointer)
            .ok_or_else(|| SchemaError::Invalid {
                path: format!("(node {at})"),
                reason: format!("$ref {target:?} points nowhere in the schema"),
            })?;
        // Reserve the slot first: a schema that refers to itself resolves to itself.
        let slot = self.push(Node::Union(Vec::new()));
        self.refs.push((target.to_owned(), slot));
        let body = self.node(value, pointer)?;
        self.nodes[slot] = Node::Union(vec![body]);
        Ok(slot)
    }

    fn node(&mut self, schema: &Value, path: &str) -> Result<NodeId, SchemaError> {
        let s = match schema {
            Value::Bool(true) => return Ok(self.push(Node::Any)),
            Value::Bool(false) => {
                return Err(SchemaError::Unsatisfiable {
                    path: at(path),
                    reason: "the schema is `false`".into(),
                });
            }
            Value::Object(s) => s,
            _ => {
                return Err(SchemaError::Invalid {
                    path: at(path),
                    reason: "a schema must be an object or a boolean".into(),
                });
            }
        };
        for key in s.keys() {
            if REFUSED.contains(&key.as_str()) {
                return Err(SchemaError::Unsupported {
                    path: at(path),
                    keyword: key.clone(),
                });
            }
        }
        if s.get("uniqueItems")
            .is_some_and(|v| v != &Value::Bool(false))
        {
            return Err(SchemaError::Unsupported {
                path: at(path),
                keyword: "uniqueItems".into(),
            });
        }
        if let Some(names) = s.get("propertyNames")
            && !plain_string_schema(names)
        {
            return Err(SchemaError::Unsupported {
                path: at(path),
                keyword: "propertyNames (other than {\"type\": \"string\"})".into(),
            });
        }
        // `$ref` beside other keywords: all of them apply; only a bare reference is supported.
        if let Some(target) = s.get("$ref") {
            let target = target.as_str().ok_or_else(|| SchemaError::Invalid {
                path: at(path),
                reason: "$ref must be a string".into(),
            })?;
            if !(target == "#" || target.starts_with("#/")) {
                return Err(SchemaError::Unsupported {
                    path: at(path),
                    keyword: format!("$ref to {target:?} (only references inside the schema)"),
                });
            }
            let others = s
                .keys()
                .filter(|k| {
                    !ANNOTATIONS.contains(&k.as_str())
                        && !["$ref", "$defs", "definitions"].contains(&k.as_str())
                })
                .count();
            if others > 0 {
                return Err(SchemaError::Unsupported {
                    path: at(path),
                    keyword: "$ref beside other assertions".into(),
                });
            }
            return Ok(self.push(Node::Ref(target.to_owned())));
        }
        if let Some(all) = s.get("allOf") {
            return match all.as_array().map(Vec::as_slice) {
                Some([only])
                    if s.keys()
                        .all(|k| k == "allOf" || ANNOTATIONS.contains(&k.as_str())) =>
                {
                    self.node(only, &format!("{path}/allOf/0"))
                }
                _ => Err(SchemaError::Unsupported {
                    path: at(path),
                    keyword: "allOf (other than one schema alone)".into(),
                }),
            };
        }
        if let Some(any) = s.get("anyOf") {
            let list =
                any.as_array()
                    .filter(|l| !l.is_empty())
                    .ok_or_else(|| SchemaError::Invalid {
                        path: at(path),
                        reason: "anyOf must be a non-empty list".into(),
                    })?;
            // Keywords beside anyOf apply to every branch: merged into each.
            let mut branches = Vec::with_capacity(list.len());
            for (i, branch) in list.iter().enumerate() {
                let merged = merge(s, branch, "anyOf");
                branches.push(self.node(&merged, &format!("{path}/anyOf/{i}"))?);
            }
            return Ok(self.push(Node::Union(branches)));
        }
        let types = self.types(s, path)?;
        if let Some(values) = enum_values(s, path)? {
            return self.enumeration(s, values, types, path);
        }
        let mut branches = Vec::new();
        for (t, _) in types.names() {
            let node = match t {
                Types::NULL => Node::Null,
                Types::BOOLEAN => Node::Boolean,
                Types::NUMBER => number(s, path)?,
                Types::STRING => string(s, path)?,
                Types::ARRAY => self.array(s, path)?,
                _ => self.object(s, path)?,
            };
            branches.push(node);
        }
        Ok(match branches.len() {
            6 if s.keys().all(|k| {
                ANNOTATIONS.contains(&k.as_str()) || k == "$defs" || k == "definitions"
            }) =>
            {
                self.push(Node::Any)
            }
            1 => self.push(branches.remove(0)),
            _ => {
                let ids = branches.into_iter().map(|n| self.push(n)).collect();
                self.push(Node::Union(ids))
            }
        })
    }

    /// The types a schema allows: `type` (one or a list; `integer` is a number), widened by
    /// `nullable: true`; without `type`, every type (narrowed by what the other keywords say
    /// of the value is not attempted: `{"properties": …}` alone also admits strings, as the
    /// standard says, but a schema with `properties` and no `type` means an object in
    /// practice, so such keywords imply their type).
    fn types(&self, s: &Map<String, Value>, path: &str) -> Result<Types, SchemaError> {
        let name = |v: &Value| -> Result<Types, SchemaError> {
            Ok(match v.as_str() {
                Some("null") => Types::NULL,
                Some("boolean") => Types::BOOLEAN,
                Some("number" | "integer") => Types::NUMBER,
                Some("string") => Types::STRING,
                Some("array") => Types::ARRAY,
                Some("object") => Types::OBJECT,
                _ => {
                    return Err(SchemaError::Invalid {
                        path: at(&format!("{path}/type")),
                        reason: format!("{v} is not a JSON schema type"),
                    });
                }
            })
        };
        let mut types = match s.get("type") {
            None => implied_types(s),
            Some(Value::Array(list)) => {
                let mut t = Types::NONE;
                for v in list {
                    t = t.union(name(v)?);
                }
                t
            }
            Some(v) => name(v)?,
        };
        if s.get("nullable") == Some(&Value::Bool(true)) {
            types = types.union(Types::NULL);
        }
        if types == Types::NONE {
            return Err(SchemaError::Unsatisfiable {
                path: at(path),
                reason: "`type` lists no type".into(),
            });
        }
        Ok(types)
    }

    fn enumeration(
        &mut self,
        s: &Map<String, Value>,
        values: Vec<Value>,
        types: Types,
        path: &str,
    ) -> Result<NodeId, SchemaError> {
        let integer = is_integer_type(s);
        let mut json = Vec::new();
        let mut raw = Vec::new();
        let mut kept = Types::NONE;
        for v in values {
            let t = Types::of(&v);
            if !types.has(t) || (integer && !v.as_f64().is_some_and(|f| f.fract() == 0.0)) {
                continue;
            }
            kept = kept.union(t);
            raw.push(v.as_str().map(|s| s.as_bytes().to_vec()));
            json.push(serde_json::to_vec(&v).unwrap_or_default());
        }
        if json.is_empty() {
            return Err(SchemaError::Unsatisfiable {
                path: at(path),
                reason: "no value of `enum`/`const` has the schema's type".into(),
            });
        }
        Ok(self.push(Node::Enum {
            json,
            raw,
            types: kept,
        }))
    }

    fn array(&mut self, s: &Map<String, Value>, path: &str) -> Result<Node, SchemaError> {
        let items = match s.get("items") {
            None => self.push(Node::Any),
            Some(items) => self.node(items, &format!("{path}/items"))?,
        };
        let min_items = count(s, "minItems", path)?.unwrap_or(0);
        let max_items = count(s, "maxItems", path)?;
        if max_items.is_some_and(|m| m < min_items) {
            return Err(SchemaError::Unsatisfiable {
                path: at(path),
                reason: "maxItems is below minItems".into(),
            });
        }
        Ok(Node::Array {
            items,
            min_items,
            max_items,
        })
    }

    fn object(&mut self, s: &Map<String, Value>, path: &str) -> Result<Node, SchemaError> {
        let empty = Map::new();
        let declared = match s.get("properties") {
            None => &empty,
            Some(Value::Object(p)) => p,
            Some(_) => {
                return Err(SchemaError::Invalid {
                    path: at(&format!("{path}/properties")),
                    reason: "properties must be an object".into(),
                });
            }
        };
        if declared.len() > MAX_PROPERTIES {
            return Err(SchemaError::Unsupported {
                path: at(&format!("{path}/properties")),
                keyword: format!(
                    "an object of {} properties (at most {MAX_PROPERTIES})",
                    declared.len()
                ),
            });
        }
        let mut properties = Vec::with_capacity(declared.len());
        for (name, schema) in declared {
            let node = self.node(
                schema,
                &format!("{path}/properties/{}", escape_pointer(name)),
            )?;
            properties.push(Property {
                name: name.clone(),
                json_key: serde_json::to_vec(name).unwrap_or_default(),
                node,
            });
        }
        let additional = match s.get("additionalProperties") {
            None | Some(Value::Bool(true)) => Some(self.push(Node::Any)),
            Some(Value::Bool(false)) => None,
            Some(schema) => Some(self.node(schema, &format!("{path}/additionalProperties"))?),
        };
        let mut required = 0u128;
        let names: Vec<String> = match s.get("required") {
            None => Vec::new(),
            Some(v) => serde_json::from_value(v.clone()).map_err(|_| SchemaError::Invalid {
                path: at(&format!("{path}/required")),
                reason: "required must be a list of names".into(),
            })?,
        };
        for name in names {
            match properties.iter().position(|p| p.name == name) {
                Some(i) => required |= 1 << i,
                // A required key that is not declared must come from additionalProperties:
                // declared here with that schema, so the matcher can require it.
                None => match additional {
                    Some(node) if properties.len() < MAX_PROPERTIES => {
                        required |= 1 << properties.len();
                        properties.push(Property {
                            json_key: serde_json::to_vec(&name).unwrap_or_default(),
                            name,
                            node,
                        });
                    }
                    Some(_) => {
                        return Err(SchemaError::Unsupported {
                            path: at(path),
                            keyword: format!("more than {MAX_PROPERTIES} properties"),
                        });
                    }
                    None => {
                        return Err(SchemaError::Unsatisfiable {
                            path: at(path),
                            reason: format!(
                                "{name:?} is required but not among `properties`, and \
                                 additionalProperties is false"
                            ),
                        });
                    }
                },
            }
        }
        Ok(Node::Object(Object {
            properties,
            required,
            additional,
        }))
    }
}

/// `{"type": "string"}` (annotations aside): what `propertyNames` may say, since every key is
/// a string anyway.
fn plain_string_schema(v: &Value) -> bool {
    match v {
        Value::Bool(true) => true,
        Value::Object(o) => o
            .iter()
            .all(|(k, v)| ANNOTATIONS.contains(&k.as_str()) || (k == "type" && v == "string")),
        _ => false,
    }
}

/// The keywords of `outer` (but `skip`) merged into `branch`, the branch's own winning.
fn merge(outer: &Map<String, Value>, branch: &Value, skip: &str) -> Value {
    let Value::Object(b) = branch else {
        return branch.clone();
    };
    let mut merged = b.clone();
    for (k, v) in outer {
        if k != skip && !ANNOTATIONS.contains(&k.as_str()) && !merged.contains_key(k) {
            merged.insert(k.clone(), v.clone());
        }
    }
    Value::Object(merged)
}

/// Without `type`: the types other keywords imply (`properties` → object, `items` → array,
/// …), else every type.
fn implied_types(s: &Map<String, Value>) -> Types {
    let mut t = Types::NONE;
    let implies = [
        (
            Types::OBJECT,
            &[
                "properties",
                "required",
                "additionalProperties",
                "propertyNames",
            ][..],
        ),
        (Types::ARRAY, &["items", "minItems", "maxItems"][..]),
        (Types::STRING, &["minLength", "maxLength"][..]),
        (
            Types::NUMBER,
            &["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"][..],
        ),
    ];
    for (types, keys) in implies {
        if keys.iter().any(|k| s.contains_key(*k)) {
            t = t.union(types);
        }
    }
    if t == Types::NONE { Types::ALL } else { t }
}

fn is_integer_type(s: &Map<String, Value>) -> bool {
    match s.get("type") {
        Some(Value::String(t)) => t == "integer",
        Some(Value::Array(list)) => {
            list.iter().any(|t| t == "integer") && !list.iter().any(|t| t == "number")
        }
        _ => false,
    }
}

fn enum_values(s: &Map<String, Value>, path: &str) -> Result<Option<Vec<Value>>, SchemaError> {
    match (s.get("enum"), s.get("const")) {
        (None, None) => Ok(None),
        (_, Some(c)) => Ok(Some(vec![c.clone()])),
        (Some(Value::Array(list)), None) if !list.is_empty() => Ok(Some(list.clone())),
        (Some(_), None) => Err(SchemaError::Invalid {
            path: at(&format!("{path}/enum")),
            reason: "enum must be a non-empty list".into(),
        }),
    }
}

fn count(s: &Map<String, Value>, key: &str, path: &str) -> Result<Option<u32>, SchemaError> {
    match s.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(|n| Some(n.min(u32::MAX as u64) as u32))
            .ok_or_else(|| SchemaError::Invalid {
                path: at(&format!("{path}/{key}")),
                reason: format!("{key} must be a non-negative integer"),
            }),
    }
}

fn string(s: &Map<String, Value>, path: &str) -> Result<Node, SchemaError> {
    let min_chars = count(s, "minLength", path)?.unwrap_or(0);
    let max_chars = count(s, "maxLength", path)?;
    if max_chars.is_some_and(|m| m < min_chars) {
        return Err(SchemaError::Unsatisfiable {
            path: at(path),
            reason: "maxLength is below minLength".into(),
        });
    }
    Ok(Node::String {
        min_chars,
        max_chars,
    })
}

fn number(s: &Map<String, Value>, path: &str) -> Result<Node, SchemaError> {
    let integer = is_integer_type(s);
    let bound = |key: &str| -> Result<Option<i128>, SchemaError> {
        match s.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => nano(n).map(Some).ok_or_else(|| SchemaError::Unsupported {
                path: at(&format!("{path}/{key}")),
                keyword: format!(
                    "{key} {n} (bounds need at most {BOUNDED_INT_DIGITS} integer and \
                     {BOUNDED_FRAC_DIGITS} fraction digits)"
                ),
            }),
            Some(_) => Err(SchemaError::Invalid {
                path: at(&format!("{path}/{key}")),
                reason: format!("{key} must be a number"),
            }),
        }
    };
    let unit = if integer { NANO } else { 1 };
    // Inclusive bounds on the values the matcher can write (whole numbers for integers,
    // multiples of 10⁻⁹ otherwise).
    let min = [
        bound("minimum")?.map(|m| ceil_to(m, unit)),
        bound("exclusiveMinimum")?.map(|m| floor_to(m, unit) + unit),
    ]
    .into_iter()
    .flatten()
    .max();
    let max = [
        bound("maximum")?.map(|m| floor_to(m, unit)),
        bound("exclusiveMaximum")?.map(|m| ceil_to(m, unit) - unit),
    ]
    .into_iter()
    .flatten()
    .min();
    if let (Some(lo), Some(hi)) = (min, max)
        && lo > hi
    {
        return Err(SchemaError::Unsatisfiable {
            path: at(path),
            reason: "its bounds admit no number".into(),
        });
    }
    Ok(Node::Number {
        integer,
        bounds: (min.is_some() || max.is_some()).then_some(Bounds { min, max }),
    })
}

/// The largest multiple of `unit` at most `v`.
fn floor_to(v: i128, unit: i128) -> i128 {
    v.div_euclid(unit) * unit
}

/// The smallest multiple of `unit` at least `v`.
fn ceil_to(v: i128, unit: i128) -> i128 {
    -floor_to(-v, unit)
}

/// A JSON number in units of 10⁻⁹, exactly, from its decimal text; `None` when it has more
/// digits than a bounded number may (see [`BOUNDED_INT_DIGITS`]).
pub fn nano(n: &serde_json::Number) -> Option<i128> {
    let text = n.to_string();
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.as_str()),
    };
    let (mantissa, exponent) = match digits.split_once(['e', 'E']) {
        Some((m, e)) => (m, e.parse::<i32>().ok()?),
        None => (digits, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all: String = format!("{int}{frac}");
    // value = all × 10^(exponent − frac.len()); in nano units × 10^9.
    let shift = exponent - frac.len() as i32 + 9;
    let mut v: i128 = 0;
    for d in all.bytes() {
        v = v.checked_mul(10)?.checked_add((d - b'0') as i128)?;
    }
    if shift >= 0 {
        v = v.checked_mul(10i128.checked_pow(shift as u32)?)?;
    } else {
        let div = 10i128.checked_pow((-shift) as u32)?;
        if v % div != 0 {
            return None;
        }
        v /= div;
    }
    if v.unsigned_abs() >= 10u128.pow(BOUNDED_INT_DIGITS + BOUNDED_FRAC_DIGITS) {
        return None;
    }
    Some(if negative { -v } else { v })
}

fn at(path: &str) -> String {
    if path.is_empty() {
        "/".into()
    } else {
        path.into()
    }
}

/// A property name as a JSON pointer token (RFC 6901: `~` → `~0`, `/` → `~1`).
fn escape_pointer(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

/// The JSON types the values of `node` may have.
pub fn types(nodes: &[Node], node: NodeId) -> Types {
    types_seen(nodes, node, &mut Vec::new())
}

fn types_seen(nodes: &[Node], node: NodeId, seen: &mut Vec<NodeId>) -> Types {
    if seen.contains(&node) {
        return Types::NONE;
    }
    seen.push(node);
    let t = match &nodes[node] {
        Node::Any => Types::ALL,
        Node::Null => Types::NULL,
        Node::Boolean => Types::BOOLEAN,
        Node::Number { .. } => Types::NUMBER,
        Node::String { .. } => Types::STRING,
        Node::Enum { types, .. } => *types,
        Node::Array { .. } => Types::ARRAY,
        Node::Object(_) => Types::OBJECT,
        Node::Union(ids) => ids
            .iter()
            .fold(Types::NONE, |t, &id| t.union(types_seen(nodes, id, seen))),
        Node::Ref(_) => Types::NONE,
    };
    seen.pop();
    t
}

impl Schema {
    /// Refuses a schema with a node no finite value satisfies (a reference cycle with no way
    /// out, e.g. an object that requires itself), which would leave the matcher without an
    /// allowed id.
    fn check_satisfiable(&self, root: NodeId) -> Result<(), SchemaError> {
        // Fixed point: a node is satisfiable when some finite value meets it, knowing which
        // other nodes are.
        let mut ok = vec![false; self.nodes.len()];
        loop {
            let mut changed = false;
            for (i, node) in self.nodes.iter().enumerate() {
                if ok[i] {
                    continue;
                }
                let now = match node {
                    Node::Any
                    | Node::Null
                    | Node::Boolean
                    | Node::Number { .. }
                    | Node::String { .. }
                    | Node::Enum { .. } => true,
                    Node::Array {
                        items, min_items, ..
                    } => *min_items == 0 || ok[*items],
                    Node::Object(o) => o
                        .properties
                        .iter()
                        .enumerate()
                        .all(|(k, p)| o.required & (1 << k) == 0 || ok[p.node]),
                    Node::Union(ids) => ids.iter().any(|&id| ok[id]),
                    Node::Ref(_) => false,
                };
                if now {
                    ok[i] = true;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        if ok[root] {
            Ok(())
        } else {
            Err(SchemaError::Unsatisfiable {
                path: "/".into(),
                reason: "it requires a value that would contain itself without end".into(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nano_units_are_exact() {
        let n = |v: Value| nano(&serde_json::from_value(v).unwrap());
        assert_eq!(n(json!(0)), Some(0));
        assert_eq!(n(json!(3)), Some(3 * NANO));
        assert_eq!(n(json!(-2.5)), Some(-2_500_000_000));
        assert_eq!(n(json!(1e-9)), Some(1));
        assert_eq!(n(json!(9007199254740991u64)), Some(9007199254740991 * NANO));
        assert_eq!(n(json!(1e-10)), None);
        assert_eq!(n(json!(1e30)), None);
    }

    #[test]
    fn claude_codes_read_tool_compiles_with_integer_bounds() {
        let (s, root) = compile(&json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {
                "file_path": {"type": "string", "description": "x"},
                "offset": {"type": "integer", "minimum": 0, "maximum": 9007199254740991u64},
                "limit": {"type": "integer", "exclusiveMinimum": 0},
            },
            "required": ["file_path"],
            "additionalProperties": false
        }))
        .unwrap();
        let Node::Object(o) = &s.nodes[root] else {
            panic!("{:?}", s.nodes[root])
        };
        assert_eq!(o.additional, None);
        let file_path = o.properties.iter().position(|p| p.name == "file_path");
        assert_eq!(o.required, 1 << file_path.unwrap());
        let limit = o.properties.iter().find(|p| p.name == "limit").unwrap();
        assert_eq!(
            s.nodes[limit.node],
            Node::Number {
                integer: true,
                bounds: Some(Bounds {
                    min: Some(NANO),
                    max: None
                })
            }
        );
    }

    #[test]
    fn refusals_name_the_keyword_and_the_path() {
        let e = compile(
            &json!({"type": "object", "properties": {"id": {"type": "string",
            "pattern": "^wf_"}}}),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "/properties/id: pattern is not supported by k3's constrained decoding"
        );
        let e = compile(
            &json!({"type": "object", "properties": {"subject": {"type": "string"}},
            "required": ["subject", "description"], "additionalProperties": false}),
        )
        .unwrap_err();
        assert!(
            matches!(e, SchemaError::Unsatisfiable { .. }) && e.to_string().contains("description"),
            "{e}"
        );
        let e = compile(&json!({"type": "string", "enum": [1, 2]})).unwrap_err();
        assert!(matches!(e, SchemaError::Unsatisfiable { .. }), "{e}");
        let e = compile(&json!({"$ref": "#/$defs/missing"})).unwrap_err();
        assert!(e.to_string().contains("points nowhere"), "{e}");
        let e = compile(
            &json!({"type": "object", "properties": {"me": {"$ref": "#"}},
            "required": ["me"]}),
        )
        .unwrap_err();
        assert!(e.to_string().contains("without end"), "{e}");
    }

    #[test]
    fn refs_any_of_and_types_compile_to_the_graph() {
        let (s, root) = compile(&json!({
            "$defs": {"node": {"type": "object", "properties": {
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
            "anyOf": [{"$ref": "#/$defs/node"}, {"type": ["string", "null"]}],
        }))
        .unwrap();
        assert_eq!(
            types(&s.nodes, root),
            Types::OBJECT.union(Types::STRING).union(Types::NULL)
        );
        let (any, root) = compile(&json!({"description": "anything"})).unwrap();
        assert_eq!(any.nodes[root], Node::Any);
        let (status, root) = compile(&json!({"anyOf": [
            {"type": "string", "enum": ["pending", "completed"]},
            {"type": "string", "const": "deleted"}]}))
        .unwrap();
        assert_eq!(types(&status.nodes, root), Types::STRING);
    }
}
