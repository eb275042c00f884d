//! JSON as the template needs it. Tool lists and schemas go out compact with keys sorted
//! (spec §8.2), which `serde_json::Value` already does (its maps are sorted). Tool-call
//! arguments keep the caller's key order instead — each key becomes its own `argument` block,
//! in order — and their values go out with `", "` and `": "` separators, so they are parsed into
//! [`Json`], which keeps objects as ordered lists.

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Number;

/// A JSON value whose objects keep their key order.
#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Number(Number),
    String(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl Json {
    pub fn parse(text: &str) -> Result<Json, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// The template's argument type name (spec §8.2).
    pub fn type_name(&self) -> &'static str {
        match self {
            Json::Null => "null",
            Json::Bool(_) => "boolean",
            Json::Number(_) => "number",
            Json::String(_) => "string",
            Json::Array(_) => "array",
            Json::Object(_) => "object",
        }
    }

    /// JSON text with `", "` and `": "` separators and non-ASCII kept (Python's `json.dumps`
    /// with `ensure_ascii=False`, which the official renderer uses for argument values).
    pub fn spaced(&self) -> String {
        let mut out = String::new();
        self.write_spaced(&mut out);
        out
    }

    fn write_spaced(&self, out: &mut String) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Number(n) => out.push_str(&n.to_string()),
            Json::String(s) => out.push_str(&quoted(s)),
            Json::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    item.write_spaced(out);
                }
                out.push(']');
            }
            Json::Object(entries) => {
                out.push('{');
                for (i, (key, value)) in entries.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    out.push_str(&quoted(key));
                    out.push_str(": ");
                    value.write_spaced(out);
                }
                out.push('}');
            }
        }
    }
}

/// A JSON string literal; non-ASCII kept, control characters escaped.
pub fn quoted(s: &str) -> String {
    // Serialising a &str cannot fail.
    serde_json::to_string(s).unwrap_or_default()
}

/// The body of a JSON string literal (no quotes), for text streamed piece by piece.
pub fn escaped(s: &str) -> String {
    let q = quoted(s);
    q[1..q.len() - 1].to_owned()
}

/// Compact JSON with keys sorted (a `Value`'s maps are sorted), non-ASCII kept.
pub fn compact_sorted(value: &serde_json::Value) -> String {
    value.to_string()
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Json, D::Error> {
        deserializer.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }

    fn visit_bool<E>(self, b: bool) -> Result<Json, E> {
        Ok(Json::Bool(b))
    }

    fn visit_i64<E>(self, n: i64) -> Result<Json, E> {
        Ok(Json::Number(n.into()))
    }

    fn visit_u64<E>(self, n: u64) -> Result<Json, E> {
        Ok(Json::Number(n.into()))
    }

    fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<Json, E> {
        Number::from_f64(n)
            .map(Json::Number)
            .ok_or_else(|| E::custom("a number that is not finite"))
    }

    fn visit_str<E>(self, s: &str) -> Result<Json, E> {
        Ok(Json::String(s.to_owned()))
    }

    fn visit_string<E>(self, s: String) -> Result<Json, E> {
        Ok(Json::String(s))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Json::Array(items))
    }

    /// A repeated key keeps its first position and takes the last value, as Python's `dict`
    /// (and so the official renderer) does.
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut entries: Vec<(String, Json)> = Vec::new();
        while let Some((key, value)) = map.next_entry::<String, Json>()? {
            match entries.iter_mut().find(|(k, _)| *k == key) {
                Some(entry) => entry.1 = value,
                None => entries.push((key, value)),
            }
        }
        Ok(Json::Object(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_key_order_and_spaces_separators() {
        let j =
            Json::parse(r#"{"b": [1, 2.5, "中\n"], "a": {"y": null, "x": true}, "b": 3}"#).unwrap();
        assert_eq!(j.spaced(), r#"{"b": 3, "a": {"y": null, "x": true}}"#);
        let j = Json::parse(r#"[[], {}, "q\"", -7]"#).unwrap();
        assert_eq!(j.spaced(), r#"[[], {}, "q\"", -7]"#);
        assert_eq!(j.type_name(), "array");
    }

    #[test]
    fn escaped_is_a_literal_body() {
        assert_eq!(escaped("a\"b\\c\nd"), r#"a\"b\\c\nd"#);
    }

    #[test]
    fn compact_sorted_sorts_recursively() {
        let v: serde_json::Value =
            serde_json::from_str(r#"{"b": {"d": 1, "c": "é"}, "a": [2]}"#).unwrap();
        assert_eq!(compact_sorted(&v), r#"{"a":[2],"b":{"c":"é","d":1}}"#);
    }
}
