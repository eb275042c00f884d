//! Request bodies whose objects name a key twice are refused (issue 45 point 5). JSON leaves a
//! duplicate key's meaning to the parser: ours kept the last (`{"messages":[A],"messages":[B]}`
//! was answered from B) where a proxy in front may check the first, so a body could pass its
//! checks and mean something else here. No reading is the right one; the body is refused with
//! the key and where it is.

use serde::Deserializer;
use serde::de::{DeserializeSeed, Error as _, MapAccess, SeqAccess, Visitor};
use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;

/// A key an object of the body has twice: `at` is the object's place (`messages[1]`; empty at
/// the top level).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Duplicate {
    pub at: String,
    pub key: String,
}

impl Duplicate {
    /// The key as a field path (`messages[1].content`), for an error's `param`.
    pub fn param(&self) -> String {
        if self.at.is_empty() {
            self.key.clone()
        } else {
            format!("{}.{}", self.at, self.key)
        }
    }
}

impl fmt::Display for Duplicate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = if self.at.is_empty() {
            "the request body".to_string()
        } else {
            format!("`{}`", self.at)
        };
        write!(
            f,
            "{at} has the key {:?} more than once; JSON keys must be unique",
            self.key
        )
    }
}

/// The first key some object in `body` (JSON text) has twice, if any. `Err` is the parser's
/// error when `body` is not JSON at all.
pub fn first_duplicate(body: &str) -> Result<Option<Duplicate>, serde_json::Error> {
    let found = RefCell::new(None);
    let mut reader = serde_json::Deserializer::from_str(body);
    let walked = Walk {
        at: String::new(),
        found: &found,
    }
    .deserialize(&mut reader)
    .and_then(|()| reader.end());
    match (walked, found.into_inner()) {
        (_, Some(duplicate)) => Ok(Some(duplicate)),
        (Ok(()), None) => Ok(None),
        (Err(e), None) => Err(e),
    }
}

/// Walks one value at `at`, keeping nothing but the keys of the objects it is inside.
struct Walk<'f> {
    at: String,
    found: &'f RefCell<Option<Duplicate>>,
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            let at = if self.at.is_empty() {
                key.clone()
            } else {
                format!("{}.{key}", self.at)
            };
            if !seen.insert(key.clone()) {
                *self.found.borrow_mut() = Some(Duplicate { at: self.at, key });
                return Err(A::Error::custom("a duplicate key"));
            }
            map.next_value_seed(Walk {
                at,
                found: self.found,
            })?;
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut index = 0usize;
        while seq
            .next_element_seed(Walk {
                at: format!("{}[{index}]", self.at),
                found: self.found,
            })?
            .is_some()
        {
            index += 1;
        }
        Ok(())
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_twice_is_found_with_where_it_is() {
        let top = first_duplicate(r#"{"messages":[1],"model":"m","messages":[2]}"#).unwrap();
        assert_eq!(
            top,
            Some(Duplicate {
                at: String::new(),
                key: "messages".into()
            })
        );
        let top = top.unwrap();
        assert_eq!(top.param(), "messages");
        assert!(
            top.to_string()
                .starts_with("the request body has the key \"messages\"")
        );
        let nested = first_duplicate(
            r#"{"messages":[{"role":"user","content":"a"},{"role":"user","content":"b","content":"c"}]}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(nested.param(), "messages[1].content");
        assert!(
            nested
                .to_string()
                .starts_with("`messages[1]` has the key \"content\"")
        );
        // The same key in two objects, escapes that spell one key two ways.
        assert_eq!(
            first_duplicate(r#"{"a":{"k":1},"b":{"k":2}}"#).unwrap(),
            None
        );
        let escaped = first_duplicate(r#"{"k":1,"\u006b":2}"#).unwrap().unwrap();
        assert_eq!(escaped.key, "k");
    }

    #[test]
    fn not_json_is_the_parsers_error() {
        assert!(first_duplicate("{\"a\":").is_err());
        assert!(first_duplicate("{} x").is_err());
        assert_eq!(first_duplicate("[1, {\"a\": null}]").unwrap(), None);
    }
}
