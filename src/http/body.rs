//! The one reader of JSON request bodies, for every route that takes one
//! (`pool serve`'s leases, the budget routes, the charge of an acquire). Size
//! and time are bounded before a route sees the body (`serve.rs`); here, one
//! rule for each of:
//!
//! - an empty body is `{}`; anything but one JSON object (text after it too)
//!   is refused naming `body`;
//! - a key given twice, at any depth, is refused naming it;
//! - a `null` is an absent field, on every route;
//! - a required field that is absent is named first (the field a typo
//!   meant), before an unknown one;
//! - an unknown field is named, "no such field";
//! - a value of the wrong type names its field and what the route says it
//!   takes.

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::json::{StrictValue, duplicate_field};

/// A refused body: the field (`body` for the whole of it) and what would
/// have been accepted. Routes turn it into their 400.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BadField {
    /// The field, as the body names it (`ttl_ms`, `budget`, `keys[1]`, ...).
    pub(crate) field: String,
    /// What would have been accepted.
    pub(crate) expected: String,
}

impl BadField {
    fn new(field: impl Into<String>, expected: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            expected: expected.into(),
        }
    }
}

/// A route's words for its fields. The words are built only for an error
/// answer (building them on every request cost allocations on `pool
/// serve`'s hot path).
#[derive(Clone, Copy)]
pub(crate) struct Rules<'a> {
    /// The fields that must be given (neither absent nor null), checked
    /// first, in this order.
    pub(crate) required: &'a [&'a str],
    /// What `field` takes, for an error: with `missing` for a required field
    /// that is absent, else for a value of the wrong type. `None`: the
    /// generic words ("a value: the field is required", or serde's).
    pub(crate) expected: &'a dyn Fn(&str, bool) -> Option<String>,
}

impl Rules<'_> {
    /// No required field; the generic words for every field (the tests' rules: every route
    /// names its fields' ranges).
    #[cfg(test)]
    pub(crate) const PLAIN: Rules<'static> = Rules {
        required: &[],
        expected: &|_, _| None,
    };

    fn missing(&self, field: &str) -> BadField {
        let expected = (self.expected)(field, true)
            .unwrap_or_else(|| "a value: the field is required".to_owned());
        BadField::new(field, expected)
    }
}

/// Reads `bytes` (one JSON object, or nothing for `{}`) into `T` by the
/// rules of this module.
///
/// Errors: [`BadField`] naming the first field refused, or `body`.
pub(crate) fn parse<T: DeserializeOwned>(bytes: &[u8], rules: Rules<'_>) -> Result<T, BadField> {
    let not_an_object = || BadField::new("body", "one JSON object and nothing after it");
    let map = if bytes.iter().all(u8::is_ascii_whitespace) {
        Map::new()
    } else {
        let mut de = serde_json::Deserializer::from_slice(bytes);
        let value =
            serde::Deserialize::deserialize(&mut de).map_err(|err: serde_json::Error| {
                match duplicate_field(&err.to_string()) {
                    Some(field) => BadField::new(field, "the field given once"),
                    None => not_an_object(),
                }
            })?;
        de.end().map_err(|_| not_an_object())?;
        match value {
            StrictValue(Value::Object(map)) => map,
            _ => return Err(not_an_object()),
        }
    };
    from_map(map, rules)
}

/// [`parse`] of a value already read (a body's nested object, which was
/// read strictly with it).
///
/// Errors: [`BadField`] naming the first field refused; `field` itself
/// when `value` is not an object.
pub(crate) fn parse_value<T: DeserializeOwned>(
    field: &str,
    value: Value,
    rules: Rules<'_>,
) -> Result<T, BadField> {
    match value {
        Value::Object(map) => from_map(map, rules),
        _ => Err(BadField::new(field, "a JSON object")),
    }
}

fn from_map<T: DeserializeOwned>(
    mut map: Map<String, Value>,
    rules: Rules<'_>,
) -> Result<T, BadField> {
    map.retain(|_, value| !value.is_null());
    if let Some(field) = rules.required.iter().find(|f| !map.contains_key(**f)) {
        return Err(rules.missing(field));
    }
    serde_path_to_error::deserialize(Value::Object(map)).map_err(|err| {
        let path = err.path().to_string();
        let message = err.inner().to_string();
        if let Some(name) = missing_field(&message) {
            return match path.as_str() {
                "." => rules.missing(name),
                _ => BadField::new(format!("{path}.{name}"), rules.missing(name).expected),
            };
        }
        if message.starts_with("unknown field `") {
            return BadField::new(path, "no such field");
        }
        let expected = (rules.expected)(&path, false).unwrap_or(message);
        BadField::new(path, expected)
    })
}

/// The name in serde's "missing field `rate`" (serde gives no other way to
/// get at it).
fn missing_field(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("missing field `")?;
    rest.split_once('`').map(|(name, _)| name)
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code, reason = "read by serde only: the fields a body may give")]
    struct Body {
        ttl_ms: Option<u64>,
        name: Option<String>,
        rate: Option<String>,
        inner: Option<Value>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Needs {
        rate: String,
        #[serde(default)]
        cost: Option<u64>,
    }

    fn words(field: &str, missing: bool) -> Option<String> {
        match (field, missing) {
            ("ttl_ms", false) => Some("an integer 1-600000".into()),
            ("ttl_ms", true) => Some("an integer 1-600000 (required)".into()),
            _ => None,
        }
    }

    const RULES: Rules<'static> = Rules {
        required: &["ttl_ms"],
        expected: &words,
    };

    fn refused(text: &str) -> (String, String) {
        let err = parse::<Body>(text.as_bytes(), RULES).unwrap_err();
        (err.field, err.expected)
    }

    #[test]
    fn the_whole_body_is_one_object() {
        for text in [
            "[1]",
            "{",
            "7",
            r#"{"ttl_ms": 5} xyz"#,
            r#"{"ttl_ms": 5}{}"#,
        ] {
            assert_eq!(refused(text).0, "body", "{text}");
        }
    }

    #[test]
    fn a_key_given_twice_is_named_at_any_depth() {
        assert_eq!(
            refused(r#"{"ttl_ms": 5, "ttl_ms": 6}"#),
            ("ttl_ms".into(), "the field given once".into())
        );
        assert_eq!(
            refused(r#"{"ttl_ms": 5, "inner": {"a": 1, "a": 2}}"#).0,
            "a"
        );
    }

    #[test]
    fn null_is_absent_and_a_missing_required_field_comes_first() {
        for text in ["", "{}", r#"{"ttl_ms": null}"#, r#"{"ttl": 5}"#] {
            assert_eq!(
                refused(text),
                ("ttl_ms".into(), "an integer 1-600000 (required)".into()),
                "{text}"
            );
        }
        let body: Body = parse(br#"{"ttl_ms": 5, "name": null}"#, RULES).unwrap();
        assert_eq!((body.ttl_ms, body.name), (Some(5), None));
        // serde's own missing field, without the route's words.
        let err = parse::<Needs>(br#"{"rate": null, "cost": 1}"#, Rules::PLAIN).unwrap_err();
        assert_eq!(
            (err.field.as_str(), err.expected.as_str()),
            ("rate", "a value: the field is required")
        );
    }

    #[test]
    fn unknown_fields_and_wrong_types_are_named() {
        assert_eq!(
            refused(r#"{"ttl_ms": 5, "ttl": 5}"#),
            ("ttl".into(), "no such field".into())
        );
        assert_eq!(
            refused(r#"{"ttl_ms": "5"}"#),
            ("ttl_ms".into(), "an integer 1-600000".into())
        );
        let (field, expected) = refused(r#"{"ttl_ms": 5, "rate": 7}"#);
        assert_eq!(field, "rate");
        assert!(expected.contains("expected a string"), "{expected}");
    }

    #[test]
    fn a_nested_object_reads_by_the_same_rules() {
        let needs: Needs = parse_value(
            "budget",
            serde_json::json!({"rate": "1/s", "cost": null}),
            Rules::PLAIN,
        )
        .unwrap();
        assert_eq!((needs.rate.as_str(), needs.cost), ("1/s", None));
        let err = parse_value::<Needs>("budget", Value::from(3), Rules::PLAIN).unwrap_err();
        assert_eq!(err.field, "budget");
    }
}
