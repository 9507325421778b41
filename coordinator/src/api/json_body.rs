//! Decoding a request body: a JSON object, never an array standing in for one.
//!
//! serde's derived `Deserialize` takes a struct from an array of its fields in order, so
//! `[]` decodes as a retry request with every field absent and `[null, [...]]` as a
//! transaction request. The contract (docs/openapi.json) says objects; this module makes the
//! server say the same. It owns the shape check only: it never interprets a field, and the
//! caller maps its error to 400 `malformed_json` with the caller's own wording.

use serde::de::DeserializeOwned;
use serde_json::Value;

/// Decodes `bytes` as `T`. The body must be a JSON object, and so must every item of each
/// field named in `object_arrays` whose value is an array (the participants of a transaction,
/// the steps of a saga). The error is a sentence for the `message`.
pub fn decode<T: DeserializeOwned>(bytes: &[u8], object_arrays: &[&str]) -> Result<T, String> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    let Value::Object(fields) = &value else {
        return Err(format!("expected a JSON object, found {}", kind(&value)));
    };
    for field in object_arrays {
        if let Some(Value::Array(items)) = fields.get(*field)
            && let Some((index, item)) = items.iter().enumerate().find(|(_, v)| !v.is_object())
        {
            return Err(format!(
                "{field}[{index}]: expected a JSON object, found {}",
                kind(item)
            ));
        }
    }
    // From the bytes, not the value: serde then refuses a field given twice, which a
    // `Value` would have kept silently (the last one).
    serde_json::from_slice(bytes).map_err(|e| e.to_string())
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
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
