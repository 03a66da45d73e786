//! JSON request bodies read strictly: every object's keys given once, at every depth.
//! serde_json keeps the last of a duplicate key, so `{"budget": {...}, "budget": null}`
//! read as a map dropped the charge of a pool acquire; structs derived with serde refuse a
//! duplicate, but a body read into a `Value` first (to name a bad field) did not.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// A JSON value whose objects each give a key at most once (RFC 8259 leaves duplicates
/// undefined; here they are refused). The error of a duplicate is "duplicate field `k`":
/// [`duplicate_field`] reads the name back.
pub(crate) struct StrictValue(pub(crate) Value);

impl<'de> Deserialize<'de> for StrictValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrictVisitor).map(StrictValue)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(StrictValue(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Value, A::Error> {
        let mut map = Map::new();
        while let Some(key) = access.next_key::<String>()? {
            let StrictValue(value) = access.next_value()?;
            if map.contains_key(&key) {
                return Err(de::Error::custom(format!("duplicate field `{key}`")));
            }
            map.insert(key, value);
        }
        Ok(Value::Object(map))
    }
}

/// The field a "duplicate field `k`" error names (serde's own wording for derived structs,
/// and [`StrictValue`]'s).
pub(crate) fn duplicate_field(message: &str) -> Option<&str> {
    let rest = &message[message.find("duplicate field `")? + "duplicate field `".len()..];
    rest.split_once('`').map(|(name, _)| name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strict(text: &str) -> Result<Value, String> {
        serde_json::from_str::<StrictValue>(text)
            .map(|v| v.0)
            .map_err(|e| e.to_string())
    }

    /// Duplicates are refused at any depth and named; everything else reads as serde_json does.
    #[test]
    fn duplicate_keys_are_refused_at_any_depth() {
        for (text, field) in [
            (r#"{"ttl_ms": 1, "budget": {}, "budget": null}"#, "budget"),
            (r#"{"budget": {"name": "a", "name": "b"}}"#, "name"),
            (r#"[{"a": 1, "a": 1}]"#, "a"),
        ] {
            let err = strict(text).unwrap_err();
            assert_eq!(duplicate_field(&err), Some(field), "{text}: {err}");
        }
        let text = r#"{"a": [1, -2, 3.5, "x", null, true], "b": {"c": {}}}"#;
        assert_eq!(
            strict(text).unwrap(),
            serde_json::from_str::<Value>(text).unwrap()
        );
    }
}
