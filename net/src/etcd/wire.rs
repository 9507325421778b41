//! The JSON shapes of etcd's v3 gateway (etcd 3.4: protobuf JSON with the proto's own field
//! names): requests out, answers in. Keys and values travel base64; int64 fields are sent as
//! JSON strings and read from strings or numbers; the gateway leaves out every field at its
//! default, so a missing field reads as zero, false or empty. Owns only the encoding; never
//! sends anything, and never trusts an answer's shape (a bad one is an `Err(what)`).

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize};

use super::{Compare, KeyValue, LeaseId, TxnOp};

pub(super) fn b64(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

/// The end of the range of every key starting with `prefix`: the prefix with its last byte
/// below 0xff incremented and what follows dropped; `\0` (every key) when there is none.
pub(super) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

// ---- requests ----

#[derive(Debug, Serialize)]
pub(super) struct RangeRequest {
    pub key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub range_end: Option<String>,
}

impl RangeRequest {
    pub fn key(key: &[u8]) -> Self {
        RangeRequest {
            key: b64(key),
            range_end: None,
        }
    }

    pub fn prefix(prefix: &[u8]) -> Self {
        // The empty prefix is every key: from "\0" to the end "\0" means "all keys >= \0".
        let key = if prefix.is_empty() { &[0][..] } else { prefix };
        RangeRequest {
            key: b64(key),
            range_end: Some(b64(&prefix_end(prefix))),
        }
    }
}

#[derive(Debug, Serialize)]
pub(super) struct PutRequest {
    pub key: String,
    pub value: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
}

impl PutRequest {
    pub fn new(key: &[u8], value: &[u8], lease: Option<LeaseId>) -> Self {
        PutRequest {
            key: b64(key),
            value: b64(value),
            lease: lease.map(|l| l.0.to_string()),
        }
    }
}

#[derive(Debug, Serialize)]
pub(super) struct DeleteRangeRequest {
    pub key: String,
}

#[derive(Debug, Serialize)]
pub(super) struct LeaseGrantRequest {
    #[serde(rename = "TTL")]
    pub ttl: String,
    #[serde(rename = "ID")]
    pub id: String,
}

/// The body of keep-alive and revoke.
#[derive(Debug, Serialize)]
pub(super) struct LeaseIdRequest {
    #[serde(rename = "ID")]
    pub id: String,
}

#[derive(Debug, Serialize)]
pub(super) struct TxnRequest {
    pub compare: Vec<WireCompare>,
    pub success: Vec<RequestOp>,
    pub failure: Vec<RequestOp>,
}

#[derive(Debug, Serialize)]
pub(super) struct WireCompare {
    pub result: &'static str,
    pub target: &'static str,
    pub key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub create_revision: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mod_revision: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

impl From<&Compare> for WireCompare {
    fn from(compare: &Compare) -> Self {
        let (target, key) = match compare {
            Compare::CreateRevision { key, .. } => ("CREATE", key),
            Compare::ModRevision { key, .. } => ("MOD", key),
            Compare::Value { key, .. } => ("VALUE", key),
        };
        let mut wire = WireCompare {
            result: "EQUAL",
            target,
            key: b64(key),
            create_revision: None,
            mod_revision: None,
            value: None,
        };
        match compare {
            Compare::CreateRevision { equals, .. } => {
                wire.create_revision = Some(equals.to_string())
            }
            Compare::ModRevision { equals, .. } => wire.mod_revision = Some(equals.to_string()),
            Compare::Value { equals, .. } => wire.value = Some(b64(equals)),
        }
        wire
    }
}

/// One operation of a txn branch (exactly one field set, as the proto's oneof).
#[derive(Debug, Serialize)]
pub(super) struct RequestOp {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_range: Option<RangeRequest>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_put: Option<PutRequest>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_delete_range: Option<DeleteRangeRequest>,
}

impl RequestOp {
    pub fn range(key: &[u8]) -> Self {
        RequestOp {
            request_range: Some(RangeRequest::key(key)),
            request_put: None,
            request_delete_range: None,
        }
    }
}

impl From<&TxnOp> for RequestOp {
    fn from(op: &TxnOp) -> Self {
        match op {
            TxnOp::Put { key, value, lease } => RequestOp {
                request_range: None,
                request_put: Some(PutRequest::new(key, value, *lease)),
                request_delete_range: None,
            },
            TxnOp::Delete { key } => RequestOp {
                request_range: None,
                request_put: None,
                request_delete_range: Some(DeleteRangeRequest { key: b64(key) }),
            },
        }
    }
}

// ---- answers ----

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct Header {
    #[serde(deserialize_with = "int64")]
    pub revision: i64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct WireKeyValue {
    #[serde(deserialize_with = "bytes")]
    pub key: Vec<u8>,
    #[serde(deserialize_with = "bytes")]
    pub value: Vec<u8>,
    #[serde(deserialize_with = "int64")]
    pub create_revision: i64,
    #[serde(deserialize_with = "int64")]
    pub mod_revision: i64,
    #[serde(deserialize_with = "int64")]
    pub lease: i64,
}

impl From<WireKeyValue> for KeyValue {
    fn from(kv: WireKeyValue) -> Self {
        KeyValue {
            key: kv.key,
            value: kv.value,
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            lease: kv.lease,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct RangeResponse {
    pub header: Header,
    pub kvs: Vec<WireKeyValue>,
}

/// The answer of put (only its header matters to us).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct HeaderOnly {
    pub header: Header,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct DeleteRangeResponse {
    pub header: Header,
    #[serde(deserialize_with = "int64")]
    pub deleted: i64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct TxnResponse {
    pub header: Header,
    pub succeeded: bool,
    pub responses: Vec<ResponseOp>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct ResponseOp {
    pub response_range: Option<RangeResponse>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct LeaseGrantResponse {
    #[serde(rename = "ID", deserialize_with = "int64")]
    pub id: i64,
    #[serde(rename = "TTL", deserialize_with = "int64")]
    pub ttl: i64,
    pub error: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct LeaseKeepAliveResponse {
    #[serde(rename = "TTL", deserialize_with = "int64")]
    pub ttl: i64,
}

/// One message of the keep-alive stream: `{"result": ...}` or `{"error": ...}`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct KeepAliveStreamMessage {
    pub result: Option<LeaseKeepAliveResponse>,
    pub error: Option<serde_json::Value>,
}

/// The body of a refused request: `{"error": "...", "message": "...", "code": 5}` (the gRPC
/// status code).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct GatewayError {
    pub message: String,
    pub code: i64,
}

/// gRPC's NotFound: etcd's "requested lease not found".
pub(super) const CODE_NOT_FOUND: i64 = 5;
/// gRPC's FailedPrecondition: etcd's "lease already exists".
pub(super) const CODE_FAILED_PRECONDITION: i64 = 9;

/// Parses an answer body as `T`, naming what failed.
pub(super) fn decode<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, String> {
    serde_json::from_slice(body).map_err(|e| e.to_string())
}

/// The first message of the keep-alive stream (the gateway writes one JSON object per line).
pub(super) fn decode_stream_first(body: &[u8]) -> Result<KeepAliveStreamMessage, String> {
    let line = body
        .split(|&b| b == b'\n')
        .find(|line| !line.iter().all(u8::is_ascii_whitespace))
        .ok_or("an empty keep-alive stream")?;
    decode(line)
}

/// An int64 as the gateway writes it (a string), or as a plain number; null is 0.
fn int64<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Int64 {
        Text(String),
        Number(i64),
        Null(()),
    }
    match Int64::deserialize(deserializer)? {
        Int64::Text(text) => text
            .parse()
            .map_err(|_| de::Error::custom(format!("{text:?} is not an int64"))),
        Int64::Number(number) => Ok(number),
        Int64::Null(()) => Ok(0),
    }
}

/// Bytes as the gateway writes them (standard base64); null is empty.
fn bytes<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
    let text = Option::<String>::deserialize(deserializer)?.unwrap_or_default();
    STANDARD
        .decode(text.as_bytes())
        .map_err(|e| de::Error::custom(format!("bad base64: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_put_sends_base64_and_its_lease_as_a_string() {
        let put = PutRequest::new(
            b"foo",
            b"\x00\xffbar",
            Some(LeaseId(7_587_869_330_231_264_256)),
        );
        let json = serde_json::to_value(&put).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"key": "Zm9v", "value": "AP9iYXI=", "lease": "7587869330231264256"})
        );
        let bare = serde_json::to_value(PutRequest::new(b"k", b"", None)).unwrap();
        assert_eq!(bare, serde_json::json!({"key": "aw==", "value": ""}));
    }

    #[test]
    fn a_prefix_range_ends_after_the_last_key_with_the_prefix() {
        assert_eq!(prefix_end(b"a/"), b"a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), b"\0");
        assert_eq!(prefix_end(b""), b"\0");
        let all = serde_json::to_value(RangeRequest::prefix(b"")).unwrap();
        assert_eq!(all, serde_json::json!({"key": "AA==", "range_end": "AA=="}));
    }

    #[test]
    fn compares_and_ops_take_the_gateways_names() {
        let request = TxnRequest {
            compare: vec![
                WireCompare::from(&Compare::CreateRevision {
                    key: b"k".to_vec(),
                    equals: 0,
                }),
                WireCompare::from(&Compare::ModRevision {
                    key: b"k".to_vec(),
                    equals: 12,
                }),
                WireCompare::from(&Compare::Value {
                    key: b"k".to_vec(),
                    equals: b"v".to_vec(),
                }),
            ],
            success: vec![
                RequestOp::from(&TxnOp::Put {
                    key: b"k".to_vec(),
                    value: b"v".to_vec(),
                    lease: Some(LeaseId(9)),
                }),
                RequestOp::from(&TxnOp::Delete { key: b"j".to_vec() }),
            ],
            failure: vec![RequestOp::range(b"k")],
        };
        let json = serde_json::to_value(&request).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "compare": [
                    {"result": "EQUAL", "target": "CREATE", "key": "aw==", "create_revision": "0"},
                    {"result": "EQUAL", "target": "MOD", "key": "aw==", "mod_revision": "12"},
                    {"result": "EQUAL", "target": "VALUE", "key": "aw==", "value": "dg=="},
                ],
                "success": [
                    {"request_put": {"key": "aw==", "value": "dg==", "lease": "9"}},
                    {"request_delete_range": {"key": "ag=="}},
                ],
                "failure": [{"request_range": {"key": "aw=="}}],
            })
        );
    }

    #[test]
    fn a_range_answer_decodes_strings_numbers_and_missing_fields() {
        let body = br#"{"header":{"cluster_id":"1","revision":"41"},"kvs":[
            {"key":"Zm9v","create_revision":"2","mod_revision":40,"version":"1","value":"YmFy","lease":"12345"},
            {"key":"eHh4","create_revision":"3","mod_revision":"3"}],"count":"2"}"#;
        let range: RangeResponse = decode(body).unwrap();
        assert_eq!(range.header.revision, 41);
        let kvs: Vec<KeyValue> = range.kvs.into_iter().map(KeyValue::from).collect();
        assert_eq!(
            kvs,
            vec![
                KeyValue {
                    key: b"foo".to_vec(),
                    value: b"bar".to_vec(),
                    create_revision: 2,
                    mod_revision: 40,
                    lease: 12345
                },
                KeyValue {
                    key: b"xxx".to_vec(),
                    value: vec![],
                    create_revision: 3,
                    mod_revision: 3,
                    lease: 0
                },
            ]
        );
        let empty: RangeResponse = decode(br#"{"header":{"revision":"2"}}"#).unwrap();
        assert!(empty.kvs.is_empty());
    }

    #[test]
    fn a_failed_txn_answer_reads_as_not_succeeded_with_its_ranges() {
        let body = br#"{"header":{"revision":"2"},"responses":[{"response_range":{"header":{"revision":"2"},
            "kvs":[{"key":"Zm9v","create_revision":"2","mod_revision":"2","value":"YmFy","lease":"7"}],"count":"1"}}]}"#;
        let txn: TxnResponse = decode(body).unwrap();
        assert!(!txn.succeeded);
        assert_eq!(txn.header.revision, 2);
        assert_eq!(txn.responses.len(), 1);
        let range = txn
            .responses
            .into_iter()
            .next()
            .unwrap()
            .response_range
            .unwrap();
        assert_eq!(range.kvs[0].lease, 7);
        let won: TxnResponse =
            decode(br#"{"header":{"revision":"3"},"succeeded":true,"responses":[{"response_put":{"header":{"revision":"3"}}}]}"#)
                .unwrap();
        assert!(won.succeeded);
        assert!(won.responses[0].response_range.is_none());
    }

    #[test]
    fn lease_answers_decode_and_a_gone_lease_has_no_ttl() {
        let grant: LeaseGrantResponse =
            decode(br#"{"header":{"revision":"1"},"ID":"7587869330231264256","TTL":"5"}"#).unwrap();
        assert_eq!((grant.id, grant.ttl), (7_587_869_330_231_264_256, 5));
        let alive =
            decode_stream_first(b"{\"result\":{\"header\":{},\"ID\":\"12345\",\"TTL\":\"5\"}}\n")
                .unwrap();
        assert_eq!(alive.result.unwrap().ttl, 5);
        let gone = decode_stream_first(b"\n{\"result\":{\"header\":{},\"ID\":\"999\"}}").unwrap();
        assert_eq!(gone.result.unwrap().ttl, 0);
        let error =
            decode_stream_first(br#"{"error":{"grpc_code":14,"message":"no leader"}}"#).unwrap();
        assert!(error.result.is_none() && error.error.is_some());
        assert!(decode_stream_first(b"\n \n").is_err());
    }

    #[test]
    fn malformed_answers_are_errors_not_panics() {
        assert!(decode::<RangeResponse>(br#"{"kvs":[{"key":"!!!"}]}"#).is_err());
        assert!(decode::<RangeResponse>(br#"{"header":{"revision":"twelve"}}"#).is_err());
        assert!(
            decode::<RangeResponse>(br#"{"header":{"revision":"99999999999999999999"}}"#).is_err()
        );
        assert!(decode::<RangeResponse>(b"not json").is_err());
        assert!(decode::<TxnResponse>(br#"{"succeeded":"yes"}"#).is_err());
        let refusal: GatewayError = decode(
            br#"{"error":"etcdserver: requested lease not found","message":"etcdserver: requested lease not found","code":5}"#,
        )
        .unwrap();
        assert_eq!(refusal.code, CODE_NOT_FOUND);
    }
}
