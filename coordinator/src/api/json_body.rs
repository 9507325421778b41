//! Decoding a request body: a JSON object, never an array standing in for one.
//!
//! serde's derived `Deserialize` takes a struct from an array of its fields in order, so
//! `[]` decodes as a retry request with every field absent and `[null, [...]]` as a
//! transaction request. The contract (docs/openapi.json) says objects; this module makes the
//! server say the same. It owns the shape check only: it never interprets a field, and the
//! caller maps its error to 400 `malformed_json` with the caller's own wording.

use std::borrow::Cow;
use std::collections::HashMap;

use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

/// Decodes `bytes` as `T`. The body must be a JSON object, and so must every item of each
/// field named in `object_arrays` whose value is an array (the participants of a transaction,
/// the steps of a saga). The error is a sentence for the `message`.
///
/// The shape is checked on the text (borrowed `RawValue`s), not on a `serde_json::Value`:
/// building a tree of every body only to look at its outline cost each transaction as much as
/// decoding it (issue 28's profiles).
pub fn decode<T: DeserializeOwned>(bytes: &[u8], object_arrays: &[&str]) -> Result<T, String> {
    check_shape(bytes, object_arrays)?;
    // From the bytes, not a map: serde then refuses a field given twice, which a map would
    // have kept silently (the last one).
    serde_json::from_slice(bytes).map_err(|e| e.to_string())
}

fn check_shape(bytes: &[u8], object_arrays: &[&str]) -> Result<(), String> {
    // One pass for the usual body, an object: its fields as borrowed text. Anything else is
    // told apart by a second look, only on the way to a refusal.
    let fields: HashMap<Cow<'_, str>, &RawValue> = match serde_json::from_slice(bytes) {
        Ok(fields) => fields,
        Err(not_a_map) => {
            let whole: &RawValue = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
            return Err(match kind(whole) {
                "an object" => not_a_map.to_string(),
                other => format!("expected a JSON object, found {other}"),
            });
        }
    };
    for field in object_arrays {
        let Some(value) = fields.get(*field).filter(|v| kind(v) == "an array") else {
            continue;
        };
        let items: Vec<&RawValue> = serde_json::from_str(value.get()).map_err(|e| e.to_string())?;
        if let Some((index, item)) = items
            .iter()
            .enumerate()
            .find(|(_, item)| kind(item) != "an object")
        {
            return Err(format!(
                "{field}[{index}]: expected a JSON object, found {}",
                kind(item)
            ));
        }
    }
    Ok(())
}

/// What a valid JSON value is, told by its first character (a `RawValue` holds no
/// surrounding whitespace).
fn kind(value: &RawValue) -> &'static str {
    match value.get().as_bytes().first() {
        Some(b'{') => "an object",
        Some(b'[') => "an array",
        Some(b'"') => "a string",
        Some(b't' | b'f') => "a boolean",
        Some(b'n') => "null",
        _ => "a number",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::operator::RetryRequest;
    use protocol::saga::SagaRequest;
    use protocol::{TransactionRequest, lease::AcquireRequest};

    #[test]
    fn arrays_that_serde_would_take_for_structs_are_refused() {
        // Each of these decodes with serde_json alone: a struct from a sequence of its fields.
        assert!(serde_json::from_slice::<RetryRequest>(b"[]").is_ok());
        assert!(serde_json::from_slice::<AcquireRequest>(br#"["h-1"]"#).is_ok());
        let tx = br#"[null, [{"name": "inventory", "payload": {}}]]"#;
        assert!(serde_json::from_slice::<TransactionRequest>(tx).is_ok());

        let err = decode::<RetryRequest>(b"[]", &[]).unwrap_err();
        assert_eq!(err, "expected a JSON object, found an array");
        let err = decode::<AcquireRequest>(br#"["h-1"]"#, &[]).unwrap_err();
        assert_eq!(err, "expected a JSON object, found an array");
        let err = decode::<TransactionRequest>(tx, &["participants"]).unwrap_err();
        assert_eq!(err, "expected a JSON object, found an array");
        for scalar in [&b"null"[..], b"1", b"\"x\"", b"true"] {
            assert!(decode::<RetryRequest>(scalar, &[]).is_err());
        }
    }

    #[test]
    fn items_of_named_arrays_must_be_objects() {
        let body = br#"{"participants": [{"name": "a", "payload": 1}, ["b", 2]]}"#;
        assert!(serde_json::from_slice::<TransactionRequest>(body).is_ok());
        let err = decode::<TransactionRequest>(body, &["participants"]).unwrap_err();
        assert_eq!(
            err,
            "participants[1]: expected a JSON object, found an array"
        );

        let saga = br#"{"id": "s-1", "steps": [["a", "inventory", {}, null]]}"#;
        let err = decode::<SagaRequest>(saga, &["steps"]).unwrap_err();
        assert_eq!(err, "steps[0]: expected a JSON object, found an array");
    }

    #[test]
    fn kinds_are_told_with_whitespace_around_and_inside() {
        let err = decode::<RetryRequest>(b" \n [1] ", &[]).unwrap_err();
        assert_eq!(err, "expected a JSON object, found an array");
        let body = b"{ \"participants\" : [ {\"name\": \"a\", \"payload\": 1} ,\n 7 ] }";
        let err = decode::<TransactionRequest>(body, &["participants"]).unwrap_err();
        assert_eq!(
            err,
            "participants[1]: expected a JSON object, found a number"
        );
        for (item, kind) in [
            ("null", "null"),
            ("false", "a boolean"),
            ("\"x\"", "a string"),
        ] {
            let body = format!(r#"{{"participants": [ {item} ]}}"#);
            let err = decode::<TransactionRequest>(body.as_bytes(), &["participants"]).unwrap_err();
            assert_eq!(
                err,
                format!("participants[0]: expected a JSON object, found {kind}")
            );
        }
        // A field that is not an array is left for the typed decode to refuse.
        let err = decode::<TransactionRequest>(br#"{"participants": 3}"#, &["participants"]);
        assert!(err.unwrap_err().contains("invalid type"));
    }

    #[test]
    fn objects_decode_and_duplicate_fields_are_still_refused() {
        let ok: TransactionRequest = decode(
            br#"{"id": "t-1", "participants": [{"name": "a", "payload": [1, 2]}]}"#,
            &["participants"],
        )
        .unwrap();
        assert_eq!(ok.participants.len(), 1);
        assert_eq!(ok.participants[0].payload, serde_json::json!([1, 2]));
        let twice = decode::<AcquireRequest>(br#"{"holder": "a", "holder": "b"}"#, &[]);
        assert!(twice.unwrap_err().contains("duplicate field"));
        assert!(decode::<AcquireRequest>(b"{not json", &[]).is_err());
    }
}
